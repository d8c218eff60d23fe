"""Process set-up shared by every command: MPI, Horovod, TF threads and device placement."""
from __future__ import annotations

import gc
import os
import signal
import sys
import time
import traceback
from contextlib import contextmanager
from typing import Callable, TypeVar

from .comm import Comm, LocalComm, MPIComm
from .comm_gloo import HorovodComm
from .launcher import gloo_launch, launched, mpirun_launch, rank_and_size
from .config import check_value
from .errors import AgreedError, ConfigError, HetgradError, Interrupted

T = TypeVar("T")


INTER_OP_MIN = 2


def configure_tf(threads: int = 1, device: str = "cpu") -> str:
    """Limit TF threads (several ranks share the cores) and pick ``cpu``, ``gpu`` or ``auto``.

    ``threads`` is the intra-op pool (what computes); the inter-op pool gets at least 2, so
    the exchange of a finished gradient starts, and its result is consumed, while the next
    layer's backward pass runs: with one inter-op thread a 25 M-parameter step was 10 %
    slower, and any extra op on the gradients (the finite check, the timers) cost 13-21 %
    more (docs/results.md#overhead).

    Returns the device string used for placement, e.g. ``/CPU:0`` or ``/GPU:0``.
    """
    import tensorflow as tf

    if not os.environ.get("HETGRAD_VERBOSE"):  # e.g. "callback is slow" notes, on every rank
        tf.get_logger().setLevel("ERROR")
    check_value("device", device)
    check_value("threads", threads)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(INTER_OP_MIN, threads))
    gpus = tf.config.list_physical_devices("GPU")
    if device == "gpu" and not gpus:
        raise ConfigError("gpu asked for, but this rank sees no GPU", field="device")
    if device == "cpu" or not gpus:
        tf.config.set_visible_devices([], "GPU")
        return "/CPU:0"
    import horovod.tensorflow as hvd
    gpu = gpus[hvd.local_rank() % len(gpus)]
    tf.config.set_visible_devices([gpu], "GPU")
    tf.config.experimental.set_memory_growth(gpu, True)
    return "/GPU:0"


_WORLD: Comm | None = None
GRACE_S = 20.0  # how long a rank lets the rank that found an error report and abort first
PEERS_S = 1.0   # how long that rank lets the others, which raise the same error, go quiet


def init() -> Comm:
    """Start Horovod (and MPI where it is the launcher's world) once; return the control
    channel of Horovod's world (see :mod:`hetgrad.comm`). Idempotent; a new channel when
    Horovod's world changed (an elastic job's ranks joined or left)."""
    global _WORLD
    if _WORLD is None or _WORLD.stale():
        _WORLD = connect()
    return _WORLD


def forget() -> None:
    """Drop the control channel: Horovod was started again on a new world (an elastic
    reset), so the next :func:`init` makes a new one, its message count from zero on every
    rank, the ranks that joined included."""
    global _WORLD
    _WORLD = None
    from .tape import forget_aggregations
    forget_aggregations()


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


def control(threads: int = 1, device: str = "cpu") -> Comm:
    """The ranks' channel for the start-up checks, which run before TensorFlow is loaded:
    mpi4py's world where MPI is the launcher's (mpirun, srun, horovodrun with MPI), so a bad
    flag is refused in about a second (no MPI at all in a process no launcher started).
    Under Gloo only Horovod's world exists, and its
    collectives are TensorFlow ops: there TensorFlow is loaded and configured first
    (:func:`configure_tf` with ``threads`` and ``device``)."""
    if _WORLD is None and not gloo_launch():
        return MPIComm() if launched() else LocalComm()
    comm = init()
    agree(comm, lambda: configure_tf(threads, device))
    return comm


