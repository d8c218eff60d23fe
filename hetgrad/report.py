"""``hetgrad report``: Markdown table and matplotlib plots from run records."""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import numpy as np

from .errors import InputFileError
from .io import read_json, write_bytes, write_json, write_text


RECORD_KEYS = ("config", "epochs", "plan", "probe", "median_epoch_time_s", "samples_per_s",
               "throughput_efficiency", "final_test_accuracy", "best_test_accuracy")


def load_runs(paths) -> list[dict]:
    """The records, each checked to hold what the report reads (errors name the file)."""
    runs = []
    for p in paths:
        rec = read_json(p, field="runs", what="run record")
        missing = [k for k in RECORD_KEYS if not isinstance(rec, dict) or k not in rec]
        if missing:
            raise InputFileError(f"{p} is not a `hetgrad train` record (lacks {missing})",
                                 field="runs")
        rec["_path"] = str(p)
        runs.append(rec)
    return runs


def _same_epochs(runs: list[dict]) -> None:
    """Records averaged together must have trained the same number of epochs."""
    counts = {r["_path"]: len(r["epochs"]) for r in runs}
    if len(set(counts.values())) > 1:
        raise InputFileError(f"records of {' '.join(group_key(runs[0]))} trained different "
                             f"numbers of epochs: {counts}; report them separately",
                             field="runs")


def group_key(rec: dict) -> tuple[str, str, str]:
    """(task, speed profile, mode): the profile a benchmark's ``label`` in the record, else
    the emulated speeds, else the probed ones."""
    c = rec["config"]
    task = f"{c['model']}/{Path(c['data']).stem}"
    profile = (rec.get("label") or c.get("emulate_speeds")
               or ",".join(str(s) for s in rec["plan"]["speeds"]))
    return task, profile, c["mode"]


def _ms(values) -> str:
    v = np.asarray(values, float)
    return f"{v.mean():.4g} ± {v.std(ddof=1) if v.size > 1 else 0.0:.2g}"


