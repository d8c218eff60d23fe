#!/usr/bin/env python
"""Equal vs uneven-avg vs weighted: time per epoch and accuracy under emulated speed profiles.

Per task and profile, every seed runs each mode once, the modes in a fresh random order every
seed (``bench/schedule.py``). Resumable: each run writes
DIR/<task>_<profile>_<mode>_s<seed>.json and is skipped when that file exists. Afterwards
`hetgrad report DIR/*.json --out-dir DIR/report` renders the table and plots (done here at
the end too).

    .venv/bin/python scripts/experiment.py --dir results/experiment
"""
from __future__ import annotations

import argparse
from pathlib import Path

from bench.launch import train
from bench.schedule import interleaved

TASKS = {  # name: (train args, epochs)
    "digits-mlp": (["--data", "digits", "--model", "mlp", "--global-batch", "96"], 10),
    "synthetic-cnn": (["--data", "synthetic", "--model", "cnn", "--global-batch", "128",
                       "--optimizer", "adam", "--lr", "0.002"], 4),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="results/experiment")
    ap.add_argument("--profiles", default="1,1,2,4;1,8", help="';'-separated speed profiles")
    ap.add_argument("--modes", default="equal,uneven-avg,weighted")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--epochs-scale", type=float, default=1.0)
    args = ap.parse_args()
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    for task in args.tasks.split(","):
        targs, epochs = TASKS[task]
        epochs = max(1, round(epochs * args.epochs_scale))
        for profile in args.profiles.split(";"):
            for seed, mode in interleaved(args.modes.split(","), args.seeds):
                f = out / f"{task}_{profile.replace(',', '-')}_{mode}_s{seed}.json"
                if f.exists():
                    continue
                print(f"[experiment] {f.name}", flush=True)
                train(len(profile.split(",")), [*targs, "--mode", mode, "--seed", str(seed),
                                                "--epochs", str(epochs),
                                                "--emulate-speeds", profile], f)
    from hetgrad.report import report
    md, pngs = report(sorted(out.glob("*.json")), out / "report")
    print(md)
    for p in pngs:
        print("plot:", p)


if __name__ == "__main__":
    main()
