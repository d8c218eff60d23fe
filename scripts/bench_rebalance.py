#!/usr/bin/env python
"""Mid-run slowdown: throughput of a static plan vs ``--rebalance``, as a fraction of the ideal.

Launches ``hetgrad train`` on local ranks (mpirun) with an emulated speed schedule in which one
rank becomes slower part-way through, once with the plan fixed and once with ``--rebalance``,
alternating the order over repeats so machine noise hits both alike. Per epoch it compares the
achieved throughput (samples / epoch time) with the *ideal* of that epoch, the sum over ranks
of the speed each rank showed while busy (``samples_i / busy_i``, measured by the train step):
what the job would reach if no rank ever waited or communicated. A third arm, ``oracle``, runs
at the post-change speeds from the start (probe -> plan for them, no rebalance): the best a
plan made with foresight does. Writes JSON and a plot.

    .venv/bin/python scripts/bench_rebalance.py --out results/bench_rebalance.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCENARIOS = {  # name: (schedule, epoch index from which the change applies)
    "equal-then-rank1-4x-slower": ("1,1,1;3:1,0.25,1", 3),
    "hetero-then-fastest-4x-slower": ("1,2,4;3:1,2,1", 3),
}


MODES = ("static", "rebalance", "oracle")


def run(np_: int, schedule: str, epochs: int, unit: float, seed: int, rebalance: bool,
        out: Path) -> dict:
    from hetgrad.cli import mpirun_command
    args = ["train", "--emulate-speeds", schedule, "--emulate-unit", str(unit),
            "--epochs", str(epochs), "--seed", str(seed), "--quiet", "--out", str(out)]
    if rebalance:
        args.append("--rebalance")
    p = subprocess.run(mpirun_command(np_, args), capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"bench_rebalance: run failed:\n{p.stderr[-3000:]}")
    return json.loads(out.read_text())


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
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(result["scenarios"])
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        sc = result["scenarios"][name]
        for mode, style in (("static", "o-"), ("rebalance", "s-"), ("oracle", "^:")):
            curves = [[r["fraction_of_ideal"] for r in rows] for rows in sc["runs"][mode]]
            mean = [statistics.mean(c) for c in zip(*curves)]
            ax.plot(range(1, len(mean) + 1), mean, style, label=mode)
        ax.axvline(sc["change_epoch"] + 0.5, color="grey", ls=":", label="slowdown")
        ax.axhline(0.9, color="grey", ls="--", lw=0.8, label="90% of ideal")
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("epoch")
        ax.set_ylabel("throughput / ideal of that epoch")
        ax.set_title(f"{name}\n{sc['schedule']}")
        ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


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
        for name, (schedule, change) in SCENARIOS.items():
            runs: dict[str, list] = {m: [] for m in MODES}
            after_change = schedule.split(";")[1].split(":")[1]
            for rep in range(args.repeats):
                for mode in MODES if rep % 2 == 0 else MODES[::-1]:
                    rec = run(args.np_, after_change if mode == "oracle" else schedule,
                              args.epochs, args.unit, rep, mode == "rebalance",
                              Path(tmp) / f"{name}-{mode}-{rep}.json")
                    runs[mode].append(per_epoch(rec))
                    print(f"{name} {mode} seed {rep}: "
                          + " ".join(f"{r['fraction_of_ideal']:.2f}" for r in runs[mode][-1]),
                          flush=True)
            # the plan can change after the slowed epoch is measured: judge the epochs after it
            after = range(change + 1, args.epochs)
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
                summary[f"{m}_within_10pct_of_ideal"] = (
                    summary[m]["fraction_of_ideal_mean"] >= 0.9)
                summary[f"{m}_within_10pct_of_oracle"] = thr[m] / thr["oracle"] >= 0.9
            result["scenarios"][name] = {"schedule": schedule, "change_epoch": change,
                                         "judged_epochs": [e + 1 for e in after],
                                         "summary": summary, "runs": runs}
            print(name, json.dumps(summary, indent=2), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    plot(result, ROOT / args.plot if not Path(args.plot).is_absolute() else Path(args.plot))
    print(f"bench_rebalance: {args.out}, {args.plot}")


if __name__ == "__main__":
    main()
