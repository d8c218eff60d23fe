"""Atomic file writers used by every writer in hetgrad: a reader (or a resumed job) sees the
old file or the new one, never half of one. Readers that name the bad file on failure."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from .errors import InputFileError


def _tmp_of(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def write_text(text: str, path: str | os.PathLike) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    path = Path(path)
    tmp = _tmp_of(path)
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json(obj, path: str | os.PathLike) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    write_text(json.dumps(obj, indent=2), path)


def write_npz(path: str | os.PathLike, *args: np.ndarray, **arrays: np.ndarray) -> None:
    """``np.savez`` through a temporary file and a rename."""
    path = Path(path)
    tmp = _tmp_of(path)
    try:
        with open(tmp, "wb") as f:
            np.savez(f, *args, **arrays)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_json(path: str | os.PathLike, *, field: str | None = None, what: str = "file"):
    """Parsed JSON of ``path``; an unreadable or malformed file raises
    :class:`InputFileError` naming ``what``, the path and the ``field`` that pointed to it."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise InputFileError(f"cannot read {what} {path}: {exc}", field=field) from None
