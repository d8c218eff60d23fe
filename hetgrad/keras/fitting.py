"""``hk.fit``: the whole pipeline for a user's own compiled model in one call -- probe, plan,
shard, weighted optimizer, broadcast, weighted metrics, rebalancing between epochs,
checkpoint/resume -- on the same epoch loop and actions as ``hetgrad train``
(:mod:`hetgrad.loop`, :mod:`hetgrad.actions`)."""
from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import tensorflow as tf

from .. import compat
from .._keras.counting import count_samples
from .._keras.data import num_samples, on_cpu
from .._keras.optimizer import DistributedOptimizer, hetgrad_outermost, set_plan
from .._keras.probing import probe
from .._keras.user_callbacks import from_backup, on_this_rank_with_progress
from ..actions import Action, Balance, Checkpointing, Emulation, Sparse, UserCallbacks
from ..checkpoint import Checkpointer, read_state
from ..emulate import from_env
from ..errors import HetgradError
from ..loop import run_epochs
from ..partition import Plan, make_plan
from ..probe import ProbeResult
from ..rebalance import Rebalancer
from ..run import Run
from ..sparse.reducer import SparseReducer

keras = compat.keras


@dataclass
class FitRun(Run):
    """One ``hk.fit`` call's state (what the loop and the actions read)."""

    comm: Any
    plan: Plan
    model: Any
    optimizer: Any
    train_xy: Any
    num_epochs: int
    seed: int = 0
    device: str = ""
    checkpointer: Checkpointer | None = None
    start_epoch: int = 0
    epochs: list[dict] = field(default_factory=list)
    validation: Any = None


def fit(model, x, y=None, *, global_batch: int, epochs: int, validation_data=None,
        plan: Plan | None = None, rebalance: bool = True, rebalance_threshold: float = 0.03,
        min_batch: int = 1, max_batch: int | Sequence[int] | None = None,
        checkpoint_dir: str | None = None, resume: bool = False, seed: int = 0,
        probe_steps: int = 8, callbacks: Sequence = (), verbose: int = 2, device: str = "",
        sparsify=None):
    """Train the compiled ``model`` on ``(x, y)`` (arrays or dicts of arrays, the same on every
    rank) with local batches that sum to ``global_batch``; returns the Keras ``History``.

    Probes this model on every rank (unless ``plan`` is given), plans, wraps the compiled
    optimizer in :func:`DistributedOptimizer` with the plan's exact weights and recompiles
    with the same loss and metrics, then runs ``epochs`` epochs on this rank's shard, with
    rebalancing between epochs (``rebalance``), Keras ``callbacks`` (they see one ``fit``,
    metrics averaged over ranks; early stopping stops every rank), ``validation_data``
    scored on every rank, and checkpoints in ``checkpoint_dir`` after every epoch; with
    ``resume`` it continues from the checkpoint there (same plan). ``sparsify`` (a policy
    name or :class:`hetgrad.sparse.Sparsify`): the top-k exchange instead of the dense one
    (its density warm-up and per-epoch ``buildup`` |U|/k included). Progress: rank 0 only.
    """
    from ..runtime import init
    comm = init()
    if isinstance(x, tf.data.Dataset):
        raise HetgradError("hk.fit takes arrays or dicts of arrays; for a tf.data.Dataset use "
                           "hk.shard(ds, plan=...) with model.fit", field="x")
    if not compat.is_compiled(model):
        raise HetgradError("compile the model (optimizer and loss) before hk.fit", field="model")
    callbacks, checkpoint_dir, resume, drop_backup = from_backup(callbacks, checkpoint_dir,
                                                                 resume)
    n = num_samples(x, y)
    make_plan([1.0] * comm.size, global_batch, n, min_batch=min_batch, max_batch=max_batch)
    env = from_env(comm.size)   # (the line above checks the plan's arguments before any work)
    emulation = Emulation.of(*env, comm.rank) if env else None
    state = _resume_state(comm, checkpoint_dir, resume)
    perf: list[ProbeResult] = []
    if state:
        plan, perf = Plan(**state["plan"]), [ProbeResult(**p) for p in state.get("probe", [])]
    elif plan is None:
        perf = probe(model, x, y, global_batch=global_batch, steps=probe_steps,
                     max_batch=max_batch[comm.rank] if isinstance(max_batch, Sequence)
                     else max_batch, min_batch=min_batch, device=device)
        plan = make_plan(perf, global_batch, n, min_batch=min_batch, max_batch=max_batch)
    _check_plan(plan, comm.size, n, global_batch)
    optimizer = _weighted(model, plan, comm.rank, sparsify)
    run = FitRun(comm, plan, model, optimizer, on_cpu(x, y, plan), epochs, seed, device,
                 Checkpointer(checkpoint_dir, model, optimizer, comm.rank,
                              state={"probe": [asdict(p) for p in perf]}),
                 start_epoch=state["epoch"] if state else 0, validation=validation_data)
    if state:
        run.checkpointer.restore(state)
    if comm.rank == 0 and verbose:
        print(f"hetgrad: plan batches {plan.batches} (B={plan.global_batch}), "
              f"{plan.steps_per_epoch} steps/epoch", flush=True)
    history = keras.callbacks.History()
    users = UserCallbacks(on_this_rank_with_progress(history, callbacks, verbose, comm.rank),
                          epochs)
    rebalancer = Rebalancer(comm, models=[p.model() for p in perf] or None,
                            threshold=rebalance_threshold if rebalance else None,
                            min_batch=min_batch, max_batch=max_batch)
    run_epochs(run, _actions(run, emulation, Balance(rebalancer, verbose > 0), users))
    if drop_backup and comm.rank == 0:   # a finished run's backup goes, as Keras' does
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
    model.history = history
    return history


