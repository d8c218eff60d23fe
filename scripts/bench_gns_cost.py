#!/usr/bin/env python
"""What measuring the gradient noise scale costs a real training job: epoch time of
``hetgrad train`` on the goodput benchmark's task (MNIST-1D, ``cnn1d``) at a fixed global
batch, without ``--gns`` and with ``--gns --gns-every N`` for each N asked (with Adam the
estimate is the preconditioned one). The arms run in a fresh random order every repeat;
the first epoch (tracing) is left out. Writes JSON: every epoch time, per arm the median and
its ratio to the plain arm (``--again``: a second plain arm, the scenario's noise floor).

    .venv/bin/python scripts/bench_gns_cost.py --optimizer adam --out results/gns_cost/adam.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from bench import results
from bench.launch import train_once
from bench.placement import profile
from bench.schedule import interleaved
from bench_goodput import mnist1d_data


def arms(everies: list[int], again: bool = False) -> dict[str, list[str]]:
    """``plain`` (no ``--gns``), ``plain-again`` (the same, to show the scenario's own noise
    in the ratios) and ``gnsK`` per K."""
    return {"plain": [], **({"plain-again": []} if again else {}),
            **{f"gns{k}": ["--gns", "--gns-every", str(k)] for k in everies}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="quota:1,0.25",
                    help="SPEEDS@UNIT (emulated) or quota:SHARES, as bench_goodput.py")
    ap.add_argument("--optimizer", choices=("sgd", "adam"), default="adam")
    ap.add_argument("--batch", type=int, default=400, help="global batch")
    ap.add_argument("--every", default="1,4", help="comma-separated --gns-every values")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--data-size", type=int, default=25000)
    ap.add_argument("--again", action="store_true",
                    help="a second plain arm: the ratio between two identical arms")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    ranks, extra, placement = profile(args.scenario)
    data = mnist1d_data(args.data_size, Path("results/goodput/data"))
    kinds = arms([int(k) for k in args.every.split(",")], args.again)
    times: dict[str, list[float]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        for rep, arm in interleaved(list(kinds), args.repeats):
            path = Path(tmp) / f"{arm}_{rep}.json"
            train_once(path, ranks, ["--model", "cnn1d", "--optimizer", args.optimizer,
                                     "--data", data, "-B", str(args.batch), "--lr", "0.01",
                                     "--epochs", str(args.epochs), *kinds[arm], *extra],
                       placement, tag="gns-cost")
            times[arm] += [e["time_s"] for e in json.loads(path.read_text())["epochs"][1:]]
    median = {k: statistics.median(v) for k, v in times.items()}
    out = {**vars(args), "epoch_s": times, "median_epoch_s": median,
           "ratio_to_plain": {k: m / median["plain"] for k, m in median.items()}}
    results.save(out, args.out, indent=1)
    print(json.dumps({k: round(v, 3) for k, v in out["ratio_to_plain"].items()}))


if __name__ == "__main__":
    main()
