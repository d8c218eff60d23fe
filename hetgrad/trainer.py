"""``hetgrad train`` as phases: :func:`build_job` (runtime, data, probe, plan, model and
optimizer, checkpoint restore), :func:`hetgrad.loop.run_epochs` (``model.fit`` per epoch with
:mod:`hetgrad.actions` around it) and :func:`finish` (the record, via
:func:`hetgrad.record.build_record`). Dense and sparse runs take the same path; they differ
only in the optimizer's reducer."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import tensorflow as tf

from . import data as data_mod, models, placement, preempt, probe
from .actions import Action, Balance, Checkpointing, Emulation, Evaluation, Sparse, Watchdog
from .checkpoint import Checkpointer
from .compat import keras
from .config import TrainConfig
from .emulate import parse_schedule
from ._keras.counting import count_samples
from ._keras.optimizer import DistributedOptimizer
from .loop import run_epochs
from .partition import Plan
from .planning import choose_plan, planner, probe_sizes
from .rebalance import Rebalancer
from .record import build_record, save_record, sparse_bytes
from .run import Run
from .runtime import agree, configure_tf, init
from .sparse.reducer import SparseReducer
from .validate import Checked, check_model, checked_train, job_identity
from .watchdog import stall_check


@dataclass
class Job(Run):
    """Everything one ``hetgrad train`` run holds; actions read it and may replace ``plan``."""

    cfg: TrainConfig
    comm: Any
    device: str
    data: data_mod.Dataset
    probe: list[probe.ProbeResult]
    probe_time_s: float
    plan: Plan
    state: dict | None = None          # the checkpoint state resumed from
    emulation: Emulation | None = None
    model: Any = None
    optimizer: Any = None
    checkpointer: Checkpointer | None = None
    train_xy: tuple | None = None
    epochs: list[dict] = field(default_factory=list)
    sparse_steps: list[dict] = field(default_factory=list)

    def __post_init__(self):
        self.first_plan = self.plan
        self.start_epoch = self.state["epoch"] if self.state else 0

    seed = property(lambda self: self.cfg.seed)           # what the loop reads, from cfg
    num_epochs = property(lambda self: self.cfg.epochs)


def build_job(checked: Checked) -> Job:
    """From settings that passed the checks (:func:`hetgrad.validate.checked_train`): start
    Horovod, check the model, probe (or reuse a probe), plan, build and compile the model,
    restore a checkpoint when resuming."""
    cfg, state = checked.cfg, checked.state
    stall_check(cfg.step_timeout)
    comm = init()   # TF threads are set before any collective (Gloo's are TF ops)
    device = agree(comm, lambda: configure_tf(cfg.threads, cfg.device))
    agree(comm, lambda: check_model(cfg))
    data = checked.data.shuffled(cfg.seed)
    emulation = emulation_of(cfg, comm)
    t0 = time.perf_counter()
    probed = measure_ranks(cfg, comm, data, device, state, emulation)
    probe_time = time.perf_counter() - t0
    plan = Plan(**state["plan"]) if state else choose_plan(cfg, comm.size,
                                                           len(data.y_train), probed)
    job = Job(cfg, comm, device, data, probed, probe_time, plan, state, emulation)
    with tf.device("/CPU:0"):  # captured by every epoch's input pipeline, not copied into it
        job.train_xy = (tf.constant(data.x_train), tf.constant(data.y_train))
    with tf.device(device):
        job.model, job.optimizer = _compile(job)
    job.checkpointer = Checkpointer(cfg.checkpoint_dir or cfg.resume, job.model, job.optimizer,
                                    job.rank, every=cfg.checkpoint_every,
                                    state={"probe": [asdict(p) for p in probed],
                                           "job": job_identity(cfg)})
    if state:
        job.checkpointer.restore(state)
    return job


def emulation_of(cfg: TrainConfig, comm) -> Emulation | None:
    """The emulated-speed action of ``--emulate-speeds`` (None without it)."""
    if not cfg.emulate_speeds:
        return None
    schedule = parse_schedule(cfg.emulate_speeds, comm.size)
    return Emulation.of(schedule, cfg.emulate_unit, comm.rank)


def measure_ranks(cfg: TrainConfig, comm, data, device: str, state: dict | None = None,
                  emulation: Emulation | None = None) -> list[probe.ProbeResult]:
    """The resumed run's probe (same shards), a saved probe, or a fresh one on every rank."""
    if state:
        return [probe.ProbeResult(**d) for d in state["probe"]]
    if cfg.probe_file:
        return probe.load(cfg.probe_file, world_size=comm.size)
    with tf.device(device):
        results = probe.run_probe(  # (validation allows --probe-refine only where it plans)
            comm, lambda: build_model(cfg, data), data.input_shape, data.num_classes,
            device=device, batches=probe_sizes(cfg, comm.rank, comm.size),
            steps=cfg.probe_steps, timeout=cfg.probe_timeout,
            before_step=emulation.emulator.pause if emulation else None,
            planner=planner(cfg.global_batch, cfg.min_batch, cfg.max_batch),
            rounds=cfg.probe_refine, loss=models.loss(cfg.loss), verbose=not cfg.quiet)
    return [replace(r, emulation=cfg.emulation_spec()) for r in results]


def build_model(cfg: TrainConfig, data: data_mod.Dataset, seed: int = 0):
    """``--model`` for the data's shape and classes (one logit per class unless ``--loss``)."""
    return models.build(cfg.model, data.input_shape, data.num_classes, seed=seed,
                        logits=cfg.loss is None)


