"""``hetgrad train`` and ``hetgrad probe`` as a front end: the command's settings
(:class:`~hetgrad.config.TrainConfig`, checked by :mod:`hetgrad.validate` before TensorFlow
loads) become a :class:`~hetgrad.run.RunSpec` -- the model built from ``--model`` and compiled
with ``--optimizer`` and ``--loss`` as a user would -- which :func:`hetgrad.assembly.assemble`
puts together like ``hk.fit``'s; :func:`hetgrad.loop.run_epochs` trains it, and rank 0 writes
the JSON record (:func:`finish`)."""
from __future__ import annotations

import math
import sys
from dataclasses import asdict, replace

import tensorflow as tf

from . import models, placement, preempt, probe
from ._keras.probing import probe as probe_model
from .actions import Balance
from .assembly import assemble
from .compat import keras
from .config import TrainConfig
from .emulate import parse_schedule
from .loop import run_epochs
from .observe import Timeline
from .planning import choose_plan, probe_sizes
from .record import build_record, save_record, sparse_bytes
from .run import ProbeSpec, Run, RunSpec
from .runtime import agree, configure_tf, init, still_heap
from .targets import kind_of, metric
from .validate import Checked, check_model, checked_train, job_identity, lr_rule_in_effect
from .watchdog import stall_check


def train(cfg: TrainConfig | Checked | None = None, **settings) -> dict:
    """Run one training job on the current MPI world (``cfg``, already checked or not, or
    ``TrainConfig(**settings)``); rank 0 writes and returns the record."""
    cfg = cfg if cfg is not None else TrainConfig(**settings)
    checked = cfg if isinstance(cfg, Checked) else checked_train(cfg)
    with preempt.listening():   # a stop request during start-up waits for epoch 1's end
        spec = spec_of(checked)
        with still_heap():   # (the model built: frozen too)
            run = assemble(spec)
            _announce(run, checked.cfg)
            wall = run_epochs(run)
    return finish(checked.cfg, run, wall)


def spec_of(checked: Checked) -> RunSpec:
    """The run ``hetgrad train``'s settings ask for: Horovod started, TF configured, the model
    checked, built and compiled on every rank."""
    cfg, data = checked.cfg, checked.data
    stall_check(cfg.step_timeout)
    comm, device = _started(cfg)
    n = len(data.train)
    sparsify = cfg.sparsify and cfg.sparse_settings(max(4096, math.ceil(n / cfg.global_batch)))
    return RunSpec(
        model=compiled_model(cfg, data, device), data=data.train,
        global_batch=cfg.global_batch, epochs=cfg.epochs, seed=cfg.seed,
        plan=choose_plan(cfg, comm.size, n, None) if cfg.plan or cfg.mode == "equal" else None,
        speeds=cfg.speeds, probe=probe_spec(cfg, comm.size), min_batch=cfg.min_batch,
        max_batch=cfg.max_batch, drop_remainder=cfg.drop_remainder,
        weight=cfg.weighting if cfg.mode == "weighted" else "average", sparsify=sparsify,
        check_finite=cfg.mode == "weighted" and cfg.on_nonfinite == "abort",
        rebalance_threshold=cfg.rebalance_threshold if cfg.rebalance else None,
        checkpoint_dir=cfg.checkpoint_dir or cfg.resume, checkpoint_every=cfg.checkpoint_every,
        resume=bool(cfg.resume), identity=job_identity(cfg), emulation=emulation_of(cfg, comm),
        test=data.test, verbose=0 if cfg.quiet else 2, step_timeout=cfg.step_timeout,
        device=device, tensorboard=cfg.tensorboard, timeline=cfg.timeline,
        timeline_steps=cfg.timeline_steps, timeline_window=cfg.timeline_window, gns=cfg.gns,
        gns_every=cfg.gns_every, adaptive_batch=tuple(cfg.batch_range or cfg.default_range())
        if cfg.adaptive_batch else None, lr_rule=lr_rule_in_effect(cfg))


def _started(cfg: TrainConfig):
    """Horovod's world, TF's threads and device (before any collective: Gloo's are TF ops),
    and the model's settings checked on every rank."""
    comm = init()
    device = agree(comm, lambda: configure_tf(cfg.threads, cfg.device))
    agree(comm, lambda: check_model(cfg))
    return comm, device


def probe_spec(cfg: TrainConfig, size: int) -> ProbeSpec:
    """The probe of ``--probe-*`` (or the saved ``--probe-file``), always run: the record
    judges the run's throughput against it."""
    results = tuple(probe.load(cfg.probe_file, world_size=size)) if cfg.probe_file else ()
    return ProbeSpec(steps=cfg.probe_steps, sizes=cfg.probe_sizes, top=cfg.probe_batch,
                     refine=cfg.probe_refine, timeout=cfg.probe_timeout, results=results,
                     always=True, tag=cfg.emulation_spec(), verbose=not cfg.quiet)


