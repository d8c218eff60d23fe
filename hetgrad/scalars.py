"""TensorBoard scalars of a run, written by rank 0 after every epoch: the run's own (loss,
accuracy, test scores, epoch time, samples/s, imbalance, global batch, re-plans, learning
rate, sparse density) in ``DIR/<run>``, and every rank's (local batch, busy and wait time,
predicted and measured step time, samples/s) in ``DIR/<run>/rank<r>`` under the same tags, so
TensorBoard draws the ranks' curves of one quantity in one chart. :func:`epoch_scalars` is
pure (no TensorFlow); :class:`ScalarWriter` writes them with ``tf.summary``."""
from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .rebalance import EpochBalance

# keys of an epoch's record row that are not the run's scalars
NOT_SCALARS = {"epoch", "first_step", "stopped_at_step", "busy_s", "wait_s", "batches",
               "global_batch", "lr"}     # (the last two: under plan/ and optimizer/)


def epoch_scalars(row: dict, balance: "EpochBalance | None", global_batch: int,
                  learning_rate: float | None) -> tuple[dict[str, float], list[dict]]:
    """The run's scalars and each rank's for one epoch: ``row`` is its record row (rank 0's,
    with the test scores), ``balance`` what the ranks measured in it (None: not measured,
    e.g. a partial epoch, whose time and rate are left out too)."""
    partial = bool(row.get("first_step") or row.get("stopped_at_step"))
    skip = NOT_SCALARS | ({"time_s", "samples_per_s"} if partial else set())
    run = {f"epoch/{k}": float(v) for k, v in row.items()
           if k not in skip and isinstance(v, (int, float)) and not isinstance(v, bool)}
    interval = row.get("b_noise_interval") or ()   # [low, high]; high None: unbounded
    run.update({f"epoch/b_noise_{end}": float(v) for end, v in zip(("low", "high"), interval)
                if v is not None})
    run["plan/global_batch"] = float(global_batch)
    if learning_rate is not None:
        run["optimizer/learning_rate"] = float(learning_rate)
    if balance is None:
        return run, []
    run.update({"balance/imbalance": balance.imbalance,
                "plan/replanned": float(balance.replanned),
                "plan/predicted_gain": balance.predicted_gain})
    ranks = []
    for r, b in enumerate(balance.batches):
        one = {"rank/batch": float(b), "rank/busy_s": balance.busy_s[r],
               "rank/wait_s": balance.wait_s[r],
               "rank/step_measured_s": balance.measured_step_s[r],
               "rank/samples_per_s": balance.measured_samples_per_s[r]}
        if balance.predicted_step_s is not None:
            one["rank/step_predicted_s"] = balance.predicted_step_s[r]
        ranks.append(one)
    return run, ranks


def new_run_dir(base: str | Path, now: float | None = None) -> Path:
    """``base/<UTC date-time>`` made, with ``-2``, ``-3``... if taken: one directory per run,
    never an earlier (or a concurrent) run's."""
    name = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
    for n in range(1, 10_000):
        path = Path(base) / (name if n == 1 else f"{name}-{n}")
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{base}/{name}-*: no free run directory")


class ScalarWriter:
    """``tf.summary`` writers for the run and for each of ``size`` ranks, under ``base``."""

    def __init__(self, base: str | Path, size: int):
        import tensorflow as tf
        self.tf, self.dir = tf, new_run_dir(base)
        width = len(str(size - 1))
        self.run = tf.summary.create_file_writer(str(self.dir))
        self.ranks = [tf.summary.create_file_writer(str(self.dir / f"rank{r:0{width}d}"))
                      for r in range(size)]

    def write(self, step: int, run: dict[str, float], ranks: list[dict]) -> None:
        for writer, values in ((self.run, run), *zip(self.ranks, ranks)):
            with writer.as_default(step=step):
                for tag, value in values.items():
                    self.tf.summary.scalar(tag, value)
            writer.flush()

    def close(self) -> None:
        for writer in (self.run, *self.ranks):
            writer.close()
