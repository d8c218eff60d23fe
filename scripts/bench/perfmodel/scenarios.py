"""The performance-model benchmark's scenarios and arms, and what it keeps of every run."""
from __future__ import annotations

import statistics
from typing import Callable

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
# arms whose plan predicts its step time ("refined-rebalance": the runs of 2026-12-05 that
# ran --rebalance with --probe-refine 1)
MODELLED = ("constant", "affine", "refined", "rebalance", "refined-rebalance")
ARMS = {"equal": ["--mode", "equal"], "constant": ["--probe-sizes", "1"], "affine": [],
        "refined": ["--probe-refine", "1"], "rebalance": ["--rebalance"], "oracle": None}
# runs one `hetgrad train`: (ranks, train args, record path, wrap=..., env=...) -> its record
Launch = Callable[..., dict]


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
