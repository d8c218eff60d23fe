#!/usr/bin/env python
"""Step time of hetgrad's weighted exchange against Horovod's own ``DistributedOptimizer``
(``op=Average``), for ``plan``, ``samples`` and float weights, with the finite check and
busy/wait timers on (the default) and off, or one of them alone.

Run under MPI with Keras 2 (Horovod's Keras optimizer does not aggregate under Keras 3):

    TF_USE_LEGACY_KERAS=1 mpirun -np 2 --oversubscribe --bind-to none -x TF_USE_LEGACY_KERAS \\
        .venv/bin/python scripts/bench_overhead.py --width 1024 --out results/overhead-1m-2.json

Every arm trains its own copy of the same MLP (``--width``: 1024 -> 1.1M parameters, 3200 ->
10.5M, 5000 -> 25.4M) on the same batch, ``--steps-per-execution`` steps per graph call (no
Python between steps). A round times one block of every arm (a persistent iterator
through the model's train function, no ``fit`` per block), in a random order drawn anew each
round; the first ``--warmup`` rounds are dropped. Per round, each arm's block time is divided
by Horovod's in the same round; the JSON (rank 0) holds every ratio, their median and
inter-quartile range. TF threads as hetgrad sets them (``--threads`` intra-op, at least 2
inter-op); ``--inter-op 1`` shows what one inter-op thread costs.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from bench import results
from bench.schedule import rounds
from bench.tables import markdown

ORDER_SEED = 12345   # the arms' order per round: the same on every rank

WEIGHTS = {"plan": "plan", "samples": "samples", "float": None}


def arms() -> list[str]:
    return ["horovod"] + [f"{w}-{c}" for w in WEIGHTS for c in ("checked", "bare")]


def horovod_keras():
    """``horovod.tensorflow.keras``, the baseline arm's (its optimizer does not allreduce
    under Keras 3: ``TF_USE_LEGACY_KERAS=1``)."""
    from hetgrad import compat
    if compat.KERAS3:
        raise SystemExit(f"bench: horovod.tensorflow.keras does not allreduce under Keras "
                         f"{compat.KERAS_VERSION}: set TF_USE_LEGACY_KERAS=1")
    import horovod.tensorflow.keras as hvd_keras
    return hvd_keras


def build(kind: str, args, plan, hvd, hk, tf):
    """A compiled model whose optimizer is ``kind``'s."""
    from hetgrad import models
    tf.keras.utils.set_random_seed(1)
    model = models.mlp((8, 8, 1), 10, args.width)
    base = (tf.keras.optimizers.Adam(1e-4) if args.optimizer == "adam"
            else tf.keras.optimizers.SGD(0.001))
    if kind == "horovod":
        opt = horovod_keras().DistributedOptimizer(base, op=hvd.Average)
    else:
        weight, mode, *how = kind.split("-")
        from hetgrad.reducers import DenseReducer
        reducer = DenseReducer(grouped=how == ["grouped"])
        opt = hk.DistributedOptimizer(base, weight=WEIGHTS[weight] or 1.0 / hvd.size(),
                                      plan=plan, reducer=reducer,
                                      check_finite=mode in ("checked", "finite")
                                      or mode.startswith("gns"))
        if mode in ("bare", "finite"):
            hk.aggregation_of(opt).timer = None
        if mode.startswith("gns"):   # checked + the noise scale of every (gns) or k-th (gnsK) step
            from hetgrad.noise import check_measurable
            check_measurable(opt, every=int(mode[3:] or 1))
            if how == ["raw"]:   # the raw gradients' noise scale (Adam's preconditioner off)
                noise = hk.aggregation_of(opt).noise
                noise.precondition = noise.gate = None
    model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(True),
                  steps_per_execution=args.steps_per_execution)
    if kind.startswith("samples"):
        hk.count_samples(model)
    return model


