#!/usr/bin/env python
"""Where a goodput run's arms spend their time (``bench_goodput.py`` records with
``elapsed_s``): per scenario and arm, the first epoch's wall time per seed (less its
evaluation; the adaptive arm's includes its split), and over the later epochs at the arm's
most frequent global batch the medians of the wall time per epoch (less evaluation) and of
the fit's time, and per seed the median fit time of its later epochs (whatever the batch: a
drift of the machine between seeds shows there); the means over the seeds of the first
epoch's fit time (the adaptive arm's: of both fits, and of its split one alone) and of the
second's. Writes JSON and prints a markdown table.

    .venv/bin/python scripts/goodput_epochs.py results/goodput/twelfth --out results/goodput/twelfth/epochs.json
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path

from bench.tables import markdown
from bench_goodput import evaluation_s, records


def of_arm(seeds: dict) -> dict:
    """The arm's first epochs (per seed) and its later epochs' medians at its usual batch."""
    later = [(seed, row, prev) for seed, rec in seeds.items()
             for prev, row in zip(rec["epochs"], rec["epochs"][1:])]
    usual = Counter(row.get("global_batch") for _, row, _ in later).most_common(1)[0][0]
    at = [(row, prev) for _, row, prev in later if row.get("global_batch") == usual]
    firsts = [rec["epochs"][0] for rec in seeds.values()]
    return {"first_epoch_s": {seed: rec["epochs"][0]["elapsed_s"] - evaluation_s(rec["epochs"][0])
                              for seed, rec in sorted(seeds.items())},
            "first_fit_s": statistics.mean(row["time_s"] for row in firsts),
            "split_fit_s": statistics.mean(row.get("split", {}).get("time_s", 0.0)
                                           for row in firsts),
            "second_fit_s": statistics.mean(rec["epochs"][1]["time_s"] for rec in seeds.values()),
            "batch": usual, "epochs": len(at),
            "wall_per_epoch_s": statistics.median(
                row["elapsed_s"] - prev["elapsed_s"] - evaluation_s(row) for row, prev in at),
            "fit_per_epoch_s": statistics.median(row["time_s"] for row, _ in at),
            "fit_per_epoch_s_by_seed": {
                seed: statistics.median(r["time_s"] for r in rec["epochs"][1:])
                for seed, rec in sorted(seeds.items())}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a bench_goodput.py --dir (records with elapsed_s)")
    ap.add_argument("--out", type=Path, required=True, help="JSON to write")
    args = ap.parse_args()
    table = {s: {arm: of_arm(seeds) for arm, seeds in sorted(arms.items())}
             for s, arms in records(args.run).items()}
    args.out.write_text(json.dumps(table, indent=1))
    print(markdown(["scenario", "arm", "first epoch (s), per seed", "later epochs at batch",
                    "wall per epoch (s, median)", "fit per epoch (s, median)",
                    "first fit (s, mean; split)", "second fit (s, mean)"],
                   [[s, arm, ", ".join(f"{t:.1f}" for t in v["first_epoch_s"].values()),
                     f"{v['batch'] or '-'} ({v['epochs']})", f"{v['wall_per_epoch_s']:.2f}",
                     f"{v['fit_per_epoch_s']:.2f}",
                     f"{v['first_fit_s']:.2f}; {v['split_fit_s']:.2f}", f"{v['second_fit_s']:.2f}"]
                    for s, arms in table.items() for arm, v in arms.items()]))


if __name__ == "__main__":
    main()
