"""This rank's batches as a ``tf.data`` pipeline: its slices of the global order
(:mod:`.order`) under a plan, read from a :class:`~hetgrad.data.sources.Source` by index --
gathered (arrays) or read (record files) a step at a time, several steps in parallel, the
source's per-sample ``decode`` applied, prefetched."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from ..errors import HetgradError
from ..partition import Plan, fixed_plan
from .arrays import ArraySource
from .order import rank_spans, shuffle_positions
from .sources import Source

AUTOTUNE = tf.data.AUTOTUNE


def rank_batches(source: Source, plan: Plan, rank: int, seed: int, epoch,
                 first_step: int = 0, stop: int | None = None) -> tf.data.Dataset:
    """``rank``'s batches of ``epoch`` (an int or a tensor), steps ``first_step`` .. ``stop
    - 1`` (default: to the epoch's end), in order."""
    starts, lengths = rank_spans(plan, rank, first_step, stop)
    n = len(source)
    read = _reader(source)

    def batch(start, length):
        return read(shuffle_positions(tf.range(start, start + length), seed, epoch, n))

    steps = tf.data.Dataset.from_tensor_slices((tf.constant(starts, tf.int64),
                                                tf.constant(lengths, tf.int64)))
    ds = steps.map(batch, num_parallel_calls=AUTOTUNE, deterministic=True)
    if source.decode is not None:
        ds = ds.map(_decoded(source.decode), num_parallel_calls=AUTOTUNE, deterministic=True)
    return untuned(ds.prefetch(2))


def shard(x, y=None, plan: Plan | None = None, *, seed: int = 0,
          rank: int | None = None) -> tf.data.Dataset:
    """``hk.shard``: this rank's batches of the global order under ``plan``, one epoch after
    another, for ``model.fit(ds, epochs=E, steps_per_epoch=plan.steps_per_epoch)``. ``x``/``y``
    as :func:`as_source` takes them; ``rank``: default Horovod's."""
    if plan is None:
        raise HetgradError("give the plan (hetgrad.make_plan) the batches follow", field="plan")
    rank = _rank_in(plan, rank)
    source = as_source(x, y)
    if len(source) != plan.dataset_size:
        raise HetgradError(f"the plan is for {plan.dataset_size} samples, the data has "
                           f"{len(source)}", field="plan")
    return tf.data.Dataset.counter().flat_map(
        lambda epoch: rank_batches(source, plan, rank, seed, epoch))


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


def in_order(source: Source, batch: int) -> tf.data.Dataset:
    """Every sample once, in storage order, in batches of ``batch`` (e.g. a test set)."""
    n = len(source)
    read = _reader(source)
    starts = tf.range(0, n, batch, dtype=tf.int64)
    ds = tf.data.Dataset.from_tensor_slices(starts).map(
        lambda s: read(tf.range(s, tf.minimum(s + batch, n))))
    if source.decode is not None:
        ds = ds.map(_decoded(source.decode))
    return untuned(ds.prefetch(2))


def untuned(ds: tf.data.Dataset) -> tf.data.Dataset:
    """``ds`` without tf.data's autotuning (``AUTOTUNE`` parallelism: the cores): its model
    thread wakes up only now and then, and deleting an iterator waits for it -- at the end
    of every ``fit`` and ``evaluate``, one iterator each, up to 0.5 s on 2 cores
    (docs/results.md)."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.with_options(options)


def first_batch(source: Source, size: int, seed: int = 0):
    """``size`` real samples, read and decoded as training reads them (the first global batch
    of epoch 0 of a one-rank plan)."""
    return next(iter(_first(source, size, seed)))


def repeated_batch(source: Source, size: int, seed: int = 0) -> tf.data.Dataset:
    """:func:`first_batch`'s samples again and again, as a dataset with the element spec of
    training's batches (the batch size unknown): what the probe times, its step traced once
    for all its sizes (not once per size)."""
    return _first(source, size, seed).cache().repeat()


def _first(source: Source, size: int, seed: int) -> tf.data.Dataset:
    return rank_batches(source, fixed_plan([size], len(source)), 0, seed, 0, stop=1)


def as_source(x, y=None) -> Source:
    """What ``hk.fit``, ``hk.shard`` and ``hk.probe`` take as data, as a source: a
    :class:`Source` (e.g. a converted dataset directory's), a path to one, arrays or dicts of
    arrays (with ``y``), or a finite ``tf.data.Dataset`` of unbatched ``(x, y)`` elements
    (read once into memory)."""
    if isinstance(x, Source):
        return x
    if isinstance(x, (str, Path)):
        from .arrays import load
        return load(str(x)).train
    if isinstance(x, tf.data.Dataset):
        if y is not None:
            raise HetgradError("with a tf.data.Dataset as x, give no y", field="y")
        return _materialized(x)
    return ArraySource(x, y)


def _materialized(ds: tf.data.Dataset) -> ArraySource:
    n = int(ds.cardinality())
    if n < 0:
        what = "infinite" if n == int(tf.data.INFINITE_CARDINALITY) else "unknown"
        raise HetgradError(f"the dataset's length is {what}; give a finite dataset (e.g. "
                           "ds.apply(tf.data.experimental.assert_cardinality(n))), or convert "
                           "it: hetgrad data convert", field="x")
    whole = ds.batch(max(n, 1)).get_single_element()
    arrays = tf.nest.map_structure(lambda t: t.numpy(), whole)
    if isinstance(arrays, tuple) and len(arrays) == 2:
        return ArraySource(arrays[0], arrays[1], name="tf.data")
    return ArraySource(arrays, name="tf.data")


def _reader(source: Source):
    """indices (a tensor) -> the samples' structure as tensors, read by ``source.take``."""
    template = source.signature
    fields = tf.nest.flatten(template)

    def take(indices: np.ndarray) -> list:
        return [np.asarray(a) for a in tf.nest.flatten(source.take(indices))]

    def read(indices):
        flat = tf.numpy_function(take, [indices], [tf.as_dtype(f.dtype) for f in fields],
                                 stateful=False)
        for tensor, field in zip(flat, fields):
            tensor.set_shape([None, *field.shape])
        return tf.nest.pack_sequence_as(template, flat)
    return read


def _decoded(decode):
    """A batch -> the batch with ``decode`` applied to every sample (in parallel); an empty
    batch (a rank with no sample in a tiny final step) -> an empty batch of decoded shape."""
    def apply(*batch):
        batch = batch[0] if len(batch) == 1 else batch
        samples = tf.data.Dataset.from_tensor_slices(batch)
        size = tf.shape(tf.nest.flatten(batch)[0], out_type=tf.int64)[0]
        decoded = samples.map(decode, num_parallel_calls=AUTOTUNE).batch(tf.maximum(size, 1))
        return decoded.concatenate(_empty(decoded.element_spec)).take(1)
    return lambda *batch: apply(*batch).get_single_element()


def _empty(spec) -> tf.data.Dataset:
    """One batch of 0 elements of ``spec``'s structure (unknown sizes taken as 0)."""
    def zeros(s):
        return tf.zeros([0, *[d or 0 for d in s.shape.as_list()[1:]]], s.dtype)
    return tf.data.Dataset.from_tensors(tf.nest.map_structure(zeros, spec))
