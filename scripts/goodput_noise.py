#!/usr/bin/env python
"""The noise scale the goodput runs' adaptive arms measured (``bench_goodput.py`` records):
per run directory and scenario, each epoch's ``b_noise`` (the epoch's own estimate, median
over seeds), how many of the epochs' estimates -- a split first fit's included -- had
``|G|^2 <= 0`` (no noise scale from them), how many epochs ended without a smoothed one,
and per seed the global batch per epoch and what
the first choice went by. Writes JSON and prints markdown tables.

    .venv/bin/python scripts/goodput_noise.py results/goodput/{fifth,sixth,seventh,eighth,ninth,tenth} \\
        --out results/goodput/noise.json
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from bench.tables import markdown
from bench_goodput import records


def estimates(rec: dict) -> list[dict]:
    """The record's per-epoch noise estimates: each split first fit's, then each epoch's."""
    out = []
    for row in rec["epochs"]:
        out += [row["split"]] if row.get("split") else []
        out.append(row)
    return [e for e in out if e.get("gns_signal") is not None]


def of_scenario(arms: dict) -> dict:
    """The adaptive arm's per-epoch median ``b_noise`` and its count of non-positive
    signals."""
    runs = list(arms.get("adaptive", {}).values())
    epochs = max((len(rec["epochs"]) for rec in runs), default=0)
    per_epoch = [[r["epochs"][e]["b_noise"] for r in runs
                  if e < len(r["epochs"]) and r["epochs"][e].get("b_noise")]
                 for e in range(epochs)]
    every = [e for rec in runs for e in estimates(rec)]
    return {"seeds": len(runs), "paths": {seed: path(rec) for seed, rec in
                                          sorted(arms.get("adaptive", {}).items())},
            "b_noise_by_epoch": [statistics.median(v) if v else None for v in per_epoch],
            "estimates": len(every),
            "nonpositive_signal": sum(e["gns_signal"] <= 0 for e in every),
            "unsmoothed_epochs": sum(not row.get("b_noise_smoothed")
                                     for rec in runs for row in rec["epochs"])}


def path(rec: dict) -> dict:
    """One adaptive run's global batch per epoch, and what its first choice went by: the
    split fit's smoothed noise scale and its interval's low end (None: none)."""
    split = rec["epochs"][0].get("split") or {}
    interval = split.get("b_noise_interval") or [None]
    return {"batches": [row["global_batch"] for row in rec["epochs"]],
            "split_b_noise": split.get("b_noise_smoothed"), "split_low": interval[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="bench_goodput.py --dir directories")
    ap.add_argument("--out", type=Path, required=True, help="JSON to write")
    args = ap.parse_args()
    table = {str(d): {s: of_scenario(arms) for s, arms in records(d).items()}
             for d in args.runs}
    args.out.write_text(json.dumps(table, indent=1))
    print(markdown(["run", "scenario", "seeds", "|G|^2 <= 0 / estimates",
                    "epochs without a smoothed one", "B_noise per epoch (median over seeds)"],
                   [[Path(d).name, s, v["seeds"],
                     f"{v['nonpositive_signal']} / {v['estimates']}", v["unsmoothed_epochs"],
                     ", ".join("-" if b is None else f"{b:.0f}" for b in v["b_noise_by_epoch"])]
                    for d, scenarios in table.items() for s, v in scenarios.items()]))
    print()
    print(markdown(["run", "scenario", "seed", "first fit: B_noise, low end", "batch per epoch"],
                   [[Path(d).name, s, seed, f"{_n(p['split_b_noise'])}, {_n(p['split_low'])}",
                     " ".join(map(str, p["batches"]))]
                    for d, scenarios in table.items() for s, v in scenarios.items()
                    for seed, p in v["paths"].items()]))


def _n(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


if __name__ == "__main__":
    main()
