"""Stop on request with a checkpoint: SIGUSR1 (Slurm's ``--signal=USR1@<seconds>`` before the
time limit, or ``kill -USR1`` of a launcher that forwards it) asks every rank to finish the
epoch, save a checkpoint and exit with :data:`EXIT_REQUEUE`, so the job script can requeue
itself and the next run resumes (``slurm/train.sbatch`` does).

A signal reaches the ranks at different steps, so the request only takes effect at an epoch
end, where the loop's one per-epoch allgather (:func:`hetgrad.loop.run_epochs`) makes every
rank agree on it.
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
    during the probe is honoured at the first epoch end."""
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


def stop(epoch: int, num_epochs: int, directory: str, rank: int) -> NoReturn:
    """Raise :class:`Preempted` after ``epoch``'s checkpoint in ``directory``; rank 0 says
    where it is and how to go on."""
    if rank == 0:
        print(f"hetgrad: stopped by {STOP_SIGNAL.name} after epoch {epoch}/{num_epochs}; "
              f"checkpoint in {directory}, resume to continue (exit {EXIT_REQUEUE})",
              file=sys.stderr, flush=True)
    raise Preempted(epoch, directory)
