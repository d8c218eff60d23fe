"""A stuck rank must not hang the job: :class:`StepWatchdog` ends every rank when a training
step has not finished within ``--step-timeout`` seconds (a rank stopped, deadlocked, or so
slow that the others wait in the exchange for it).

The watchdog is a Keras callback (armed when a batch begins, disarmed when it ends) and a
daemon thread that checks it once a second. It cannot tell from inside one rank which peer is
missing, so it also sets Horovod's stall check to half the timeout: Horovod's warning, printed
before the abort, lists the ranks that did not submit the exchange.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable

from .compat import keras


def stall_check(timeout: float) -> None:
    """Let Horovod warn about a stalled exchange (naming the missing ranks) after half the
    step timeout; call before Horovod starts."""
    os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", str(max(1, int(timeout / 2))))


class StepWatchdog(keras.callbacks.Callback):
    """Calls ``on_timeout(message)`` (e.g. print and abort every rank) when this rank has
    made no progress for ``timeout`` seconds: progress is any step, evaluation batch or
    epoch boundary (:meth:`beat`), so a wait in any collective counts, within an epoch or
    between epochs (e.g. for rank 0's checkpoint). Armed by the first beat."""

    def __init__(self, timeout: float, on_timeout: Callable[[str], None]):
        super().__init__()
        self.timeout = timeout
        self.on_timeout = on_timeout
        self._last: float | None = None
        self._where, self._step = "before training", 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name="hetgrad-watchdog")
        self._thread.start()

    def beat(self, where: str | None = None) -> None:
        self._last = time.monotonic()
        if where is not None:
            self._where, self._step = where, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.beat(f"epoch {epoch + 1}")

    def on_train_batch_end(self, batch, logs=None):   # per call: a clock read, no strings
        steps = (self.params or {}).get("steps")  # Keras 3 names a short last call's N-th step
        self._last, self._step = time.monotonic(), min(batch + 1, steps or batch + 1)

    def on_test_batch_end(self, batch, logs=None):
        self.beat()

    def on_epoch_end(self, epoch, logs=None):
        self.beat(f"the end of epoch {epoch + 1}")

    def close(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            last = self._last
            if last is not None and time.monotonic() - last > self.timeout:
                where = self._where + (f", after step {self._step}" if self._step else "")
                self.on_timeout(f"no progress for {self.timeout:g}s at {where}: a rank "
                                "is stuck or far slower than the others (Horovod's stall "
                                "warning above names the ranks it waits for); raise "
                                "--step-timeout if a step or a checkpoint takes this long")
                return


def abort_all(rank: int, size: int) -> Callable[[str], None]:
    """What a watchdog does on every rank of the world: one hetgrad line, then abort."""
    def fire(message: str) -> None:
        where = f" on rank {rank}/{size}" if size > 1 else ""
        print(f"hetgrad: error{where}: --step-timeout: {message}", file=sys.stderr, flush=True)
        from .runtime import abort
        if size > 1:
            abort(3)
        os._exit(3)
    return fire
