"""The benchmarks' harness: every ``scripts/bench_*.py`` (and ``experiment.py``) uses it.

- :mod:`bench.launch`: build an ``mpirun`` line, run it under one timeout rule, load the
  run's record; a failure is one line naming the command;
- :mod:`bench.schedule`: arms interleaved in a fresh random order every round (why:
  there);
- :mod:`bench.results`: the results JSON, rewritten atomically after every run; a rerun
  skips the runs it already holds;
- :mod:`bench.records`: what the benchmarks read off a run record, on top of the summaries
  ``hetgrad/record.py`` already wrote into it;
- :mod:`bench.tables`, :mod:`bench.figures`: Markdown tables, matplotlib figures;
- :mod:`bench.placement`: ranks pinned to cores and capped at a CPU share (cgroup v1);
- :mod:`bench.perfmodel`: ``bench_perfmodel.py``'s four tools (oracle, churn, breakdown,
  ceiling).

A script in ``scripts/`` imports it as ``bench`` (its own directory is on ``sys.path``);
importing it puts the repository root there too, so ``hetgrad`` imports from a checkout.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
