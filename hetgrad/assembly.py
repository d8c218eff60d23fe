"""The one way a training run is put together, for ``hetgrad train`` and ``hk.fit`` alike:
:func:`assemble` turns a checked :class:`~hetgrad.run.RunSpec` into a whole
:class:`~hetgrad.run.Run` -- the checkpoint to resume (checked against the spec), the
model's optimizer wrapped by hetgrad, every rank's step model (the checkpoint's, a saved
probe's, or timed now on real samples, through that optimizer's step), the plan, the
checkpointer (restored), and the actions around the
epochs in their one order (:data:`ACTION_ORDER`). The front ends only translate their
arguments into a spec and their results out of the run."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from dataclasses import asdict, replace

from . import compat
from ._keras.counting import count_samples
from ._keras.found import aggregation_of
from ._keras.optimizer import DistributedOptimizer, hetgrad_outermost, start_plan
from ._keras.probing import probe as probe_model
from ._keras.callbacks import on_this_rank
from .adapt import AdaptiveBatch
from .actions import (Balance, Checkpointing, Emulation, Evaluation, Sparse, UserCallbacks,
                      Watchdog)
from .checkpoint import Checkpointer, checked_state
from .errors import HetgradError
from .goodput import BatchChooser
from .partition import Plan, make_plan
from .perfmodel import probe_batches
from .planning import check_plan
from .probe import ProbeResult
from .noise import EVERY as GNS_EVERY, check_measurable
from .observe import Noise, Scalars, Timeline
from .rebalance import Rebalancer
from .run import Progress, Run, RunSpec
from .timeline import Sampler
from .runtime import init
from .validate import check_resumed
from .weights import FixedWeight

# What runs around the epochs, in this order at every hook: the emulated speeds and the
# watchdog first (they pace and guard everything after them); the sparse exchange's
# statistics (a row says what its epoch ran); rank 0's test score before the balance (whose
# gather -- or with the noise scale, its sum over the ranks -- is where the other ranks wait
# for it); the balance, which may re-plan, before the
# checkpoint (which keeps the plan the next epoch uses); the user's Keras callbacks; the
# checkpoint, of everything the epoch did; then what only observes: TensorBoard's scalars and
# the timeline (last: at an epoch's end it sees the re-plan and the checkpoint). The noise
# scale before the balance and the goodput's batch after it (which weighs both): that one's
# learning rate is set before the user's callbacks read it at an epoch's end.
ACTION_ORDER = (Emulation, Watchdog, Sparse, Evaluation, Noise, Balance, AdaptiveBatch,
                UserCallbacks, Checkpointing, Scalars, Timeline)


def assemble(spec: RunSpec) -> Run:
    """The run ``spec`` asks for, on this MPI/Horovod world (every rank calls it)."""
    comm = init()
    state = _resumed(spec, comm)
    same_world = state is not None and len(state["plan"]["batches"]) == comm.size
    planned = replace(spec, global_batch=state["plan"]["global_batch"]) if state else spec
    # hetgrad's optimizer before the probe, which times (and traces) its step: on equal
    # speeds' plan until the probe's is known
    plan = Plan(**state["plan"]) if same_world else _plan(planned, comm.size,
                                                            [1.0] * comm.size)
    optimizer = _hetgrad_optimizer(spec, plan, comm.rank, comm.size)
    _check_adaptive(spec, optimizer, comm.size)
    if spec.gns or spec.adaptive_batch:
        check_measurable(optimizer, "adaptive_batch" if spec.adaptive_batch else "gns",
                         spec.gns_every or (1 if spec.adaptive_batch else GNS_EVERY))
    t0 = time.perf_counter()
    probed = _probe(spec, comm, state if same_world else None)
    probe_time = time.perf_counter() - t0
    if not same_world and _planned_by_probe(spec):
        plan = _plan(planned, comm.size, probed)
        start_plan(optimizer, plan)
    checkpointer = Checkpointer(spec.checkpoint_dir, spec.model, optimizer, comm.rank,
                                every=spec.checkpoint_every,
                                state={"probe": [asdict(p) for p in probed],
                                       "job": spec.identity})
    if state:
        checkpointer.restore(state, rank_state=same_world)
        if not same_world and comm.rank == 0:
            print(f"hetgrad: resuming a {len(state['plan']['batches'])}-rank checkpoint on "
                  f"{comm.size} ranks: plan batches {plan.batches}", file=sys.stderr, flush=True)
    epoch, step = _position(state, plan)
    run = Run(spec, comm, spec.model, optimizer, checkpointer,
              _actions(spec, comm, probed, checkpointer, state),
              Progress(plan, shift=(state or {}).get("shift", 0) if step else 0), plan,
              tuple(probed), probe_time, epoch, spec.device, step)
    compat.build_for_fit(spec.model, run.batches(epoch, step).element_spec)  # one trace
    return run


def _check_adaptive(spec: RunSpec, optimizer, size: int) -> None:
    """What the noise scale's interval and the adaptive batch need (hk.fit's arguments; the
    CLI's flags are checked before TensorFlow)."""
    if spec.gns_every is not None and spec.gns_every < 1:
        raise HetgradError(f"must be >= 1, got {spec.gns_every}", field="gns_every")
    replans = "adaptive_batch" if spec.adaptive_batch else (
        "rebalance" if spec.rebalance_threshold is not None else None)
    if replans and isinstance(aggregation_of(optimizer).weight, FixedWeight):
        raise HetgradError("a fixed weight (the plain average, or a float) cannot follow a new "
                           "plan: weigh by 'plan' or 'samples'", field=replans)
    if not spec.adaptive_batch:
        return
    if spec.sparsify is not None:
        raise HetgradError("the adaptive batch is not built with sparsification yet",
                           field="adaptive_batch")
    if compat.has_schedule(optimizer):
        raise HetgradError("the adaptive batch scales the learning rate: give the optimizer a "
                           "number, not a schedule (a LearningRateScheduler callback works)",
                           field="adaptive_batch")
    if size < 2:
        raise HetgradError("the adaptive batch needs 2 or more ranks (the noise scale compares "
                           "their gradients)", field="adaptive_batch")


