#!/usr/bin/env python
"""Plans from the performance model vs the constant-speed plan, Horovod's equal split and an
oracle, under emulated and real heterogeneity (CPU affinity, CPU quotas).

Per scenario, first an oracle search: short runs of a grid of static batch splits around the
affine plan (every ordered pair of ranks, one step of samples moved), the 3 fastest run twice
more, the best by median becomes the ``oracle`` arm. Then the arms, interleaved (the order turns every repeat):

- ``equal``: Horovod's split (``--mode equal``);
- ``constant``: the old plan, one probe size, constant speed (``--probe-sizes 1``);
- ``affine``: the default, probe at 3 sizes, equal predicted step time;
- ``refined``: ``affine``, then every rank timed at its planned batch, all in lockstep, and
  its model scaled through that point before the plan is made (``--probe-refine 1``);
- ``rebalance``: affine plus ``--rebalance`` (the online model);
- ``oracle``: the best split the grid found (``--plan``).

Throughput = samples per epoch / median epoch time without the first (tracing) epoch. Writes
JSON (every record's summary) and a bar plot.

``--churn N`` instead runs only the ``rebalance`` arm (or, for ``--scenarios
SCENARIO:ARM``, that arm) for N epochs (``--repeats`` times, the runs interleaved, no oracle)
and keeps every epoch's imbalance and decision: does the online model re-plan on noise when
speeds do not change? And ``SCENARIO:equal`` on equal ranks: how imbalanced does noise alone
make a balanced job? Its rows go under ``churn`` in the same JSON.

``--breakdown`` instead runs :data:`BREAKDOWN` once each (the slow emulated rank alone, then
beside a fast one under three Horovod cycle times): where one step's time goes, under
``breakdown`` in the JSON.

``--ceiling [SET]`` instead runs a :data:`CEILINGS` set ``--repeats`` times: what one process
with the whole batch, and Horovod's equal split on equal ranks, reach against the sum of probed
rates, beside hetgrad's plan on unequal ranks (``all``: at two emulated step lengths;
``steps_per_execution``: with 1 and 4 steps per call); under ``ceiling`` / ``ceiling_SET``.

    .venv/bin/python scripts/bench_perfmodel.py --out results/bench_perfmodel.json
    .venv/bin/python scripts/bench_perfmodel.py --scenarios real-cnn-3ranks --churn 20 \
        --repeats 3 --out results/bench_perfmodel_real.json
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EMU = ["--emulate-unit", "2e-3"]
CNN = ["--data", "synthetic", "--model", "cnn", "-B", "120"]
SCENARIOS = {  # name: (ranks, train args, placement: rank -> (core, share of it or None))
    "emu-1124-B96": (4, ["--data", "digits", "-B", "96", "--emulate-speeds", "1,1,2,4", *EMU],
                     None),
    "emu-1124-B512": (4, ["--data", "synthetic", "-B", "512", "--emulate-speeds", "1,1,2,4",
                          *EMU], None),
    "emu-18-B96": (2, ["--data", "digits", "-B", "96", "--emulate-speeds", "1,8", *EMU], None),
    "emu-18-B512": (2, ["--data", "synthetic", "-B", "512", "--emulate-speeds", "1,8", *EMU],
                    None),
    # real compute heterogeneity: rank 0 alone on core 0, ranks 1 and 2 time-share core 1
    # (a rank's speed then depends on whether the other one is computing or waiting)
    "real-cnn-3ranks": (3, CNN, [(0, None), (1, None), (1, None)]),
    # real compute, every rank a fixed CPU share (quota), so no rank's speed depends on
    # another's load: like three unequal dedicated cores
    "quota-cnn-3ranks": (3, CNN, [(0, 0.9), (1, 0.5), (1, 0.4)]),
    # the same with three equal shares: under --churn with the equal arm, the imbalance that
    # timing noise alone gives a perfectly balanced job (the floor under the real target)
    "quota-cnn-3ranks-equal-shares": (3, CNN, [(0, 0.45), (1, 0.45), (1, 0.45)]),
}
CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
QUOTA_PERIOD_US = 4000   # 4 ms: the cap holds within a step (default 100 ms would not)
# --breakdown: where a step's time goes, one run each: the slow rank alone (no exchange),
# then with a fast one, under Horovod's default, a long and a short cycle time
B512_18 = ["--data", "synthetic", "-B", "512", "--emulate-speeds", "1,8", *EMU]
BREAKDOWN = {  # name: (ranks, environment, train args)
    "1 rank, B=59, speed 1": (1, {}, ["--data", "synthetic", "-B", "59", "--emulate-speeds",
                                      "1", *EMU]),
    "emu-18-B512": (2, {}, B512_18),
    "emu-18-B512, HOROVOD_CYCLE_TIME=5": (2, {"HOROVOD_CYCLE_TIME": "5"}, B512_18),
    "emu-18-B512, HOROVOD_CYCLE_TIME=0.2": (2, {"HOROVOD_CYCLE_TIME": "0.2"}, B512_18),
}


def _ceiling_runs(speeds: list[float], unit: str, extra: tuple[str, ...] = ()) -> dict:
    """``--ceiling``'s runs for one B=512 scenario, all with the same sum of emulated speeds
    (so the same ideal step): one process with the whole batch (no split, no exchange),
    Horovod's equal split on as many equal ranks, hetgrad's plan on the unequal ones, all with
    ``extra`` train args; each ``name: (ranks, train args, name of the one-process run
    without extra args)``."""
    emu = ["--data", "synthetic", "-B", "512", "--emulate-unit", unit, "--probe-steps", "4"]
    p, total = len(speeds), sum(speeds)
    same, uneven = ",".join([f"{total / p:g}"] * p), ",".join(f"{s:g}" for s in speeds)
    one, tail = f"one process, speed {total:g}, unit {unit}", "".join(f" {a}" for a in extra)
    return {one + tail: (1, [*emu, "--emulate-speeds", f"{total:g}", *extra], one),
            f"Horovod equal split, speeds {same}, unit {unit}{tail}":
                (p, [*emu, "--emulate-speeds", same, "--mode", "equal", *extra], one),
            f"hetgrad, speeds {uneven}, unit {unit}{tail}":
                (p, [*emu, "--emulate-speeds", uneven, *extra], one)}


CEILINGS = {  # --ceiling SET: the runs, under "ceiling" or "ceiling_SET" in the JSON
    # at the scenarios' step (unit 2e-3) and at one 5x longer
    "all": {k: v for speeds in ([1, 8], [1, 1, 2, 4]) for unit in ("2e-3", "1e-2")
            for k, v in _ceiling_runs(speeds, unit).items()},
    # the same at 4 steps per call into the graph, against one step per call
    "steps_per_execution": {**_ceiling_runs([1, 8], "2e-3"),
                            **_ceiling_runs([1, 8], "2e-3", ("--steps-per-execution", "4"))},
}
# arms whose plan predicts its step time ("refined-rebalance": the runs of 2026-12-05 that
# ran --rebalance with --probe-refine 1)
MODELLED = ("constant", "affine", "refined", "rebalance", "refined-rebalance")
ARMS = {"equal": ["--mode", "equal"], "constant": ["--probe-sizes", "1"], "affine": [],
        "refined": ["--probe-refine", "1"], "rebalance": ["--rebalance"], "oracle": None}


def launch(np_: int, args: list[str], wrap: list[str] | None, out: Path,
           env: dict[str, str] | None = None) -> dict:
    """``hetgrad train ARGS`` on local ranks, each rank's command behind ``wrap`` (from
    :func:`placed`) when given, with ``env`` added to the environment."""
    from hetgrad.cli import mpirun_command
    cmd = mpirun_command(np_, ["train", *args, "--quiet", "--out", str(out)])
    if wrap:
        i = cmd.index(sys.executable)
        cmd = cmd[:i] + wrap + cmd[i:]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                       env={**os.environ, **(env or {})})
    if p.returncode != 0:
        raise SystemExit(f"bench_perfmodel: run failed: {' '.join(args)}\n{p.stderr[-3000:]}")
    return json.loads(out.read_text())


@contextlib.contextmanager
def placed(placement: list[tuple[int, float | None]] | None):
    """The command prefix that puts local rank ``r`` on core ``placement[r][0]`` (taskset)
    and, when ``placement[r][1]`` is a share, in its own cgroup capped at that share of a
    core (cgroup v1 cpu quota, period :data:`QUOTA_PERIOD_US`); the cgroups are removed on
    exit, also on failure. None: no prefix."""
    if not placement:
        yield None
        return
    root = CPU_CGROUP / f"hetgrad-bench-{os.getpid()}"
    shares = {r: s for r, (_, s) in enumerate(placement) if s}
    made: list[Path] = []
    try:
        for r, share in shares.items():
            group = root / f"rank{r}"
            try:
                group.mkdir(parents=True)
            except OSError as exc:
                raise SystemExit(f"bench_perfmodel: cannot create {group} ({exc}); CPU shares "
                                 "need root and cgroup v1's cpu controller") from None
            made.insert(0, group)
            (group / "cpu.cfs_period_us").write_text(str(QUOTA_PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(round(share * QUOTA_PERIOD_US)))
        cases = " ".join(
            f"{r}) c={core};" + (f" echo $$ > {root}/rank{r}/cgroup.procs || exit 97;"
                                  if r in shares else "") + ";"
            for r, (core, _) in enumerate(placement))
        yield ["sh", "-c", f'case $OMPI_COMM_WORLD_RANK in {cases} esac; '
                           f'exec taskset -c $c "$@"', "sh"]
    finally:
        for group in made + ([root] if made else []):
            try:
                group.rmdir()
            except OSError as exc:   # a rank still inside: say so, never hide the run's error
                print(f"bench_perfmodel: warning: cannot remove {group}: {exc}", file=sys.stderr)


def summary(rec: dict) -> dict:
    """What the tables need from one record."""
    plan, bal = rec["plan"], rec["balance"]
    steady = [e for e in bal if e["epoch"] >= 2 and e["batches"] == rec["final_plan"]["batches"]]
    # the slowest rank's busy seconds per step (what the plan's predicted step time predicts)
    measured_step = statistics.median(max(e["measured_step_s"]) for e in steady) if steady \
        else None
    return {"batches": plan["batches"], "final_batches": rec["final_plan"]["batches"],
            "samples_per_s": rec["samples_per_s"],
            "sum_probed_samples_per_s": rec["ideal_samples_per_s"],
            "efficiency": rec["throughput_efficiency"],
            "predicted_step_s": plan.get("predicted_step_s"), "measured_step_s": measured_step,
            "steady_imbalance": statistics.median(e["imbalance"] for e in steady)
            if steady else None,
            "replans_after_epoch_2": sum(e["replanned"] for e in bal if e["epoch"] >= 2),
            "probe": [{k: p.get(k) for k in ("points", "fixed_s", "samples_per_s", "fit_error",
                                              "kind", "plan_points", "scale")}
                      for p in rec["probe"]],
            "final_test_accuracy": rec["final_test_accuracy"]}


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


def oracle_search(name, np_, args, wrap, epochs, tmp: Path, confirm: int = 2) -> dict:
    """Run the grid around the affine plan once per split, then the best 3 splits ``confirm``
    more times (one short run's noise must not pick the oracle); return the split with the
    best median and every run's throughput."""
    from hetgrad.partition import fixed_plan
    base = launch(np_, [*args, "--epochs", "2"], wrap, tmp / f"{name}-base.json")
    batches, n = base["plan"]["batches"], base["plan"]["dataset_size"]
    step = max(1, sum(batches) // 48)
    tried = [{"batches": split, "samples_per_s": []} for split in grid(batches, step)]

    def measure(k: int, t: dict) -> None:
        path = tmp / f"{name}-grid{k}.plan.json"
        fixed_plan(t["batches"], n).save(path)
        rec = launch(np_, [*args, "--plan", str(path), "--epochs", str(max(3, epochs - 1)),
                           "--seed", str(len(t["samples_per_s"]))], wrap,
                     tmp / f"{name}-grid{k}.json")
        t["samples_per_s"].append(rec["samples_per_s"])
        print(f"{name} grid {t['batches']}: {rec['samples_per_s']:.0f} samples/s", flush=True)

    for k, t in enumerate(tried):
        measure(k, t)
    top = sorted(range(len(tried)), key=lambda k: -tried[k]["samples_per_s"][0])[:3]
    for _ in range(confirm):
        for k in top:
            measure(k, tried[k])
    best = max((tried[k] for k in top), key=lambda t: statistics.median(t["samples_per_s"]))
    path = tmp / f"{name}-oracle.plan.json"
    fixed_plan(best["batches"], n).save(path)
    return {"plan_file": str(path), "best": best["batches"], "grid": tried}


def run_scenario(name: str, epochs: int, repeats: int, tmp: Path) -> dict:
    np_, args, placement = SCENARIOS[name]
    batch = int(args[args.index("-B") + 1])
    if batch % np_:  # the equal arm needs it; say so before the oracle search, not after
        raise SystemExit(f"bench_perfmodel: scenario {name}: -B {batch} is not divisible by "
                         f"{np_} ranks (the equal arm needs it)")
    with placed(placement) as wrap:
        oracle = oracle_search(name, np_, args, wrap, epochs, tmp)
        runs: dict[str, list] = {arm: [] for arm in ARMS}
        for rep in range(repeats):
            order = list(ARMS) if rep % 2 == 0 else list(ARMS)[::-1]
            for arm in order:
                extra = ARMS[arm] if ARMS[arm] is not None else ["--plan", oracle["plan_file"]]
                rec = launch(np_, [*args, *extra, "--epochs", str(epochs), "--seed", str(rep)],
                             wrap, tmp / f"{name}-{arm}-{rep}.json")
                runs[arm].append(summary(rec))
                print(f"{name} {arm} rep {rep}: {runs[arm][-1]['samples_per_s']:.0f} samples/s "
                      f"batches {runs[arm][-1]['final_batches']}", flush=True)
    return {"ranks": np_, "args": args, "placement": placement, "oracle_search": oracle,
            "runs": runs, "table": table(runs)}


def run_churn(runs: list[str], epochs: int, repeats: int, tmp: Path) -> Iterator[dict]:
    """For each ``SCENARIO[:ARM]`` of ``runs`` (the arm by default ``rebalance``), the arm for
    ``epochs`` epochs, ``repeats`` times, interleaved (the order turns every repeat): every
    epoch's imbalance, batches and decision, and the re-plans after epoch 2. Yields every row
    so far after each run, keyed by the run as given with ``:`` written ``, `` (``SCENARIO``
    or ``SCENARIO, ARM``)."""
    out = {}
    for run in runs:
        name, _, arm = run.partition(":")
        arm = arm or "rebalance"
        if name not in SCENARIOS or ARMS.get(arm) is None:
            arms = ", ".join(a for a in ARMS if ARMS[a] is not None)
            raise SystemExit(f"bench_perfmodel: --churn: {run!r}: scenarios are "
                             f"{', '.join(SCENARIOS)}; arms {arms}")
        np_, args, placement = SCENARIOS[name]
        out[run.replace(":", ", ")] = {"ranks": np_, "args": [*args, *ARMS[arm]],
                                       "placement": placement, "epochs": epochs, "runs": []}
    for rep in range(repeats):
        for key in list(out) if rep % 2 == 0 else list(out)[::-1]:
            sc = out[key]
            with placed(sc["placement"]) as wrap:
                rec = launch(sc["ranks"], [*sc["args"], "--epochs", str(epochs), "--seed",
                                           str(rep)], wrap, tmp / f"churn-{rep}.json")
            sc["runs"].append(churn_row(rec))
            r = sc["runs"][-1]
            print(f"{key} rep {rep}: re-plans after epochs {r['replanned_after_epochs']}, "
                  f"steady imbalance {r['steady_imbalance']:.3f}, batches {r['final_batches']}",
                  flush=True)
            yield out


def churn_row(rec: dict) -> dict:
    """One churn run's every-epoch imbalance, decision and time, and its summary."""
    bal, base = rec["balance"], summary(rec)
    return {**{k: base[k] for k in ("samples_per_s", "final_batches", "replans_after_epoch_2")},
            "first_batches": base["batches"],
            "replanned_after_epochs": [e["epoch"] for e in bal if e["replanned"]],
            "imbalance": [e["imbalance"] for e in bal],
            "steady_imbalance": statistics.median(e["imbalance"] for e in bal[2:]),
            "predicted_gain": [e["predicted_gain"] for e in bal],
            "noise": [e["noise"] for e in bal], "batches": [e["batches"] for e in bal],
            "epoch_time_s": [e["time_s"] for e in rec["epochs"]]}


def step_breakdown(rec: dict, np_: int) -> dict:
    """A run's plan (batches, predicted step), its ideal step ``B / sum s_i``, per step (medians
    over the epochs after the first) the slowest rank's busy time and its wait and the epoch
    time, and its efficiency."""
    steps, bal = rec["plan"]["steps_per_epoch"], rec["balance"][1:]
    slow = [max(range(np_), key=lambda r: e["busy_s"][r]) for e in bal]
    med = lambda xs: statistics.median(xs) / steps  # noqa: E731
    return {"batches": rec["plan"]["batches"],
            "predicted_step_s": rec["plan"]["predicted_step_s"],
            "ideal_step_s": sum(rec["plan"]["batches"]) / rec["ideal_samples_per_s"],
            "busy_step_s": med([e["busy_s"][r] for e, r in zip(bal, slow)]),
            "wait_step_s": med([e["wait_s"][r] for e, r in zip(bal, slow)]),
            "epoch_step_s": med([e["time_s"] for e in rec["epochs"][1:]]),
            "efficiency": rec["throughput_efficiency"]}


def run_breakdown(epochs: int, tmp: Path) -> dict:
    """One run per :data:`BREAKDOWN` entry, each's :func:`step_breakdown`."""
    out = {}
    for k, (name, (np_, env, args)) in enumerate(BREAKDOWN.items()):
        rec = launch(np_, [*args, "--epochs", str(epochs)], None, tmp / f"breakdown{k}.json",
                     env)
        out[name] = {"ranks": np_, "env": env, "args": args, **step_breakdown(rec, np_)}
        print(breakdown_markdown({"breakdown": out}).splitlines()[-1], flush=True)
    return out


def run_ceiling(runs: dict, epochs: int, repeats: int, tmp: Path) -> dict:
    """Every run of ``runs`` (a :data:`CEILINGS` set) ``repeats`` times, interleaved (the
    order turns every repeat): each run's :func:`step_breakdown`."""
    out = {name: {"ranks": np_, "args": args, "one_process": one, "runs": []}
           for name, (np_, args, one) in runs.items()}
    for rep in range(repeats):
        for k, name in enumerate(list(runs) if rep % 2 == 0 else list(runs)[::-1]):
            np_, args, _ = runs[name]
            rec = launch(np_, [*args, "--epochs", str(epochs), "--seed", str(rep)], None,
                         tmp / f"ceiling-{rep}-{k}.json")
            out[name]["runs"].append(step_breakdown(rec, np_))
            print(f"{name} rep {rep}: efficiency {out[name]['runs'][-1]['efficiency']:.3f}",
                  flush=True)
    return out


def ceiling_key(name: str) -> str:
    """Where a :data:`CEILINGS` set's runs go in the JSON."""
    return "ceiling" if name == "all" else f"ceiling_{name}"


def ceiling_markdown(result: dict, key: str = "ceiling") -> str:
    """One row per run of ``result[key]`` (from :func:`run_ceiling`): medians over repeats,
    and each repeat's efficiency over its one process's of the same repeat ("" without)."""
    if not result.get(key):
        return ""
    lines = ["| run | batches (last repeat) | B / sum s_i | epoch time / steps "
             "| efficiency vs sum s_i | / one process's (per repeat) |", "|---|---|---|---|---|---|"]
    rows = result[key]
    for name, row in rows.items():
        one = rows[row["one_process"]]["runs"]
        ratios = [r["efficiency"] / o["efficiency"] for r, o in zip(row["runs"], one)]
        med = lambda field: statistics.median(r[field] for r in row["runs"])  # noqa: E731
        lines.append(f"| {name} | {row['runs'][-1]['batches']} "
                     f"| {1e3 * med('ideal_step_s'):.1f} ms | {1e3 * med('epoch_step_s'):.1f} ms "
                     f"| {med('efficiency'):.3f} | {statistics.median(ratios):.3f} "
                     f"({', '.join(f'{v:.3f}' for v in ratios)}) |")
    return "\n".join(lines)


def breakdown_markdown(result: dict) -> str:
    """One row per breakdown run ("" without them)."""
    if not result.get("breakdown"):
        return ""
    lines = ["| run | batches | predicted step | slowest busy step | its wait | epoch time / "
             "steps | efficiency vs sum s_i |", "|---|---|---|---|---|---|---|"]
    ms = lambda v: "-" if v is None else f"{1e3 * v:.1f} ms"  # noqa: E731
    for name, r in result["breakdown"].items():
        lines.append(f"| {name} | {r['batches']} | {ms(r['predicted_step_s'])} "
                     f"| {ms(r['busy_step_s'])} | {ms(r['wait_step_s'])} "
                     f"| {ms(r['epoch_step_s'])} | {r['efficiency']:.3f} |")
    return "\n".join(lines)


def churn_markdown(result: dict) -> str:
    """One row per churn run: re-plans, steady imbalance, plans ("" without churn runs)."""
    if not result.get("churn"):
        return ""
    lines = ["| scenario | run | epochs | re-plans after epoch 2 (at epochs) | steady imbalance "
             "(median from epoch 3) | max imbalance from epoch 3 | first -> final batches "
             "| samples/s |", "|" + "---|" * 8]
    for name, sc in result.get("churn", {}).items():
        for k, r in enumerate(sc["runs"]):
            at = [e for e in r["replanned_after_epochs"] if e >= 2]
            lines.append(f"| {name} | {k} | {sc['epochs']} | {r['replans_after_epoch_2']} "
                         f"({', '.join(map(str, at)) or '-'}) | {r['steady_imbalance']:.3f} "
                         f"| {max(r['imbalance'][2:]):.3f} | {r['first_batches']} -> "
                         f"{r['final_batches']} | {r['samples_per_s']:.0f} |")
    return "\n".join(lines)


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
        pred = [r["predicted_step_s"] / r["measured_step_s"] for r in rs
                if arm in MODELLED and r["predicted_step_s"] and r["measured_step_s"]
                and r["batches"] == r["final_batches"]]
        row["predicted_over_measured_step"] = statistics.median(pred) if pred else None
        # the efficiency the plan's own prediction reaches: with fixed costs a_i > 0 it is
        # below 1 even for a perfect split with no exchange
        ceil = [sum(r["batches"]) / r["predicted_step_s"] / r["sum_probed_samples_per_s"]
                for r in rs if arm in MODELLED and r["predicted_step_s"]]
        row["predicted_efficiency_median"] = statistics.median(ceil) if ceil else None
        out[arm] = row
    return out


def markdown(result: dict) -> str:
    """The docs/results.md table: one row per scenario and arm."""
    lines = ["| scenario | arm | batches (final) | samples/s | / oracle (per repeat) | / equal "
             "| efficiency vs sum s_i (predicted) | steady imbalance "
             "| predicted / measured step | re-plans after epoch 2 | final acc |",
             "|" + "---|" * 11]
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    for name, sc in result["scenarios"].items():
        for arm, row in table(sc["runs"]).items():
            batches = sc["runs"][arm][-1]["final_batches"]
            per = ", ".join(f"{r:.2f}" for r in row["ratios_over_oracle_per_repeat"])
            lines.append(
                f"| {name} | {arm} | {batches} | {row['samples_per_s_median']:.0f} "
                f"| {row['over_oracle']:.3f} ({per}) | {row['over_equal']:.2f} "
                f"| {row['efficiency_median']:.2f} "
                f"({fmt(row.get('predicted_efficiency_median'), '.2f')}) "
                f"| {fmt(row['steady_imbalance_median'], '.3f')} "
                f"| {fmt(row['predicted_over_measured_step'], '.2f')} "
                f"| {sum(row['replans_after_epoch_2'])} | {row['final_test_accuracy_mean']:.3f} |")
    return "\n".join(lines)


def gap_markdown(result: dict, arm: str = "affine") -> str:
    """Where efficiency goes, per scenario (medians over the arm's repeats, per step): the
    ideal ``B / sum s_i``, the plan's predicted step, the slowest rank's measured busy step,
    and the epoch time per step (samples per step / throughput)."""
    lines = ["| scenario | B / sum s_i | predicted step | slowest busy step | epoch time / steps "
             "| efficiency |", "|---|---|---|---|---|---|"]
    ms = lambda v, ref: f"{1e3 * v:.1f} ms" + (f" ({100 * (v / ref - 1):+.1f} %)" if ref else "")  # noqa: E731
    for name, sc in result["scenarios"].items():
        rs = [r for r in sc["runs"].get(arm, []) if r["predicted_step_s"] and r["measured_step_s"]]
        if not rs:
            continue
        med = lambda f: statistics.median(f(r) for r in rs)  # noqa: E731
        ideal = med(lambda r: sum(r["batches"]) / r["sum_probed_samples_per_s"])
        pred, busy = med(lambda r: r["predicted_step_s"]), med(lambda r: r["measured_step_s"])
        step = med(lambda r: sum(r["final_batches"]) / r["samples_per_s"])
        lines.append(f"| {name} | {ms(ideal, None)} | {ms(pred, ideal)} | {ms(busy, pred)} "
                     f"| {ms(step, busy)} | {med(lambda r: r['efficiency']):.2f} |")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(result["scenarios"])
    present = {a for n in names for a in result["scenarios"][n]["table"]}
    arms = [a for a in [*ARMS, *sorted(present - set(ARMS))] if a in present]
    fig, ax = plt.subplots(figsize=(max(8.0, 2.2 * len(names) + 2), 4.6))
    width = 0.8 / len(arms)
    for k, arm in enumerate(arms):
        vals = [result["scenarios"][n]["table"].get(arm, {}).get("over_oracle", float("nan"))
                for n in names]  # (not every scenario ran every arm: no bar)
        ax.bar([i + k * width for i in range(len(names))], vals, width, label=arm)
    ax.axhline(0.97, color="grey", ls="--", lw=0.8, label="0.97 of oracle")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names, fontsize=8)
    ax.set_ylabel("throughput / oracle's (median of repeats)")
    ax.set_ylim(0, 1.15)
    ax.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="results/bench_perfmodel.json")
    ap.add_argument("--plot", default="docs/img/perfmodel.png")
    ap.add_argument("--churn", type=int, metavar="EPOCHS",
                    help="only the rebalance arm (or SCENARIO:ARM), this many epochs, to "
                         "count re-plans")
    ap.add_argument("--breakdown", action="store_true",
                    help="only the runs of BREAKDOWN: where one step's time goes")
    ap.add_argument("--ceiling", nargs="?", const="all", choices=list(CEILINGS),
                    help="only the runs of this CEILINGS set, --repeats times: efficiency's "
                         "ceiling")
    ap.add_argument("--table", action="store_true", help="print the table of --out and stop")
    args = ap.parse_args()
    out = Path(args.out)
    if args.table:
        result = json.loads(out.read_text())
        parts = [markdown(result) if result.get("scenarios") else "",
                 gap_markdown(result) if result.get("scenarios") else "", churn_markdown(result),
                 breakdown_markdown(result),
                 *(ceiling_markdown(result, ceiling_key(c)) for c in CEILINGS)]
        print("\n\n".join(p for p in parts if p))
        return
    result = json.loads(out.read_text()) if out.exists() else {"scenarios": {}}
    with tempfile.TemporaryDirectory() as tmp:
        if args.breakdown:
            result["breakdown"] = run_breakdown(args.epochs, Path(tmp))
            out.write_text(json.dumps(result, indent=2))
            print(breakdown_markdown(result))
            return
        if args.ceiling:
            key = ceiling_key(args.ceiling)
            result[key] = run_ceiling(CEILINGS[args.ceiling], args.epochs, args.repeats,
                                      Path(tmp))
            out.write_text(json.dumps(result, indent=2))
            print(ceiling_markdown(result, key))
            return
        if args.churn:
            for rows in run_churn(args.scenarios.split(","), args.churn, args.repeats,
                                  Path(tmp)):
                result.setdefault("churn", {}).update(rows)
                out.write_text(json.dumps(result, indent=2))  # after every run: kept on failure
            print(churn_markdown(result))
            return
        result.update(epochs=args.epochs, repeats=args.repeats)
        for name in args.scenarios.split(","):
            result["scenarios"][name] = run_scenario(name, args.epochs, args.repeats, Path(tmp))
            print(name, json.dumps(result["scenarios"][name]["table"], indent=1), flush=True)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=2))  # after every scenario: resumable
    plot(result, ROOT / args.plot)
    print(f"bench_perfmodel: {out}, {args.plot}")


if __name__ == "__main__":
    main()
