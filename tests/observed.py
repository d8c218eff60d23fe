"""Reading back what ``--tensorboard`` and ``--timeline`` wrote: TensorBoard's own event reader,
the trace's schema checked on the way."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path


def only_run(base: str | Path) -> Path:
    """The one run directory under a ``--tensorboard`` directory."""
    runs = sorted(p for p in Path(base).iterdir() if p.is_dir())
    assert len(runs) == 1, runs
    return runs[0]


def read_scalars(run_dir: Path) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """``{"": run's, "rank0": rank 0's, ...}`` of ``{tag: [(step, value), ...]}``, read by
    TensorBoard's EventAccumulator."""
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    out = {}
    for d in [run_dir, *sorted(p for p in run_dir.iterdir() if p.is_dir())]:
        acc = EventAccumulator(str(d), size_guidance={"tensors": 0})
        acc.Reload()
        out["" if d == run_dir else d.name] = {
            tag: [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]
            for tag in acc.Tags()["tensors"]}
    return out


def load_trace(path: str | Path, ranks: int) -> dict:
    """The trace, checked: ``traceEvents``, a named process per rank, every span's duration
    >= 0 and on a rank's pid. Returns ``{"steps": {pid: [(name, ts, dur, args)]}, "markers":
    [...], "epochs": {pid: [...]}}``."""
    events = json.loads(Path(path).read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(names) == list(range(ranks)), names
    steps, epochs, markers = defaultdict(list), defaultdict(list), []
    for e in events:
        if e["ph"] == "M":
            continue
        assert e["pid"] in names and e["ts"] >= 0, e
        if e["ph"] == "X":
            assert e["dur"] >= 0, e
        if e["cat"] == "step":
            steps[e["pid"]].append((e["name"], e["ts"], e["dur"], e["args"]))
        elif e["cat"] == "epoch":
            epochs[e["pid"]].append(e)
        else:
            markers.append(e)
    return {"steps": dict(steps), "epochs": dict(epochs), "markers": markers}


def assert_observed(tensorboard: str | Path, timeline: str | Path, ranks: int,
                    epochs: int) -> dict:
    """What every observed run must show: per-rank scalars of every epoch in one chart per
    quantity, the run's loss, and every rank's compute and exchange spans. Returns the
    scalars and the trace."""
    scalars = read_scalars(only_run(tensorboard))
    rank_runs = sorted(k for k in scalars if k)
    assert rank_runs == [f"rank{r}" for r in range(ranks)], rank_runs
    for run in rank_runs:
        for tag in ("rank/busy_s", "rank/wait_s", "rank/batch", "rank/step_measured_s"):
            assert [s for s, _ in scalars[run][tag]] == list(range(1, epochs + 1)), (run, tag)
    assert [s for s, _ in scalars[""]["epoch/loss"]] == list(range(1, epochs + 1))
    trace = load_trace(timeline, ranks)
    for r in range(ranks):
        kinds = {name for name, *_ in trace["steps"][r]}
        assert kinds == {"compute", "exchange"}, kinds
        assert len(trace["epochs"][r]) == epochs
    return {"scalars": scalars, "trace": trace}
