"""The step timeline: every rank's compute and exchange spans of sampled steps, written by rank 0
as a Chrome-trace / Perfetto JSON file (``chrome://tracing``, ui.perfetto.dev), one track per
rank, with re-plans and checkpoints as markers; and the same as a PNG for ``hetgrad report``.

A step of rank ``r`` *computes* from the end of the exchange before it to its local gradients
being ready (data, forward, backward and the callbacks between steps: its own speed), then
*exchanges* until the step's exchange ends (waiting for the slowest rank, then the
communication) -- the :class:`~hetgrad.timing.StepTimer`'s own timestamps, read after each
sampled step. :class:`Sampler` keeps a long job's file at megabytes. No TensorFlow here.
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from .io import write_text

# one sampled step of one rank: (epoch 1-based, step in the epoch, start, ready, done) in Unix s
Span = tuple[int, int, float, float, float]


@dataclass
class Sampler:
    """Which steps the timeline keeps: every step of the process's first ``first`` steps, then
    a ``window`` of consecutive steps in the middle of an epoch: in every epoch until
    ``windows`` windows were taken, then in every 2nd epoch, after as many more in every 4th,
    and so on -- the windows grow with the logarithm of the epochs."""

    first: int = 100
    window: int = 10
    windows: int = 100
    seen: int = 0                 # steps seen by :meth:`wants`
    epochs: int = 0               # epochs begun
    taken: int = 0                # epochs that had a window
    span: range = field(default_factory=lambda: range(0))   # this epoch's window

    def begin_epoch(self, first_step: int, steps: int, rest: bool = False) -> None:
        """An epoch runs steps ``first_step`` .. ``steps - 1``: choose its window. ``rest``:
        the same epoch goes on there after a split (a window it has moves into what is left;
        no epoch more)."""
        if rest:
            self.span = self._window(first_step, steps) if self.span else self.span
            return
        stride = 2 ** (self.taken // self.windows)
        self.span = range(0)
        if self.epochs % stride == 0:
            self.span = self._window(first_step, steps)
            self.taken += 1
        self.epochs += 1

    def _window(self, first_step: int, steps: int) -> range:
        lo = max(first_step, (first_step + steps) // 2 - self.window // 2)
        return range(lo, min(steps, lo + self.window))

    def wants(self, steps: range) -> bool:
        """Whether to keep the call into the train step that ran ``steps`` of the epoch (one
        step, or ``steps_per_execution``; call once per call, in order)."""
        before, self.seen = self.seen, self.seen + len(steps)
        return before < self.first or any(s in self.span for s in steps)


def clock_offsets(steps: dict[tuple[int, int], list]) -> list[float]:
    """Each rank's clock minus rank 0's: the median difference of the ends of the same steps'
    exchanges, which end together on every rank (corrects the skew of other hosts' clocks)."""
    ranks = len(next(iter(steps.values()))) if steps else 0
    diffs: list[list[float]] = [[] for _ in range(ranks)]
    for spans in steps.values():
        if spans[0] is None:
            continue
        for r, s in enumerate(spans):
            if s is not None:
                diffs[r].append(s[2] - spans[0][2])
    return [statistics.median(d) if d else 0.0 for d in diffs]


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 1)