@contextmanager
def still_heap():
    """Objects alive at the start (TensorFlow's, Keras', the model's: millions) out of the
    garbage collector's sight for the training (``gc.freeze``; back at its end): each full
    collection no longer scans them. Tracing a step makes enough objects to run several, and
    they made the first step about a fifth slower (docs/results.md). Objects made later are
    collected as before; garbage not yet collected at the start is kept to the end (a
    collection first would cost one full scan). Left alone where the process froze some
    itself (a freeze made during the training is undone with it)."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextmanager
def fail_fast(flags: dict[str, str] | None = None):
    """Turn any error on any rank into a one-line message naming the rank, then end all ranks.

    A rank that fails alone would leave the others blocked in a collective, so with more than
    one rank we call ``MPI_Abort``; exit code 2 for user errors, 1 otherwise. An error every
    rank raised (:class:`AgreedError`) is printed by rank 0 only; every rank exits, or under
    Open MPI's mpirun rank 0 aborts (mpirun ends ranks that exit non-zero 2 s later).
    ``flags`` maps a setting to the flag shown for it (see :meth:`HetgradError.render`). An
    error another rank reports (``reported_elsewhere``) waits :data:`GRACE_S` for that rank's
    abort first; that rank waits :data:`PEERS_S` before it, for the others to reach theirs.
    """
    _raise_on_signals()
    try:
        yield
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - we report and abort on anything
        if isinstance(exc, KeyboardInterrupt):
            exc = Interrupted(signal.SIGINT)
        if _signalled is not None:   # raised in the handler, maybe wrapped (e.g. by autograph)
            exc = Interrupted(_signalled)
        code = getattr(exc, "exit_code", 2 if isinstance(exc, HetgradError) else 1)
        rank, size = _rank_size()
        if isinstance(exc, AgreedError):  # every rank raised it: no rank is left waiting
            if rank == 0:
                print(f"hetgrad: error: {exc.render(flags)}", file=sys.stderr, flush=True)
            if size > 1 and mpirun_launch() and not gloo_launch():   # not mpirun's 2 s
                _abort_from_rank0(rank, code)                       # teardown: 0.3 s
            sys.exit(code)
        if size > 1 and getattr(exc, "reported_elsewhere", False):
            quiet_on_sigterm()
            time.sleep(GRACE_S)
        where = f" on rank {rank}/{size}" if size > 1 else ""
        if code == 1:
            traceback.print_exc()
        text = exc.render(flags) if isinstance(exc, HetgradError) else str(exc)
        print(f"hetgrad: error{where}: {text}", file=sys.stderr, flush=True)
        if size > 1:
            if getattr(exc, "culprits", None):   # the others raise it in the same step: a
                time.sleep(PEERS_S)              # slower one must not meet the abort's SIGTERM
            abort(code)                          # before it knows (it would print a line)
        sys.exit(code)


def _abort_from_rank0(rank: int, code: int) -> None:
    """End an agreed error's job through rank 0's ``MPI_Abort`` (its banner replaces mpirun's
    non-zero-exit one) once every rank is quiet on SIGTERM; the others wait for it."""
    quiet_on_sigterm()
    (_WORLD or MPIComm()).barrier()
    if rank == 0:
        abort(code)
    time.sleep(GRACE_S)


_signalled: int | None = None   # the signal that :func:`_raise_on_signals` turned into an error


def quiet_on_sigterm() -> None:
    """Another rank reports the job's error and its abort ends this rank: the launcher's
    SIGTERM then ends it without a line of its own (main thread only)."""
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except ValueError:
        pass


def _raise_on_signals() -> None:
    """SIGTERM (and SIGINT) raise :class:`Interrupted` at the rank's next Python step, so it
    ends with a hetgrad line and the launcher's other ranks are taken down with it."""
    def handler(signum, frame):
        global _signalled
        _signalled = signum
        raise Interrupted(signum)
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            signal.signal(sig, handler)
        except ValueError:   # not the main thread (e.g. an embedding host): leave them
            return


def agree(comm: Comm, check: Callable[[], T]) -> T:
    """``check()`` on every rank; if it raised a :class:`HetgradError` on any rank, every rank
    raises the same :class:`AgreedError` (the lowest failing rank's), so no rank goes on
    into a collective alone. Other exceptions (bugs) propagate to :func:`fail_fast`."""
    try:
        result, problem = check(), None
    except AgreedError:
        raise
    except HetgradError as exc:
        result, problem = None, (exc.message, exc.field)
    problems = comm.allgather(problem) if comm.size > 1 else [problem]
    failed = [r for r, p in enumerate(problems) if p is not None]
    if failed:
        message, field = problems[failed[0]]
        raise AgreedError(message, field=field, ranks=failed, size=comm.size)
    return result


def abort(code: int) -> None:
    """End every rank: through the world in use, else the launcher's (MPI, or Gloo's exit)."""
    if _WORLD is not None:
        _WORLD.abort(code)
    elif gloo_launch():
        os._exit(code)
    else:
        from mpi4py import MPI
        MPI.COMM_WORLD.Abort(code)


def _rank_size() -> tuple[int, int]:
    """This rank and the world size, also before (or without) :func:`init`."""
    if _WORLD is not None:
        return _WORLD.rank, _WORLD.size
    return rank_and_size()
