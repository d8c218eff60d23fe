#!/usr/bin/env python
"""Time to a target accuracy: the goodput-chosen global batch (``--adaptive-batch``) against
fixed global batches -- the task's default ``B_0`` and a grid up to the range's top.

One task (MNIST-1D, ``cnn1d``, Adam, ``B_0`` = 100 at learning rate 0.02, its best of
0.005-0.04: ``results/goodput/lr-b0``); a fixed ``B`` runs at ``0.02 sqrt(B / B_0)`` (the
square-root rule) unless the arm names its rate (``--grid 400-lr0.02``).
Scenarios: emulated speeds (``1,1,2,4@1e-4``: 4 ranks of speeds 1,1,2,4 sleeping 0.1 ms per
sample at speed 1) and fixed CPU shares (``quota:1,0.25``: 2 ranks, the second capped at a
quarter of its core; real compute). Per scenario, every seed runs every arm once, the arms in
a fresh random order every seed. Time to target = the wall time from the training's start to
the end of the first epoch whose test accuracy reaches the target (the work between epochs
included, evaluation left out: the same for every arm; records from before ``elapsed_s``:
the epochs' training times); the probe's time (a job's fixed cost, longer for the adaptive
arm, which times batches up to the range's top) is reported beside it, and the ratios also
with it added.
Resumable: each run writes DIR/<scenario>_<arm>_s<seed>.json. At the end: DIR/goodput.json,
DIR/goodput.md and one accuracy-vs-time plot per scenario.

    .venv/bin/python scripts/bench_goodput.py --dir results/goodput
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from bench.figures import panels, pyplot, save
from bench.launch import train_once
from bench.placement import profile
from bench.schedule import interleaved
from bench.tables import markdown, num
from hetgrad.goodput import default_lr_rule

TASK = ["--model", "cnn1d", "--optimizer", "adam"]
B0, LR0, TOP = 100, 0.02, 800


def mnist1d_data(size: int, cache: Path) -> str:
    """``mnist1d`` for its own 5,000 samples, else an ``.npz`` of ``size`` MNIST-1D samples
    (80 % train) made with the package's published arguments but that number (cached in
    ``cache``): longer epochs, so the first epoch's tracing weighs less."""
    if size == 5000:
        return "mnist1d"
    path = cache / f"mnist1d-{size}.npz"
    if not path.exists():
        import numpy as np
        from mnist1d.data import get_dataset_args, make_dataset
        args = get_dataset_args()
        args.num_samples = size
        d = make_dataset(args)
        cache.mkdir(parents=True, exist_ok=True)
        np.savez(path, x_train=d["x"].astype(np.float32), y_train=d["y"],
                 x_test=d["x_test"].astype(np.float32), y_test=d["y_test"])
    return str(path)


def tag_of(scenario: str) -> str:
    """A scenario's name in file names: ``1,1,2,4@1e-4`` -> ``1-1-2-4-1e-4``."""
    return scenario.replace(",", "-").replace(":", "-").replace("@", "-")


def adaptive_arm(rule: str) -> str:
    """The arm of ``--lr-rule rule``: ``adaptive`` for the default (Adam's)."""
    return "adaptive" if rule == default_lr_rule(sgd=False) else f"adaptive-{rule}"


def fixed_arm(arm: str) -> tuple[int, float | None]:
    """``fixed-B`` -> (B, None: the square-root rule's rate); ``fixed-B-lrRATE`` -> (B, RATE).
    ValueError for anything else."""
    size, _, rate = arm.removeprefix("fixed-").partition("-lr")
    if not arm.startswith("fixed-") or int(size) < 1:
        raise ValueError(arm)
    return int(size), float(rate) if rate else None


def arm_args(arm: str, lr0: float = LR0) -> list[str]:
    if arm.startswith("adaptive"):
        rule = arm[len("adaptive-"):]
        return ["-B", str(B0), "--lr", str(lr0), "--adaptive-batch",
                "--batch-range", f"{B0},{TOP}", *(["--lr-rule", rule] if rule else [])]
    b, rate = fixed_arm(arm)
    return ["-B", str(b), "--lr", f"{rate if rate else lr0 * math.sqrt(b / B0):.6g}"]


