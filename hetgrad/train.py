"""``hetgrad train``: probe -> plan -> model.fit with the chosen aggregation -> JSON record."""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import data as data_mod
from .errors import HetgradError
from .partition import Plan, equal_plan, make_plan

MODES = ("weighted", "uneven-avg", "equal")


@dataclass
class TrainConfig:
    data: str = "digits"
    model: str = "mlp"
    mode: str = "weighted"
    weighting: str = "samples"          # weighted mode: "samples" (exact) or "plan" (b_i/B)
    global_batch: int = 96
    epochs: int = 10
    lr: float = 0.05
    optimizer: str = "sgd"
    seed: int = 0
    speeds: list[float] | None = None   # skip the probe and plan for these speeds
    plan: str | None = None             # or load a saved plan
    emulate_speeds: str | None = None   # e.g. "1,2,4" or "1,2,4;3:1,0.5,4"
    emulate_unit: float = 1e-3          # seconds of sleep per sample at speed 1
    probe_batch: int = 128
    probe_steps: int = 8
    min_batch: int = 1
    max_batch: list[int] | None = None
    threads: int = 1
    device: str = "cpu"
    out: str = "run.json"
    verbose: bool = True
    extra: dict = field(default_factory=dict)

    def check(self) -> None:
        if self.mode not in MODES:
            raise HetgradError(f"unknown mode {self.mode!r}; choose from {MODES}", flag="--mode")
        if self.weighting not in ("samples", "plan"):
            raise HetgradError(f"unknown weighting {self.weighting!r}", flag="--weighting")
        if self.epochs < 1:
            raise HetgradError(f"must be >= 1, got {self.epochs}", flag="--epochs")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise HetgradError(f"must be a positive number, got {self.lr}", flag="--lr")
        if self.optimizer not in ("sgd", "adam"):
            raise HetgradError(f"unknown optimizer {self.optimizer!r}; use sgd or adam",
                               flag="--optimizer")
        if self.threads < 1:
            raise HetgradError(f"must be >= 1, got {self.threads}", flag="--threads")
        if self.emulate_unit <= 0:
            raise HetgradError("must be > 0", flag="--emulate-unit")
        out_dir = Path(self.out).resolve().parent
        if not out_dir.is_dir():
            raise HetgradError(f"directory {out_dir} does not exist", flag="--out")


def _base_optimizer(cfg: TrainConfig):
    import tensorflow as tf
    if cfg.optimizer == "adam":
        return tf.keras.optimizers.Adam(cfg.lr)
    return tf.keras.optimizers.SGD(cfg.lr, momentum=0.9)


def choose_plan(cfg: TrainConfig, size: int, n_train: int, probed: list | None) -> Plan:
    """The plan file if given, else equal batches (mode equal), else speeds -> partitioner."""
    if cfg.plan:
        plan = Plan.load(cfg.plan, world_size=size)
        if plan.dataset_size != n_train:
            raise HetgradError(f"plan file {cfg.plan} is for {plan.dataset_size} samples, the "
                               f"data has {n_train}", flag="--plan")
        return plan
    if cfg.mode == "equal":
        if cfg.global_batch % size:
            raise HetgradError(f"mode equal needs a global batch divisible by {size} ranks",
                               flag="--global-batch")
        return equal_plan(size, cfg.global_batch, n_train)
    if cfg.speeds is not None:
        if len(cfg.speeds) != size:
            raise HetgradError(f"{len(cfg.speeds)} speeds for {size} ranks", flag="--speeds")
        speeds = cfg.speeds
    else:
        speeds = [r.samples_per_s for r in probed]
    return make_plan(speeds, cfg.global_batch, n_train, min_batch=cfg.min_batch,
                     max_batch=cfg.max_batch)


def _callbacks(cfg, plan, rank, size, model, ds_test, emulator, schedule, epochs_log):
    import tensorflow as tf
    import horovod.tensorflow.keras as hvd_keras
    from .keras import WeightedMetricAverageCallback
    from .emulate import speed_at

    class Epochs(tf.keras.callbacks.Callback):
        """Speed schedule at epoch start, wall time at epoch end (before rank 0's eval)."""

        def on_epoch_begin(self, epoch, logs=None):
            if emulator is not None:
                emulator.set_speed(speed_at(schedule, epoch, rank))
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            logs["time_s"] = time.perf_counter() - self.t0

    class Evaluate(tf.keras.callbacks.Callback):
        """Rank 0 scores the full test set; the record keeps every epoch; progress lines."""

        def on_epoch_end(self, epoch, logs=None):
            row = {"epoch": epoch + 1, **{k: float(v) for k, v in logs.items()}}
            if rank == 0:
                t0 = time.perf_counter()
                test_loss, test_acc = model.evaluate(ds_test, verbose=0)
                row.update(test_loss=float(test_loss), test_accuracy=float(test_acc),
                           eval_time_s=time.perf_counter() - t0,
                           samples_per_s=plan.dataset_size - plan.dropped)
                row["samples_per_s"] /= row["time_s"]
                if cfg.verbose:
                    print(f"epoch {epoch + 1:3d}/{cfg.epochs}  loss {row['loss']:.4f}  "
                          f"acc {row['accuracy']:.4f}  test_acc {test_acc:.4f}  "
                          f"{row['time_s']:.2f}s  {row['samples_per_s']:.0f} samples/s",
                          flush=True)
            epochs_log.append(row)

    last = plan.last_batches()[rank]
    steps = plan.steps_per_epoch
    emulate = [emulator.callback(lambda i: last if i == steps - 1 else plan.batches[rank])
               ] if emulator is not None else []
    return [hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0), Epochs(), *emulate,
            WeightedMetricAverageCallback(plan.shard_sizes[rank]), Evaluate()]


