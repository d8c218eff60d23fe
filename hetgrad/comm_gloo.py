"""The control channel under ``horovodrun --gloo`` (:class:`HorovodComm`), where every process
is an MPI world of one and Horovod's own collectives carry hetgrad's messages."""
from __future__ import annotations

import itertools
import os
import sys
import threading
import time

from .comm import Comm, timeout_error
from .errors import PeerTimeoutError


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
            raise timeout_error(missing, timeout, field)
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