def curve(rec: dict) -> list[tuple[float, float]]:
    """(seconds, test accuracy) after every epoch: rank 0's wall time since the training's
    start (``elapsed_s``: what runs between the epochs counted too, e.g. the adaptive arm's
    choice) less the evaluations up to then (the same for every arm); for a record from
    before ``elapsed_s``, the epochs' training times summed. The probe before is left out:
    a job's fixed cost, reported on its own."""
    t, evaluated, out = 0.0, 0.0, []
    for row in rec["epochs"]:
        t += row["time_s"]
        evaluated += evaluation_s(row)
        out.append((row["elapsed_s"] - evaluated if "elapsed_s" in row else t,
                    row["test_accuracy"]))
    return out


def evaluation_s(row: dict) -> float:
    """An epoch's seconds of evaluation: rank 0's test-set score and a fit's validation."""
    return row.get("eval_time_s", 0.0) + row.get("validation_s", 0.0)


def time_to(rec: dict, target: float) -> float | None:
    return next((t for t, acc in curve(rec) if acc >= target), None)


def between(rec: dict) -> float:
    """Seconds per epoch outside its fits and evaluation: the work between epochs (the
    adaptive arm's choice and re-plan, checkpoints, barriers); from the run's wall time
    for a record from before ``elapsed_s``."""
    rows = rec["epochs"]
    end = rows[-1]["elapsed_s"] if "elapsed_s" in rows[-1] else rec["wall_time_s"]
    inside = sum(r["time_s"] + evaluation_s(r) for r in rows)
    return (end - inside) / len(rows)


def run_all(args, out: Path) -> None:
    arms = [*map(adaptive_arm, args.rules), *(f"fixed-{b}" for b in args.grid)]
    data = ["--data", mnist1d_data(args.data_size, out / "data")]
    for scenario in args.scenarios:
        ranks, extra, placement = profile(scenario)
        for seed, arm in interleaved(arms, args.seeds):
            train_once(out / f"{tag_of(scenario)}_{arm}_s{seed}.json", ranks,
                       [*TASK, *data, *arm_args(arm, args.lr0), *extra, "--seed", str(seed),
                        "--epochs", str(args.epochs)], placement, tag="goodput",
                       scenario=scenario, arm=arm, seed=seed)


def records(out: Path) -> dict[str, dict[str, dict[int, dict]]]:
    """The run's records as ``{scenario: {arm: {seed: record}}}``, scenarios sorted."""
    runs = [json.loads(p.read_text()) for p in sorted(out.glob("*_s*.json"))]
    grouped: dict = {}
    for r in sorted(runs, key=lambda r: r["scenario"]):
        grouped.setdefault(r["scenario"], {}).setdefault(r["arm"], {})[r["seed"]] = r
    return grouped


def summarize(out: Path, target: float) -> list[dict]:
    """Per scenario and arm: time to target per seed, its mean, final accuracy; and the
    adaptive arm's paired ratios to the default and to the best fixed arm."""
    rows = []
    for scenario, by_arm in records(out).items():
        walls = {"elapsed_s" in r["epochs"][0]
                 for seeds in by_arm.values() for r in seeds.values()}
        if len(walls) > 1:   # wall times against fits' times: no ratio to take
            raise SystemExit(f"bench: {out}: scenario {scenario} mixes records with and without "
                             "elapsed_s (runs before and after wall time was counted); "
                             "run it again in a new --dir")
        for arm, seeds in sorted(by_arm.items()):
            times = {s: time_to(r, target) for s, r in seeds.items()}
            reached = [t for t in times.values() if t is not None]
            rows.append({"scenario": scenario, "arm": arm, "seeds": len(seeds),
                         "time_to_target": times,
                         "probe_s": statistics.mean(r["probe_time_s"] for r in seeds.values()),
                         "probe_by_seed": {s: r["probe_time_s"] for s, r in seeds.items()},
                         "between_s": statistics.mean(map(between, seeds.values())),
                         "mean_time": statistics.mean(reached) if len(reached) == len(times)
                         else None,
                         "final_accuracy": statistics.mean(r["final_test_accuracy"]
                                                          for r in seeds.values()),
                         "final_by_seed": {s: r["final_test_accuracy"]
                                           for s, r in seeds.items()},
                         "batches": {s: [e.get("global_batch") for e in r["epochs"]]
                                     for s, r in seeds.items()}})
    return rows


