#!/usr/bin/env python
"""Step time of hetgrad's weighted allreduce vs Horovod's own DistributedOptimizer averaging.

Run under MPI; both optimizers train the same >= 1M-parameter model in the same processes,
alternating blocks of steps so machine noise hits both alike. Rank 0 writes JSON.

    TF_USE_LEGACY_KERAS=1 mpirun -np 2 --oversubscribe -x TF_USE_LEGACY_KERAS \
        .venv/bin/python scripts/bench_overhead.py --out results/bench_overhead.json

(Horovod's Keras optimizer does not aggregate under Keras 3, so the comparison needs Keras 2.)
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=10)
    ap.add_argument("--steps", type=int, default=20, help="steps per block")
    ap.add_argument("--out", default="results/bench_overhead.json")
    args = ap.parse_args()

    from hetgrad.runtime import configure_tf, init
    comm = init()
    configure_tf(1, "cpu")
    import horovod.tensorflow as hvd
    from hetgrad import compat
    hvd_keras = compat.horovod_keras()  # Horovod's own optimizer: Keras 2 only (see compat.md)
    import tensorflow as tf
    import hetgrad.keras as hk
    from hetgrad import models

    rng = np.random.default_rng(hvd.rank())
    x = rng.random((args.batch, 8, 8, 1), dtype=np.float32)
    y = rng.integers(0, 10, args.batch)
    size = hvd.size()
    from hetgrad.partition import make_plan
    plan = make_plan([1.0] * size, args.batch * size, 100 * args.batch * size)

    def compiled(kind: str):
        model = models.build("wide-mlp", (8, 8, 1), 10)
        base = tf.keras.optimizers.SGD(0.01)
        if kind == "horovod":
            opt = hvd_keras.DistributedOptimizer(base, op=hvd.Average)
        else:
            opt = hk.DistributedOptimizer(base, weight=kind.split("-")[1], plan=plan)
        model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(True))
        if kind == "hetgrad-samples":
            hk.count_samples(model)
        model.train_on_batch(x, y)  # build + trace
        return model

    kinds = ["horovod", "hetgrad-plan", "hetgrad-samples"]
    built = {k: compiled(k) for k in kinds}
    params = built["horovod"].count_params()
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for block in range(args.blocks):
        order = kinds if block % 2 == 0 else kinds[::-1]
        for k in order:
            for _ in range(args.steps):
                t0 = time.perf_counter()
                built[k].train_on_batch(x, y)
                times[k].append(time.perf_counter() - t0)
    if hvd.rank() == 0:
        med = {k: statistics.median(v) for k, v in times.items()}
        out = {"ranks": size, "params": params, "batch_per_rank": args.batch,
               "median_step_s": med,
               "ratio_vs_horovod": {k: med[k] / med["horovod"] for k in kinds},
               "steps_each": args.blocks * args.steps}
        with open(args.out, "w") as f:
            json.dump(out, f, indent=2)
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
