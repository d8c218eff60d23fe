"""What the benchmarks read off a ``hetgrad train`` record beyond what ``hetgrad/record.py``
already summarised in it (``median_epoch_time_s``, ``samples_per_s``,
``ideal_samples_per_s``, ``throughput_efficiency``, ``sparse_summary``): the same summaries
over a later stretch of the run (after a warm-up), never a second way to compute them."""
from __future__ import annotations

import statistics

from hetgrad.record import SPARSE_KEYS


def epoch_s(rec: dict, skip: int = 1) -> float:
    """Median epoch seconds without the first ``skip`` epochs: the record's own
    ``median_epoch_time_s`` (which leaves out the first, tracing epoch) when ``skip`` <= 1."""
    if skip <= 1:
        return rec["median_epoch_time_s"]
    return statistics.median(e["time_s"] for e in rec["epochs"][skip:])


def step_s(rec: dict, skip: int = 1) -> float:
    """:func:`epoch_s` per step of the first plan."""
    return epoch_s(rec, skip) / rec["plan"]["steps_per_epoch"]


def sparse_means(rec: dict, after_epoch: int) -> dict[str, float]:
    """``sparse_summary``'s means (k, |U|, |U|/k, bytes) over the steps of the epochs after
    ``after_epoch`` only (at the target density, once a warm-up is over); {} without such
    steps."""
    late = [r for r in rec.get("sparse_steps", []) if r["epoch"] > after_epoch]
    return {key: statistics.fmean(r[key] for r in late) for key in SPARSE_KEYS} if late else {}
