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


def write_bytes(data: bytes, path: str | os.PathLike) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename."""
    path = Path(path)
    tmp = _tmp_of(path)
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(text: str, path: str | os.PathLike) -> None:
    """Write ``text`` to ``path`` atomically."""
    write_bytes(text.encode(), path)


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


_BASE = {"int": (int,), "float": (int, float), "str": (str,), "dict": (dict,), "list": (list,),
         "bool": (bool,)}


def _matches(value, annotation: str) -> bool:
    """Whether ``value`` (parsed JSON) fits a field annotation such as ``list[int] | None``."""
    for alt in (a.strip() for a in annotation.split("|")):
        if alt == "None":
            if value is None:
                return True
        elif alt.startswith("list[") and alt.endswith("]"):
            if isinstance(value, list) and all(_matches(v, alt[5:-1]) for v in value):
                return True
        elif alt in _BASE:
            if isinstance(value, _BASE[alt]) and (alt == "bool" or not isinstance(value, bool)):
                return True
        else:
            return True   # an annotation this check does not know: not checked
    return False


def typed(cls, data, what: str) -> dict:
    """``data`` (parsed JSON) checked against the fields of dataclass ``cls``: a dict whose
    values have the annotated types (JSON kinds); raises ``TypeError`` naming the field."""
    from dataclasses import fields
    if not isinstance(data, dict):
        raise TypeError(f"{what} must be a JSON object, got {type(data).__name__}")
    known = {f.name: f for f in fields(cls)}
    for key, value in data.items():
        if key in known and not _matches(value, str(known[key].type)):
            raise TypeError(f"field {key!r} is {value!r}, expected {known[key].type}")
    return data
