"""Start-up probe: every rank times real training steps of the actual model and the results
are allgathered, so all ranks know every rank's samples/s."""
from __future__ import annotations

import json
import socket
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import tensorflow as tf


@dataclass
class ProbeResult:
    rank: int
    host: str
    device: str
    samples_per_s: float
    probe_batch: int
    step_times_s: list[float]


def measure(model: tf.keras.Model, input_shape, num_classes: int, *, batch: int = 32,
            warmup: int = 3, steps: int = 10, seed: int = 0) -> tuple[float, list[float]]:
    """Median samples/s of ``model.train_on_batch`` on a synthetic batch of the real shape.

    The model must be compiled; its weights change (probe on a throw-away copy).
    """
    rng = np.random.default_rng(seed)
    x = rng.random((batch, *input_shape), dtype=np.float32)
    y = rng.integers(0, num_classes, size=batch)
    for _ in range(warmup):
        model.train_on_batch(x, y)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        model.train_on_batch(x, y)
        times.append(time.perf_counter() - t0)
    return batch / statistics.median(times), times


def run_probe(comm, build_model: Callable[[], tf.keras.Model], input_shape, num_classes: int, *,
              device: str, batch: int = 32, warmup: int = 3, steps: int = 10,
              prepare: Callable[[tf.keras.Model], None] | None = None) -> list[ProbeResult]:
    """Probe this rank (``prepare`` may wrap the model, e.g. speed emulation) and allgather."""
    model = build_model()
    model.compile(optimizer=tf.keras.optimizers.SGD(0.0),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    if prepare is not None:
        prepare(model)
    sps, times = measure(model, input_shape, num_classes, batch=batch, warmup=warmup, steps=steps)
    mine = ProbeResult(comm.Get_rank(), socket.gethostname(), device, sps, batch, times)
    return [ProbeResult(**d) for d in comm.allgather(asdict(mine))]


def save(results: list[ProbeResult], path: str | Path) -> None:
    Path(path).write_text(json.dumps([asdict(r) for r in results], indent=2))


def load(path: str | Path, world_size: int | None = None) -> list[ProbeResult]:
    from .errors import HetgradError
    try:
        results = [ProbeResult(**d) for d in json.loads(Path(path).read_text())]
    except (OSError, ValueError, TypeError) as exc:
        raise HetgradError(f"cannot read probe file {path}: {exc}", flag="--probe") from None
    if world_size is not None and len(results) != world_size:
        raise HetgradError(f"probe file {path} has {len(results)} ranks, job has {world_size}",
                           flag="--probe")
    return results
