"""Tables and plots of ``scripts/bench_sparse.py``'s JSON: per rank count and arm, the mean over
seeds, step time as a ratio to dense within the same (ranks, seed) block (at the target
density, after the warm-up), and time to reach dense's final accuracy."""
from __future__ import annotations

import itertools
import statistics
from pathlib import Path

from bench import figures
from bench.tables import markdown

TARGET_GAP = 0.01  # time to reach dense's mean final accuracy minus this


def cumulative(curve: list) -> list[tuple[float, float]]:
    """(seconds of training so far, test accuracy) after each epoch."""
    return list(zip(itertools.accumulate(t for t, _ in curve), (a for _, a in curve)))


def time_to(curve: list, target: float) -> float | None:
    return next((t for t, a in cumulative(curve) if a >= target), None)


def acc_within(curve: list, seconds: float) -> float | None:
    """Test accuracy after the last epoch that ended within ``seconds`` of training."""
    return next((a for t, a in reversed(cumulative(curve)) if t <= seconds), None)


def summary(rows: list[dict]) -> list[dict]:
    """One line per (ranks, arm)."""
    dense = {(r["ranks"], r["seed"]): r for r in rows if r["arm"] == "dense"}
    out = []
    for (np_, arm), group in itertools.groupby(
            sorted(rows, key=lambda r: (r["ranks"], r["arm"] != "dense", r["arm"])),
            key=lambda r: (r["ranks"], r["arm"])):
        group = list(group)
        base = [dense[(np_, r["seed"])] for r in group if (np_, r["seed"]) in dense]
        target = (statistics.fmean(b["final_test_accuracy"] for b in base) - TARGET_GAP
                  if base else None)
        reached = [time_to(r["curve"], target) for r in group] if target else []
        # the same training time as dense on the same seed: a wall-clock budget
        budget = [acc_within(r["curve"], cumulative(dense[(np_, r["seed"])]["curve"])[-1][0])
                  for r in group if (np_, r["seed"]) in dense]
        line = {"ranks": np_, "arm": arm, "seeds": len(group),
                "step_ms": 1e3 * statistics.fmean(r["step_s"] for r in group),
                "vs_dense": statistics.median(r["step_s"] / dense[(np_, r["seed"])]["step_s"]
                                              for r in group if (np_, r["seed"]) in dense),
                "acc": statistics.fmean(r["final_test_accuracy"] for r in group),
                "acc_sd": statistics.pstdev(r["final_test_accuracy"] for r in group),
                "epochs": statistics.fmean(len(r["curve"]) for r in group),
                "acc_at_dense_time": statistics.fmean(a for a in budget if a is not None)
                if any(a is not None for a in budget) else None,
                "target": target, "reached": sum(t is not None for t in reached),
                "time_to_target_s": statistics.fmean(t for t in reached if t is not None)
                if any(t is not None for t in reached) else None}
        for key in ("buildup", "bytes_sent", "bytes_received"):
            if key in group[0]:
                line[key] = statistics.fmean(r[key] for r in group)
        out.append(line)
    return out


def table(lines: list[dict]) -> str:
    """Markdown: one line per (ranks, arm) of :func:`summary`."""
    rows = []
    for x in lines:
        tt = (f"{x['time_to_target_s']:.1f} ({x['reached']}/{x['seeds']})"
              if x["time_to_target_s"] is not None else f"never (0/{x['seeds']})")
        u = f"{x['buildup']:.2f}" if "buildup" in x else "–"
        b = f"{x['bytes_sent']:,.0f}" if "bytes_sent" in x else "–"
        budget = "–" if x["acc_at_dense_time"] is None else f"{x['acc_at_dense_time']:.3f}"
        rows.append([x["ranks"], x["arm"], f"{x['epochs']:g}", f"{x['step_ms']:.1f}",
                     f"{x['vs_dense']:.2f}", u, b, f"{x['acc']:.3f} ± {x['acc_sd']:.3f}",
                     budget, tt])
    return markdown(["ranks", "arm", "epochs", "step (ms)", "/ dense", "\\|U\\|/k",
                     "bytes sent / step / rank", "final test acc (mean ± sd)",
                     "acc at dense's training time", "time to dense acc − 1 pt (s)"],
                    rows) + "\n"


def per_seed(rows: list[dict], lines: list[dict]) -> str:
    """Markdown: per (ranks, arm), seed by seed, the first epoch's and the whole training
    time, time to dense's mean final accuracy minus 1 point and to that accuracy, best and
    final accuracy."""
    out = []
    targets = {(x["ranks"], x["arm"]): x["target"] for x in lines}
    for r in sorted(rows, key=lambda r: (r["ranks"], r["arm"] != "dense", r["arm"], r["seed"])):
        target = targets[(r["ranks"], r["arm"])]
        if target is None:
            continue
        times = [time_to(r["curve"], t) for t in (target, target + TARGET_GAP)]
        shown = ["never" if t is None else f"{t:.0f}" for t in times]
        out.append([r["ranks"], r["arm"], r["seed"], f"{r['curve'][0][0]:.1f}",
                    f"{cumulative(r['curve'])[-1][0]:.0f}", *shown,
                    f"{max(a for _, a in r['curve']):.3f}", f"{r['final_test_accuracy']:.3f}"])
    return markdown(["ranks", "arm", "seed", "epoch 1 (s)", "training (s)",
                     "to dense acc − 1 pt (s)", "to dense acc (s)", "best acc", "final acc"],
                    out) + "\n"


def plot(rows: list[dict], lines: list[dict], png: Path) -> None:
    """Accuracy against training seconds (mean over seeds), one panel per rank count."""
    ranks = sorted({r["ranks"] for r in rows})
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    fig, axes = figures.panels(len(ranks), 5, 4)
    for ax, np_ in zip(axes, ranks):
        for j, arm in enumerate(arms):
            curves = [cumulative(r["curve"]) for r in rows if r["ranks"] == np_
                      and r["arm"] == arm]
            if not curves:
                continue
            ts = figures.mean_curve([[t for t, _ in c] for c in curves])
            acc = figures.mean_curve([[a for _, a in c] for c in curves])
            ax.plot(ts, acc, label=arm, color=f"C{j}", lw=2 if arm == "dense" else 1.2)
        target = next((x["target"] for x in lines if x["ranks"] == np_ and x["target"]), None)
        if target:
            ax.axhline(target, color="gray", ls=":", lw=1)
        ax.set(title=f"{np_} ranks", xlabel="training seconds (cumulative)",
               ylabel="test accuracy", ylim=(max(0.0, (target or 0.9) - 0.25), 1.0))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="lower right")
    figures.save(fig, png)


def report(data: dict, prefix: str) -> None:
    """``PREFIX.md`` (the tables) and ``PREFIX.png`` (time-to-accuracy curves)."""
    rows = data["rows"]
    lines = summary(rows)
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    text = table(lines) + "\n" + per_seed(rows, lines)
    Path(f"{prefix}.md").write_text(text)
    plot(rows, lines, Path(f"{prefix}.png"))
    print(text)
