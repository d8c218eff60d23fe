#!/usr/bin/env python
"""Plans from the performance model vs the constant-speed plan, Horovod's equal split and an
oracle, under emulated and real heterogeneity (CPU affinity, CPU quotas).

Per scenario, first an oracle search: short runs of a grid of static batch splits around the
affine plan (every ordered pair of ranks, one step of samples moved), the 3 fastest run twice
more, the best by median becomes the ``oracle`` arm. Then the arms, interleaved (a fresh
random order every repeat: ``bench/schedule.py``):

- ``equal``: Horovod's split (``--mode equal``);
- ``constant``: the old plan, one probe size, constant speed (``--probe-sizes 1``);
- ``affine``: the default, probe at 3 sizes, equal predicted step time;
- ``refined``: ``affine``, then every rank timed at its planned batch, all in lockstep, and
  its model scaled through that point before the plan is made (``--probe-refine 1``);
- ``rebalance``: affine plus ``--rebalance`` (the online model);
- ``oracle``: the best split the grid found (``--plan``).

Throughput = samples per epoch / median epoch time without the first (tracing) epoch. Writes
JSON (every record's summary) and a bar plot.

``--churn N`` instead runs only the ``rebalance`` arm (or, for ``--scenarios
SCENARIO:ARM``, that arm) for N epochs (``--repeats`` times, the runs interleaved, no oracle)
and keeps every epoch's imbalance and decision: does the online model re-plan on noise when
speeds do not change? And ``SCENARIO:equal`` on equal ranks: how imbalanced does noise alone
make a balanced job? Its rows go under ``churn`` in the same JSON.

``--breakdown`` instead runs ``BREAKDOWN`` once each (the slow emulated rank alone, then
beside a fast one under three Horovod cycle times): where one step's time goes, under
``breakdown`` in the JSON.

``--ceiling [SET]`` instead runs a ``CEILINGS`` set ``--repeats`` times: what one process
with the whole batch, and Horovod's equal split on equal ranks, reach against the sum of probed
rates, beside hetgrad's plan on unequal ranks (``all``: at two emulated step lengths;
``steps_per_execution``: with 1 and 4 steps per call); under ``ceiling`` / ``ceiling_SET``.

The tools live in ``bench/perfmodel/`` (scenarios, oracle, churn, breakdown, ceiling).

    .venv/bin/python scripts/bench_perfmodel.py --out results/bench_perfmodel.json
    .venv/bin/python scripts/bench_perfmodel.py --scenarios real-cnn-3ranks --churn 20 \
        --repeats 3 --out results/bench_perfmodel_real.json
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from bench import ROOT, results
from bench.perfmodel.breakdown import breakdown_markdown, run_breakdown
from bench.perfmodel.ceiling import CEILINGS, ceiling_key, ceiling_markdown, run_ceiling
from bench.perfmodel.churn import churn_markdown, run_churn
from bench.perfmodel.oracle import gap_markdown, markdown, plot, run_scenario
from bench.perfmodel.oracle import table  # noqa: F401  (tests/test_report.py reads it here)
from bench.perfmodel.scenarios import SCENARIOS
from bench.placement import CPU_CGROUP, QUOTA_PERIOD_US, placed  # noqa: F401  (the same)


def tables(result: dict) -> str:
    """Every table the results hold (``--table``)."""
    scenarios = bool(result.get("scenarios"))
    parts = [markdown(result) if scenarios else "", gap_markdown(result) if scenarios else "",
             churn_markdown(result), breakdown_markdown(result),
             *(ceiling_markdown(result, ceiling_key(c)) for c in CEILINGS)]
    return "\n\n".join(p for p in parts if p)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="results/bench_perfmodel.json")
    ap.add_argument("--plot", default="docs/img/perfmodel.png")
    ap.add_argument("--churn", type=int, metavar="EPOCHS",
                    help="only the rebalance arm (or SCENARIO:ARM), this many epochs, to "
                         "count re-plans")
    ap.add_argument("--breakdown", action="store_true",
                    help="only the runs of BREAKDOWN: where one step's time goes")
    ap.add_argument("--ceiling", nargs="?", const="all", choices=list(CEILINGS),
                    help="only the runs of this CEILINGS set, --repeats times: efficiency's "
                         "ceiling")
    ap.add_argument("--table", action="store_true", help="print the table of --out and stop")
    return ap


def main() -> None:
    args = parser().parse_args()
    out = Path(args.out)
    if args.table:
        print(tables(json.loads(out.read_text())))
        return
    result = results.load(out, {"scenarios": {}})
    with tempfile.TemporaryDirectory() as tmp:
        if args.breakdown:
            result["breakdown"] = run_breakdown(args.epochs, Path(tmp))
            results.save(result, out)
            print(breakdown_markdown(result))
        elif args.ceiling:
            key = ceiling_key(args.ceiling)
            result[key] = run_ceiling(CEILINGS[args.ceiling], args.epochs, args.repeats,
                                      Path(tmp))
            results.save(result, out)
            print(ceiling_markdown(result, key))
        elif args.churn:
            for rows in run_churn(args.scenarios.split(","), args.churn, args.repeats,
                                  Path(tmp)):
                result.setdefault("churn", {}).update(rows)
                results.save(result, out)  # after every run: kept on failure
            print(churn_markdown(result))
        else:
            scenarios(result, args, Path(tmp))


def scenarios(result: dict, args: argparse.Namespace, tmp: Path) -> None:
    """The oracle search and the arms of every ``--scenarios`` entry; the JSON rewritten
    after each scenario; the plot at the end."""
    result.update(epochs=args.epochs, repeats=args.repeats)
    for name in args.scenarios.split(","):
        result["scenarios"][name] = run_scenario(name, args.epochs, args.repeats, tmp)
        print(name, json.dumps(result["scenarios"][name]["table"], indent=1), flush=True)
        results.save(result, args.out)
    plot(result, ROOT / args.plot)
    print(f"bench_perfmodel: {args.out}, {args.plot}")


if __name__ == "__main__":
    main()
