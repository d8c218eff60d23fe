#!/usr/bin/env python
"""What one sparse train step costs on its own: one process (no other rank to wait for), the
digits MLP, dense against sparse arms, under several Horovod cycle times.

Horovod's background thread works in cycles (``HOROVOD_CYCLE_TIME``, 1 ms by default): a
collective that can start only after another one finished (``union``: the indices, then the
values on their union) waits for the next cycle. One child process per cycle time (Horovod
reads it at ``init``); in each, every arm is timed ``--repeats`` times, arms interleaved in a
fresh random order every repeat (``bench/schedule.py``); the minimum per arm is kept. Writes
JSON.

    .venv/bin/python scripts/bench_sparse_step.py --out results/bench_sparse_step.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from bench import results
from bench.launch import run
from bench.schedule import rounds

ARMS = ["dense", "topk/allgather", "sticky/allgather", "topk/union", "sticky/union"]


def time_arms(arms: list[str], repeats: int, steps: int) -> dict[str, list[float]]:
    """Seconds per step of each arm (``repeats`` timings of ``steps`` steps), in this process."""
    import numpy as np
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    import hetgrad.keras as hk
    from hetgrad import models
    from hetgrad.compat import keras
    hk.init()
    rng = np.random.default_rng(0)
    x, y = rng.random((1440, 8, 8, 1), dtype=np.float32), rng.integers(0, 10, 1440)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(96).repeat().prefetch(2)
    out: dict[str, list[float]] = {a: [] for a in arms}
    for order in rounds(arms, repeats):
        for arm in order:
            sparsify = None if arm == "dense" else hk.Sparsify(
                arm.split("/")[0], density=0.01, exchange=arm.split("/")[1], momentum=0.9)
            model = models.build("mlp", (8, 8, 1), 10)
            opt = hk.DistributedOptimizer(keras.optimizers.SGD(0.05), weight=1.0,
                                          sparsify=sparsify)
            model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(
                from_logits=True))
            model.fit(ds, steps_per_epoch=20, epochs=1, verbose=0)   # trace, warm up
            t0 = time.perf_counter()
            model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0)
            out[arm].append((time.perf_counter() - t0) / steps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycle-times", default="1,0.5,0.1", help="HOROVOD_CYCLE_TIME values (ms)")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", help="JSON file (default: print only)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    arms = args.arms.split(",")
    if args.child:
        print(json.dumps(time_arms(arms, args.repeats, args.steps)))
        return
    result = {"arms": arms, "repeats": args.repeats, "steps": args.steps, "cycle_times": {}}
    for cycle in args.cycle_times.split(","):
        p = run([sys.executable, __file__, "--child", "--arms", args.arms,
                 "--repeats", str(args.repeats), "--steps", str(args.steps)],
                env={"HOROVOD_CYCLE_TIME": cycle})
        times = json.loads(p.stdout.strip().splitlines()[-1])
        result["cycle_times"][cycle] = {a: {"step_s": min(v), "all_s": v} for a, v in times.items()}
        dense = min(times["dense"]) if "dense" in times else None
        for a, v in times.items():
            ratio = f"  {min(v) / dense:.2f}x dense" if dense else ""
            print(f"cycle {cycle} ms  {a:17s} {1e3 * min(v):.2f} ms/step{ratio}", flush=True)
    if args.out:
        results.save(result, args.out, indent=1)


if __name__ == "__main__":
    main()
