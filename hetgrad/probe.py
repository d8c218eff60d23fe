"""Start-up probe: every rank times real training steps of the actual model at several batch
sizes (:func:`measure`; :func:`hetgrad._keras.probing.probe` runs it on the user's model and
data), fits its step-time model (:mod:`hetgrad.perfmodel`), and the results are allgathered
(:func:`share`), so all ranks know every rank's model. :func:`refine` then times every rank at
its batch of the plan those models give and corrects each model there. Loading and saving
probe files needs no TensorFlow."""
from __future__ import annotations

import socket
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence


from .comm import Comm
from .errors import InputFileError
from .io import read_json, typed, write_json
from .perfmodel import StepModel, fit, relative_noise, scale_through

if TYPE_CHECKING:   # loading a saved probe (the start-up checks) needs no TensorFlow
    import tensorflow as tf
    from .compat import keras


@dataclass
class ProbeResult:
    """One rank's probe: the measured ``points`` (``[batch, median seconds per step]``), the
    step-time model fitted to them (:func:`hetgrad.perfmodel.fit`), and the ``scale`` that
    corrects it to the ``plan_points`` timed at the planned batches (:func:`refine`)."""

    rank: int
    host: str
    device: str
    samples_per_s: float
    fixed_s: float = 0.0
    points: list[list[float]] = field(default_factory=list)
    fit_error: float = 0.0
    kind: str = "affine"
    step_times_s: list = field(default_factory=list)   # per point: every timed step
    probe_batch: int | None = None                      # files from before the model
    emulation: str | None = None                        # "--emulate-speeds@unit" timed under
    plan_points: list[list[float]] = field(default_factory=list)  # [batch, s] at the plan
    scale: float = 1.0                                  # model correction at plan_points

    def __post_init__(self):
        if not self.points and self.probe_batch:  # old file: one size, constant speed
            self.points = [[self.probe_batch, self.probe_batch / self.samples_per_s]]
            self.kind = "constant"

    def model(self) -> StepModel:
        return StepModel(self.fixed_s, self.samples_per_s, self.kind,
                         [list(p) for p in self.points], self.fit_error, self.scale)


Batches = Callable[[int], "tf.data.Dataset"]  # batch size -> batches of that many samples
Planner = Callable[[list[StepModel]], list[int]]  # every rank's model -> every rank's batch


def measure(model: keras.Model, batches_of: Batches, *, batches: Sequence[int],
            warmup: int = 3, steps: int = 10, before_step: Callable[[int], None] | None = None,
            sync: Callable[[], object] | None = None,
            step_sync: Callable[[], object] | None = None,
            on_point: Callable[[int, float], None] | None = None) -> tuple[list, list]:
    """Median seconds per training step at each batch size, on the batches ``batches_of(b)``
    gives: ``([[batch, seconds], ...], [step times per batch])``.

    Each size is one ``model.fit`` of ``warmup + steps`` steps, timed per step: the train step
    gets its data as ``fit`` gives it (a custom ``train_step`` that unpacks ``(x, y)`` works).
    The model must be compiled; its weights change. ``before_step(n)`` runs inside each timed
    step (speed emulation). ``sync()`` runs before each size, so that all ranks time the same
    size together, under the contention training has (not a slow rank's small batches
    against the fast ranks' large ones). ``step_sync()`` runs before every step (not timed),
    as training's exchange does: ranks at different batches then overlap as in training.
    ``on_point(batch, seconds)`` reports each size when done. A size given again is timed
    again, its steps counted as one point.
    """
    from . import compat
    timed: dict[int, list[float]] = {}
    for batch in batches:
        data = batches_of(batch)
        compat.build_for_fit(model, data.element_spec)   # (the step traced once)
        if sync:
            sync()
        clock = _step_clock(warmup, lambda: before_step(batch) if before_step else None,
                            step_sync)
        model.fit(data, epochs=1, steps_per_epoch=warmup + steps, verbose=0, shuffle=False,
                  callbacks=[clock])
        timed.setdefault(int(batch), []).extend(clock.times)
        if on_point:
            on_point(int(batch), statistics.median(clock.times))
    return [[b, statistics.median(t)] for b, t in timed.items()], list(timed.values())


def _step_clock(warmup: int, before: Callable[[], object], step_sync):
    """A Keras callback that times every step after the first ``warmup`` (which also trace
    the step): ``before()`` inside the timed interval, ``step_sync()`` (if given) just before
    it."""
    from .compat import keras

    class StepClock(keras.callbacks.Callback):
        times: list[float] = []

        def on_train_begin(self, logs=None):
            self.times = []

        def on_train_batch_begin(self, batch, logs=None):
            if batch >= warmup and step_sync:
                step_sync()
            self.t0 = time.perf_counter()
            before()

        def on_train_batch_end(self, batch, logs=None):
            if batch >= warmup:
                self.times.append(time.perf_counter() - self.t0)

    return StepClock()


def refine(comm: Comm, results: list[ProbeResult], planner: Planner,
           time_at: Callable[..., tuple[list, list]], rounds: int,
           timeout: float) -> list[ProbeResult]:
    """Time every rank at its batch of the plan the models give, all ranks in lockstep
    (``time_at(sizes, lockstep=True)``: the contention training will have, each rank at its
    own batch), and scale each model through what it measured there, as FuPerMod refines its
    models at the partition's points: a plan a sample or two off from noise in the fitted
    fixed costs is corrected before training starts. Up to ``rounds`` rounds, while the plan
    still moves."""
    batches = None
    for _ in range(rounds):
        planned = planner([r.model() for r in results])
        if planned == batches:
            break
        batches = planned
        (point,), _ = time_at([batches[comm.rank]], lockstep=True)
        gathered = comm.gather_with_timeout(point, timeout)
        results = [_corrected(r, p) for r, p in zip(results, gathered)]
    return results


def _corrected(result: ProbeResult, point: list[float]) -> ProbeResult:
    """``result`` with ``point`` added to its plan points and its scale refitted to them."""
    points = result.plan_points + [list(point)]
    return replace(result, plan_points=points,
                   scale=scale_through(replace(result, scale=1.0).model(), points))


def share(comm: Comm, points: list, times: list, device: str,
          timeout: float) -> list[ProbeResult]:
    """Fit this rank's step-time model to its ``points``; allgather every rank's result."""
    m = fit(points, [relative_noise(t) for t in times])
    mine = ProbeResult(comm.rank, socket.gethostname(), device, m.samples_per_s, m.fixed_s,
                       m.points, m.fit_error, m.kind, times)
    return [ProbeResult(**d) for d in comm.gather_with_timeout(asdict(mine), timeout)]


def save(results: list[ProbeResult], path: str | Path) -> None:
    write_json([asdict(r) for r in results], path)


def load(path: str | Path, world_size: int | None = None) -> list[ProbeResult]:
    data = read_json(path, field="probe_file", what="probe file")
    try:
        if not isinstance(data, list):
            raise TypeError(f"expected a list of per-rank results, got {type(data).__name__}")
        results = [ProbeResult(**typed(ProbeResult, d, "probe entry")) for d in data]
    except (TypeError, ValueError) as exc:
        raise InputFileError(f"cannot read probe file {path}: {exc}", field="probe_file") from None
    if world_size is not None and len(results) != world_size:
        raise InputFileError(f"probe file {path} has {len(results)} ranks, job has {world_size}",
                             field="probe_file")
    return results
