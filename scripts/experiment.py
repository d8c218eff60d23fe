#!/usr/bin/env python
"""Equal vs uneven-avg vs weighted: accuracy and time per epoch under unequal speeds.

Profiles: emulated speeds (``1,8``: a rank of speed s sleeps n x 1 ms / s per step of n
samples) or fixed CPU shares (``quota:1,0.25``: rank r on core r, capped at that share of it
by a cgroup quota, ``bench/placement.py``: real compute, needs root). Per task and profile,
every seed runs each mode once, the modes in a fresh random order every seed
(``bench/schedule.py``). Resumable: each run writes DIR/<task>_<profile>_<mode>_s<seed>.json
and is skipped when that file exists. At the end: ``hetgrad report``'s table and plots in
DIR/report (or ``--report-dir``), and the claim table (weighted - uneven-avg per cell with
its 95 % interval, ``bench/claim.py``) in DIR/claim.md and DIR/claim.json.

    .venv/bin/python scripts/experiment.py --dir results/claim
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.claim import cells, markdown
from bench.launch import train_once
from bench.placement import profile
from bench.schedule import interleaved

TASKS = {  # name: (train args, epochs)
    "digits-mlp": (["--data", "digits", "--model", "mlp", "--global-batch", "96"], 10),
    "mnist1d-cnn": (["--data", "mnist1d", "--model", "cnn1d", "--global-batch", "100",
                     "--optimizer", "adam", "--lr", "0.01"], 20),
    # compute-bound steps (1.1M weights, ~16 ms a step of 256 on a core): CPU shares show in
    # step times there, unlike in the two tiny tasks above
    "mnist1d-wide": (["--data", "mnist1d", "--model", "wide-mlp", "--global-batch", "256",
                      "--optimizer", "adam", "--lr", "0.001"], 20),
    "synthetic-cnn": (["--data", "synthetic", "--model", "cnn", "--global-batch", "128",
                       "--optimizer", "adam", "--lr", "0.002"], 4),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="results/claim")
    ap.add_argument("--profiles", default="1,8;1,1,2,4;quota:1,0.25",
                    help="';'-separated speed profiles")
    ap.add_argument("--modes", default="equal,uneven-avg,weighted")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--tasks", default="digits-mlp,mnist1d-cnn")
    ap.add_argument("--epochs-scale", type=float, default=1.0)
    ap.add_argument("--report-dir", help="where the report goes (default DIR/report)")
    args = ap.parse_args()
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    for task in args.tasks.split(","):
        targs, epochs = TASKS[task]
        epochs = max(1, round(epochs * args.epochs_scale))
        for name in args.profiles.split(";"):
            ranks, extra, placement = profile(name)
            tag = name.replace(",", "-").replace(":", "-")
            for seed, mode in interleaved(args.modes.split(","), args.seeds):
                # label: the record's profile, for the report's groups
                train_once(out / f"{task}_{tag}_{mode}_s{seed}.json", ranks,
                           [*targs, *extra, "--mode", mode, "--seed", str(seed),
                            "--epochs", str(epochs)], placement, tag="experiment", label=name)
    summarize(out, Path(args.report_dir or out / "report"))


def summarize(out: Path, report_dir: Path) -> None:
    """The report (in ``report_dir``) and the claim table (in ``out``) of every record in
    ``out``."""
    from hetgrad.report import load_runs, report
    paths = sorted(out.glob("*_s*.json"))
    md, pngs = report(paths, report_dir)
    rows = cells(load_runs(paths))
    (out / "claim.json").write_text(json.dumps(rows, indent=1))
    (out / "claim.md").write_text(markdown(rows))
    print(md + "\n" + markdown(rows))
    for p in pngs:
        print("plot:", p)


if __name__ == "__main__":
    main()