def _actions(run: FitRun, emulation: Emulation | None, balance: Balance,
             users: "UserCallbacks") -> list[Action]:
    """What runs around the epochs, in order: emulation, sparse density and statistics,
    balance, the user's callbacks, checkpoints."""
    actions: list[Action] = [emulation] if emulation else []
    if isinstance(run.reducer, SparseReducer):
        actions.append(Sparse(run.reducer))
    return actions + [balance, users, Checkpointing(run.checkpointer)]


def _resume_state(comm, checkpoint_dir: str | None, resume: bool) -> dict | None:
    """The checkpoint state to continue from, as rank 0 reads it (so every rank resumes from
    the same epoch even while rank 0's last save is still landing on a shared file system)."""
    if not resume:
        return None
    if not checkpoint_dir:
        raise HetgradError("resume needs the checkpoint_dir to continue from", field="resume")
    found = None
    if comm.rank == 0:
        try:
            found = (read_state(checkpoint_dir), None) if (
                Path(checkpoint_dir) / "state.json").is_file() else (None, None)
        except HetgradError as exc:   # sent to every rank, so none waits in the broadcast
            found = (None, (type(exc), exc.message, exc.field))
    state, error = comm.bcast(found, root=0)
    if error:
        kind, message, field = error
        raise kind(message, field=field)
    return state    # None: nothing saved yet (a first run, e.g. before a Slurm requeue)


def _check_plan(plan: Plan, size: int, n: int, global_batch: int) -> None:
    if plan.world_size != size:
        raise HetgradError(f"the plan is for {plan.world_size} ranks, this job has {size}",
                           field="plan")
    if plan.dataset_size != n:
        raise HetgradError(f"the plan is for {plan.dataset_size} samples, the data has {n}",
                           field="plan")
    if plan.global_batch != global_batch:
        raise HetgradError(f"the plan is for a global batch of {plan.global_batch}, not "
                           f"{global_batch}", field="plan")


def _weighted(model, plan: Plan, rank: int, sparsify=None):
    """The model recompiled with a hetgrad optimizer following ``plan`` (the compiled one
    wrapped, or kept if it already is one, a loss scale put inside it); returns that
    optimizer."""
    hetgrad_outermost(model)
    opt = model.optimizer
    agg = getattr(opt, "hetgrad", None)
    if agg is not None and sparsify is not None:
        raise HetgradError("the model's optimizer is already hetgrad's: give it sparsify= "
                           "there, not to hk.fit", field="sparsify")
    if agg is None:
        opt = DistributedOptimizer(opt, plan=plan, rank=rank, sparsify=sparsify)
        compat.recompile(model, opt)
    else:
        set_plan(opt, plan)
        count_samples(model)    # for weight="samples"; harmless for the plan's weights
    return opt
