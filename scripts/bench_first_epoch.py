#!/usr/bin/env python
"""The first epoch of a run, arm against arm: the probe before it (``probe_s``), how long
its fit takes (``time_s``; the step's tracing in it where the probe did not trace it; for
the adaptive arm ``split_s``, its steps before the first choice),
the wall time up to its end (``elapsed_s``: the start's broadcast too), the second epoch
(the plan's quality: the per-rank ``batches`` are recorded too),
for the goodput benchmark's task (MNIST-1D 25,000, cnn1d, Adam, 2 epochs) in one of its
scenarios (default emulated speeds 1,1,2,4 at 0.1 ms per sample).

Each arm is a checkout whose ``hetgrad`` the ranks import (they start in DIR, with this
Python) and one of the goodput benchmark's arms (``fixed-B``, ``adaptive``; default
``fixed-`` ``--batch``), with more ``hetgrad train`` flags after it: ``NAME=DIR[:ARM[ FLAGS]]``.
Every round runs each arm once, in a fresh random order. E.g. before and after a change, from
the repository's root::

    git worktree add /tmp/before 6b27cb7
    .venv/bin/python scripts/bench_first_epoch.py --arm before=/tmp/before --arm after=. \\
        --rounds 4 --out results/first_epoch.json
    .venv/bin/python scripts/bench_first_epoch.py --scenario quota:1,0.25 \\
        --arm f100=.:fixed-100 --arm f100-gns=".:fixed-100 --gns" --arm ada=.:adaptive
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import tempfile
from pathlib import Path

from bench.launch import QUIET_TF, run, train_cmd
from bench.placement import placed, profile
from bench.results import save
from bench.schedule import interleaved
from bench.tables import markdown, series
from bench_goodput import TASK, arm_args, mnist1d_data

FIGURES = ("probe_s", "first_epoch_s", "split_s", "first_wall_s", "second_epoch_s")


def parse_arm(text: str, batch: int) -> tuple[str, Path, list[str]]:
    """``NAME=DIR[:ARM[ FLAGS]]`` -> (name, checkout, ``hetgrad train`` args of the arm)."""
    name, _, rest = text.partition("=")
    directory, _, arm = rest.partition(":")
    arm, *flags = shlex.split(arm) or [f"fixed-{batch}"]
    try:
        return name, Path(directory).resolve(), [*arm_args(arm), *flags]
    except ValueError:
        raise SystemExit(f"bench: --arm {text}: {arm!r} is neither adaptive[-RULE] nor "
                         "fixed-B[-lrRATE]") from None


def first_epoch(directory: Path, arm: list[str], scenario: str, data: str) -> dict:
    """One 2-epoch run of ``arm`` with the checkout in ``directory``: its first epochs'
    figures."""
    ranks, extra, placement = profile(scenario)
    args = [*TASK, "--data", data, *arm, *extra, "--epochs", "2"]
    with tempfile.TemporaryDirectory() as tmp, placed(placement) as wrap:
        out = Path(tmp) / "run.json"
        run(train_cmd(ranks, args, out, wrap=wrap), cwd=directory, env=QUIET_TF)
        record = json.loads(out.read_text())
    rows = record["epochs"]
    return {"probe_s": record["probe_time_s"], "first_epoch_s": rows[0]["time_s"],
            "split_s": rows[0].get("split", {}).get("time_s", 0.0),
            "first_wall_s": rows[0]["elapsed_s"], "second_epoch_s": rows[1]["time_s"],
            "batches": record["plan"]["batches"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arm", action="append", required=True, metavar="NAME=DIR[:ARM[ FLAGS]]",
                    help="a checkout and goodput-benchmark arm to run (repeat for each arm)")
    ap.add_argument("--scenario", default="1,1,2,4@1e-4",
                    help="SPEEDS@UNIT (emulated) or quota:SHARES, as bench_goodput.py")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--batch", type=int, default=200, help="an arm's default: fixed-BATCH")
    ap.add_argument("--out", default="results/first_epoch.json")
    args = ap.parse_args()
    arms = {name: (d, a) for name, d, a in (parse_arm(t, args.batch) for t in args.arm)}
    data = str(Path(mnist1d_data(25000, Path("results/goodput/data"))).resolve())
    runs: dict[str, list[dict]] = {name: [] for name in arms}
    for r, name in interleaved(list(arms), args.rounds):
        runs[name].append({"round": r, **first_epoch(*arms[name], args.scenario, data)})
        print(f"[first-epoch] round {r} {name}: {runs[name][-1]}", flush=True)
    save({"arms": {n: [str(d), *a] for n, (d, a) in arms.items()}, "scenario": args.scenario,
          "runs": runs}, args.out)
    print(markdown(["arm", *(f"{f} (per round; median)" for f in FIGURES)],
                   [[name, *(f"{series(r[f] for r in rows)}; "
                             f"{statistics.median(r[f] for r in rows):.2f}" for f in FIGURES)]
                    for name, rows in runs.items()]))


if __name__ == "__main__":
    main()
