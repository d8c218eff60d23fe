"""Start-up probe: every rank times real training steps of the actual model and the results
are allgathered, so all ranks know every rank's samples/s."""
from __future__ import annotations

import socket
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .comm import Comm
from .compat import keras
from .errors import InputFileError
from .io import read_json, write_json


@dataclass
class ProbeResult:
    rank: int
    host: str
    device: str
    samples_per_s: float
    probe_batch: int
    step_times_s: list[float]


def measure(model: keras.Model, input_shape, num_classes: int, *, batch: int = 32,
            warmup: int = 3, steps: int = 10, seed: int = 0,
            before_step: Callable[[int], None] | None = None) -> tuple[float, list[float]]:
    """Median samples/s of ``model.train_on_batch`` on a synthetic batch of the real shape.

    The model must be compiled; its weights change (probe on a throw-away copy).
    ``before_step(n)`` runs inside each timed step (speed emulation).
    """
    before_step = before_step or (lambda n: None)
    rng = np.random.default_rng(seed)
    x = rng.random((batch, *input_shape), dtype=np.float32)
    y = rng.integers(0, num_classes, size=batch)
    for _ in range(warmup):
        before_step(batch)
        model.train_on_batch(x, y)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        before_step(batch)
        model.train_on_batch(x, y)
        times.append(time.perf_counter() - t0)
    return batch / statistics.median(times), times


def run_probe(comm: Comm, build_model: Callable[[], keras.Model], input_shape, num_classes: int, *,
              device: str, batch: int = 32, warmup: int = 3, steps: int = 10,
              before_step: Callable[[int], None] | None = None,
              timeout: float = 300.0) -> list[ProbeResult]:
    """Probe this rank (``before_step(n)``: e.g. speed emulation) and allgather the results."""
    model = build_model()
    model.compile(optimizer=keras.optimizers.SGD(0.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    sps, times = measure(model, input_shape, num_classes, batch=batch, warmup=warmup, steps=steps,
                         before_step=before_step)
    mine = ProbeResult(comm.rank, socket.gethostname(), device, sps, batch, times)
    return [ProbeResult(**d) for d in comm.gather_with_timeout(asdict(mine), timeout)]


def save(results: list[ProbeResult], path: str | Path) -> None:
    write_json([asdict(r) for r in results], path)


def load(path: str | Path, world_size: int | None = None) -> list[ProbeResult]:
    data = read_json(path, field="probe_file", what="probe file")
    try:
        results = [ProbeResult(**d) for d in data]
    except TypeError as exc:
        raise InputFileError(f"cannot read probe file {path}: {exc}", field="probe_file") from None
    if world_size is not None and len(results) != world_size:
        raise InputFileError(f"probe file {path} has {len(results)} ranks, job has {world_size}",
                             field="probe_file")
    return results
