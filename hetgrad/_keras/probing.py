"""``hk.probe``: every rank times real training steps of the user's own compiled model on real
batches of the user's data, at several batch sizes, and all ranks get every rank's model."""
from __future__ import annotations

import contextlib
from typing import Callable, Sequence

import numpy as np

from .. import compat
from ..emulate import SpeedEmulator, from_env
from ..errors import HetgradError
from ..perfmodel import probe_batches
from ..planning import planner
from ..probe import ProbeResult, measure, refine as refine_models, share
from ..data.reader import as_source, first_batch, repeated_batch
from ..aggregate import Aggregation
from ..reducers import DenseReducer
from ..runtime import init
from ..weights import SampleWeight
from .counting import counted
from .optimizer import hetgrad_outermost


def probe(model, x, y=None, *, global_batch: int | None = None,
          batches: Sequence[int] | None = None, max_batch: int | None = None,
          min_batch: int = 1, steps: int = 8, warmup: int = 3, refine: int = 0,
          timeout: float = 300.0, device: str = "",
          before_step: Callable[[int], None] | None = None,
          verbose: bool = False) -> list[ProbeResult]:
    """Time training steps of the compiled ``model`` on ``b`` real samples of the data for
    each probe batch ``b`` and fit this rank's step-time model; every rank returns all ranks'
    results (pass them to :func:`hetgrad.make_plan`).

    ``x``/``y``: what ``hk.shard`` takes (arrays or dicts of arrays, a dataset directory or
    :class:`~hetgrad.data.Source`, a finite ``tf.data.Dataset``); the samples are read and
    decoded as training reads them, and ``model.fit`` runs the steps (a custom
    ``train_step`` gets ``(x, y)``). ``batches``: the sizes to time; default 3 geometric sizes
    from ``B / (4 P)`` up to the global batch ``B`` (or ``max_batch``, this rank's memory cap).
    The model's weights, its optimizer's state, metrics and history are exactly as before
    when the probe returns. With hetgrad's ``DistributedOptimizer`` (dense, one pass per
    step, no loss scale) it times the training step itself with the exchange off (each rank
    alone: ``fit`` then need not trace it again); else a local step. ``before_step(b)``:
    called before each timed step (default: the emulated sleep of
    ``HETGRAD_EMULATE_SPEEDS``, if set). With ``global_batch``,
    ``refine`` rounds then time every rank at its batch of the plan (``min_batch``, every
    rank's ``max_batch``) and correct its model there (:func:`hetgrad.probe.refine`; default
    0). ``verbose``: rank 0 says what it times.
    """
    if not compat.is_compiled(model) or getattr(model, "optimizer", None) is None:
        raise HetgradError("compile the model (optimizer and loss) before probing it",
                           field="model")
    source = as_source(x, y)
    n = len(source)
    if batches is not None and any(int(b) != b or not 1 <= b <= n for b in batches):
        raise HetgradError(f"probe batches must be integers in [1, {n}], got {list(batches)}",
                           field="batches")
    comm = init()
    top = min(global_batch or n, max_batch or n, n)
    sizes = _as_many(comm, list(batches) if batches else
                     probe_batches(top, global_batch or top, comm.size), timeout)
    before_step = _emulated_pause(comm) if before_step is None else before_step
    report = _reporter(comm, sizes, warmup, steps) if verbose else None
    if not model.built:   # a subclassed model: its variables exist once it is called
        model(first_batch(source, 1)[0])
    hetgrad_outermost(model)   # (a loss scale around hetgrad's optimizer goes inside)
    agg = _aggregation_alone(model)

    def time_at(sizes: Sequence[int], lockstep: bool = False) -> tuple[list, list]:
        return measure(model, lambda b: repeated_batch(source, b), batches=sizes,
                       warmup=warmup, steps=steps, before_step=before_step,
                       sync=lambda: comm.gather_with_timeout(None, timeout),
                       step_sync=comm.exchange_barrier if lockstep else None, on_point=report)

    with _restored(model, [] if agg is None else agg.own_variables()), \
            _local_optimizer(model) if agg is None else _alone(agg), \
            compat.one_step_per_call(model):
        results = share(comm, *time_at(sizes), device or _device(), timeout)
        if global_batch and refine:
            caps = comm.gather_with_timeout(max_batch or global_batch, timeout)
            results = refine_models(comm, results, planner(global_batch, min_batch, caps),
                                    time_at, refine, timeout)
    return results


