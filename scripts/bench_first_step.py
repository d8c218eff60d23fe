#!/usr/bin/env python
"""The first training step on one process, arm against arm: its wall time (the step's
tracing and first run in it) under ``hk.fit`` -- the goodput benchmark's model (cnn1d, Adam at
0.02, MNIST-1D 25,000, B = 100), one epoch, with or without the noise scale measured in every
step (``:gns``). One process and no launcher: the quietest view of a start-up cost (on several
ranks sharing 2 cores single traces vary by 0.5 s).

Each arm is a checkout whose ``hetgrad`` the process imports (it starts in DIR):
``NAME=DIR[:gns]``. Every round runs each arm once, in a fresh random order. E.g.::

    git worktree add /tmp/before 60ae545
    .venv/bin/python scripts/bench_first_step.py --arm before=/tmp/before --arm after=. \\
        --arm before-gns=/tmp/before:gns --arm after-gns=.:gns --rounds 6
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from bench.launch import QUIET_TF, run
from bench.results import save
from bench.schedule import interleaved
from bench.tables import markdown, series
from bench_goodput import mnist1d_data

STEP = """
import json, sys, time
import numpy as np
import hetgrad.keras as hk
from hetgrad.compat import keras
from hetgrad.models import build
data, gns = np.load(sys.argv[1]), sys.argv[2] == "1"
x, y = data["x_train"], data["y_train"]
model = build("cnn1d", x.shape[1:], 10, seed=0)
model.compile(optimizer=keras.optimizers.Adam(0.02), metrics=["accuracy"],
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
times = []
class First(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        self.t0 = time.perf_counter()
    def on_train_batch_end(self, batch, logs=None):
        times.append(time.perf_counter() - self.t0)
hk.fit(model, x, y, global_batch=100, epochs=1, gns=gns, gns_every=1 if gns else None,
       callbacks=[First()], verbose=0)
print("FIRST_STEP " + json.dumps({"first_step_s": times[0],
                                 "later_step_s": float(np.median(times[1:]))}))
"""


def first_step(directory: Path, gns: bool, data: str) -> dict:
    """One ``hk.fit`` epoch on one process with the checkout in ``directory``."""
    out = run([sys.executable, "-c", STEP, data, "1" if gns else "0"], cwd=directory,
              env=QUIET_TF).stdout
    line = next(l for l in out.splitlines() if l.startswith("FIRST_STEP "))
    return json.loads(line.split(" ", 1)[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arm", action="append", required=True, metavar="NAME=DIR[:gns]",
                    help="a checkout, with the noise scale or not (repeat for each arm)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", default="results/first_step.json")
    args = ap.parse_args()
    arms = {}
    for text in args.arm:
        name, _, rest = text.partition("=")
        directory, _, what = rest.partition(":")
        if what not in ("", "gns"):
            ap.error(f"--arm {text}: after DIR only ':gns' (got {what!r})")
        arms[name] = (Path(directory).resolve(), what == "gns")
    data = str(Path(mnist1d_data(25000, Path("results/goodput/data"))).resolve())
    runs: dict[str, list[dict]] = {name: [] for name in arms}
    for r, name in interleaved(list(arms), args.rounds):
        runs[name].append({"round": r, **first_step(*arms[name], data)})
        print(f"[first-step] round {r} {name}: {runs[name][-1]}", flush=True)
    save({"arms": {n: [str(d), g] for n, (d, g) in arms.items()}, "runs": runs}, args.out)
    print(markdown(["arm", "first step (s), per round", "median", "mean", "later steps (ms)"],
                   [[name, series(r["first_step_s"] for r in rows),
                     f"{statistics.median(r['first_step_s'] for r in rows):.3f}",
                     f"{statistics.mean(r['first_step_s'] for r in rows):.3f}",
                     f"{1000 * statistics.median(r['later_step_s'] for r in rows):.1f}"]
                    for name, rows in runs.items()]))


if __name__ == "__main__":
    main()
