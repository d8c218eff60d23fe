"""Stop on request with a checkpoint: SIGUSR1 (Slurm's ``--signal=USR1@<seconds>`` before the
time limit, or ``kill -USR1`` of a launcher that forwards it) asks every rank to stop after
the step it is in, save a checkpoint and exit with :data:`EXIT_REQUEUE`, so the job script can
requeue itself and the next run resumes there (``slurm/train.sbatch`` does).

A signal reaches the ranks at different steps, so the request takes effect where the ranks
agree on it: after a step (the epoch loop's per-step check, :mod:`hetgrad.loop`), or at an
epoch end for one that came later in the epoch.
"""
from __future__ import annotations

import signal
import sys
from contextlib import contextmanager
from typing import NoReturn

STOP_SIGNAL = signal.SIGUSR1
EXIT_REQUEUE = 75   # EX_TEMPFAIL: "try again later"

_requested = False
_depth = 0   # nested listening(): only the outermost installs the handler and resets


def requested() -> bool:
    """Whether this rank got :data:`STOP_SIGNAL` since :func:`listening` began."""
    return _requested


def clear() -> None:
    """Forget a request (one that cannot be honoured)."""
    global _requested
    _requested = False


@contextmanager
def listening():
    """Record :data:`STOP_SIGNAL` instead of dying of it (its default action) while inside;
    nothing is installed outside the main thread. Nested (``hetgrad train`` listens from
    start-up, the epoch loop again), the outer one's handler and request are kept: a request
    during the probe is honoured after the first step."""
    global _requested, _depth
    if _depth:
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
        return
    _requested = False

    def note(signum, frame):
        global _requested
        _requested = True
    try:
        previous = signal.signal(STOP_SIGNAL, note)
    except ValueError:   # not the main thread: leave the signal alone
        yield
        return
    _depth = 1
    try:
        yield
    finally:
        _depth = 0
        signal.signal(STOP_SIGNAL, previous)


class Preempted(SystemExit):
    """Raised on every rank together once the stop request's checkpoint is saved: the
    process exits with :data:`EXIT_REQUEUE` unless a script catches it."""

    def __init__(self, epoch: int, directory: str):
        self.epoch, self.directory = epoch, directory
        super().__init__(EXIT_REQUEUE)


def stop(epoch: int, num_epochs: int, directory: str, rank: int,
         step: tuple[int, int] | None = None) -> NoReturn:
    """Raise :class:`Preempted` after the checkpoint in ``directory`` of ``epoch`` epochs (and
    ``step = (k, steps)``: ``k`` steps of the next); rank 0 says where and how to go on."""
    if rank == 0:
        where = (f"at step {step[0]}/{step[1]} of epoch {epoch + 1}/{num_epochs}" if step
                 else f"after epoch {epoch}/{num_epochs}")
        print(f"hetgrad: stopped by {STOP_SIGNAL.name} {where}; checkpoint in {directory}, "
              f"resume to continue (exit {EXIT_REQUEUE})", file=sys.stderr, flush=True)
    raise Preempted(epoch, directory)
