"""The arms against an oracle: per scenario, a grid search of static splits around the affine
plan finds the ``oracle`` arm, then every arm of :data:`~.scenarios.ARMS` runs ``repeats``
times, interleaved (:mod:`bench.schedule`). Its tables and bar plot."""
from __future__ import annotations

import itertools
import statistics
from pathlib import Path

from bench import figures
from bench.launch import train
from bench.placement import placed
from bench.schedule import interleaved, rounds
from bench.tables import markdown as md_table, ms, num, series

from .scenarios import ARMS, MODELLED, SCENARIOS, Launch, summary


def grid(batches: list[int], step: int) -> list[list[int]]:
    """The split itself and every split with ``step`` samples moved from one rank to another."""
    out = [list(batches)]
    for i, j in itertools.permutations(range(len(batches)), 2):
        if batches[i] - step >= 1:
            moved = list(batches)
            moved[i] -= step
            moved[j] += step
            out.append(moved)
    return out


def oracle_search(name: str, np_: int, args: list[str], wrap: list[str] | None, epochs: int,
                  tmp: Path, confirm: int = 2, launch: Launch = train) -> dict:
    """Run the grid around the affine plan once per split, then the best 3 splits ``confirm``
    more times (one short run's noise must not pick the oracle), all in random order; return
    the split with the best median and every run's throughput."""
    from hetgrad.partition import fixed_plan
    base = launch(np_, [*args, "--epochs", "2"], tmp / f"{name}-base.json", wrap=wrap)
    batches, n = base["plan"]["batches"], base["plan"]["dataset_size"]
    tried = [{"batches": split, "samples_per_s": []}
             for split in grid(batches, max(1, sum(batches) // 48))]

    def measure(k: int) -> None:
        t, path = tried[k], tmp / f"{name}-grid{k}.plan.json"
        fixed_plan(t["batches"], n).save(path)
        rec = launch(np_, [*args, "--plan", str(path), "--epochs", str(max(3, epochs - 1)),
                           "--seed", str(len(t["samples_per_s"]))],
                     tmp / f"{name}-grid{k}.json", wrap=wrap)
        t["samples_per_s"].append(rec["samples_per_s"])
        print(f"{name} grid {t['batches']}: {rec['samples_per_s']:.0f} samples/s", flush=True)

    for k in next(rounds(range(len(tried)), 1)):
        measure(k)
    top = sorted(range(len(tried)), key=lambda k: -tried[k]["samples_per_s"][0])[:3]
    for _, k in interleaved(top, confirm, seed=1):
        measure(k)
    best = max((tried[k] for k in top), key=lambda t: statistics.median(t["samples_per_s"]))
    path = tmp / f"{name}-oracle.plan.json"
    fixed_plan(best["batches"], n).save(path)
    return {"plan_file": str(path), "best": best["batches"], "grid": tried}


def run_scenario(name: str, epochs: int, repeats: int, tmp: Path,
                 launch: Launch = train) -> dict:
    """The oracle search, then every arm ``repeats`` times (seed = repeat), interleaved."""
    np_, args, placement = SCENARIOS[name]
    batch = int(args[args.index("-B") + 1])
    if batch % np_:  # the equal arm needs it; say so before the oracle search, not after
        raise SystemExit(f"bench_perfmodel: scenario {name}: -B {batch} is not divisible by "
                         f"{np_} ranks (the equal arm needs it)")
    with placed(placement) as wrap:
        oracle = oracle_search(name, np_, args, wrap, epochs, tmp, launch=launch)
        runs: dict[str, list] = {arm: [] for arm in ARMS}
        for rep, arm in interleaved(list(ARMS), repeats):
            extra = ARMS[arm] if ARMS[arm] is not None else ["--plan", oracle["plan_file"]]
            rec = launch(np_, [*args, *extra, "--epochs", str(epochs), "--seed", str(rep)],
                         tmp / f"{name}-{arm}-{rep}.json", wrap=wrap)
            runs[arm].append(summary(rec))
            print(f"{name} {arm} rep {rep}: {runs[arm][-1]['samples_per_s']:.0f} samples/s "
                  f"batches {runs[arm][-1]['final_batches']}", flush=True)
    return {"ranks": np_, "args": args, "placement": placement, "oracle_search": oracle,
            "runs": runs, "table": table(runs)}


def table(runs: dict[str, list]) -> dict:
    """Per arm: median throughput, its ratio to the oracle's, and the model's checks."""
    med = {arm: statistics.median(r["samples_per_s"] for r in rs) for arm, rs in runs.items()}
    out = {}
    for arm, rs in runs.items():
        row = {"samples_per_s_median": med[arm], "over_oracle": med[arm] / med["oracle"],
               "over_equal": med[arm] / med["equal"],
               "efficiency_median": statistics.median(r["efficiency"] for r in rs),
               "ratios_over_oracle_per_repeat": [r["samples_per_s"] / o["samples_per_s"]
                                                 for r, o in zip(rs, runs["oracle"])],
               "replans_after_epoch_2": [r["replans_after_epoch_2"] for r in rs],
               "final_test_accuracy_mean": statistics.mean(r["final_test_accuracy"] for r in rs)}
        imb = [r["steady_imbalance"] for r in rs if r["steady_imbalance"] is not None]
        row["steady_imbalance_median"] = statistics.median(imb) if imb else None
        modelled = [r for r in rs if arm in MODELLED and r["predicted_step_s"]]
        pred = [r["predicted_step_s"] / r["measured_step_s"] for r in modelled
                if r["measured_step_s"] and r["batches"] == r["final_batches"]]
        row["predicted_over_measured_step"] = statistics.median(pred) if pred else None
        # the efficiency the plan's own prediction reaches: with fixed costs a_i > 0 it is
        # below 1 even for a perfect split with no exchange
        ceil = [sum(r["batches"]) / r["predicted_step_s"] / r["sum_probed_samples_per_s"]
                for r in modelled]
        row["predicted_efficiency_median"] = statistics.median(ceil) if ceil else None
        out[arm] = row
    return out


def markdown(result: dict) -> str:
    """The docs/results.md table: one row per scenario and arm."""
    header = ["scenario", "arm", "batches (final)", "samples/s", "/ oracle (per repeat)",
              "/ equal", "efficiency vs sum s_i (predicted)", "steady imbalance",
              "predicted / measured step", "re-plans after epoch 2", "final acc"]
    rows = []
    for name, sc in result["scenarios"].items():
        for arm, row in table(sc["runs"]).items():
            rows.append([
                name, arm, sc["runs"][arm][-1]["final_batches"],
                f"{row['samples_per_s_median']:.0f}",
                f"{row['over_oracle']:.3f} ({series(row['ratios_over_oracle_per_repeat'])})",
                f"{row['over_equal']:.2f}",
                f"{row['efficiency_median']:.2f} "
                f"({num(row.get('predicted_efficiency_median'), '.2f')})",
                num(row["steady_imbalance_median"], ".3f"),
                num(row["predicted_over_measured_step"], ".2f"),
                sum(row["replans_after_epoch_2"]), f"{row['final_test_accuracy_mean']:.3f}"])
    return md_table(header, rows)


def gap_markdown(result: dict, arm: str = "affine") -> str:
    """Where efficiency goes, per scenario (medians over the arm's repeats, per step): the
    ideal ``B / sum s_i``, the plan's predicted step, the slowest rank's measured busy step,
    and the epoch time per step (samples per step / throughput)."""
    def against(v: float, ref: float) -> str:
        return f"{ms(v)} ({100 * (v / ref - 1):+.1f} %)"

    rows = []
    for name, sc in result["scenarios"].items():
        rs = [r for r in sc["runs"].get(arm, []) if r["predicted_step_s"] and r["measured_step_s"]]
        if not rs:
            continue
        med = lambda f: statistics.median(f(r) for r in rs)  # noqa: E731
        ideal = med(lambda r: sum(r["batches"]) / r["sum_probed_samples_per_s"])
        pred, busy = med(lambda r: r["predicted_step_s"]), med(lambda r: r["measured_step_s"])
        step = med(lambda r: sum(r["final_batches"]) / r["samples_per_s"])
        rows.append([name, ms(ideal), against(pred, ideal), against(busy, pred),
                     against(step, busy), f"{med(lambda r: r['efficiency']):.2f}"])
    return md_table(["scenario", "B / sum s_i", "predicted step", "slowest busy step",
                     "epoch time / steps", "efficiency"], rows)


def plot(result: dict, path: Path) -> None:
    """Bars: every arm's median throughput over the oracle's, per scenario."""
    names = list(result["scenarios"])
    present = {a for n in names for a in result["scenarios"][n]["table"]}
    arms = [a for a in [*ARMS, *sorted(present - set(ARMS))] if a in present]
    fig, (ax,) = figures.panels(1, max(8.0, 2.2 * len(names) + 2), 4.6)
    figures.grouped_bars(ax, names, {  # (not every scenario ran every arm: no bar)
        arm: [result["scenarios"][n]["table"].get(arm, {}).get("over_oracle", float("nan"))
              for n in names] for arm in arms})
    ax.axhline(0.97, color="grey", ls="--", lw=0.8, label="0.97 of oracle")
    ax.set_ylabel("throughput / oracle's (median of repeats)")
    ax.set_ylim(0, 1.15)
    ax.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    figures.save(fig, path)