def _position(state: dict | None, plan: Plan) -> tuple[int, int]:
    """Epochs done and steps done of the next, where a resumed run goes on. A checkpoint of
    another world size saved in an epoch's final step that this one's plan drops (its tail
    has fewer samples than ranks) goes on at the next epoch."""
    if state is None:
        return 0, 0
    epoch, step = state["epoch"], state.get("step", 0)
    return (epoch + 1, 0) if step >= plan.steps_per_epoch else (epoch, step)


def _resumed(spec: RunSpec, comm) -> dict | None:
    """The checkpoint state to continue from, as rank 0 reads it (every rank resumes the same
    epoch even while rank 0's last save is still landing on a shared file system), checked
    against ``spec`` on every rank; None when there is nothing saved yet."""
    if not spec.resume:
        return None
    if not spec.checkpoint_dir:
        raise HetgradError("resume needs the checkpoint_dir to continue from", field="resume")
    found = None
    if comm.rank == 0:
        directory = Path(spec.checkpoint_dir)
        try:
            found = (checked_state(directory)[0] if (directory / "state.json").is_file()
                     else None, None)
        except HetgradError as exc:   # sent to every rank, so none waits in the broadcast
            found = (None, (type(exc), exc.message, exc.field))
    state, error = comm.bcast(found, root=0)
    if error:
        kind, message, field = error
        raise kind(message, field=field)
    if state is not None:
        check_resumed(state, spec.checkpoint_dir, spec.identity, global_batch=spec.global_batch,
                      n_train=len(spec.data), epochs=spec.epochs,
                      batch_range=spec.adaptive_batch)
    return state