def ratios(rows: list[dict], default: str) -> list[dict]:
    """Per scenario and adaptive arm: its time to target over the default's and the best
    fixed arm's (the one with the least mean time), per seed, and their mean; the mean also
    with each run's probe added to its time."""
    out = []
    for scenario in sorted({r["scenario"] for r in rows}):
        arms = {r["arm"]: r for r in rows if r["scenario"] == scenario}
        fixed = [r for a, r in arms.items() if a.startswith("fixed")
                 and r["mean_time"] is not None]
        if not fixed:
            continue
        best = min(fixed, key=lambda r: r["mean_time"])
        for arm in sorted(a for a in arms if a.startswith("adaptive")):
            ada = arms[arm]["time_to_target"]
            for name, other in (("default", arms.get(default)), ("best fixed", best)):
                if other is None:
                    continue
                seeds = [s for s in ada if ada[s] and other["time_to_target"].get(s)]
                per = [ada[s] / other["time_to_target"][s] for s in seeds]
                probed = [(ada[s] + arms[arm]["probe_by_seed"][s])
                          / (other["time_to_target"][s] + other["probe_by_seed"][s])
                          for s in seeds]
                out.append({"scenario": scenario, "arm": arm,
                            "versus": f"{name} ({other['arm']})", "ratios": per,
                            "mean_ratio": statistics.mean(per) if per else None,
                            "mean_ratio_with_probe": statistics.mean(probed) if per else None,
                            "accuracy_diff": arms[arm]["final_accuracy"]
                            - other["final_accuracy"],
                            "paired_accuracy": paired_difference(
                                arms[arm].get("final_by_seed"), other.get("final_by_seed")),
                            "paired_probe_s": paired_difference(
                                arms[arm]["probe_by_seed"], other["probe_by_seed"])})
    return out


def paired_difference(mine: dict | None, theirs: dict | None) -> tuple[float, float] | None:
    """A figure's difference seed by seed (the seeds both ran): its mean and the standard
    error of that mean (None for fewer than 2 common seeds, or older rows)."""
    seeds = sorted(set(mine or {}) & set(theirs or {}))
    if len(seeds) < 2:
        return None
    diffs = [mine[s] - theirs[s] for s in seeds]
    return statistics.mean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs))


def tables(rows: list[dict], paired: list[dict], target: float) -> str:
    arms = markdown(["scenario", "arm", "seeds", "time to target (s), per seed", "mean",
                     "probe (s)", "between epochs (s/epoch)", "final test acc",
                     "global batch per epoch (seed 0)"],
                    [[r["scenario"], r["arm"], r["seeds"],
                      ", ".join(num(t, ".1f") for _, t in sorted(r["time_to_target"].items())),
                      num(r["mean_time"], ".1f"), f"{r['probe_s']:.1f}",
                      f"{r['between_s']:.2f}",
                      f"{r['final_accuracy']:.3f}",
                      _batches(r["batches"].get(0))] for r in rows])
    vs = markdown(["scenario", "arm", "vs", "time ratio per seed", "mean",
                   "mean, the probe added", "final acc diff (paired mean +- SE)",
                   "probe diff (s, paired)"],
                  [[p["scenario"], p.get("arm", "adaptive"), p["versus"],
                    ", ".join(f"{x:.2f}" for x in p["ratios"]),
                    num(p["mean_ratio"], ".2f"), num(p.get("mean_ratio_with_probe"), ".2f"),
                    _accuracy(p), _plus_minus(p.get("paired_probe_s"), 1, "s")]
                   for p in paired])
    return f"Target test accuracy {target}.\n\n{arms}\n\n{vs}\n"


