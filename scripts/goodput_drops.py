"""Test-accuracy drops of the goodput runs' adaptive arms against the size of each epoch's
last step: every epoch (after the first) of every ``*adaptive*`` record under the given run
directories, split by whether its last step held under a tenth of the global batch
(``hetgrad.goodput.thin``). Writes ``--out`` (JSON) and prints the table.

    .venv/bin/python scripts/goodput_drops.py results/goodput/{fourth,fifth,sixth} --out results/goodput/drops.json
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from hetgrad.goodput import thin


def epochs(run_dirs: list[Path]) -> list[dict]:
    """One entry per adaptive epoch after the first: its change of test accuracy, batch and
    last step."""
    out = []
    for d in run_dirs:
        for f in sorted(d.glob("*adaptive*_s*.json")):
            rec = json.loads(f.read_text())
            n = rec["plan"]["dataset_size"] - rec["plan"]["dropped"]
            rows = rec["epochs"]
            for before, row in zip(rows, rows[1:]):
                b = row["global_batch"]
                out.append({"run": d.name, "record": f.name, "epoch": row["epoch"], "batch": b,
                            "last_step": n % b or b, "thin": thin(b, n),
                            "change": row["test_accuracy"] - before["test_accuracy"]})
    return out


def summary(rows: list[dict], drop: float) -> dict:
    """Per kind of last step: epochs, drops of more than ``drop``, mean change, the drops."""
    kinds = {}
    for name, is_thin in (("thin last step", True), ("last step >= B/10", False)):
        mine = [r for r in rows if r["thin"] == is_thin]
        drops = [r for r in mine if r["change"] < -drop]
        kinds[name] = {"epochs": len(mine), "drops": len(drops),
                       "mean_change": statistics.fmean(r["change"] for r in mine) if mine else None,
                       "which": drops}
    return kinds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="goodput run directories")
    ap.add_argument("--drop", type=float, default=0.03, help="a drop: accuracy falls by more")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    kinds = summary(epochs(args.runs), args.drop)
    args.out.write_text(json.dumps({"runs": [str(p) for p in args.runs], "drop": args.drop,
                                    "kinds": kinds}, indent=1))
    print(f"| last step | epochs | drops > {100 * args.drop:.0f} pts | mean change |")
    print("|---|---|---|---|")
    for name, k in kinds.items():
        mean = "-" if k["mean_change"] is None else f"{100 * k['mean_change']:+.2f} pts"
        print(f"| {name} | {k['epochs']} | {k['drops']} | {mean} |")
    for name, k in kinds.items():
        for r in k["which"]:
            print(f"  {name}: {r['run']}/{r['record']} epoch {r['epoch']} at {r['batch']} "
                  f"(last step {r['last_step']}): {100 * r['change']:+.1f} pts")


if __name__ == "__main__":
    main()