class Stepper:
    """Runs a compiled model's train function on a persistent iterator: ``steps_per_execution``
    steps per call, no ``fit`` set-up (its ~0.1-0.2 s per call made the blocks bimodal)."""

    def __init__(self, model, data, steps_per_execution: int):
        self.fn = model.make_train_function()
        self.it = iter(data)
        self.spe = steps_per_execution

    def block(self, steps: int) -> float:
        """Seconds per step over ``steps`` steps (a multiple of steps_per_execution)."""
        calls = max(1, steps // self.spe)
        t0 = time.perf_counter()
        for _ in range(calls):
            out = self.fn(self.it)
        float(out["loss"])   # wait for the last call
        return (time.perf_counter() - t0) / (calls * self.spe)


def iqr(values: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def bootstrap_ci(values: list[float], reps: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % bootstrap interval of the median of ``values``."""
    rng = np.random.default_rng(seed)
    v = np.asarray(values)
    medians = np.median(rng.choice(v, (reps, v.size)), axis=1)
    return float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))


def table(paths: list[str], against: str = "horovod") -> str:
    """Markdown: per file (size, ranks) and arm, the median ratio to Horovod (or, paired per
    round, to the arm ``against``), its IQR and the 95 % bootstrap interval of the median."""
    rows = []
    for path in paths:
        with open(path) as f:
            d = json.load(f)
        base = np.asarray(d["ratios"][against])
        for arm, ratios in d["ratios"].items():
            if arm in ("horovod", against):
                continue
            ratios = list(np.asarray(ratios) / base)
            lo, hi = bootstrap_ci(ratios)
            q1, q3 = iqr(ratios)
            rows.append([f"{d['params'] / 1e6:.1f} M", d["ranks"],
                         f"{d['rounds']} × {d['steps_per_block']}",
                         f"{1e3 * d['median_step_s']['horovod']:.1f}", arm,
                         f"{statistics.median(ratios):.3f}", f"{q1:.3f}-{q3:.3f}",
                         f"{lo:.3f}-{hi:.3f}"])
    return markdown(["params", "ranks", "rounds × steps", "Horovod step (ms)", "arm",
                     f"median ratio to {against}", "IQR", "95 % CI of median"], rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", nargs="+", metavar="JSON",
                    help="print the Markdown table of these results and exit (no MPI)")
    ap.add_argument("--against", default="horovod",
                    help="with --table: each arm's ratio to this arm, paired per round")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64, help="per rank")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20, help="steps per block")
    ap.add_argument("--steps-per-execution", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="TF intra-op threads")
    ap.add_argument("--inter-op", type=int,
                    help="TF inter-op threads (default: hetgrad's, max(2, --threads))")
    ap.add_argument("--arms", default=",".join(arms()),
                    help="comma-separated: horovod, WEIGHT-MODE[-grouped|-raw]; MODE: checked "
                         "(finite check + timers), bare (neither), finite, timed (one), gns "
                         "(checked + the noise scale of every step), gnsK (of every K-th); "
                         "-raw: a gns arm without Adam's preconditioner")
    ap.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd",
                    help="every arm's (with adam, gns arms measure Adam's preconditioned "
                         "noise scale, from its 10th step: warm-up blocks cover them)")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.table:
        print(table(args.table, args.against))
        return
    if not args.out:
        ap.error("--out is required (unless --table)")

    from hetgrad.runtime import configure_tf, init
    init()
    configure_tf(args.threads, "cpu")
    import horovod.tensorflow as hvd
    import tensorflow as tf
    if args.inter_op:
        tf.config.threading.set_inter_op_parallelism_threads(args.inter_op)
    import hetgrad.keras as hk
    from hetgrad.partition import make_plan

    rng = np.random.default_rng(hvd.rank())
    x = rng.random((args.batch, 8, 8, 1), dtype=np.float32)
    y = rng.integers(0, 10, args.batch)
    data = tf.data.Dataset.from_tensors((x, y)).repeat()
    plan = make_plan([1.0] * hvd.size(), args.batch * hvd.size(),
                     1000 * args.batch * hvd.size())
    kinds = args.arms.split(",")
    models = {k: build(k, args, plan, hvd, hk, tf) for k in kinds}
    steppers = {k: Stepper(models[k], data, args.steps_per_execution) for k in kinds}
    for k in kinds:  # trace, first steps
        steppers[k].block(args.steps_per_execution)
    per_step = {k: [] for k in kinds}
    # a fresh random order every round (bench/schedule.py says why), the same on every rank
    for order in rounds(kinds, args.warmup + args.rounds, seed=ORDER_SEED):
        for k in order:
            per_step[k].append(steppers[k].block(args.steps))
    if hvd.rank() == 0:
        write(args, models["horovod"].count_params(), hvd.size(), kinds,
              {k: v[args.warmup:] for k, v in per_step.items()})


def write(args, params: int, size: int, kinds: list[str], per_step: dict) -> None:
    import tensorflow as tf
    ratios = {k: [a / h for a, h in zip(per_step[k], per_step["horovod"])] for k in kinds}
    threads = tf.config.threading   # as the run had them
    out = {"ranks": size, "params": params, "batch_per_rank": args.batch,
           "optimizer": args.optimizer,
           "threads": threads.get_intra_op_parallelism_threads(),
           "inter_op": threads.get_inter_op_parallelism_threads(),
           "rounds": args.rounds, "steps_per_block": args.steps,
           "median_step_s": {k: statistics.median(v) for k, v in per_step.items()},
           "ratio_median": {k: statistics.median(v) for k, v in ratios.items()},
           "ratio_iqr": {k: iqr(v) for k, v in ratios.items()},
           "ratios": ratios, "step_s": per_step}
    results.save(out, args.out, indent=1)
    print(json.dumps({k: out[k] for k in ("ranks", "params", "ratio_median", "ratio_iqr")},
                     indent=1))


if __name__ == "__main__":
    main()
