#!/usr/bin/env python
"""Sparse aggregation against dense training: time per step, bytes, |U|/k and accuracy over
wall-clock time, on shared memory or on MPI over TCP on loopback shaped to a slow network.

Every run is `hetgrad train` under mpirun (equal speeds, fixed plan). Arms: ``dense`` and
``POLICY/EXCHANGE`` (topk, recent, sticky x allgather, union) and ``leader``; all sparse arms
with the same DGC options (momentum correction, density warm-up). Runs are interleaved:
for each seed, for each rank count, every arm once, in a fresh random order every time
(``bench/schedule.py``). The JSON is rewritten after every run and a rerun skips what it
holds (resumable).

    # shared memory, digits MLP
    .venv/bin/python scripts/bench_sparse.py --out results/bench_sparse_shm.json
    # 1 Gbit/s (tc tbf on lo, MPI forced onto TCP), a 10.5M-parameter MLP; needs root
    .venv/bin/python scripts/bench_sparse.py --net 1gbit --model big-mlp -B 128 --epochs 8 \\
        --out results/bench_sparse_1gbit.json
    .venv/bin/python scripts/bench_sparse.py --out X.json --report docs/img/sparse  # no runs

The report compares time to accuracy and the accuracy reached within dense's training time
(same seed); ``--sparse-epochs`` gives the sparse arms more epochs than dense for that.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import records
from bench.launch import train
from bench.results import Rows
from bench.schedule import rounds
from sparse_report import report

ARMS = ["dense", "topk/allgather", "topk/union", "recent/allgather", "recent/union",
        "sticky/allgather", "sticky/union", "leader"]
DGC = ["--momentum-correction"]
SPARSE_KEYS = ("density", "density_warmup", "dense_above", "momentum_correction",
               "momentum_unmasked", "fresh", "local_clip")
TCP = ["--mca", "pml", "ob1", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo"]


@contextlib.contextmanager
def shaped_loopback(rate: str | None):
    """``lo`` limited to ``rate`` (tc tbf, burst above lo's 64 KiB MTU) for the block, and
    always restored, on an error or a signal too. Refuses to replace a qdisc it did not add."""
    if rate is None:
        yield
        return
    if os.geteuid() != 0 or shutil.which("tc") is None:
        raise SystemExit("--net 1gbit shapes lo with tc: run as root with iproute2 installed")
    now = subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True)
    if "noqueue" not in now.stdout:
        raise SystemExit(f"lo already has a qdisc ({now.stdout.strip()}); not touching it")
    clear = ["tc", "qdisc", "del", "dev", "lo", "root"]
    previous = signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
    subprocess.run(["tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", rate,
                    "burst", "1mb", "latency", "100ms"], check=True)
    try:
        yield
    finally:
        subprocess.run(clear, capture_output=True)
        signal.signal(signal.SIGTERM, previous)


def arm_args(arm: str, args) -> list[str]:
    if arm == "dense":
        return []
    policy, _, exchange = arm.partition("/")
    return ["--sparsify", policy, "--exchange", exchange or "union",
            "--density", str(args.density), "--density-warmup", str(args.density_warmup),
            *DGC, *shlex.split(args.sparse_args)]


def run_one(np_: int, arm: str, seed: int, args, tcp: bool) -> dict:
    """One `hetgrad train` run; the row this benchmark keeps of its record."""
    epochs = args.sparse_epochs if arm != "dense" and args.sparse_epochs else args.epochs
    with tempfile.TemporaryDirectory() as tmp:
        rec = train(np_, ["--speeds", ",".join(["1"] * np_), "--epochs", str(epochs),
                          "--data", args.data, "--model", args.model,
                          "-B", str(args.global_batch), "--lr", str(args.lr),
                          "--seed", str(seed), *arm_args(arm, args)],
                    Path(tmp) / "run.json", mpirun_args=TCP if tcp else [])
    return summarize(rec, np_, arm, seed)


def summarize(rec: dict, np_: int, arm: str, seed: int) -> dict:
    """Step time, k, |U| and bytes at the target density: epochs after the warm-up (and
    after the first, which traces the step); accuracy after every epoch."""
    skip = max(1, rec["config"]["density_warmup"])
    return {"ranks": np_, "arm": arm, "seed": seed, "step_s": records.step_s(rec, skip),
            "final_test_accuracy": rec["final_test_accuracy"],
            "curve": [[e["time_s"], e["test_accuracy"]] for e in rec["epochs"]],
            "wall_time_s": rec["wall_time_s"],
            "sparse_config": {k: rec["config"].get(k) for k in SPARSE_KEYS},
            **records.sparse_means(rec, skip)}


def schedule(ranks: list[int], seeds: list[int], arms: list[str]):
    """(ranks, arm, seed) in interleaved order: every (seed, ranks) block runs each arm once,
    in its own random order (the same on every rerun, so a resumed run keeps it)."""
    blocks = [(seed, np_) for seed in seeds for np_ in ranks]
    for (seed, np_), order in zip(blocks, rounds(arms, len(blocks))):
        yield from ((np_, arm, seed) for arm in order)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--net", choices=["shm", "1gbit"], default="shm")
    ap.add_argument("--ranks", default="2,3,4")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--sparse-epochs", type=int,
                    help="epochs of the sparse arms (default --epochs): a budget of about "
                         "dense's training time, since their steps are shorter")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--density-warmup", type=int, default=2, help="DGC's warm-up epochs")
    ap.add_argument("--sparse-args", default="",
                    help="more `hetgrad train` flags for the sparse arms, e.g. '--fresh 0.3'")
    ap.add_argument("--data", default="digits")
    ap.add_argument("--model", default="mlp")
    ap.add_argument("-B", "--global-batch", type=int, default=96)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--out", required=True)
    ap.add_argument("--report", metavar="PREFIX", help="only write tables/plots from --out")
    args = ap.parse_args()
    rows = Rows(args.out, key=lambda r: (r["ranks"], r["arm"], r["seed"]), fresh={
        "args": vars(args), "rows": [],
        "env": {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_")}})
    if args.report:
        report(rows.data, args.report)
        return
    todo = rows.pending(schedule([int(r) for r in args.ranks.split(",")],
                                 [int(s) for s in args.seeds.split(",")], args.arms.split(",")))
    with shaped_loopback("1gbit" if args.net == "1gbit" else None):
        for i, (np_, arm, seed) in enumerate(todo):
            row = run_one(np_, arm, seed, args, tcp=args.net != "shm")
            rows.add(row)
            print(f"[{i + 1}/{len(todo)}] P={np_} {arm:17s} seed {seed}: step "
                  f"{1e3 * row['step_s']:.1f} ms, |U|/k {row.get('buildup', 0):.2f}, "
                  f"acc {row['final_test_accuracy']:.3f}", flush=True)


if __name__ == "__main__":
    main()
