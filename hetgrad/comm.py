"""hetgrad's own control messages between ranks (probe results, rebalance timings, checkpoint
state, the host-side sparse exchange), on Horovod's world under every launcher.

Gradients go through Horovod's collectives in the graph; this layer carries the rest. Two
implementations of one small interface, picked by :func:`connect`:

- :class:`MPIComm` (mpi4py) where MPI's world is Horovod's: mpirun, srun, horovodrun --mpi;
- :class:`HorovodComm` (Horovod's own collectives) under ``horovodrun --gloo``, where every
  process is an MPI world of one.
"""
from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from typing import Any

import numpy as np

from .errors import HetgradError, PeerTimeoutError
from .launcher import gloo_launch


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


def _timeout_error(missing: list[int], timeout: float, field: str) -> PeerTimeoutError:
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
            self.comm.send(obj, dest=0, tag=tag)
            _idle_until(self.comm.Ibarrier())   # rank 0 joins once it has every object
            return self.comm.bcast(None, root=0)
        reqs = {r: self.comm.irecv(source=r, tag=tag) for r in range(1, self.size)}
        got = {0: obj}
        deadline = time.monotonic() + timeout
        while reqs and time.monotonic() < deadline:
            for r, req in list(reqs.items()):
                done, value = req.test()
                if done:
                    got[r] = value
                    del reqs[r]
            time.sleep(POLL_S)
        if reqs:
            raise _timeout_error(sorted(reqs), timeout, field)
        _idle_until(self.comm.Ibarrier())
        return self.comm.bcast([got[r] for r in range(self.size)], root=0)


POLL_S = 0.002   # how often a rank waiting idle looks again


def _idle_until(request) -> None:
    """Wait for an MPI request off the core: MPI's blocking calls spin while they wait, and
    where ranks share cores a spinning rank slows those still computing (the probe timed
    their steps with the waiting ranks' spin in them)."""
    while not request.Test():
        time.sleep(POLL_S)


class HorovodComm(Comm):
    """Horovod's object collectives (eager ops, named in call order, the same on every rank).

    The timed gather posts each rank's object to the launcher's rendezvous key-value store
    (``horovodrun`` runs one for Gloo), so rank 0 can name the ranks that never posted.
    """

    kind = "gloo"

    def __init__(self):
        import horovod.tensorflow as hvd
        self.hvd = hvd
        self.rank, self.size = hvd.rank(), hvd.size()
        self._calls = itertools.count()

    def stale(self) -> bool:   # an elastic job re-initialises Horovod on a new world
        return (not self.hvd.is_initialized()
                or (self.hvd.rank(), self.hvd.size()) != (self.rank, self.size))

    def _name(self, kind: str) -> str:
        return f"hetgrad_{kind}_{next(self._calls)}"

    def allgather(self, obj):
        return list(self.hvd.allgather_object(obj, name=self._name("allgather")))

    def bcast(self, obj, root=0):
        return self.hvd.broadcast_object(obj, root_rank=root, name=self._name("bcast"))

    def allreduce_sum(self, array):
        import tensorflow as tf
        with tf.device("/CPU:0"):
            out = self.hvd.allreduce(tf.constant(array), op=self.hvd.Sum,
                                     name=self._name("allreduce"))
        return out.numpy()

    def abort(self, code):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # a non-elastic horovodrun then ends the other workers

    def gather_with_timeout(self, obj, timeout, field="probe_timeout"):
        name = self._name("timed")
        addr = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
        port = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
        if self.size == 1:
            return [obj]
        if not (addr and port):
            return _allgather_within(self, obj, timeout, field)
        from horovod.runner.http.http_client import put_data_into_kvstore, read_data_from_kvstore
        put_data_into_kvstore(addr, port, name, str(self.rank), obj)
        if self.rank != 0:
            return self.bcast(None, root=0)
        got, deadline = {}, time.monotonic() + timeout
        while len(got) < self.size and time.monotonic() < deadline:
            for r in set(range(self.size)) - set(got):
                try:
                    got[r] = read_data_from_kvstore(addr, port, name, str(r))
                except RuntimeError:  # not posted yet
                    pass
            time.sleep(0.05)
        missing = sorted(set(range(self.size)) - set(got))
        if missing:
            raise _timeout_error(missing, timeout, field)
        return self.bcast([got[r] for r in range(self.size)], root=0)


def _allgather_within(comm: Comm, obj, timeout: float, field: str) -> list:
    """Without a rendezvous store: an allgather that gives up after ``timeout`` (the missing
    ranks cannot be told apart then)."""
    box: dict = {}
    worker = threading.Thread(target=lambda: box.setdefault("objs", comm.allgather(obj)),
                              daemon=True)
    worker.start()
    worker.join(timeout)
    if "objs" not in box:
        raise PeerTimeoutError(f"some rank did not report within {timeout:g}s (no rendezvous "
                               "store to tell which)", ranks=[], field=field)
    return box["objs"]


def connect() -> Comm:
    """Start Horovod (and MPI unless on Gloo) and return the control channel of its world."""
    import horovod.tensorflow as hvd
    if gloo_launch():
        hvd.init()
        return HorovodComm()
    comm = MPIComm()  # MPI first (thread-multiple), then Horovod joins the same world
    hvd.init()
    check_same_world(comm.size, hvd.size())
    return comm


def check_same_world(mpi_size: int, horovod_size: int) -> None:
    """Refuse to run when MPI's world and Horovod's world disagree (a launcher mix-up)."""
    if mpi_size != horovod_size:
        raise HetgradError(
            f"MPI's world has {mpi_size} rank(s) but Horovod's has {horovod_size}: launch "
            "with mpirun/srun/horovodrun, or with horovodrun --gloo (HOROVOD_CONTROLLER=gloo)")
