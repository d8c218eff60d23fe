#!/usr/bin/env python
"""The user guide's timeline figure, from a real run with unequal CPU shares.

Two ranks, rank 0 on a whole core and rank 1 capped at a quarter of another (cgroup quota,
``bench/placement.py``, needs root), start on equal batches (``--speeds 1,1``) with
``--rebalance``: rank 0 waits for rank 1 until the rebalancer, from the busy times it
measured, moves work to rank 0. The run writes ``--timeline`` and ``--tensorboard`` into DIR,
its record DIR/run.json, and ``hetgrad report`` draws DIR/report/timeline_run.png (copied
to ``--figure``).

    .venv/bin/python scripts/timeline_figure.py --dir results/timeline --figure docs/img/timeline.png
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from bench.launch import train
from bench.placement import placed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="results/timeline")
    ap.add_argument("--share", type=float, default=0.25, help="rank 1's share of a core")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--figure", help="copy the timeline PNG here")
    args = ap.parse_args()
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    with placed([(0, None), (1, args.share)]) as wrap:
        rec = train(2, ["--data", "mnist1d", "--model", "wide-mlp", "--global-batch", "256",
                        "--optimizer", "adam", "--lr", "0.001", "--speeds", "1,1",
                        "--rebalance", "--epochs", str(args.epochs),
                        "--timeline", str(out / "timeline.json"),
                        "--tensorboard", str(out / "tb")], out / "run.json", wrap=wrap)
    for e in rec["balance"]:
        print(f"epoch {e['epoch']}: batches {e['batches']}, busy "
              f"{[round(b, 2) for b in e['busy_s']]} s, wait "
              f"{[round(w, 2) for w in e['wait_s']]} s"
              + (f" -> re-plan {e['new_batches']}" if e["replanned"] else ""))
    subprocess.run([sys.executable, "-m", "hetgrad.cli", "report", str(out / "run.json"),
                    "--out-dir", str(out / "report")], check=True)
    if args.figure:
        shutil.copyfile(out / "report" / "timeline_run.png", args.figure)


if __name__ == "__main__":
    main()
