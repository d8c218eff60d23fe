"""``--churn``: one arm per scenario for many epochs, the runs interleaved, every epoch's
imbalance and decision kept: does the online model re-plan on noise when speeds do not
change, and how imbalanced does noise alone make a balanced job?"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Iterator

from bench.launch import train
from bench.placement import placed
from bench.schedule import interleaved
from bench.tables import markdown

from .scenarios import ARMS, SCENARIOS, Launch, summary


def runs_of(runs: list[str], epochs: int) -> dict[str, dict]:
    """Each ``SCENARIO[:ARM]`` of ``runs`` (the arm by default ``rebalance``), keyed as given
    with ``:`` written ``, ``: its ranks, train args, placement, epochs and no runs yet. A bad one
    stops the benchmark before any run."""
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
    return out


def run_churn(runs: list[str], epochs: int, repeats: int, tmp: Path,
              launch: Launch = train) -> Iterator[dict]:
    """:func:`runs_of` ``runs``, each for ``epochs`` epochs, ``repeats`` times (seed =
    repeat), interleaved: every epoch's imbalance, batches and decision, and the re-plans
    after epoch 2 (:func:`churn_row`). Yields every row so far after each run."""
    out = runs_of(runs, epochs)
    for rep, key in interleaved(list(out), repeats):
        sc = out[key]
        with placed(sc["placement"]) as wrap:
            rec = launch(sc["ranks"], [*sc["args"], "--epochs", str(epochs), "--seed",
                                       str(rep)], tmp / f"churn-{rep}.json", wrap=wrap)
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


def churn_markdown(result: dict) -> str:
    """One row per churn run: re-plans, steady imbalance, plans ("" without churn runs)."""
    if not result.get("churn"):
        return ""
    rows = []
    for name, sc in result["churn"].items():
        for k, r in enumerate(sc["runs"]):
            at = ", ".join(str(e) for e in r["replanned_after_epochs"] if e >= 2) or "-"
            rows.append([name, k, sc["epochs"], f"{r['replans_after_epoch_2']} ({at})",
                         f"{r['steady_imbalance']:.3f}", f"{max(r['imbalance'][2:]):.3f}",
                         f"{r['first_batches']} -> {r['final_batches']}",
                         f"{r['samples_per_s']:.0f}"])
    return markdown(["scenario", "run", "epochs", "re-plans after epoch 2 (at epochs)",
                     "steady imbalance (median from epoch 3)", "max imbalance from epoch 3",
                     "first -> final batches", "samples/s"], rows)
