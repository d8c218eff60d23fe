"""``hk.probe``: every rank times real training steps of the user's own compiled model on real
batches of the user's data, at several batch sizes, and all ranks get every rank's model."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .. import compat
from ..emulate import SpeedEmulator, from_env
from ..errors import HetgradError
from ..perfmodel import probe_batches
from ..planning import planner
from ..probe import ProbeResult, measure, refine as refine_models, share
from ..data.reader import as_source, first_batch, repeated_batch
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
    when the probe returns. ``before_step(b)``: called before each timed step (default: the
    emulated sleep of ``HETGRAD_EMULATE_SPEEDS``, if set). With ``global_batch``, ``refine``
    rounds then time every rank at its batch of the plan (``min_batch``, every rank's
    ``max_batch``) and correct its model there (:func:`hetgrad.probe.refine`; default 0:
    none). ``verbose``: rank 0 says what it times.
    """
    if not compat.is_compiled(model) or getattr(model, "optimizer", None) is None:
        raise HetgradError("compile the model (optimizer and loss) before probing it",
                           field="model")
    source = as_source(x, y)
    n = len(source)
    if batches is not None and any(int(b) != b or not 1 <= b <= n for b in batches):
        raise HetgradError(f"probe batches must be integers in [1, {n}], got {list(batches)}",
                           field="batches")
    from ..runtime import init
    comm = init()
    top = min(global_batch or n, max_batch or n, n)
    sizes = _as_many(comm, list(batches) if batches else
                     probe_batches(top, global_batch or top, comm.size), timeout)
    if before_step is None:
        before_step = _emulated_pause(comm)
    report = _reporter(comm, sizes, warmup, steps) if verbose else None

    def time_at(sizes: Sequence[int], lockstep: bool = False) -> tuple[list, list]:
        return measure(model, lambda b: repeated_batch(source, b), batches=sizes,
                       warmup=warmup, steps=steps, before_step=before_step,
                       sync=lambda: comm.gather_with_timeout(None, timeout),
                       step_sync=comm.exchange_barrier if lockstep else None, on_point=report)

    if not model.built:   # a subclassed model: its variables exist once it is called
        model(first_batch(source, 1)[0])
    hetgrad_outermost(model)   # (a loss scale around hetgrad's optimizer goes inside)
    with _restored(model), _local_optimizer(model), compat.one_step_per_call(model):
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
    print(f"hetgrad: probe: timing batch sizes {list(sizes)} (rank 0's) on {comm.size} ranks, "
          f"{warmup} warm-up + {steps} steps each", flush=True)
    return lambda b, t: print(f"hetgrad: probe: batch {b}: {1e3 * t:.1f} ms/step on rank 0",
                              flush=True)


class _restored:
    """Put the model's variables, its optimizer's variables, its metrics and its last
    ``fit``'s history back on exit."""

    def __init__(self, model):
        self.model = model

    def __enter__(self):
        opt = self.model.optimizer
        compat.build_optimizer(opt, self.model.trainable_variables)
        self.variables = list(self.model.variables) + compat.optimizer_variables(opt)
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


class _local_optimizer:
    """Within: a model compiled with hetgrad's optimizer is compiled with a copy of the
    optimizer it wraps (a probe step is this rank's compute alone: an exchange would make
    every rank wait for the slowest), and with hetgrad's again on exit."""

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