def _probe(spec: RunSpec, comm, state: dict | None) -> list[ProbeResult]:
    """Every rank's step model: the checkpoint's, a saved probe's, or timed now (where the
    plan needs it, or always with ``spec.probe.always``); none otherwise."""
    if state is not None:
        return [ProbeResult(**d) for d in state["probe"]]
    p = spec.probe
    if p.results:
        return list(p.results)
    if not (p.always or _planned_by_probe(spec)):
        return []
    cap = spec.max_batch[comm.rank] if isinstance(spec.max_batch, (list, tuple)) \
        else spec.max_batch
    widest = spec.global_batch   # the models must hold the batches a rank may get: with an
    if spec.adaptive_batch:      # adaptive batch, up to twice an equal share of its top
        widest = max(widest, min(spec.adaptive_batch[1], 2 * spec.adaptive_batch[1] // comm.size))
    widest = min(widest, len(spec.data))
    top = min(p.top or widest, cap or widest)
    emulation = Emulation.of(*spec.emulation, comm.rank) if spec.emulation else None
    results = probe_model(spec.model, spec.data, global_batch=spec.global_batch,
                          batches=probe_batches(top, spec.global_batch, comm.size, p.sizes),
                          max_batch=cap, min_batch=spec.min_batch, steps=p.steps,
                          warmup=p.warmup, refine=p.refine if _planned_by_probe(spec) else 0,
                          timeout=p.timeout, device=spec.device, verbose=p.verbose,
                          before_step=emulation.emulator.pause if emulation else None)
    return [replace(r, emulation=p.tag) for r in results]


def _planned_by_probe(spec: RunSpec) -> bool:
    return spec.plan is None and spec.speeds is None


def _plan(spec: RunSpec, size: int, probed: list[ProbeResult]) -> Plan:
    """The given plan (checked against this job), else the partitioner on the given speeds or
    the probed models."""
    if spec.plan is not None:
        check_plan(spec.plan, size, len(spec.data), spec.global_batch)
        return spec.plan
    speeds = spec.speeds if spec.speeds is not None else probed
    return make_plan(speeds, spec.global_batch, len(spec.data), min_batch=spec.min_batch,
                     max_batch=spec.max_batch, drop_remainder=spec.drop_remainder)


def _hetgrad_optimizer(spec: RunSpec, plan: Plan, rank: int, size: int):
    """The model compiled again with hetgrad's optimizer around its own (kept if it is
    hetgrad's already, a loss scale put inside it); returns that optimizer."""
    model = spec.model
    hetgrad_outermost(model)
    opt = model.optimizer
    if getattr(opt, "hetgrad", None) is not None:
        if spec.sparsify is not None:
            raise HetgradError("the model's optimizer is already hetgrad's: give it sparsify= "
                               "there", field="sparsify")
        start_plan(opt, plan)
    else:
        weight = 1.0 / size if spec.weight == "average" else spec.weight
        opt = DistributedOptimizer(opt, weight=weight, plan=plan, rank=rank,
                                   sparsify=spec.sparsify, check_finite=spec.check_finite)
        compat.recompile(model, opt)
    count_samples(model)    # for weight="samples" and the metric average
    return opt


def _actions(spec: RunSpec, comm, probed: list[ProbeResult], checkpointer,
             state: dict | None) -> tuple:
    """The run's actions, in :data:`ACTION_ORDER` (``state``: the resumed checkpoint's)."""
    verbose = spec.verbose > 0
    rebalancer = Rebalancer(comm, models=[p.model() for p in probed]
                            if _planned_by_probe(spec) and probed else None,
                            threshold=spec.rebalance_threshold, min_batch=spec.min_batch,
                            max_batch=spec.max_batch, drop_remainder=spec.drop_remainder)
    made = {
        Emulation: Emulation.of(*spec.emulation, comm.rank) if spec.emulation else None,
        Watchdog: Watchdog(spec.step_timeout) if spec.step_timeout else None,
        Sparse: Sparse() if spec.sparsify is not None or _sparse(spec.model) else None,
        Balance: Balance(rebalancer, verbose),
        UserCallbacks: UserCallbacks(on_this_rank(spec.callbacks, comm.rank), spec.epochs)
        if spec.callbacks else None,
        Evaluation: Evaluation(spec.test, verbose) if spec.test is not None else None,
        Checkpointing: Checkpointing(checkpointer),
        Noise: Noise() if spec.gns or spec.adaptive_batch else None,
        AdaptiveBatch: AdaptiveBatch(BatchChooser(*spec.adaptive_batch, spec.global_batch),
                                     rebalancer, spec.lr_rule, spec.verbose,
                                     (state or {}).get("adaptive"),
                                     then_every=None if spec.gns_every else GNS_EVERY)
        if spec.adaptive_batch else None,
        Scalars: Scalars(spec.tensorboard, rebalancer) if spec.tensorboard else None,
        Timeline: Timeline(spec.timeline, Sampler(spec.timeline_steps, spec.timeline_window),
                           rebalancer, checkpointer) if spec.timeline else None,
    }
    return tuple(made[kind] for kind in ACTION_ORDER if made[kind] is not None)


def _sparse(model) -> bool:
    """Whether the model's (hetgrad) optimizer exchanges sparsely."""
    reducer = getattr(getattr(model.optimizer, "hetgrad", None), "reducer", None)
    return reducer is not None and hasattr(reducer, "set_density")
