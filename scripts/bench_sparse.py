#!/usr/bin/env python
"""Benchmark sparse aggregation policies against dense training (issue: sparsification).

For each rank count and policy, runs `hetgrad train` under mpirun on the same data, model,
seed and epochs, and records mean |U|/k, bytes per step per rank, time per step and final test
accuracy. All runs of one invocation share the machine, so compare them as ratios.

    .venv/bin/python scripts/bench_sparse.py --ranks 2,3,4 --epochs 10 --out results/bench_sparse.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from hetgrad.cli import mpirun_command  # noqa: E402

CONFIGS = [("dense", None, None), ("topk", "topk", "allgather"), ("topk", "topk", "union"),
           ("recent", "recent", "union"), ("sticky", "sticky", "union"),
           ("leader", "leader", "union")]


def run(np_: int, extra: list[str], out: Path) -> dict:
    cmd = mpirun_command(np_, ["train", "--quiet", "--out", str(out), *extra])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return json.loads(out.read_text())


def plot(rows: list[dict], png: Path) -> None:
    """Build-up |U|/k and final accuracy per policy, one group of bars per rank count."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ranks = sorted({r["ranks"] for r in rows})
    labels = [f"{p}/{e}" for p, _, e in CONFIGS if p != "dense"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / (len(labels) + 1)
    for j, lab in enumerate(["dense/dense-allreduce"] + labels):
        pol, ex = lab.split("/")
        sel = {r["ranks"]: r for r in rows if r["policy"] == pol and r["exchange"] == ex}
        xs = [i + j * width for i in range(len(ranks))]
        if pol != "dense":
            a1.bar(xs, [sel[n]["buildup"] for n in ranks], width, label=lab, color=f"C{j}")
        a2.bar(xs, [sel[n]["final_test_accuracy"] for n in ranks], width, label=lab,
               color=f"C{j}")
    for a, title in ((a1, "union build-up |U|/k (lower: less to aggregate)"),
                     (a2, "final test accuracy")):
        a.set_xticks([i + 0.4 for i in range(len(ranks))], [f"{n} ranks" for n in ranks])
        a.set_title(title)
        a.grid(axis="y", alpha=0.3)
    a2.set_ylim(0.7, 1.0)
    a2.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="2,3,4")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--data", default="digits")
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/bench_sparse.json")
    ap.add_argument("--plot", default=None, help="PNG of build-up and accuracy")
    ap.add_argument("--plot-only", action="store_true", help="re-plot --out, run nothing")
    args = ap.parse_args()
    if args.plot_only:
        plot(json.loads(Path(args.out).read_text())["rows"], Path(args.plot))
        return
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for np_ in [int(r) for r in args.ranks.split(",")]:
            for label, policy, exchange in CONFIGS:
                extra = ["--epochs", str(args.epochs), "--data", args.data, "--model", args.model,
                         "--seed", str(args.seed), "--speeds", ",".join(["1"] * np_)]
                if policy:
                    extra += ["--sparsify", policy, "--exchange", exchange,
                              "--density", str(args.density)]
                rec = run(np_, extra, Path(tmp) / "run.json")
                steps = rec["plan"]["steps_per_epoch"] * args.epochs
                row = {"ranks": np_, "policy": label, "exchange": exchange or "dense-allreduce",
                       "final_test_accuracy": rec["final_test_accuracy"],
                       "best_test_accuracy": rec["best_test_accuracy"],
                       "time_per_step_s": rec["wall_time_s"] / steps}
                if policy:
                    s = rec["sparse_summary"]
                    row.update(k=s["k"], mean_union=s["union"], buildup=s["buildup"],
                               bytes_sent_per_step=s["bytes_sent"],
                               bytes_received_per_step=s["bytes_received"],
                               aggregator_send_entries=s["aggregator_send_entries"],
                               buildup_curve=[r["buildup"] for r in rec["sparse_steps"]
                                              if r["step"] == 0])
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "buildup_curve"}),
                      flush=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    print(f"wrote {args.out}")
    if args.plot:
        plot(rows, Path(args.plot))


if __name__ == "__main__":
    main()