def emulation_of(cfg: TrainConfig, comm) -> tuple | None:
    """``--emulate-speeds``' schedule and seconds per sample (None without it)."""
    if not cfg.emulate_speeds:
        return None
    return parse_schedule(cfg.emulate_speeds, comm.size), cfg.emulate_unit


def compiled_model(cfg: TrainConfig, data, device: str = "/CPU:0"):
    """``--model`` for the data's shape and classes (one logit per class unless ``--loss``),
    compiled with ``--optimizer``, ``--loss`` and accuracy (mean absolute error for a
    regression loss), as a user would compile it."""
    with tf.device(device):
        model = models.build(cfg.model, data.input_shape, data.num_classes, seed=cfg.seed)
        model.compile(optimizer=base_optimizer(cfg), metrics=[metric(kind_of(cfg.loss))],
                      loss=models.loss(cfg.loss, data.num_classes,
                                       logits=cfg.model in models.MODELS),
                      steps_per_execution=cfg.steps_per_execution)
    return model


def base_optimizer(cfg: TrainConfig):
    """Adam, or SGD with momentum 0.9 (kept in the sparse memory with momentum correction)."""
    if cfg.optimizer == "adam":
        return keras.optimizers.Adam(cfg.lr)
    return keras.optimizers.SGD(cfg.lr, momentum=0.0 if cfg.momentum_correction else 0.9)


def probe_ranks(checked: Checked) -> list[probe.ProbeResult]:
    """``hetgrad probe``: every rank's step model of the model ``hetgrad train`` would train,
    timed on the data's real samples (every rank returns all ranks')."""
    cfg, data = checked.cfg, checked.data
    comm, device = _started(cfg)
    emulation = emulation_of(cfg, comm)
    from .actions import Emulation
    pause = Emulation.of(*emulation, comm.rank).emulator.pause if emulation else None
    with tf.device(device):
        results = probe_model(compiled_model(cfg, data, device), data.train,
                              global_batch=cfg.global_batch,
                              batches=probe_sizes(cfg, comm.rank, comm.size), steps=cfg.probe_steps,
                              timeout=cfg.probe_timeout, device=device, before_step=pause,
                              verbose=not cfg.quiet)
    return [replace(r, emulation=cfg.emulation_spec()) for r in results]


def finish(cfg: TrainConfig, run: Run, wall_time_s: float) -> dict:
    """Gather every rank's epoch times (and sparse bytes); rank 0 builds the record, writes
    ``--out`` and returns it, the other ranks return ``{}``."""
    progress, comm = run.progress, run.comm
    sparse = cfg.sparsify is not None
    times = comm.gather([row["time_s"] for row in progress.epochs], root=0)
    nbytes = comm.gather(sparse_bytes(progress.sparse_steps) if sparse else None, root=0)
    ranks = comm.gather(placement.here(run.device), root=0)
    if run.rank != 0:
        return {}
    balance = next(a.rebalancer.records() for a in run.actions if isinstance(a, Balance))
    timeline = next((a.summary() for a in run.actions if isinstance(a, Timeline)), None)
    record = build_record(
        config=cfg.to_dict(), world_size=run.size, device=run.device, controller=comm.kind,
        ranks=ranks, probe=[asdict(p) for p in run.probe], probe_time_s=run.probe_time_s,
        first_plan=run.first_plan, final_plan=run.plan, epochs=progress.epochs,
        wall_time_s=wall_time_s, per_rank_epoch_times_s=times, balance=balance,
        sparse_steps=progress.sparse_steps if sparse else None,
        sparse_bytes_per_rank=nbytes if sparse else None, timeline=timeline)
    where = save_record(record, cfg.out, [cfg.checkpoint_dir or cfg.resume])
    if not cfg.quiet:
        score = next(k for k in record if k.startswith("final_test_"))
        print(f"hetgrad: {score.replace('_', ' ')} {record[score]:.4f}, "
              f"{record['samples_per_s']:.0f} samples/s "
              f"({100 * record['throughput_efficiency']:.0f}% of the probed ideal), "
              f"record -> {where}", flush=True)
    return record


def _announce(run: Run, cfg: TrainConfig) -> None:
    if run.rank != 0 or cfg.quiet:
        return
    plan = run.plan
    print(f"hetgrad: {run.size} ranks, mode {cfg.mode}, probe samples/s "
          f"{[round(p.samples_per_s) for p in run.probe]}", flush=True)
    print(f"hetgrad: plan batches {plan.batches} (B={plan.global_batch}), "
          f"{plan.steps_per_epoch} steps/epoch of the global order"
          + (f", {plan.dropped} samples of each epoch's tail left out" if plan.dropped else ""),
          flush=True)
    if warning := plan.thin_tail():
        print(f"hetgrad: warning: {warning}", file=sys.stderr, flush=True)