def _accuracy(p: dict) -> str:
    if not p.get("paired_accuracy"):
        return f"{100 * p['accuracy_diff']:+.1f} pts"
    return _plus_minus(p["paired_accuracy"], 100, "pts")


def _plus_minus(pair: tuple[float, float] | None, scale: float, unit: str) -> str:
    """``mean +- SE`` of :func:`paired_difference` in ``unit`` (``-``: none)."""
    return "-" if not pair else f"{scale * pair[0]:+.2f} +- {scale * pair[1]:.2f} {unit}"


def _batches(batches: list | None) -> str:
    if not batches:
        return "-"
    runs, last = [], None
    for b in batches:
        if b != last:
            runs.append(str(b))
        last = b
    return " -> ".join(runs)


def plot(out: Path, target: float) -> list[Path]:
    runs = [json.loads(p.read_text()) for p in sorted(out.glob("*_s*.json"))]
    plt, paths = pyplot(), []
    for scenario in sorted({r["scenario"] for r in runs}):
        fig, (ax,) = panels(1, 6.5, 4.2)
        arms = sorted({r["arm"] for r in runs if r["scenario"] == scenario})
        for k, arm in enumerate(arms):
            for r in (r for r in runs if r["scenario"] == scenario and r["arm"] == arm):
                t, acc = zip(*curve(r))
                ax.plot(t, acc, color=f"C{k}", lw=2.2 if arm.startswith("adaptive") else 1.0,
                        alpha=0.8, label=arm if r["seed"] == 0 else None)
        ax.axhline(target, color="grey", ls=":", lw=1)
        ax.set(xlabel="seconds of training", ylabel="test accuracy",
               title=f"MNIST-1D cnn1d, {scenario}")
        ax.legend(fontsize=8)
        paths.append(save(fig, out / f"goodput_{tag_of(scenario)}.png"))
        plt.close(fig)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="results/goodput")
    ap.add_argument("--scenarios", default="1,1,2,4@1e-4;quota:1,0.25",
                    help="';'-separated: SPEEDS@UNIT (emulated) or quota:SHARES")
    ap.add_argument("--grid", default="100,200,400,800",
                    help="fixed global batches: B (at the square-root rule's rate) or "
                         "B-lrRATE (e.g. 100-lr0.02: at that rate)")
    ap.add_argument("--rules", default=default_lr_rule(sgd=False),
                    help="learning-rate rules of the adaptive arms (hetgrad train --lr-rule); "
                         "'' for none")
    ap.add_argument("--lr0", type=float, default=LR0,
                    help="the learning rate at B_0 (the adaptive arm's; fixed arms at "
                         "lr0 sqrt(B / B_0))")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--data-size", type=int, default=5000,
                    help="MNIST-1D samples (5000: the package's own set)")
    args = ap.parse_args()
    args.scenarios = args.scenarios.split(";")
    args.grid = args.grid.split(",")
    for b in args.grid:
        try:
            fixed_arm(f"fixed-{b}")
        except ValueError:
            ap.error(f"--grid: {b!r} is neither a batch B nor B-lrRATE (e.g. 100-lr0.02)")
    args.rules = [r for r in args.rules.split(",") if r]
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    run_all(args, out)
    rows = summarize(out, args.target)
    paired = ratios(rows, f"fixed-{B0}")
    (out / "goodput.json").write_text(json.dumps({"target": args.target, "arms": rows,
                                                  "adaptive_vs": paired}, indent=1))
    md = tables(rows, paired, args.target)
    (out / "goodput.md").write_text(md)
    print(md)
    for p in plot(out, args.target):
        print("plot:", p)


if __name__ == "__main__":
    main()
