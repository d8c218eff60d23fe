#!/usr/bin/env python
"""Mid-run slowdown: throughput of a static plan vs ``--rebalance``, as a fraction of the ideal.

Launches ``hetgrad train`` on local ranks (mpirun) with an emulated speed schedule in which one
rank becomes slower part-way through, once with the plan fixed and once with ``--rebalance``,
in a fresh random order every repeat (``bench/schedule.py``) so machine noise hits both alike.
Per epoch it compares the achieved throughput (samples / epoch time) with the *ideal* of that
epoch, the sum over ranks of the speed each rank showed while busy (``samples_i / busy_i``,
measured by the train step): what the job would reach if no rank ever waited or communicated.
A third arm, ``oracle``, runs at the post-change speeds from the start (probe -> plan for them,
no rebalance): the best a plan made with foresight does. Writes JSON (after every scenario)
and a plot.

    .venv/bin/python scripts/bench_rebalance.py --out results/bench_rebalance.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from bench import ROOT, figures, results
from bench.launch import train
from bench.schedule import interleaved

SCENARIOS = {  # name: (schedule, epoch index from which the change applies)
    "equal-then-rank1-4x-slower": ("1,1,1;3:1,0.25,1", 3),
    "hetero-then-fastest-4x-slower": ("1,2,4;3:1,2,1", 3),
}
MODES = ("static", "rebalance", "oracle")


def run(np_: int, schedule: str, epochs: int, unit: float, seed: int, rebalance: bool,
        out: Path) -> dict:
    """One ``hetgrad train`` run under the emulated speed ``schedule``: its record."""
    args = ["--emulate-speeds", schedule, "--emulate-unit", str(unit),
            "--epochs", str(epochs), "--seed", str(seed)]
    return train(np_, [*args, "--rebalance"] if rebalance else args, out)


def per_epoch(rec: dict) -> list[dict]:
    """Achieved vs ideal throughput of every epoch of one record."""
    n = rec["plan"]["dataset_size"] - rec["plan"]["dropped"]
    rows = []
    for row, bal in zip(rec["epochs"], rec["balance"]):
        achieved = n / row["time_s"]
        ideal = sum(bal["measured_samples_per_s"])
        rows.append({"epoch": row["epoch"], "batches": bal["batches"],
                     "samples_per_s": achieved, "ideal_samples_per_s": ideal,
                     "fraction_of_ideal": achieved / ideal, "imbalance": bal["imbalance"],
                     "replanned": bal["replanned"], "test_accuracy": row["test_accuracy"]})
    return rows


def plot(result: dict, path: Path) -> None:
    """Per scenario, each mode's fraction of the ideal per epoch (mean over repeats)."""
    names = list(result["scenarios"])
    fig, axes = figures.panels(len(names), 6, 4)
    for ax, name in zip(axes, names):
        sc = result["scenarios"][name]
        for mode, style in (("static", "o-"), ("rebalance", "s-"), ("oracle", "^:")):
            mean = figures.mean_curve([[r["fraction_of_ideal"] for r in rows]
                                       for rows in sc["runs"][mode]])
            ax.plot(range(1, len(mean) + 1), mean, style, label=mode)
        ax.axvline(sc["change_epoch"] + 0.5, color="grey", ls=":", label="slowdown")
        ax.axhline(0.9, color="grey", ls="--", lw=0.8, label="90% of ideal")
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("epoch")
        ax.set_ylabel("throughput / ideal of that epoch")
        ax.set_title(f"{name}\n{sc['schedule']}")
        ax.legend(loc="lower left", fontsize=8)
    figures.save(fig, path)


def scenario(name: str, args: argparse.Namespace, tmp: Path) -> dict:
    """Every mode ``--repeats`` times (seed = repeat), interleaved, and the summary."""
    schedule, change = SCENARIOS[name]
    after_change = schedule.split(";")[1].split(":")[1]
    runs: dict[str, list] = {m: [] for m in MODES}
    for rep, mode in interleaved(MODES, args.repeats):
        rec = run(args.np_, after_change if mode == "oracle" else schedule, args.epochs,
                  args.unit, rep, mode == "rebalance", tmp / f"{name}-{mode}-{rep}.json")
        runs[mode].append(per_epoch(rec))
        print(f"{name} {mode} seed {rep}: "
              + " ".join(f"{r['fraction_of_ideal']:.2f}" for r in runs[mode][-1]), flush=True)
    # the plan can change after the slowed epoch is measured: judge the epochs after it
    after = range(change + 1, args.epochs)
    return {"schedule": schedule, "change_epoch": change,
            "judged_epochs": [e + 1 for e in after], "summary": summarize(runs, after),
            "runs": runs}


def summarize(runs: dict[str, list], after: range) -> dict:
    """Per mode, the judged epochs' fraction of the ideal, throughput and final accuracy;
    the modes' throughput ratios, and which are within 10 % of the ideal and the oracle."""
    summary = {}
    for mode, recs in runs.items():
        fr = [rows[e]["fraction_of_ideal"] for rows in recs for e in after]
        thr = [rows[e]["samples_per_s"] for rows in recs for e in after]
        summary[mode] = {"fraction_of_ideal_mean": statistics.mean(fr),
                         "fraction_of_ideal_min": min(fr),
                         "samples_per_s_mean": statistics.mean(thr),
                         "final_test_accuracy_mean": statistics.mean(
                             rows[-1]["test_accuracy"] for rows in recs)}
    thr = {m: summary[m]["samples_per_s_mean"] for m in MODES}
    summary["rebalance_over_static_throughput"] = thr["rebalance"] / thr["static"]
    summary["rebalance_over_oracle_throughput"] = thr["rebalance"] / thr["oracle"]
    summary["static_over_oracle_throughput"] = thr["static"] / thr["oracle"]
    for m in ("static", "rebalance"):
        summary[f"{m}_within_10pct_of_ideal"] = summary[m]["fraction_of_ideal_mean"] >= 0.9
        summary[f"{m}_within_10pct_of_oracle"] = thr[m] / thr["oracle"] >= 0.9
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", dest="np_", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--unit", type=float, default=2e-3, help="--emulate-unit")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="results/bench_rebalance.json")
    ap.add_argument("--plot", default="docs/img/rebalance.png")
    args = ap.parse_args()

    result = {"ranks": args.np_, "epochs": args.epochs, "emulate_unit": args.unit,
              "repeats": args.repeats, "scenarios": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in SCENARIOS:
            result["scenarios"][name] = scenario(name, args, Path(tmp))
            print(name, json.dumps(result["scenarios"][name]["summary"], indent=2), flush=True)
            results.save(result, args.out)
    plot(result, ROOT / args.plot)
    print(f"bench_rebalance: {args.out}, {args.plot}")


if __name__ == "__main__":
    main()