def train(cfg: TrainConfig) -> dict:
    """Run one training job on the current MPI world; rank 0 writes and returns the record."""
    from .runtime import configure_tf, init
    cfg.check()
    comm = init()
    import horovod.tensorflow as hvd
    import horovod.tensorflow.keras as hvd_keras
    import tensorflow as tf
    from . import models, probe
    from .emulate import SpeedEmulator, parse_schedule
    from .keras import DistributedOptimizer, count_samples

    rank, size = hvd.rank(), hvd.size()
    device = configure_tf(cfg.threads, cfg.device)
    ds = data_mod.load(cfg.data).shuffled(cfg.seed)
    n_train = len(ds.y_train)
    schedule = parse_schedule(cfg.emulate_speeds, size) if cfg.emulate_speeds else None

    def build():
        return models.build(cfg.model, ds.input_shape, ds.num_classes, seed=cfg.seed)

    emulator = SpeedEmulator(schedule[0][rank], cfg.emulate_unit) if schedule else None

    t_probe = time.perf_counter()
    with tf.device(device):
        probed = probe.run_probe(comm, build, ds.input_shape, ds.num_classes, device=device,
                                 batch=cfg.probe_batch, steps=cfg.probe_steps,
                                 before_step=emulator.pause if emulator else None)
    t_probe = time.perf_counter() - t_probe
    plan = choose_plan(cfg, size, n_train, probed)
    if rank == 0 and cfg.verbose:
        print(f"hetgrad: {size} ranks, mode {cfg.mode}, probe samples/s "
              f"{[round(p.samples_per_s) for p in probed]}", flush=True)
        print(f"hetgrad: plan batches {plan.batches} (B={plan.global_batch}), shards "
              f"{plan.shard_sizes}, {plan.steps_per_epoch} steps/epoch"
              + (f", {plan.dropped} samples dropped" if plan.dropped else ""), flush=True)

    lo, n = plan.shard_starts[rank], plan.shard_sizes[rank]
    local = tf.data.Dataset.from_tensor_slices((ds.x_train[lo:lo + n], ds.y_train[lo:lo + n]))
    local = (local.shuffle(n, seed=cfg.seed + rank, reshuffle_each_iteration=True)
             .batch(plan.batches[rank]).repeat().prefetch(2))
    test = tf.data.Dataset.from_tensor_slices((ds.x_test, ds.y_test)).batch(512)

    with tf.device(device):
        model = build()
        if cfg.mode == "weighted":
            weight = "samples" if cfg.weighting == "samples" else plan.weights()[rank]
            opt = DistributedOptimizer(_base_optimizer(cfg), weight=weight)
        else:  # Horovod's own averaging: the baseline
            opt = hvd_keras.DistributedOptimizer(_base_optimizer(cfg), op=hvd.Average)
        model.compile(optimizer=opt, metrics=["accuracy"],
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        if cfg.mode == "weighted" and cfg.weighting == "samples":
            count_samples(model)
        epochs_log: list[dict] = []
        t0 = time.perf_counter()
        model.fit(local, epochs=cfg.epochs, steps_per_epoch=plan.steps_per_epoch, verbose=0,
                  callbacks=_callbacks(cfg, plan, rank, size, model, test, emulator, schedule,
                                       epochs_log))
        wall = time.perf_counter() - t0

    epoch_times = comm.gather([row["time_s"] for row in epochs_log], root=0)
    if rank != 0:
        return {}
    ideal = sum(p.samples_per_s for p in probed)
    train_times = [row["time_s"] for row in epochs_log]
    achieved = (plan.dataset_size - plan.dropped) / float(np.median(train_times))
    record = {
        "config": asdict(cfg), "world_size": size, "device": device,
        "plan": plan.to_dict(), "probe": [asdict(p) for p in probed], "probe_time_s": t_probe,
        "epochs": epochs_log, "wall_time_s": wall,
        "final_test_accuracy": epochs_log[-1]["test_accuracy"],
        "best_test_accuracy": max(r["test_accuracy"] for r in epochs_log),
        "median_epoch_time_s": float(np.median(train_times)),
        "samples_per_s": achieved, "ideal_samples_per_s": ideal,
        "throughput_efficiency": achieved / ideal,
        "per_rank_epoch_times_s": epoch_times,
    }
    write_json(record, cfg.out)
    if cfg.verbose:
        print(f"hetgrad: final test accuracy {record['final_test_accuracy']:.4f}, "
              f"{achieved:.0f} samples/s ({100 * record['throughput_efficiency']:.0f}% of the "
              f"probed ideal), record -> {cfg.out}", flush=True)
    return record


def write_json(obj, path: str | os.PathLike) -> None:
    """Atomic write: a reader never sees half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)
