"""The seed's claim, per cell (task, speed profile): weighted's final accuracy against
uneven-avg's -- the paired difference over seeds (a seed fixes the initial weights and the
order of samples in every mode) with its 95 % t interval -- and the epoch times behind
"at comparable speed"."""
from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from hetgrad.report import group_key

T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042}   # Student t, 97.5 % quantile


def t975(df: int) -> float:
    """The 97.5 % quantile of Student's t with ``df`` degrees of freedom (the next smaller
    tabulated one: an interval never narrower than it should be)."""
    return T975[max(k for k in T975 if k <= df)] if df < 30 else 1.96 + 2.4 / df


def paired(a: dict[int, float], b: dict[int, float]) -> dict:
    """Mean of ``a[s] - b[s]`` over the seeds in both, with its 95 % interval."""
    d = np.array([a[s] - b[s] for s in sorted(set(a) & set(b))])
    if d.size < 2:
        return {"n": int(d.size), "mean": float(d.mean()) if d.size else math.nan,
                "low": math.nan, "high": math.nan}
    half = t975(d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
    return {"n": int(d.size), "mean": float(d.mean()), "low": float(d.mean() - half),
            "high": float(d.mean() + half)}


def verdict(diff: dict, time_ratio: float, speedup: float | None) -> str:
    """What the cell says of the claim (accuracy >= uneven-avg's, epoch time within 5 % of
    it, >= 1.25x faster than equal)."""
    if math.isnan(diff["low"]):
        return "too few seeds"
    acc = ("better" if diff["low"] > 0 else "worse" if diff["high"] < 0 else "no difference "
           "resolved")
    fast = time_ratio <= 1.05 and (speedup is None or speedup >= 1.25)
    return f"accuracy {acc}; speed {'as claimed' if fast else 'short of the claim'}"


def cells(runs: list[dict]) -> list[dict]:
    """One row per (task, profile): per mode final/best accuracy and median epoch time by
    seed, weighted - uneven-avg paired, and the verdict."""
    by = defaultdict(lambda: defaultdict(dict))
    for r in runs:
        task, profile, mode = group_key(r)
        by[(task, profile)][mode][r["config"]["seed"]] = r
    rows = []
    for (task, profile), modes in sorted(by.items()):
        final = {m: {s: r["final_test_accuracy"] for s, r in rs.items()} for m, rs in modes.items()}
        best = {m: {s: r["best_test_accuracy"] for s, r in rs.items()} for m, rs in modes.items()}
        epoch = {m: float(np.mean([r["median_epoch_time_s"] for r in rs.values()]))
                 for m, rs in modes.items()}
        row = {"task": task, "profile": profile, "seeds": {m: len(rs) for m, rs in modes.items()},
               "final_acc": {m: _mean_sd(v) for m, v in final.items()},
               "best_acc": {m: _mean_sd(v) for m, v in best.items()},
               "epoch_time_s": epoch}
        if {"weighted", "uneven-avg"} <= set(modes):
            row["diff_final"] = paired(final["weighted"], final["uneven-avg"])
            row["diff_best"] = paired(best["weighted"], best["uneven-avg"])
            row["time_ratio"] = epoch["weighted"] / epoch["uneven-avg"]
            row["speedup_vs_equal"] = (epoch["equal"] / epoch["weighted"]
                                       if "equal" in epoch else None)
            row["verdict"] = verdict(row["diff_final"], row["time_ratio"],
                                     row["speedup_vs_equal"])
        rows.append(row)
    return rows


def _mean_sd(by_seed: dict) -> list[float]:
    v = np.array(list(by_seed.values()), float)
    return [float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0]


def markdown(rows: list[dict]) -> str:
    """The claim table: a line per cell."""
    def acc(row, key, mode):
        m, s = row[key].get(mode, [math.nan, math.nan])
        return f"{m:.3f} ± {s:.3f}"

    def ci(d):
        return f"{d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]"

    lines = ["| task | speeds | seeds | final acc equal / uneven-avg / weighted | weighted - "
             "uneven-avg, final (95 % CI) | ... best | epoch time w / u-a | speed-up of w vs "
             "equal | verdict |", "|" + "---|" * 9]
    for r in rows:
        if "diff_final" not in r:
            continue
        sp = "–" if r["speedup_vs_equal"] is None else f"{r['speedup_vs_equal']:.2f}x"
        lines.append(
            f"| {r['task']} | {r['profile']} | {r['diff_final']['n']} | "
            f"{acc(r, 'final_acc', 'equal')} / {acc(r, 'final_acc', 'uneven-avg')} / "
            f"{acc(r, 'final_acc', 'weighted')} | {ci(r['diff_final'])} | "
            f"{ci(r['diff_best'])} | {r['time_ratio']:.3f} | {sp} | {r['verdict']} |")
    return "\n".join(lines) + "\n"
