#!/usr/bin/env python
"""Statistical efficiency as measured against the goodput model, from a goodput run's records
(``bench_goodput.py``): how many epochs each fixed global batch needed to reach a test
accuracy, relative to ``B_0``'s, against ``E(B) = (B_noise + B_0) / (B_noise + B)`` at the
noise scale the adaptive arms measured when they reached that accuracy.

Per scenario, accuracy level and fixed ``B``: ``E`` measured = epochs at ``B_0`` to the level
over epochs at ``B`` (each interpolated between epochs, paired per seed, median over the
seeds that reached it in both), the noise scale for which the model says as much
(``(E B - B_0) / (1 - E)``), the adaptive arms' smoothed ``B_noise`` in the epoch where they
reached the level (median over seeds) and the model's ``E(B)`` there. Writes JSON and prints a
markdown table.

    .venv/bin/python scripts/goodput_efficiency.py results/goodput/eighth \\
        --out results/goodput/eighth/efficiency.json
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from bench.tables import markdown, num
from bench_goodput import fixed_arm, records
from hetgrad.goodput import efficiency

LEVELS = (0.80, 0.85, 0.90, 0.92, 0.93)


def crossing(accuracies: list[float], level: float) -> float | None:
    """The (fractional) epoch at which ``accuracies`` (one per epoch) first reach ``level``,
    linear between epochs; None if they never do."""
    before = 0.0
    for epoch, acc in enumerate(accuracies, 1):
        if acc >= level:
            return epoch - 1 + (level - before) / (acc - before) if acc > before else epoch
        before = acc
    return None


def reached_noise(records: dict, level: float) -> float | None:
    """The adaptive records' smoothed ``B_noise`` in the epoch they first reached ``level``
    (median over seeds)."""
    seen = []
    for rec in records.values():
        for row in rec["epochs"]:
            if row["test_accuracy"] >= level:
                if row.get("b_noise_smoothed"):
                    seen.append(row["b_noise_smoothed"])
                break
    return statistics.median(seen) if seen else None


def rows_of(arms: dict, b0: int) -> list[dict]:
    """One row per accuracy level and fixed batch above ``b0``."""
    base = arms.get(f"fixed-{b0}", {})
    sizes = {a: fixed_arm(a) for a in arms if a.startswith("fixed-")}
    compared = sorted((a for a, (b, rate) in sizes.items() if rate is None and b != b0),
                      key=lambda a: sizes[a][0])   # (arms at a rate of their own: not B's)
    rows = []
    for level in LEVELS:
        b_noise = reached_noise(arms.get("adaptive", {}), level)
        for arm in compared:
            batch, ratios = sizes[arm][0], []
            for seed, rec in arms[arm].items():
                mine = crossing([r["test_accuracy"] for r in rec["epochs"]], level)
                theirs = seed in base and crossing(
                    [r["test_accuracy"] for r in base[seed]["epochs"]], level)
                if mine and theirs:
                    ratios.append(theirs / mine)
            e = statistics.median(ratios) if ratios else None
            rows.append({"level": level, "batch": batch, "seeds": len(ratios),
                         "efficiency_measured": e,
                         "b_noise_implied": (e * batch - b0) / (1 - e) if e and e < 1 else None,
                         "b_noise_measured": b_noise,
                         "efficiency_model": efficiency(batch, b_noise, b0) if b_noise else None})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a bench_goodput.py --dir")
    ap.add_argument("--b0", type=int, default=100, help="the starting (default) global batch")
    ap.add_argument("--out", required=True, help="JSON to write")
    args = ap.parse_args()
    table = {scenario: rows_of(arms, args.b0) for scenario, arms in records(Path(args.run)).items()}
    Path(args.out).write_text(json.dumps({"run": args.run, "b0": args.b0, "rows": table},
                                         indent=1))
    print(markdown(["scenario", "test acc", "B", "seeds", "E measured", "B_noise implied",
                    "B_noise measured (adaptive)", "E model"],
                   [[scenario, r["level"], r["batch"], r["seeds"],
                     num(r["efficiency_measured"], ".2f"), num(r["b_noise_implied"], ".0f"),
                     num(r["b_noise_measured"], ".0f"), num(r["efficiency_model"], ".2f")]
                    for scenario, rows in table.items() for r in rows]))


if __name__ == "__main__":
    main()