class Trace:
    """Rank 0's timeline: the sampled spans of every rank by (epoch, step), epoch spans and
    markers, written whole to ``path`` (atomically: the file is always a complete trace) at
    most every ``every_s`` seconds and at the end."""

    def __init__(self, path: str | Path, size: int, every_s: float = 30.0):
        self.path, self.size, self.every_s = Path(path), size, every_s
        self.steps: dict[tuple[int, int], list] = {}
        self.epochs: list[tuple[int, int, float, float]] = []   # rank, epoch, begin, end
        self.markers: list[dict] = []
        self.hosts: list[str] = ["?"] * size
        self.written = 0.0

    def add(self, rank: int, spans: Sequence[Span], epoch_span: tuple[int, float, float]):
        """One rank's spans of one epoch and the epoch's begin and end on it."""
        for epoch, step, *times in spans:
            self.steps.setdefault((epoch, step), [None] * self.size)[rank] = tuple(times)
        self.epochs.append((rank, *epoch_span))

    def mark(self, name: str, at: float, rank: int = 0, dur: float | None = None,
             **args) -> None:
        """A marker: an instant on every track (``dur`` None), or a span on ``rank``'s
        second track."""
        self.markers.append({"name": name, "at": at, "rank": rank, "dur": dur, "args": args})

    def _aligned(self):
        """``(rank, t) ->`` seconds from the first epoch's begin on rank 0's clock."""
        off = clock_offsets(self.steps) or [0.0] * self.size
        t0 = min((begin - off[r] for r, _, begin, _ in self.epochs), default=0.0)
        return lambda r, t: t - off[r] - t0

    def events(self) -> list[dict]:
        """The Chrome-trace events, times in microseconds from the first epoch's begin."""
        at = self._aligned()
        shift = lambda r, t: _us(at(r, t))  # noqa: E731
        out = []
        for r in range(self.size):
            out += [{"name": "process_name", "ph": "M", "pid": r,
                     "args": {"name": f"rank {r} ({self.hosts[r]})"}},
                    {"name": "process_sort_index", "ph": "M", "pid": r,
                     "args": {"sort_index": r}},
                    {"name": "thread_name", "ph": "M", "pid": r, "tid": 0,
                     "args": {"name": "steps"}},
                    {"name": "thread_name", "ph": "M", "pid": r, "tid": 1,
                     "args": {"name": "epochs"}}]
        for (epoch, step), spans in sorted(self.steps.items()):
            for r, s in enumerate(spans):
                if s is None:
                    continue
                start, ready, done = s
                args = {"epoch": epoch, "step": step}
                out.append({"name": "compute", "cat": "step", "ph": "X", "pid": r, "tid": 0,
                            "ts": shift(r, start), "dur": _us(max(0.0, ready - start)),
                            "args": args})
                out.append({"name": "exchange", "cat": "step", "ph": "X", "pid": r, "tid": 0,
                            "ts": shift(r, ready), "dur": _us(max(0.0, done - ready)),
                            "args": args})
        for r, epoch, begin, end in self.epochs:
            out.append({"name": f"epoch {epoch}", "cat": "epoch", "ph": "X", "pid": r,
                        "tid": 1, "ts": shift(r, begin), "dur": _us(max(0.0, end - begin))})
        for m in self.markers:
            e = {"name": m["name"], "cat": "marker", "pid": m["rank"],
                 "ts": shift(m["rank"], m["at"]), "args": m["args"]}
            out.append({**e, "ph": "i", "s": "g", "tid": 0} if m["dur"] is None else
                       {**e, "ph": "X", "tid": 1, "dur": _us(max(0.0, m["dur"]))})
        return out

    def write(self, force: bool = False) -> None:
        """The whole trace to the file, when ``every_s`` passed since the last write (or
        ``force``)."""
        if not force and time.monotonic() - self.written < self.every_s:
            return
        write_text(json.dumps({"traceEvents": self.events(), "displayTimeUnit": "ms"},
                              separators=(",", ":")), self.path)
        self.written = time.monotonic()

    def summary(self, first: int = 30) -> dict:
        """For the run's record (drawn by :func:`png`): the file, the epochs that re-planned,
        and every rank's spans of up to ``first`` sampled steps of the epoch whose timings
        led to the first re-plan (without one, the second epoch: the first traces the step)
        and of the last epoch, in seconds from the first epoch's begin."""
        at = self._aligned()
        keys = sorted(self.steps)
        epochs = sorted({e for e, _ in keys})
        replans = [m["args"].get("epoch") for m in self.markers if m["name"] == "re-plan"]
        early = (replans[0] if replans and replans[0] in epochs else
                 epochs[1] if len(epochs) > 1 else epochs[0] if epochs else None)
        chosen = [k for k in keys if k[0] == early][:first]
        chosen += [k for k in keys if k[0] == epochs[-1] and k not in chosen] if epochs else []
        rel = lambda r, s: None if s is None else [round(at(r, t), 6) for t in s]  # noqa: E731
        return {"file": str(self.path), "replanned_after": replans, "steps": [
            {"epoch": e, "step": st, "ranks": [rel(r, s) for r, s in
                                                enumerate(self.steps[(e, st)])]}
            for e, st in chosen]}


def png(summary: dict, title: str = "") -> bytes:
    """Ranks x time: each rank's compute and exchange spans of the record's early and last
    sampled steps (:meth:`Trace.summary`), side by side."""
    import io
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = summary["steps"]
    groups = [[s for s in steps if s["epoch"] == steps[0]["epoch"]],
              [s for s in steps if s["epoch"] == steps[-1]["epoch"]]] if steps else [[]]
    if len(steps) and groups[0] == groups[1]:
        groups = groups[:1]
    fig, axes = plt.subplots(1, len(groups), figsize=(7 * len(groups), 2.6), squeeze=False)
    for ax, group in zip(axes[0], groups):
        for s in group:
            for r, span in enumerate(s["ranks"]):
                if span is None:
                    continue
                start, ready, done = span
                ax.broken_barh([(start, ready - start)], (r - 0.35, 0.7), color="tab:blue")
                ax.broken_barh([(ready, done - ready)], (r - 0.35, 0.7), color="tab:orange")
        if group:
            epoch = group[0]["epoch"]
            said = f"epoch {epoch}" + (" (re-planned after it)"
                                       if epoch in summary.get("replanned_after", ()) else "")
            ax.set_title(f"{title}: {said}" if title else said, fontsize=10)
        n = len(steps[0]["ranks"]) if steps else 1
        ax.set(xlabel="seconds since the first epoch began", ylabel="rank",
               yticks=range(n), ylim=(n - 0.5, -0.5))
        ax.grid(alpha=0.3, axis="x")
    axes[0][0].legend(handles=[plt.Rectangle((0, 0), 1, 1, color="tab:blue"),
                               plt.Rectangle((0, 0), 1, 1, color="tab:orange")],
                      labels=["compute", "exchange (wait + communication)"],
                      loc="upper right", fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()
