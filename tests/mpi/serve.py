"""One rank of a test world (tests/world.py): connect to the test process, then run the cases
it sends -- ``(case, args, kwargs, env)``, ``case`` a ``module:function`` of this directory --
until it sends None. Every reply is ``("ok", value, stdout, stderr)`` or ``("error",
traceback, stdout, stderr)``.

Usage: serve.py SOCKET
"""
import contextlib
import importlib
import io
import os
import sys
import traceback
from multiprocessing.connection import Client

import hetgrad

comm = hetgrad.init()   # MPI and Horovod, as every hetgrad entry point starts them
import horovod.tensorflow as hvd  # noqa: E402

from hetgrad.compat import keras  # noqa: E402
from hetgrad.runtime import configure_tf  # noqa: E402

configure_tf(1, "cpu")   # what hetgrad train sets by default: 1 compute thread per rank


@contextlib.contextmanager
def environment(env: dict):
    """``env`` set in ``os.environ`` within (restored after)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update({k: str(v) for k, v in env.items()})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run(case: str, args: tuple, kwargs: dict, env: dict) -> tuple:
    module, _, function = case.partition(":")
    out, err = io.StringIO(), io.StringIO()
    hvd.init()
    try:
        with environment(env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            value = getattr(importlib.import_module(module), function)(*args, **kwargs)
        return "ok", value, out.getvalue(), err.getvalue()
    except BaseException:  # noqa: BLE001 - the test process reports it
        return "error", traceback.format_exc(), out.getvalue(), err.getvalue()
    finally:
        hvd.shutdown()   # an idle Horovod spins on the cores the other tests need
        keras.backend.clear_session()


def main(address: str) -> None:
    hvd.shutdown()
    conn = Client(address)
    conn.send(comm.rank)
    while (message := conn.recv()) is not None:
        conn.send(run(*message))


if __name__ == "__main__":
    main(sys.argv[1])
