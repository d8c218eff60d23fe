"""matplotlib figures for the benchmarks, drawn off-screen (Agg) and saved the same way."""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Sequence


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def panels(n: int, width: float, height: float):
    """A figure of ``n`` panels side by side, each ``width`` x ``height`` inches: (fig, axes)."""
    fig, axes = pyplot().subplots(1, n, figsize=(width * n, height), squeeze=False)
    return fig, list(axes[0])


def save(fig, path: str | Path, dpi: int = 110) -> Path:
    """Write ``fig`` to ``path`` (its directory made if needed) after a tight layout; close it."""
    path = Path(path)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path


def mean_curve(curves: Sequence[Sequence[float]]) -> list[float]:
    """The point-by-point mean of ``curves``, as long as the shortest one."""
    return [statistics.fmean(points) for points in zip(*curves)]


def grouped_bars(ax, groups: Sequence[str], series: dict[str, Sequence[float]]) -> None:
    """One bar per ``series`` entry side by side in each group (NaN: no bar), the groups
    labelled on the x axis."""
    width = 0.8 / len(series)
    for k, (label, values) in enumerate(series.items()):
        ax.bar([i + k * width for i in range(len(groups))], values, width, label=label)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))], groups, fontsize=8)
