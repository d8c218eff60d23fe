#!/usr/bin/env python
"""The first epoch of a run, checkout against checkout: how long its fit takes (``time_s``,
the step's tracing in it) and the wall time up to its end (``elapsed_s``: the start's
broadcast too), for the goodput benchmark's task at a fixed batch (MNIST-1D 25,000, cnn1d,
Adam, emulated speeds 1,1,2,4 at 0.1 ms per sample, 2 epochs).

Each arm is a checkout (``NAME=DIR``) whose ``hetgrad`` the ranks import (they start in DIR,
with this Python); every round runs each arm once, in a fresh random order. E.g. before and
after a change, from the repository's root::

    git worktree add /tmp/before 6b27cb7
    .venv/bin/python scripts/bench_first_epoch.py --arm before=/tmp/before --arm after=. \\
        --rounds 4 --out results/first_epoch.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from bench.launch import QUIET_TF, run, train_cmd
from bench.results import save
from bench.schedule import interleaved
from bench.tables import markdown, series
from bench_goodput import B0, LR0, TASK, mnist1d_data

FIGURES = ("first_epoch_s", "first_wall_s", "second_epoch_s")


def first_epoch(directory: Path, batch: int, data: str) -> dict:
    """One 2-epoch run of the checkout in ``directory``: its first epochs' figures."""
    args = [*TASK, "--data", data, "-B", str(batch), "--lr", f"{LR0 * (batch / B0) ** 0.5:.6g}",
            "--emulate-speeds", "1,1,2,4", "--emulate-unit", "1e-4", "--epochs", "2"]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        run(train_cmd(4, args, out), cwd=directory, env=QUIET_TF)
        rows = json.loads(out.read_text())["epochs"]
    return {"first_epoch_s": rows[0]["time_s"], "first_wall_s": rows[0]["elapsed_s"],
            "second_epoch_s": rows[1]["time_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arm", action="append", required=True, metavar="NAME=DIR",
                    help="a checkout to run (repeat for each arm)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--out", default="results/first_epoch.json")
    args = ap.parse_args()
    arms = dict(a.split("=", 1) for a in args.arm)
    data = str(Path(mnist1d_data(25000, Path("results/goodput/data"))).resolve())
    runs: dict[str, list[dict]] = {name: [] for name in arms}
    for r, name in interleaved(list(arms), args.rounds):
        runs[name].append({"round": r, **first_epoch(Path(arms[name]).resolve(),
                                                       args.batch, data)})
        print(f"[first-epoch] round {r} {name}: {runs[name][-1]}", flush=True)
    save({"arms": arms, "batch": args.batch, "runs": runs}, args.out)
    print(markdown(["arm", *(f"{f} (per round; median)" for f in FIGURES)],
                   [[name, *(f"{series(r[f] for r in rows)}; "
                             f"{statistics.median(r[f] for r in rows):.2f}" for f in FIGURES)]
                    for name, rows in runs.items()]))


if __name__ == "__main__":
    main()
