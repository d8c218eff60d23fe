"""A benchmark's results file: JSON, loaded when it exists, rewritten atomically (a temporary
file and a rename: ``hetgrad.io``) after every run, so an interrupted benchmark keeps what
it measured and a rerun can skip it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Hashable, Iterable, TypeVar

from hetgrad.io import write_text

K = TypeVar("K", bound=Hashable)


def load(path: str | Path, fresh: dict) -> dict:
    """The results at ``path``, or ``fresh`` when there is no such file yet."""
    path = Path(path)
    return json.loads(path.read_text()) if path.is_file() else fresh


def save(data: dict, path: str | Path, indent: int = 2) -> None:
    """Write ``data`` to ``path`` (its directory made if needed) atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(json.dumps(data, indent=indent), path)


class Rows:
    """Results kept as ``data["rows"]``, one row per run, each run known by ``key(row)``:
    :meth:`pending` leaves out the runs already held, :meth:`add` appends and saves."""

    def __init__(self, path: str | Path, key: Callable[[dict], K], fresh: dict,
                 indent: int = 1):
        self.path, self.key, self.indent = Path(path), key, indent
        self.data = load(path, dict(fresh))
        self.data.setdefault("rows", [])

    @property
    def rows(self) -> list[dict]:
        return self.data["rows"]

    def pending(self, todo: Iterable[K]) -> list[K]:
        """The runs of ``todo`` (keys, in its order) that no row holds yet."""
        done = {self.key(r) for r in self.rows}
        return [k for k in todo if k not in done]

    def add(self, row: dict) -> None:
        """Append ``row`` and rewrite the file."""
        self.rows.append(row)
        save(self.data, self.path, self.indent)
