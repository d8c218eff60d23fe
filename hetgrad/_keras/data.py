"""``hk.shard``: this rank's part of the user's data as a ``tf.data.Dataset`` of its local
batches, following the plan (contiguous shards, the plan's partial final step), reshuffled
every epoch in an order seeded by ``(seed, rank, epoch)``."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from ..errors import HetgradError
from ..partition import Plan
from ..pipeline import epoch_batches


def num_samples(x, y=None) -> int:
    """The common first dimension of every array in ``x`` and ``y`` (arrays or dicts)."""
    sizes = {name: len(a) for name, a in _named_arrays(x, y)}
    if not sizes:
        raise HetgradError("no data given", field="x")
    if len(set(sizes.values())) > 1:
        raise HetgradError(f"inputs and targets differ in length: {sizes}", field="x")
    return next(iter(sizes.values()))


def _named_arrays(x, y):
    for prefix, part in (("x", x), ("y", y)):
        if part is None:
            continue
        if isinstance(part, dict):
            yield from ((f"{prefix}[{k!r}]", v) for k, v in part.items())
        elif isinstance(part, (list, tuple)):
            yield from ((f"{prefix}[{i}]", v) for i, v in enumerate(part))
        else:
            yield prefix, part


def take(xy, b: int):
    """The first ``b`` samples of every array in the structure ``xy``."""
    return tf.nest.map_structure(lambda a: a[:b], xy)


def shard(x, y=None, plan: Plan | None = None, *, seed: int = 0,
          rank: int | None = None) -> tf.data.Dataset:
    """This rank's local batches for ``model.fit(ds, epochs=E,
    steps_per_epoch=plan.steps_per_epoch)``: an endless dataset, one epoch after another.

    ``x``/``y``: arrays or dicts of arrays, or ``x`` a finite ``tf.data.Dataset`` of
    unbatched elements (then ``y`` is None; its shard is shuffled through a buffer of the
    shard's size). ``rank``: default Horovod's.
    """
    if plan is None:
        raise HetgradError("give the plan (hetgrad.make_plan) the shards follow", field="plan")
    rank = _rank_in(plan, rank)
    lo, n, b = plan.shard_starts[rank], plan.shard_sizes[rank], plan.batches[rank]
    if isinstance(x, tf.data.Dataset):
        if y is not None:
            raise HetgradError("with a tf.data.Dataset as x, give no y", field="y")
        _check_size(plan, _cardinality(x))
        part = x.skip(lo).take(n).cache()
        return part.shuffle(n, seed=seed * 1_000_003 + rank).batch(b).repeat()
    data = on_cpu(x, y, plan)
    return tf.data.Dataset.counter().flat_map(
        lambda epoch: epoch_batches(data, plan, rank, seed, epoch))


def _rank_in(plan: Plan, rank: int | None) -> int:
    import horovod.tensorflow as hvd
    size = hvd.size() if hvd.is_initialized() else 1
    if rank is None:
        rank = hvd.rank() if hvd.is_initialized() else 0
        if plan.world_size != size:
            raise HetgradError(f"the plan is for {plan.world_size} ranks, this job has {size}",
                               field="plan")
    if not 0 <= rank < plan.world_size:
        raise HetgradError(f"rank {rank} is not in the plan's {plan.world_size} ranks",
                           field="rank")
    return rank


def _check_size(plan: Plan, n: int) -> None:
    if n != plan.dataset_size:
        raise HetgradError(f"the plan is for {plan.dataset_size} samples, the data has {n}",
                           field="plan")


def _cardinality(ds: tf.data.Dataset) -> int:
    n = int(ds.cardinality())
    if n < 0:
        what = "infinite" if n == int(tf.data.INFINITE_CARDINALITY) else "unknown"
        raise HetgradError(f"the dataset's length is {what}; give a finite dataset (e.g. "
                           "ds.apply(tf.data.experimental.assert_cardinality(n)))", field="x")
    return n


def on_cpu(x, y, plan: Plan):
    """``(x, y)`` (or ``x`` without targets) as tensors in host memory, checked against the
    plan's dataset size; every epoch's input pipeline gathers from them."""
    _check_size(plan, num_samples(x, y))
    with tf.device("/CPU:0"):
        return tf.nest.map_structure(lambda a: tf.constant(np.asarray(a)),
                                     (x, y) if y is not None else x)
