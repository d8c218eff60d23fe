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
    weighting: str = "plan"             # weighted mode: "plan" (exact per-step plan weights,
                                        # no extra comm) or "samples" (count allreduce per step)
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
    probe_timeout: float = 300.0
    probe_file: str | None = None       # reuse a saved probe (`hetgrad probe --out`)
    min_batch: int = 1
    max_batch: list[int] | None = None
    sparsify: str | None = None         # topk | recent | sticky | leader (None: dense)
    density: float = 0.01
    exchange: str = "union"             # allgather | union
    dense_below: int = 1024             # tensors smaller than this stay dense
    rebalance: bool = False             # re-plan between epochs from measured busy times
    rebalance_threshold: float = 0.05   # ... when max(busy) / mean(busy) - 1 exceeds this
    on_nonfinite: str = "abort"         # NaN/Inf in a local gradient: abort | ignore
    checkpoint_dir: str | None = None   # rank 0 saves model+optimizer+epoch+plan here
    checkpoint_every: int = 1           # epochs between checkpoints
    resume: str | None = None           # a checkpoint dir to continue from
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
        if self.rebalance and self.mode != "weighted":
            raise HetgradError("rebalancing needs --mode weighted (the baselines keep their "
                               "batches)", flag="--rebalance")
        if not (math.isfinite(self.rebalance_threshold) and self.rebalance_threshold >= 0):
            raise HetgradError(f"must be a number >= 0, got {self.rebalance_threshold}",
                               flag="--rebalance-threshold")
        if self.on_nonfinite not in ("abort", "ignore"):
            raise HetgradError(f"unknown choice {self.on_nonfinite!r}; use abort or ignore",
                               flag="--on-nonfinite")
        if self.checkpoint_every < 1:
            raise HetgradError(f"must be >= 1, got {self.checkpoint_every}",
                               flag="--checkpoint-every")
        if self.resume and not (Path(self.resume) / "state.json").is_file():
            raise HetgradError(f"no checkpoint in {self.resume} (state.json missing)",
                               flag="--resume")
        if self.sparsify is not None and self.mode != "weighted":
            raise HetgradError("sparsification runs with --mode weighted only", flag="--sparsify")
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


def _callbacks(cfg, plan, rank, model, ds_test, emulator, schedule, timer, epochs_log):
    """Keras callbacks of one epoch: speed schedule + timer start, metrics over all ranks,
    rank 0's evaluation and progress line."""
    import tensorflow as tf
    from .keras import WeightedMetricAverageCallback
    from .emulate import speed_at

    class Epochs(tf.keras.callbacks.Callback):
        """Speed schedule at epoch start, wall time at epoch end (before rank 0's eval)."""

        def on_epoch_begin(self, epoch, logs=None):
            if emulator is not None:
                emulator.set_speed(speed_at(schedule, epoch, rank))
            if timer is not None:
                timer.start()
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
                           samples_per_s=(plan.dataset_size - plan.dropped) / row["time_s"],
                           batches=list(plan.batches))
                if cfg.verbose:
                    print(f"epoch {epoch + 1:3d}/{cfg.epochs}  loss {row['loss']:.4f}  "
                          f"acc {row['accuracy']:.4f}  test_acc {test_acc:.4f}  "
                          f"{row['time_s']:.2f}s  {row['samples_per_s']:.0f} samples/s",
                          flush=True)
            epochs_log.append(row)

    emulate = [emulator.callback(lambda i: _batch_size(plan, rank, i))] if emulator else []
    return [*emulate, Epochs(), WeightedMetricAverageCallback(plan.shard_sizes[rank]),
            Evaluate()]


def _batch_size(plan: Plan, rank: int, step: int) -> int:
    """Samples of ``rank`` in ``step`` of an epoch (the last step may be partial)."""
    return plan.last_batches()[rank] if step == plan.steps_per_epoch - 1 else plan.batches[rank]


def _nonfinite(epoch: int) -> HetgradError:
    return HetgradError(f"NaN or Inf in this rank's gradients in epoch {epoch + 1}; lower --lr, "
                        "check the data, or pass --on-nonfinite ignore", flag="--on-nonfinite")