def _reporter(comm, sizes, warmup: int, steps: int):
    """Rank 0 says what the probe times, then each size's step time (None elsewhere)."""
    if comm.rank != 0:
        return None
    print(f"hetgrad: probe: timing batch sizes {list(dict.fromkeys(sizes))} (rank 0's) on "
          f"{comm.size} ranks, {warmup} warm-up + {steps} steps each", flush=True)
    return lambda b, t: print(f"hetgrad: probe: batch {b}: {1e3 * t:.1f} ms/step on rank 0",
                              flush=True)


class _restored:
    """Put the model's variables, its optimizer's variables, ``extra`` variables (those of
    hetgrad's exchange), its count of samples, its metrics and its last ``fit``'s history
    back on exit."""

    def __init__(self, model, extra: list):
        self.model, self.extra = model, extra

    def __enter__(self):
        opt = self.model.optimizer
        compat.build_optimizer(opt, self.model.trainable_variables)
        self.variables = (list(self.model.variables) + compat.optimizer_variables(opt)
                          + self.extra + counted(self.model))
        self.values = [np.array(v.numpy(), copy=True) for v in self.variables]
        self.history = getattr(self.model, "history", None)

    def __exit__(self, *exc):
        for var, value in zip(self.variables, self.values):
            var.assign(value)
        self.model.reset_metrics()
        self.model.history = self.history
        return False


def _as_many(comm, sizes: list[int], timeout: float) -> list[int]:
    """``sizes``, the last one again up to as many as any rank times (a memory cap can leave a
    rank fewer): every rank's gathers per size then pair up."""
    most = max(comm.gather_with_timeout(len(sizes), timeout))
    return sizes + sizes[-1:] * (most - len(sizes))


def _aggregation_alone(model) -> Aggregation | None:
    """The aggregation whose training step the probe can time :attr:`alone
    <hetgrad.aggregate.Aggregation.alone>` (nothing exchanged): hetgrad's dense exchange of
    one backward pass per step without a loss scale, whose own state the probe puts back
    (:meth:`~hetgrad.aggregate.Aggregation.own_variables`). The step is then traced once for
    the probe and the training (a second trace took most of the first epoch's excess,
    docs/results.md). None otherwise: a step of its own (:class:`_local_optimizer`)."""
    opt = model.optimizer
    agg = getattr(opt, "hetgrad", None)
    if (agg is None or type(agg.reducer) is not DenseReducer
            or compat.is_loss_scale_optimizer(opt)
            or getattr(opt, "_hetgrad_passes", 1) > 1
            or isinstance(agg.weight, SampleWeight) and not agg.weight.fused):
        return None   # (an unfused count's allreduce would make the steps wait for all)
    return agg


@contextlib.contextmanager
def _alone(agg: Aggregation):
    """Within: ``agg``'s steps exchange nothing (the rank's own gradients are applied)."""
    agg.alone.assign(True)
    try:
        yield
    finally:
        agg.alone.assign(False)


class _local_optimizer:
    """Within: a model compiled with hetgrad's optimizer is compiled with a copy of the
    optimizer it wraps (where its own step cannot run alone, :func:`_aggregation_alone`),
    and with hetgrad's again on exit."""

    def __init__(self, model):
        self.model = model
        self.saved = None

    def __enter__(self):
        opt = self.model.optimizer
        if getattr(opt, "hetgrad", None) is not None:
            self.saved = opt
            compat.recompile(self.model, opt._hetgrad_base.from_config(opt.get_config()))

    def __exit__(self, *exc):
        if self.saved is not None:
            compat.recompile(self.model, self.saved)
        return False


def _emulated_pause(comm) -> Callable[[int], None] | None:
    """``HETGRAD_EMULATE_SPEEDS``' sleep before each probe step (see hetgrad.emulate)."""
    env = from_env(comm.size)
    return SpeedEmulator(env[0][0][comm.rank], env[1]).pause if env else None


def _device() -> str:
    import tensorflow as tf
    return "/GPU:0" if tf.config.get_visible_devices("GPU") else "/CPU:0"
