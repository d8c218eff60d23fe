"""Markdown tables and the number formats the benchmarks' tables share."""
from __future__ import annotations

from typing import Iterable, Sequence


def markdown(header: Sequence[str], rows: Iterable[Sequence]) -> str:
    """A Markdown table: the header, its rule, one line per row (cells as ``str``)."""
    line = lambda cells: "| " + " | ".join(map(str, cells)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "---|" * len(header), *map(line, rows)])


def num(value: float | None, spec: str, missing: str = "-") -> str:
    """``value`` formatted by ``spec``, or ``missing`` for None."""
    return missing if value is None else format(value, spec)


def ms(seconds: float | None, missing: str = "-") -> str:
    """Seconds shown as milliseconds with one decimal (``12.3 ms``)."""
    return missing if seconds is None else f"{1e3 * seconds:.1f} ms"


def series(values: Iterable[float], spec: str = ".2f") -> str:
    """``0.91, 1.02, 0.97``: one number per repeat."""
    return ", ".join(format(v, spec) for v in values)
