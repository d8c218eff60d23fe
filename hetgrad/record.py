"""The JSON record of one ``hetgrad train`` run, built by a pure function (no MPI, no TF) from
what the trainer measured, so its arithmetic is unit-tested on its own; and where it goes."""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from .errors import InputFileError
from .io import write_json
from .partition import Plan

SPARSE_KEYS = ("k", "union", "buildup", "bytes_sent", "bytes_received")


def build_record(*, config: dict, world_size: int, device: str, controller: str,
                 ranks: Sequence[dict], probe: Sequence[dict],
                 probe_time_s: float, first_plan: Plan, final_plan: Plan,
                 epochs: Sequence[dict], wall_time_s: float,
                 per_rank_epoch_times_s: Sequence[Sequence[float]], balance: Sequence[dict],
                 sparse_steps: Sequence[dict] | None = None,
                 sparse_bytes_per_rank: Sequence[dict] | None = None,
                 timeline: dict | None = None) -> dict:
    """Summaries over ``epochs`` (rank 0's rows, with its test scores) and the raw inputs.

    ``samples_per_s`` is the samples trained per epoch over the median epoch time (without
    the first epoch, which traces the step where the probe did not, when there are more);
    ``throughput_efficiency`` divides it by the sum of the probed rates (what perfect balance
    with no communication would reach). ``ranks``: where each rank ran
    (:func:`hetgrad.placement.here`). ``timeline``: the sampled steps' spans
    (:meth:`hetgrad.timeline.Trace.summary`), drawn by ``hetgrad report``."""
    times = [row["time_s"] for row in epochs]
    median = float(statistics.median(times[1:] if len(times) > 1 else times))
    achieved = (final_plan.dataset_size - final_plan.dropped) / median
    ideal = sum(p["samples_per_s"] for p in probe)
    record = {
        "config": dict(config), "world_size": world_size, "device": device,
        "controller": controller, "ranks": list(ranks),
        "plan": first_plan.to_dict(), "final_plan": final_plan.to_dict(),
        "probe": list(probe), "probe_time_s": probe_time_s,
        "epochs": list(epochs), "wall_time_s": wall_time_s,
        **_test_scores(epochs),
        "median_epoch_time_s": median,
        "samples_per_s": achieved, "ideal_samples_per_s": ideal,
        "throughput_efficiency": achieved / ideal,
        "per_rank_epoch_times_s": [list(t) for t in per_rank_epoch_times_s],
        "balance": list(balance),
    }
    if sparse_steps is not None:
        record["sparse_steps"] = list(sparse_steps)
        record["sparse_summary"] = {key: statistics.fmean(row[key] for row in sparse_steps)
                                    for key in SPARSE_KEYS}
        record["sparse_bytes_per_rank"] = list(sparse_bytes_per_rank or [])
    if timeline is not None:
        record["timeline"] = timeline
    return record


def _test_scores(epochs: Sequence[dict]) -> dict:
    """The final and best test score: accuracy (highest), or a regression's mean absolute
    error (lowest)."""
    name, best = ("accuracy", max) if "test_accuracy" in epochs[-1] else ("mae", min)
    scores = [row[f"test_{name}"] for row in epochs]
    return {f"final_test_{name}": scores[-1], f"best_test_{name}": best(scores)}


def sparse_bytes(steps: Sequence[dict]) -> dict:
    """One rank's total bytes sent and received over its sparse steps."""
    return {"bytes_sent": sum(r["bytes_sent"] for r in steps),
            "bytes_received": sum(r["bytes_received"] for r in steps)}


def save_record(record: dict, out: str, fallback_dirs: Sequence[str | None] = ()) -> str:
    """Write the record to ``out``; if that fails now (it was checked writable at the
    start), to the first of ``fallback_dirs``, the working directory or the temp directory
    that works, saying where. Returns the path written."""
    name = Path(out).name
    places = [out] + [str(Path(d) / name) for d in
                      (*fallback_dirs, os.getcwd(), tempfile.gettempdir()) if d]
    for i, path in enumerate(places):
        try:
            write_json(record, path)
        except OSError as exc:
            print(f"hetgrad: warning: cannot write the record to {path}: {exc.strerror}",
                  file=sys.stderr, flush=True)
            continue
        if i:
            print(f"hetgrad: warning: record written to {path} instead of {out}",
                  file=sys.stderr, flush=True)
        return path
    raise InputFileError(f"the record could not be written anywhere ({places})", field="out")