class SparseLoop:
    """Custom loop for ``--sparsify``: local gradient -> sparse weighted exchange (mpi4py) ->
    ``apply_gradients``. Tensors below ``dense_below`` entries are allreduced densely."""

    def __init__(self, cfg, comm, model):
        import tensorflow as tf
        from .sparsify import SparseExchanger
        from .rebalance import WallTimer
        self.cfg, self.comm, self.model = cfg, comm, model
        self.variables = model.trainable_variables
        sizes = [int(np.prod(v.shape)) for v in self.variables]
        self.groups = ([i for i, n in enumerate(sizes) if n >= cfg.dense_below],
                       [i for i, n in enumerate(sizes) if n < cfg.dense_below])
        self.exchanger = SparseExchanger(comm, [sizes[i] for i in self.groups[0]],
                                         policy=cfg.sparsify, density=cfg.density,
                                         exchange=cfg.exchange)
        self.timer = WallTimer()
        self.steps_log: list[dict] = []
        loss_fn, variables = model.compiled_loss, self.variables

        @tf.function
        def local_step(x, y):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = loss_fn(y, logits)
            grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]
            hits = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, -1), tf.cast(y, tf.int64)),
                                          tf.float32))
            return loss, hits, grads

        self.local_step = local_step

    def _flat(self, grads, ids) -> np.ndarray:
        return np.concatenate([grads[i].numpy().ravel() for i in ids]) if ids else np.zeros(0)

    def _unflat(self, flat: np.ndarray, ids, out: list) -> None:
        import tensorflow as tf
        pos = 0
        for i in ids:
            shape = self.variables[i].shape
            n = int(np.prod(shape))
            out[i] = tf.constant(flat[pos:pos + n].reshape(shape))
            pos += n

    def run_epoch(self, epoch: int, batches, emulator, callbacks) -> None:
        from mpi4py import MPI
        sparse_ids, dense_ids = self.groups
        for cb in callbacks:
            cb.on_epoch_begin(epoch)
        seen = loss_sum = acc_sum = 0.0
        for step, (x, y) in enumerate(batches):
            n = int(y.shape[0])
            if emulator is not None:
                emulator.pause(n)
            loss, hits, grads = self.local_step(x, y)
            flat, dense = self._flat(grads, sparse_ids), self._flat(grads, dense_ids)
            if self.cfg.on_nonfinite == "abort" and not (np.isfinite(flat).all()
                                                         and np.isfinite(dense).all()):
                raise _nonfinite(epoch)
            self.timer.ready()
            weight = n / self.comm.allreduce(n, op=MPI.SUM)
            agg, stats = self.exchanger.step(flat, weight)
            dense = np.ascontiguousarray(dense * weight, np.float32)
            if dense_ids:
                self.comm.Allreduce(MPI.IN_PLACE, dense, op=MPI.SUM)
            self.timer.done()
            new: list = [None] * len(self.variables)
            self._unflat(agg, sparse_ids, new)
            self._unflat(dense, dense_ids, new)
            self.model.optimizer.apply_gradients(zip(new, self.variables))
            seen += n
            loss_sum += float(loss) * n
            acc_sum += float(hits) * n
            self.steps_log.append({"epoch": epoch + 1, "step": step, **vars(stats)})
        logs = {"loss": loss_sum / seen, "accuracy": acc_sum / seen}
        for cb in callbacks:
            cb.on_epoch_end(epoch, logs)


def _local_batches(xy, plan: Plan, rank: int, seed: int, epoch: int):
    """This rank's batches for ``epoch`` from the training tensors ``xy``: its shard in an
    order seeded by ``(seed, rank, epoch)``, so a resumed run sees exactly the batches an
    uninterrupted one would (and a new plan after a rebalance takes effect at once)."""
    import tensorflow as tf
    x, y = xy
    lo, n = plan.shard_starts[rank], plan.shard_sizes[rank]
    order = np.random.default_rng([seed, rank, epoch]).permutation(n) + lo
    return (tf.data.Dataset.from_tensor_slices(order)
            .batch(plan.batches[rank])
            .map(lambda idx: (tf.gather(x, idx), tf.gather(y, idx)))
            .prefetch(2))


