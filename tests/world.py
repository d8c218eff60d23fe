"""Test worlds: ``size`` real MPI ranks started once (``mpirun -np size``) that run many test
cases, one after another, instead of one ``mpirun`` (and one TensorFlow import per rank) per
case -- the way Horovod runs its own suite in one world per file.

A case is a function ``module:function`` in ``tests/mpi/``; every rank calls it with the same
arguments and sends back what it returned (or its traceback), with what it printed. The test
then asserts on the values in the test process::

    def test_something(world3):
        res = world3.run("exactness:weighted_step")   # every rank's return value
        assert res.root["dense_plan"] < 1e-5           # rank 0's

A rank that raises fails the case with its rank and traceback; a case that does not finish
in ``timeout`` seconds (e.g. one rank raised while the others wait in a collective) ends the
world, and the next case starts a new one. Between cases Horovod is shut down on every rank
(so idle ranks do not spin on the cores), and started again for the next case.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path

SERVE = Path(__file__).parent / "mpi" / "serve.py"
START_TIMEOUT = 180.0   # every rank imports TensorFlow and Horovod first
GRACE_S = 20.0          # how long the other ranks may take to report after one rank failed


class CaseError(AssertionError):
    """A case failed on some rank (its traceback), or did not finish in time."""


@dataclass
class CaseResult:
    """What every rank returned and printed (lists indexed by rank)."""

    values: list
    stdout: list[str]
    stderr: list[str]

    @property
    def root(self):
        """Rank 0's return value."""
        return self.values[0]


class World:
    """``size`` ranks under ``mpirun`` serving cases over one Unix socket per rank."""

    def __init__(self, size: int, mpirun_cmd, env: dict):
        self.size = size
        self.dir = Path(tempfile.mkdtemp(prefix=f"hetgrad-world{size}-"))
        self.log = self.dir / "ranks.log"
        address = str(self.dir / "socket")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(address)
        server.listen(size)
        server.settimeout(START_TIMEOUT)
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(mpirun_cmd(size, [str(SERVE), address]), stdout=log,
                                         stderr=subprocess.STDOUT, env=env)
        self.conns: dict[int, Connection] = {}
        try:
            while len(self.conns) < size:
                sock, _ = server.accept()
                conn = Connection(sock.detach())
                self.conns[conn.recv()] = conn
        except (OSError, EOFError) as exc:
            self.close()
            raise CaseError(f"world of {size} ranks did not start ({exc}):\n{self.tail()}") \
                from None
        finally:
            server.close()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None and len(self.conns) == self.size

    def run(self, case: str, *args, timeout: float = 300, env: dict | None = None,
            **kwargs) -> CaseResult:
        """Call ``case`` (``"module:function"`` of tests/mpi) on every rank with these
        arguments (``env``: environment variables set for the call)."""
        for conn in self.conns.values():
            conn.send((case, args, kwargs, env or {}))
        replies: dict[int, tuple] = {}
        deadline = time.monotonic() + timeout
        while len(replies) < self.size:
            waiting = {c: r for r, c in self.conns.items() if r not in replies}
            left = deadline - time.monotonic()
            if any(rep[0] == "error" for rep in replies.values()):
                left = min(left, GRACE_S)
            ready = wait(list(waiting), timeout=max(left, 0)) if left > 0 else []
            if not ready:
                break
            for conn in ready:
                try:
                    replies[waiting[conn]] = conn.recv()
                except EOFError:
                    replies[waiting[conn]] = ("error", "the rank's process ended", "", "")
        return self._result(case, replies)

    def _result(self, case: str, replies: dict[int, tuple]) -> CaseResult:
        failed = {r: rep for r, rep in sorted(replies.items()) if rep[0] == "error"}
        missing = sorted(set(range(self.size)) - set(replies))
        if failed or missing:
            if missing or not self.alive:
                self.close()   # ranks stuck in a collective (or gone): a new world next time
            lines = [f"case {case} failed on {self.size} ranks"]
            for r, (_, text, out, err) in failed.items():
                lines.append(f"--- rank {r} raised:\n{text}\n--- rank {r} printed:\n{out}{err}")
            if missing:
                lines.append(f"--- rank(s) {missing} did not finish; world ended. Ranks' log:\n"
                             f"{self.tail()}")
            raise CaseError("\n".join(lines))
        return CaseResult(*([replies[r][i] for r in range(self.size)] for i in (1, 2, 3)))

    def tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text()[-chars:]
        except OSError:
            return ""

    def close(self) -> None:
        """Ask every rank to leave, then end the launcher (killed if it does not end), and
        remove the world's directory (its socket and the ranks' log)."""
        for conn in self.conns.values():
            try:
                conn.send(None)
                conn.close()
            except OSError:
                pass
        self.conns = {}
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Worlds:
    """The session's worlds, one per size, started on first use and again after one ended."""

    def __init__(self, mpirun_cmd, env: dict):
        self.mpirun_cmd, self.env = mpirun_cmd, env
        self.open: dict[int, World] = {}

    def __call__(self, size: int) -> World:
        world = self.open.get(size)
        if world is None or not world.alive:
            if world is not None:   # ended (its failure already reported its log)
                world.close()
            world = self.open[size] = World(size, self.mpirun_cmd, self.env)
        return world

    def close(self) -> None:
        for world in self.open.values():
            world.close()
        self.open = {}


class WorldOf:
    """A fixture's handle on the world of one size: ``run`` starts it (again) when needed."""

    def __init__(self, worlds: Worlds, size: int):
        self.worlds, self.size = worlds, size

    def run(self, case: str, *args, **kwargs) -> CaseResult:
        return self.worlds(self.size).run(case, *args, **kwargs)


def world_env() -> dict:
    """The environment of the ranks: the test process's, quieted, unbuffered."""
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
                OMPI_MCA_rmaps_base_oversubscribe="1")
