"""``hk.fit``: the whole pipeline for a user's own compiled model in one call -- probe, plan,
the global order of the data, weighted optimizer, broadcast, weighted metrics, rebalancing
between epochs, checkpoint/resume -- as a front end over the same assembly and epoch loop as
``hetgrad train`` (:mod:`hetgrad.assembly`, :mod:`hetgrad.loop`)."""
from __future__ import annotations

import shutil
import sys
from dataclasses import asdict
from typing import Sequence

from .. import compat
from .._keras.user_callbacks import from_backup, progress_callbacks
from ..assembly import assemble
from ..data.reader import as_source
from ..emulate import from_env, parse_schedule
from ..errors import HetgradError
from ..config import check_value
from ..goodput import check_range, default_lr_rule
from ..loop import run_epochs
from ..partition import Plan, make_plan
from ..run import ProbeSpec, RunSpec
from ..runtime import agree, init, still_heap
from ..sparse.settings import Sparsify
from ..writable import check_observers

keras = compat.keras


def fit(model, x, y=None, *, global_batch: int, epochs: int, validation_data=None,
        plan: Plan | None = None, rebalance: bool = True, rebalance_threshold: float = 0.03,
        min_batch: int = 1, max_batch: int | Sequence[int] | None = None,
        drop_remainder: bool = False, checkpoint_dir: str | None = None, resume: bool = False, seed: int = 0,
        probe_steps: int = 8, callbacks: Sequence = (), verbose: int = 2, device: str = "",
        sparsify=None, step_timeout: float | None = 600.0, emulate_speeds: str | None = None,
        emulate_unit: float = 1e-3, tensorboard: str | None = None, timeline: str | None = None,
        gns: bool = False, gns_every: int | None = None,
        adaptive_batch: tuple[int, int] | None = None, lr_rule: str | None = None):
    """Train the compiled ``model`` on ``(x, y)`` with local batches that sum to
    ``global_batch``; returns the Keras ``History``.

    ``x``/``y``: arrays or dicts of arrays (the same on every rank), a dataset directory from
    ``hetgrad data convert`` (or its :class:`~hetgrad.data.Source`), or a finite
    ``tf.data.Dataset``, visited in one global order that no world size or plan changes (the
    last ``N mod B`` samples a smaller final step, or left out with ``drop_remainder``).
    Wraps its optimizer in :func:`DistributedOptimizer` and recompiles, probes the model on
    every rank through it (unless ``plan`` is given), gives it the plan's weights, trains with
    rebalancing (``rebalance``), Keras ``callbacks`` (they see one ``fit``, metrics averaged
    over ranks; those that write files run on rank 0 only; early stopping stops every rank; a
    ``BackupAndRestore`` becomes hk.fit's checkpoints), ``validation_data`` scored on every
    rank, and checkpoints in ``checkpoint_dir`` every epoch; ``resume`` continues from there
    (refused if a setting changed; on another number of ranks it re-plans). ``sparsify`` (a
    policy name or :class:`hetgrad.sparse.Sparsify`): the top-k exchange. ``step_timeout``:
    end every rank when one makes no progress that long. ``emulate_speeds`` (default
    ``HETGRAD_EMULATE_SPEEDS``), ``tensorboard``, ``timeline``, ``gns``, ``gns_every``: as
    ``hetgrad train``'s flags. ``adaptive_batch=(lo, hi)``: each epoch's global batch chosen
    there by goodput, the learning rate (a number, for ``global_batch``) scaled with it by
    ``lr_rule`` (``hetgrad train --lr-rule``; default: by optimizer).
    """
    comm = init()
    source, adaptive_batch, lr_rule = _checked(comm, model, x, y, global_batch, min_batch,
                                               max_batch, adaptive_batch, lr_rule)
    callbacks, checkpoint_dir, resume, drop_backup = from_backup(callbacks, checkpoint_dir,
                                                                 resume)
    tensorboard, timeline = _observers(comm, tensorboard, timeline)
    sparsify = Sparsify(sparsify) if isinstance(sparsify, str) else sparsify
    history = keras.callbacks.History()
    with still_heap():
        run = assemble(RunSpec(
            model=model, data=source, global_batch=global_batch, epochs=epochs, seed=seed,
            plan=plan, probe=ProbeSpec(steps=probe_steps), min_batch=min_batch,
            max_batch=max_batch, drop_remainder=drop_remainder, sparsify=sparsify,
            rebalance_threshold=rebalance_threshold if rebalance else None,
            checkpoint_dir=checkpoint_dir, resume=resume,
            identity={"seed": seed, "sparsify": asdict(sparsify) if sparsify else None,
                      "drop_remainder": drop_remainder, "adaptive_batch":
                      adaptive_batch and list(adaptive_batch), "lr_rule": lr_rule},
            emulation=_emulation(emulate_speeds, emulate_unit, comm.size),
            validation=validation_data, verbose=verbose, step_timeout=step_timeout,
            device=device, tensorboard=tensorboard, timeline=timeline, gns=gns,
            gns_every=gns_every, adaptive_batch=adaptive_batch, lr_rule=lr_rule,
            callbacks=[history, *callbacks, *progress_callbacks(verbose, comm.rank)]))
        if comm.rank == 0 and verbose:
            _announce(run.plan)
        run_epochs(run)
    if drop_backup and comm.rank == 0:   # a finished run's backup goes, as Keras' does
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
    model.history = history
    return history


def _announce(plan: Plan) -> None:
    print(f"hetgrad: plan batches {plan.batches} (B={plan.global_batch}), "
          f"{plan.steps_per_epoch} steps/epoch", flush=True)
    if warning := plan.thin_tail("drop_remainder=True"):
        print(f"hetgrad: warning: {warning}", file=sys.stderr, flush=True)


def _checked(comm, model, x, y, global_batch: int, min_batch: int, max_batch,
             adaptive_batch, lr_rule) -> tuple:
    """The data as a source, the batch range and the learning-rate rule in effect (None
    without an adaptive batch), with the model and the plan's arguments checked first."""
    if not compat.is_compiled(model):
        raise HetgradError("compile the model (optimizer and loss) before hk.fit", field="model")
    source = as_source(x, y)
    make_plan([1.0] * comm.size, global_batch, len(source), min_batch=min_batch,
              max_batch=max_batch)
    check_value("lr_rule", lr_rule)
    if adaptive_batch is None:
        if lr_rule is not None:
            raise HetgradError("does nothing without adaptive_batch", field="lr_rule")
        return source, None, None
    return (source, check_range(adaptive_batch, global_batch, "adaptive_batch"),
            lr_rule or default_lr_rule(compat.is_sgd(model.optimizer)))


def _observers(comm, tensorboard: str | None, timeline: str | None) -> tuple:
    """Where rank 0 writes the scalars and the timeline -- rank 0's arguments, else any
    rank's (Horovod's habit: give them on rank 0 only) -- checked by rank 0 before any work
    (every rank raises its error)."""
    given = comm.allgather((tensorboard, timeline)) if comm.size > 1 else [(tensorboard,
                                                                           timeline)]
    chosen = tuple(next((g[i] for g in given if g[i]), None) for i in (0, 1))
    agree(comm, lambda: check_observers(*chosen) if comm.rank == 0 else None)
    return chosen


def _emulation(speeds: str | None, unit: float, size: int) -> tuple | None:
    """The emulated speeds asked for, else those of ``HETGRAD_EMULATE_SPEEDS``."""
    if speeds:
        return parse_schedule(speeds, size), unit
    return from_env(size)
