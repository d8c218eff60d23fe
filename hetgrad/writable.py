"""Where a run writes, checked before any work (no TensorFlow): a file that can be created
or replaced, a directory that can be made and written in."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import ConfigError


def check_writable(path: str | os.PathLike, field: str) -> None:
    """``path`` can be created or replaced: not a directory, in an existing directory where a
    file can be created (tried with a temporary file, removed at once)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{p} is a directory; give a file path", field=field)
    parent = p.resolve().parent
    if not parent.is_dir():
        raise ConfigError(f"directory {parent} does not exist", field=field)
    can_create(parent, field)


def check_observers(tensorboard: str | None, timeline: str | None) -> None:
    """Where rank 0 writes TensorBoard's scalars (a directory, made if missing) and the
    timeline (a file) can be written."""
    if tensorboard:
        check_log_dir(tensorboard, "tensorboard")
    if timeline:
        check_writable(timeline, "timeline")


def check_log_dir(path: str | os.PathLike, field: str) -> None:
    """``path`` is a directory where files can be written, made if missing (its parents
    too)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{p} is a file; give a directory", field=field)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot make directory {p}: {exc.strerror}", field=field) from None
    can_create(p, field)


def can_create(directory: Path, field: str) -> None:
    """A file can be made in ``directory`` (tried, removed at once)."""
    try:
        fd, name = tempfile.mkstemp(dir=directory, prefix=".hetgrad-check")
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        raise ConfigError(f"cannot write in {directory}: {exc.strerror}", field=field) from None
