"""Launch a run, check it, load its record: one way for every benchmark.

One timeout rule: every launched command may take :data:`TIMEOUT_S` seconds (the longest a
benchmark run legitimately takes, a 1 Gbit/s sparse run, with margin), or what
``HETGRAD_BENCH_TIMEOUT`` says. A command that fails or times out stops the benchmark with a
one-line :class:`LaunchError` naming it; the end of its stderr is printed just before.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

TIMEOUT_S = float(os.environ.get("HETGRAD_BENCH_TIMEOUT", "5400"))
STDERR_TAIL = 3000   # characters of a failed command's stderr shown
# TensorFlow's start-up chatter off in launched runs, unless the caller's environment says
QUIET_TF = {"TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}


class LaunchError(SystemExit):
    """A launched command failed: one line naming it (a SystemExit: the script stops with
    that line, no traceback)."""


def run(cmd: Sequence[str], *, env: dict[str, str] | None = None, cwd: str | Path | None = None,
        timeout: float | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd`` to its end (output captured as text), ``env`` added to this environment;
    raise :class:`LaunchError` when it exits non-zero or outlives ``timeout`` (default
    :data:`TIMEOUT_S`)."""
    limit = TIMEOUT_S if timeout is None else timeout
    shown, t0 = shlex.join(map(str, cmd)), time.monotonic()
    try:
        proc = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, cwd=cwd,
                              env={**os.environ, **(env or {})}, timeout=limit)
    except subprocess.TimeoutExpired as exc:
        _show_tail(exc.stderr)
        raise LaunchError(f"bench: timed out after {limit:g} s: {shown}") from None
    if proc.returncode:
        _show_tail(proc.stderr)
        raise LaunchError(f"bench: exit {proc.returncode} after "
                          f"{time.monotonic() - t0:.1f} s: {shown}")
    return proc


def _show_tail(stderr: str | bytes | None) -> None:
    if isinstance(stderr, bytes):
        stderr = stderr.decode(errors="replace")
    if stderr:
        print(stderr[-STDERR_TAIL:].rstrip(), file=sys.stderr, flush=True)


def mpirun(np_: int, args: Sequence[str], *, mpirun_args: Sequence[str] = (),
           wrap: Sequence[str] | None = None) -> list[str]:
    """``hetgrad ARGS`` on ``np_`` local ranks (``hetgrad.cli.mpirun_command``: oversubscribed,
    not bound, as root when root), each rank's Python behind ``wrap`` when given (e.g.
    :func:`bench.placement.placed`'s prefix)."""
    from hetgrad.cli import mpirun_command
    cmd = mpirun_command(np_, list(args), list(mpirun_args))
    if wrap:
        i = cmd.index(sys.executable)
        cmd = cmd[:i] + list(wrap) + cmd[i:]
    return cmd


def train_cmd(np_: int, args: Sequence[str], out: str | Path, **kw) -> list[str]:
    """``hetgrad train ARGS --quiet --out OUT`` on ``np_`` local ranks (``kw``: those of
    :func:`mpirun`)."""
    return mpirun(np_, ["train", *args, "--quiet", "--out", str(out)], **kw)


def train(np_: int, args: Sequence[str], out: str | Path, *, env: dict[str, str] | None = None,
          **kw) -> dict:
    """Run :func:`train_cmd` (with ``env`` added) and return the record it wrote to ``out``."""
    cmd = train_cmd(np_, args, out, **kw)
    run(cmd, env={**QUIET_TF, **(env or {})})
    return load_record(out, cmd)


def train_once(path: Path, np_: int, args: Sequence[str], placement=None, *, tag: str,
               **fields) -> None:
    """The record of ``hetgrad train ARGS`` on ``np_`` ranks placed by ``placement``
    (:func:`bench.placement.placed`) at ``path``, with ``fields`` added -- unless ``path``
    exists (a benchmark resumes where it stopped); written through ``path.part``."""
    from bench.placement import placed
    if path.exists():
        return
    print(f"[{tag}] {path.name}", flush=True)
    part = path.with_name(path.name + ".part")
    with placed(placement) as wrap:
        rec = train(np_, args, part, wrap=wrap)
    rec.update(fields)
    path.write_text(json.dumps(rec, indent=1))
    part.unlink()


def load_record(out: str | Path, cmd: Sequence[str] = ()) -> dict:
    """The JSON record at ``out``; a missing or broken one is a :class:`LaunchError`."""
    try:
        return json.loads(Path(out).read_text())
    except (OSError, ValueError) as exc:
        raise LaunchError(f"bench: no record in {out} ({exc}) after: "
                          f"{shlex.join(map(str, cmd))}") from None