def train(cfg: TrainConfig) -> dict:
    """Run one training job on the current MPI world; rank 0 writes and returns the record."""
    from .runtime import configure_tf, init
    cfg.check()
    comm = init()
    import horovod.tensorflow as hvd
    import horovod.tensorflow.keras as hvd_keras
    import tensorflow as tf
    from . import checkpoint, models, probe
    from .emulate import SpeedEmulator, parse_schedule
    from .keras import NONFINITE, DistributedOptimizer, count_samples, set_plan
    from .rebalance import Rebalancer

    rank, size = hvd.rank(), hvd.size()
    device = configure_tf(cfg.threads, cfg.device)
    ds = data_mod.load(cfg.data).shuffled(cfg.seed)
    n_train = len(ds.y_train)
    schedule = parse_schedule(cfg.emulate_speeds, size) if cfg.emulate_speeds else None

    def build():
        return models.build(cfg.model, ds.input_shape, ds.num_classes, seed=cfg.seed)

    emulator = SpeedEmulator(schedule[0][rank], cfg.emulate_unit) if schedule else None

    state = checkpoint.read_state(cfg.resume) if cfg.resume else None
    start_epoch = state["epoch"] if state else 0
    if start_epoch >= cfg.epochs:
        raise HetgradError(f"the checkpoint is at epoch {start_epoch}; ask for more epochs",
                           flag="--epochs")
    t_probe = time.perf_counter()
    if state:  # same plan and probe as the interrupted run: the same shards
        probed = [probe.ProbeResult(**d) for d in state["probe"]]
    elif cfg.probe_file:
        probed = probe.load(cfg.probe_file, world_size=size)
    else:
        with tf.device(device):
            probed = probe.run_probe(comm, build, ds.input_shape, ds.num_classes,
                                     device=device, batch=cfg.probe_batch,
                                     steps=cfg.probe_steps,
                                     before_step=emulator.pause if emulator else None,
                                     timeout=cfg.probe_timeout)
    t_probe = time.perf_counter() - t_probe
    plan = Plan(**state["plan"]) if state else choose_plan(cfg, size, n_train, probed)
    first_plan = plan
    if rank == 0 and cfg.verbose:
        print(f"hetgrad: {size} ranks, mode {cfg.mode}, probe samples/s "
              f"{[round(p.samples_per_s) for p in probed]}", flush=True)
        print(f"hetgrad: plan batches {plan.batches} (B={plan.global_batch}), shards "
              f"{plan.shard_sizes}, {plan.steps_per_epoch} steps/epoch"
              + (f", {plan.dropped} samples dropped" if plan.dropped else ""), flush=True)

    test = tf.data.Dataset.from_tensor_slices((ds.x_test, ds.y_test)).batch(512)
    with tf.device("/CPU:0"):  # captured by every epoch's input pipeline, not copied into it
        train_xy = (tf.constant(ds.x_train), tf.constant(ds.y_train))
    with tf.device(device):
        model = build()
        if cfg.sparsify:  # the sparse loop aggregates itself
            opt = _base_optimizer(cfg)
        elif cfg.mode == "weighted":
            opt = DistributedOptimizer(_base_optimizer(cfg), weight=cfg.weighting, plan=plan,
                                       check_finite=cfg.on_nonfinite == "abort")
        else:  # Horovod's own averaging: the baseline
            opt = hvd_keras.DistributedOptimizer(_base_optimizer(cfg), op=hvd.Average)
        model.compile(optimizer=opt, metrics=["accuracy"],
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        if cfg.mode == "weighted" and cfg.weighting == "samples" and not cfg.sparsify:
            count_samples(model)
        sparse = SparseLoop(cfg, comm, model) if cfg.sparsify else None
        timer = sparse.timer if sparse else getattr(opt, "hetgrad_timer", None)
        ckpt = checkpoint.Checkpointer(cfg.checkpoint_dir or cfg.resume, model, opt, rank,
                                       every=cfg.checkpoint_every,
                                       state={"probe": [asdict(p) for p in probed]})
        if state:
            ckpt.restore(state)
            if sparse:
                sparse.exchanger.load_state_dict(ckpt.rank_state(state))
        # measures every epoch (the record's "balance"); re-plans only with --rebalance
        balance = Rebalancer(comm, threshold=cfg.rebalance_threshold if cfg.rebalance else None,
                             min_batch=cfg.min_batch, max_batch=cfg.max_batch)
        broadcast = hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)  # once, 1st step
        if sparse:
            hvd.broadcast_variables(model.variables, root_rank=0)
        epochs_log: list[dict] = []
        t0 = time.perf_counter()
        for epoch in range(start_epoch, cfg.epochs):
            batches = _local_batches(train_xy, plan, rank, cfg.seed, epoch)
            callbacks = _callbacks(cfg, plan, rank, model, test, emulator, schedule, timer,
                                   epochs_log)
            try:
                if sparse:
                    sparse.run_epoch(epoch, batches, emulator, callbacks)
                else:
                    model.fit(batches, epochs=epoch + 1, initial_epoch=epoch,
                              steps_per_epoch=plan.steps_per_epoch, verbose=0,
                              callbacks=[broadcast, *callbacks])
            except tf.errors.InvalidArgumentError as exc:
                if NONFINITE in str(exc):
                    raise _nonfinite(epoch) from None
                raise
            if timer is not None:
                busy, wait = timer.read()
                new = balance.after_epoch(epoch, plan, busy, wait)
                epochs_log[-1].update(busy_s=busy, wait_s=wait)
                if new is not plan:
                    if rank == 0 and cfg.verbose:
                        e = balance.history[-1]
                        print(f"hetgrad: rebalance after epoch {epoch + 1}: busy "
                              f"{[round(b, 2) for b in e.busy_s]} s (imbalance "
                              f"{e.imbalance:.2f} > {cfg.rebalance_threshold}), batches "
                              f"{plan.batches} -> {new.batches}", flush=True)
                    plan = new
                    if not sparse:
                        set_plan(opt, plan)
            last = epoch + 1 == cfg.epochs
            if ckpt.due(epoch + 1, last):
                per_rank = comm.gather(sparse.exchanger.state_dict(), root=0) if sparse else None
                ckpt.save(epoch + 1, per_rank, plan=plan.to_dict())
        ckpt.save_final_weights()
        wall = time.perf_counter() - t0

    epoch_times = comm.gather([row["time_s"] for row in epochs_log], root=0)
    sparse_bytes = comm.gather(None if sparse is None else
                               {"bytes_sent": sum(r["bytes_sent"] for r in sparse.steps_log),
                                "bytes_received": sum(r["bytes_received"]
                                                      for r in sparse.steps_log)},
                               root=0)
    if rank != 0:
        return {}
    ideal = sum(p.samples_per_s for p in probed)
    train_times = [row["time_s"] for row in epochs_log]
    achieved = (plan.dataset_size - plan.dropped) / float(np.median(train_times))
    record = {
        "config": asdict(cfg), "world_size": size, "device": device,
        "plan": first_plan.to_dict(), "final_plan": plan.to_dict(),
        "probe": [asdict(p) for p in probed], "probe_time_s": t_probe,
        "epochs": epochs_log, "wall_time_s": wall,
        "final_test_accuracy": epochs_log[-1]["test_accuracy"],
        "best_test_accuracy": max(r["test_accuracy"] for r in epochs_log),
        "median_epoch_time_s": float(np.median(train_times)),
        "samples_per_s": achieved, "ideal_samples_per_s": ideal,
        "throughput_efficiency": achieved / ideal,
        "per_rank_epoch_times_s": epoch_times,
        "balance": balance.records(),
    }
    if sparse is not None:
        steps = sparse.steps_log
        record["sparse_steps"] = steps
        record["sparse_summary"] = {
            key: float(np.mean([r[key] for r in steps]))
            for key in ("k", "union", "buildup", "bytes_sent", "bytes_received",
                        "aggregator_send_entries")}
        record["sparse_bytes_per_rank"] = sparse_bytes
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
