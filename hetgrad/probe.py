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

from .compat import keras
from .errors import InputFileError, PeerTimeoutError
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


def run_probe(comm, build_model: Callable[[], keras.Model], input_shape, num_classes: int, *,
              device: str, batch: int = 32, warmup: int = 3, steps: int = 10,
              before_step: Callable[[int], None] | None = None,
              timeout: float = 300.0) -> list[ProbeResult]:
    """Probe this rank (``before_step(n)``: e.g. speed emulation) and allgather the results."""
    model = build_model()
    model.compile(optimizer=keras.optimizers.SGD(0.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    sps, times = measure(model, input_shape, num_classes, batch=batch, warmup=warmup, steps=steps,
                         before_step=before_step)
    mine = ProbeResult(comm.Get_rank(), socket.gethostname(), device, sps, batch, times)
    return [ProbeResult(**d) for d in gather_with_timeout(comm, asdict(mine), timeout)]


def gather_with_timeout(comm, obj, timeout: float, tag: int = 7301) -> list:
    """Allgather ``obj`` via rank 0, which names every rank that has not reported within
    ``timeout`` seconds (then ``fail_fast`` aborts the job) instead of waiting forever."""
    rank, size = comm.Get_rank(), comm.Get_size()
    if size == 1:
        return [obj]
    if rank != 0:
        comm.send(obj, dest=0, tag=tag)
        return comm.bcast(None, root=0)
    reqs = {r: comm.irecv(source=r, tag=tag) for r in range(1, size)}
    got = {0: obj}
    deadline = time.monotonic() + timeout
    while reqs and time.monotonic() < deadline:
        for r, req in list(reqs.items()):
            done, value = req.test()
            if done:
                got[r] = value
                del reqs[r]
        time.sleep(0.01)
    if reqs:
        raise PeerTimeoutError(f"rank(s) {sorted(reqs)} did not report within {timeout:g}s",
                               ranks=sorted(reqs), field="probe_timeout")
    return comm.bcast([got[r] for r in range(size)], root=0)


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
