"""The examples run as a user would run them, on real ranks."""
import re

from conftest import run_mpi


def test_regression_example_probes_plans_and_trains_on_two_ranks():
    proc = run_mpi(2, ["examples/regression.py", "--epochs", "6"], timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    plans = re.findall(r"plan: batches \[(\d+), (\d+)\], (\d+) steps per epoch", proc.stdout)
    assert len(plans) == 1, proc.stdout          # rank 0 only
    b0, b1, steps = map(int, plans[0])
    assert b0 + b1 == 256 and steps == -(-4096 // 256)
    first, last, mean = map(float, re.search(
        r"first epoch ([\d.]+), last epoch ([\d.]+), predicting the mean ([\d.]+)",
        proc.stdout).groups())
    assert last < first and last < 0.5 * mean, proc.stdout   # it learns
