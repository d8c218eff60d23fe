"""``--ceiling [SET]``: what one process with the whole batch, and Horovod's equal split on
equal ranks, reach against the sum of probed rates, beside hetgrad's plan on unequal ranks,
all with the same sum of emulated speeds (so the same ideal step)."""
from __future__ import annotations

import statistics
from pathlib import Path

from bench.launch import train
from bench.schedule import interleaved
from bench.tables import markdown, ms, series

from .breakdown import step_breakdown
from .scenarios import Launch


def ceiling_runs(speeds: list[float], unit: str, extra: tuple[str, ...] = ()) -> dict:
    """The runs for one B=512 scenario: one process with the whole batch (no split, no
    exchange), Horovod's equal split on as many equal ranks, hetgrad's plan on the unequal
    ones, all with ``extra`` train args; each ``name: (ranks, train args, name of the
    one-process run without extra args)``."""
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
            for k, v in ceiling_runs(speeds, unit).items()},
    # the same at 4 steps per call into the graph, against one step per call
    "steps_per_execution": {**ceiling_runs([1, 8], "2e-3"),
                            **ceiling_runs([1, 8], "2e-3", ("--steps-per-execution", "4"))},
}


def ceiling_key(name: str) -> str:
    """Where a :data:`CEILINGS` set's runs go in the JSON."""
    return "ceiling" if name == "all" else f"ceiling_{name}"


def run_ceiling(runs: dict, epochs: int, repeats: int, tmp: Path,
                launch: Launch = train) -> dict:
    """Every run of ``runs`` (a :data:`CEILINGS` set) ``repeats`` times (seed = repeat),
    interleaved: each run's :func:`step_breakdown`."""
    out = {name: {"ranks": np_, "args": args, "one_process": one, "runs": []}
           for name, (np_, args, one) in runs.items()}
    for k, (rep, name) in enumerate(interleaved(list(runs), repeats)):
        np_, args, _ = runs[name]
        rec = launch(np_, [*args, "--epochs", str(epochs), "--seed", str(rep)],
                     tmp / f"ceiling-{k}.json")
        out[name]["runs"].append(step_breakdown(rec, np_))
        print(f"{name} rep {rep}: efficiency {out[name]['runs'][-1]['efficiency']:.3f}",
              flush=True)
    return out


def ceiling_markdown(result: dict, key: str = "ceiling") -> str:
    """One row per run of ``result[key]`` (from :func:`run_ceiling`): medians over repeats,
    and each repeat's efficiency over its one process's of the same repeat ("" without)."""
    if not result.get(key):
        return ""
    rows, runs = [], result[key]
    for name, row in runs.items():
        one = runs[row["one_process"]]["runs"]
        ratios = [r["efficiency"] / o["efficiency"] for r, o in zip(row["runs"], one)]
        med = lambda field: statistics.median(r[field] for r in row["runs"])  # noqa: E731
        rows.append([name, row["runs"][-1]["batches"], ms(med("ideal_step_s")),
                     ms(med("epoch_step_s")), f"{med('efficiency'):.3f}",
                     f"{statistics.median(ratios):.3f} ({series(ratios, '.3f')})"])
    return markdown(["run", "batches (last repeat)", "B / sum s_i", "epoch time / steps",
                     "efficiency vs sum s_i", "/ one process's (per repeat)"], rows)