def base_optimizer(cfg: TrainConfig):
    """Adam, or SGD with momentum 0.9 (kept in the sparse memory with momentum correction)."""
    if cfg.optimizer == "adam":
        return keras.optimizers.Adam(cfg.lr)
    return keras.optimizers.SGD(cfg.lr, momentum=0.0 if cfg.momentum_correction else 0.9)


def baseline_optimizer(optimizer, size: int):
    """Horovod's plain average of the ranks' gradients, as hetgrad's optimizer with the equal
    share ``1 / size`` (the same sum as Horovod's ``op=Average``: tests/test_horovod_parity.py),
    so the baselines are timed by the same busy/wait timers as the weighted mode."""
    return DistributedOptimizer(optimizer, weight=1.0 / size, check_finite=False)


def _compile(job: Job):
    """The model and its optimizer: hetgrad's (dense or sparse reducer) or Horovod's average
    for the baselines."""
    cfg = job.cfg
    model = build_model(cfg, job.data, seed=cfg.seed)
    if cfg.mode != "weighted":
        opt = baseline_optimizer(base_optimizer(cfg), job.size)
    else:
        sparsify = cfg.sparsify and cfg.sparse_settings(max(4096, job.plan.steps_per_epoch))
        opt = DistributedOptimizer(base_optimizer(cfg), weight=cfg.weighting, plan=job.plan,
                                   rank=job.rank, sparsify=sparsify,
                                   check_finite=cfg.on_nonfinite == "abort")
    model.compile(optimizer=opt, metrics=["accuracy"], loss=models.loss(cfg.loss),
                  steps_per_execution=cfg.steps_per_execution)
    if cfg.mode == "weighted" and cfg.weighting == "samples":
        count_samples(model)
    return model, opt


def default_actions(job: Job) -> list[Action]:
    """Emulation (if asked), evaluation, balance measurement/rebalancing, sparse statistics,
    checkpoints -- in the order they must see each epoch's end."""
    cfg, verbose = job.cfg, not job.cfg.quiet
    actions: list[Action] = [job.emulation] if job.emulation else []
    test = tf.data.Dataset.from_tensor_slices((job.data.x_test, job.data.y_test)).batch(512)
    actions.append(Evaluation(test, verbose))
    if job.aggregation is not None:  # measures every epoch; re-plans only with --rebalance
        probed = [p.model() for p in job.probe] if cfg.planned_by_probe else None
        rebalancer = Rebalancer(job.comm, models=probed, min_batch=cfg.min_batch,
                                threshold=cfg.rebalance_threshold if cfg.rebalance else None,
                                max_batch=cfg.max_batch)
        actions.append(Balance(rebalancer, verbose))
    if isinstance(job.reducer, SparseReducer):
        actions.append(Sparse(job.reducer))
    actions.append(Checkpointing(job.checkpointer))
    actions.append(Watchdog(cfg.step_timeout))
    return actions


def finish(job: Job, wall_time_s: float, balance: list[dict]) -> dict:
    """Gather every rank's epoch times (and sparse bytes); rank 0 builds the record, writes
    ``cfg.out`` and returns it, the other ranks return ``{}``."""
    times = job.comm.gather([row["time_s"] for row in job.epochs], root=0)
    sparse = isinstance(job.reducer, SparseReducer)
    nbytes = job.comm.gather(sparse_bytes(job.sparse_steps) if sparse else None, root=0)
    ranks = job.comm.gather(placement.here(job.device), root=0)
    if job.rank != 0:
        return {}
    record = build_record(
        config=job.cfg.to_dict(), world_size=job.size, device=job.device,
        controller=job.comm.kind, ranks=ranks,
        probe=[asdict(p) for p in job.probe], probe_time_s=job.probe_time_s,
        first_plan=job.first_plan, final_plan=job.plan, epochs=job.epochs,
        wall_time_s=wall_time_s, per_rank_epoch_times_s=times, balance=balance,
        sparse_steps=job.sparse_steps if sparse else None,
        sparse_bytes_per_rank=nbytes if sparse else None)
    where = save_record(record, job.cfg.out, [job.cfg.checkpoint_dir or job.cfg.resume])
    if not job.cfg.quiet:
        print(f"hetgrad: final test accuracy {record['final_test_accuracy']:.4f}, "
              f"{record['samples_per_s']:.0f} samples/s "
              f"({100 * record['throughput_efficiency']:.0f}% of the probed ideal), "
              f"record -> {where}", flush=True)
    return record


def _announce(job: Job) -> None:
    if job.rank != 0 or job.cfg.quiet:
        return
    plan = job.plan
    print(f"hetgrad: {job.size} ranks, mode {job.cfg.mode}, probe samples/s "
          f"{[round(p.samples_per_s) for p in job.probe]}", flush=True)
    print(f"hetgrad: plan batches {plan.batches} (B={plan.global_batch}), shards "
          f"{plan.shard_sizes}, {plan.steps_per_epoch} steps/epoch"
          + (f", {plan.dropped} samples dropped" if plan.dropped else ""), flush=True)


def train(cfg: TrainConfig | Checked | None = None, **settings) -> dict:
    """Run one training job on the current MPI world (``cfg``, already checked or not, or
    ``TrainConfig(**settings)``); rank 0 writes and returns the record."""
    cfg = cfg if cfg is not None else TrainConfig(**settings)
    checked = cfg if isinstance(cfg, Checked) else checked_train(cfg)
    with preempt.listening():   # a stop request during start-up waits for epoch 1's end
        job = build_job(checked)
        _announce(job)
        actions = default_actions(job)
        wall = run_epochs(job, actions)
    balance = next((a.rebalancer.records() for a in actions if isinstance(a, Balance)), [])
    return finish(job, wall, balance)
