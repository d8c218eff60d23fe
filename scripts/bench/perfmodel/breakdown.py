"""``--breakdown``: where one step's time goes. The slow emulated rank alone, then beside a
fast one under Horovod's default, a long and a short cycle time, one run each."""
from __future__ import annotations

import statistics
from pathlib import Path

from bench.launch import train
from bench.records import step_s
from bench.tables import markdown, ms

from .scenarios import EMU, Launch

B512_18 = ["--data", "synthetic", "-B", "512", "--emulate-speeds", "1,8", *EMU]
BREAKDOWN = {  # name: (ranks, environment, train args)
    "1 rank, B=59, speed 1": (1, {}, ["--data", "synthetic", "-B", "59", "--emulate-speeds",
                                      "1", *EMU]),
    "emu-18-B512": (2, {}, B512_18),
    "emu-18-B512, HOROVOD_CYCLE_TIME=5": (2, {"HOROVOD_CYCLE_TIME": "5"}, B512_18),
    "emu-18-B512, HOROVOD_CYCLE_TIME=0.2": (2, {"HOROVOD_CYCLE_TIME": "0.2"}, B512_18),
}


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
            "epoch_step_s": step_s(rec),
            "efficiency": rec["throughput_efficiency"]}


def run_breakdown(epochs: int, tmp: Path, launch: Launch = train) -> dict:
    """One run per :data:`BREAKDOWN` entry, in its order, each's :func:`step_breakdown`."""
    out = {}
    for k, (name, (np_, env, args)) in enumerate(BREAKDOWN.items()):
        rec = launch(np_, [*args, "--epochs", str(epochs)], tmp / f"breakdown{k}.json", env=env)
        out[name] = {"ranks": np_, "env": env, "args": args, **step_breakdown(rec, np_)}
        print(breakdown_markdown({"breakdown": out}).splitlines()[-1], flush=True)
    return out


def breakdown_markdown(result: dict) -> str:
    """One row per breakdown run ("" without them)."""
    if not result.get("breakdown"):
        return ""
    rows = [[name, r["batches"], ms(r["predicted_step_s"]), ms(r["busy_step_s"]),
             ms(r["wait_step_s"]), ms(r["epoch_step_s"]), f"{r['efficiency']:.3f}"]
            for name, r in result["breakdown"].items()]
    return markdown(["run", "batches", "predicted step", "slowest busy step", "its wait",
                     "epoch time / steps", "efficiency vs sum s_i"], rows)