def summarize(runs: list[dict]) -> list[dict]:
    """One row per (task, speed profile, mode): mean and std over seeds."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        groups[group_key(r)].append(r)
    rows = []
    for (task, profile, mode), rs in sorted(groups.items()):
        _same_epochs(rs)
        rows.append({
            "task": task, "profile": profile, "mode": mode, "seeds": len(rs),
            "epoch_time_s": [r["median_epoch_time_s"] for r in rs],
            "samples_per_s": [r["samples_per_s"] for r in rs],
            "efficiency": [r["throughput_efficiency"] for r in rs],
            "final_acc": [r["final_test_accuracy"] for r in rs],
            "best_acc": [r["best_test_accuracy"] for r in rs],
            "mean_idle": [float(np.mean(idle_shares(r))) for r in rs],
        })
    # speed-up of each mode over `equal` in the same task and profile
    base = {(r["task"], r["profile"]): np.mean(r["epoch_time_s"]) for r in rows
            if r["mode"] == "equal"}
    for r in rows:
        b = base.get((r["task"], r["profile"]))
        r["speedup_vs_equal"] = None if b is None else b / float(np.mean(r["epoch_time_s"]))
    return rows


def markdown(rows: list[dict]) -> str:
    head = ("| task | speeds | mode | seeds | epoch time (s) | samples/s | efficiency | "
            "speed-up vs equal | mean idle share | final acc | best acc |\n|" + "---|" * 11)
    lines = [head]
    for r in rows:
        sp = "–" if r["speedup_vs_equal"] is None else f"{r['speedup_vs_equal']:.2f}x"
        lines.append(f"| {r['task']} | {r['profile']} | {r['mode']} | {r['seeds']} | "
                     f"{_ms(r['epoch_time_s'])} | {_ms(r['samples_per_s'])} | "
                     f"{_ms(r['efficiency'])} | {sp} | {_ms(r['mean_idle'])} | "
                     f"{_ms(r['final_acc'])} | "
                     f"{_ms(r['best_acc'])} |")
    return "\n".join(lines) + "\n"


def idle_shares(rec: dict) -> list[float]:
    """Per-rank idle share of an epoch, estimated from the probe: a rank is busy
    ``shard_i / probed_rate_i`` seconds and waits for the slowest for the rest."""
    t = rec["median_epoch_time_s"]
    return [max(0.0, 1.0 - n / p["samples_per_s"] / t)
            for n, p in zip(rec["plan"]["shard_sizes"], rec["probe"])]


def plots(runs: list[dict]) -> dict[str, bytes]:
    """Per (task, profile): test accuracy vs epoch and vs wall time, one line per mode (mean
    over seeds); and per-rank idle share of the epoch (1 - own busy time / epoch time); and
    the step timeline of every record that has one.
    Returns PNG bytes by file name (nothing is written here)."""
    import io
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        task, profile, mode = group_key(r)
        groups[(task, profile)][mode].append(r)
    pngs = {}
    for (task, profile), modes in sorted(groups.items()):
        fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(15, 3.8))
        for mode, rs in sorted(modes.items()):
            acc = np.mean([[e["test_accuracy"] for e in r["epochs"]] for r in rs], axis=0)
            t = np.mean([np.cumsum([e["time_s"] for e in r["epochs"]]) for r in rs], axis=0)
            a1.plot(np.arange(1, len(acc) + 1), acc, marker="o", label=mode)
            a2.plot(t, acc, marker="o", label=mode)
        names = sorted(modes)
        for j, mode in enumerate(names):
            idle = np.mean([idle_shares(r) for r in modes[mode]], axis=0)
            xs = np.arange(len(idle)) + j / (len(names) + 1)
            a3.bar(xs, idle, 1 / (len(names) + 1), label=mode)
        a3.set(xlabel="rank", ylabel="idle share of epoch (probe estimate)", ylim=(0, 1))
        a3.set_xticks(np.arange(len(idle)) + 0.33, [str(r) for r in range(len(idle))])
        a3.legend()
        a1.set(xlabel="epoch", ylabel="test accuracy", title=f"{task}, speeds {profile}")
        a2.set(xlabel="training time (s)", ylabel="test accuracy")
        for a in (a1, a2):
            a.grid(alpha=0.3)
            a.legend()
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        plt.close(fig)
        name = f"{task.replace('/', '_')}_{re.sub(r'[,:;@ ]', '-', profile)}"
        pngs[f"acc_{name}.png"] = buf.getvalue()
    return {**pngs, **timelines(runs)}


def timelines(runs: list[dict]) -> dict[str, bytes]:
    """``timeline_<record>.png`` of every record that holds a timeline (``--timeline``);
    ``timeline_<its directory>_<record>.png`` where two records share a name."""
    from .timeline import png
    drawn = [r for r in runs if r.get("timeline", {}).get("steps")]
    stems = [Path(r["_path"]).stem for r in drawn]
    pngs = {}
    for r, stem in zip(drawn, stems):
        name = stem if stems.count(stem) == 1 else f"{Path(r['_path']).parent.name}_{stem}"
        pngs[f"timeline_{name}.png"] = png(r["timeline"], name)
    return pngs


def report(paths, out_dir: str | Path) -> tuple[str, list[Path]]:
    """Table, summary and plots of the records in ``paths``, all computed before any file is
    written (a bad record leaves ``out_dir`` as it was)."""
    runs = load_runs(paths)
    if not runs:
        raise InputFileError("no run records given", field="runs")
    rows = summarize(runs)
    md = markdown(rows)
    pngs = plots(runs)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputFileError(f"{out} is a file, not a directory", field="out_dir")
    out.mkdir(parents=True, exist_ok=True)
    write_text(md, out / "table.md")
    write_json(rows, out / "summary.json")
    for name, png in pngs.items():
        write_bytes(png, out / name)
    return md, [out / name for name in pngs]
