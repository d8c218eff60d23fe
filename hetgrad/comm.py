"""hetgrad's own control messages between ranks (probe results, rebalance timings, checkpoint
state, the host-side sparse exchange), on Horovod's world under every launcher.

Gradients go through Horovod's collectives in the graph; this layer carries the rest. Two
implementations of one small interface, picked by :func:`hetgrad.runtime.connect`:

- :class:`MPIComm` (mpi4py) where MPI's world is Horovod's: mpirun, srun, horovodrun --mpi;
- :class:`~hetgrad.comm_gloo.HorovodComm` (Horovod's own collectives) under
  ``horovodrun --gloo``, where every process is an MPI world of one.
"""
from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from .errors import PeerTimeoutError


class Comm:
    """The collectives hetgrad needs; every rank calls each one in the same order."""

    rank: int
    size: int
    kind: str  # "mpi" or "gloo": what carries the messages (in the run's record)

    def allgather(self, obj: Any) -> list:
        raise NotImplementedError

    def bcast(self, obj: Any, root: int = 0) -> Any:
        raise NotImplementedError

    def allreduce_sum(self, array: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def abort(self, code: int) -> None:
        """End every rank now (after this rank printed why)."""
        raise NotImplementedError

    def stale(self) -> bool:
        """Whether Horovod's world is no longer the one this channel was made for."""
        return False

    def gather(self, obj: Any, root: int = 0) -> list | None:
        """Every rank's ``obj`` on ``root``, None elsewhere."""
        objs = self.allgather(obj)
        return objs if self.rank == root else None

    def barrier(self) -> None:
        self.allgather(None)

    def exchange_barrier(self) -> None:
        """Wait for every rank the way training's gradient exchange waits: in a Horovod
        allreduce (MPI's own blocking calls spin on a core while they wait, which slows the
        ranks still computing where cores are shared)."""
        import horovod.tensorflow as hvd
        import tensorflow as tf
        with tf.device("/CPU:0"):
            hvd.allreduce(tf.zeros([1]), op=hvd.Sum, name="hetgrad_exchange_barrier")

    def gather_with_timeout(self, obj: Any, timeout: float, field: str = "probe_timeout") -> list:
        """Allgather ``obj``; a rank that has not reported within ``timeout`` seconds is named
        in a :class:`PeerTimeoutError` (raised on rank 0) instead of being waited for forever."""
        raise NotImplementedError


def timeout_error(missing: list[int], timeout: float, field: str) -> PeerTimeoutError:
    return PeerTimeoutError(f"rank(s) {missing} did not report within {timeout:g}s",
                            ranks=missing, field=field)


class LocalComm(Comm):
    """A world of one process that no launcher started (``hetgrad train`` typed directly):
    the start-up checks need no MPI there."""

    kind = "local"
    rank, size = 0, 1

    def allgather(self, obj):
        return [obj]

    def bcast(self, obj, root=0):
        return obj

    def allreduce_sum(self, array):
        return np.array(array, copy=True)

    def abort(self, code):
        sys.exit(code)

    def gather_with_timeout(self, obj, timeout, field="probe_timeout"):
        return [obj]


class MPIComm(Comm):
    """mpi4py's communicator (``MPI.COMM_WORLD`` by default)."""

    kind = "mpi"

    def __init__(self, comm=None):
        from mpi4py import MPI
        self.mpi = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def allgather(self, obj):
        return self.comm.allgather(obj)

    def bcast(self, obj, root=0):
        return self.comm.bcast(obj, root=root)

    def gather(self, obj, root=0):
        return self.comm.gather(obj, root=root)

    def barrier(self):
        self.comm.Barrier()

    def allreduce_sum(self, array):
        out = np.array(array, copy=True, order="C")
        self.comm.Allreduce(self.mpi.IN_PLACE, out, op=self.mpi.SUM)
        return out

    def abort(self, code):
        self.comm.Abort(code)

    def gather_with_timeout(self, obj, timeout, field="probe_timeout", tag=7301):
        if self.size == 1:
            return [obj]
        if self.rank != 0:   # (waits idle: the probe's faster ranks wait here for the others)
            _idle_until(self.comm.isend(obj, dest=0, tag=tag))   # (a large one waits for 0)
            _idle_until(self.comm.Ibarrier())   # rank 0 joins once it has every object
            return self.comm.bcast(None, root=0)
        got, deadline = {0: obj}, time.monotonic() + timeout
        while len(got) < self.size and time.monotonic() < deadline:
            for r in set(range(1, self.size)) - set(got):
                message = self.comm.improbe(source=r, tag=tag)
                if message is not None:   # (received whatever its size: an irecv holds 32 KiB)
                    got[r] = message.recv()
            time.sleep(POLL_S)
        missing = sorted(set(range(self.size)) - set(got))
        if missing:
            raise timeout_error(missing, timeout, field)
        _idle_until(self.comm.Ibarrier())
        return self.comm.bcast([got[r] for r in range(self.size)], root=0)


POLL_S = 0.002   # how often a rank waiting idle looks again


def _idle_until(request) -> None:
    """Wait for an MPI request off the core: MPI's blocking calls spin while they wait, and
    where ranks share cores a spinning rank slows those still computing (the probe timed
    their steps with the waiting ranks' spin in them)."""
    while not request.Test():
        time.sleep(POLL_S)
