"""No hung ranks: a fault on one rank ends all ranks quickly with a message naming it."""
import time

import pytest

from conftest import MPI_DIR, run_mpi


@pytest.mark.parametrize("fault,needle", [
    ("raise", "hetgrad: error on rank 1/3: injected failure in the probe"),
    ("sleep", "hetgrad: error on rank 0/3: --probe-timeout: rank(s) [1] did not report within 5s"),
    # Open MPI names the rank that died (process [[job,1],1]) and its exit code
    ("exit", "Exit code:    3"),
])
def test_fault_on_one_rank_ends_the_job(fault, needle):
    t0 = time.monotonic()
    proc = run_mpi(3, [str(MPI_DIR / "faults.py"), fault], timeout=100)
    elapsed = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert needle in out, out[-3000:]
    assert elapsed < 60, elapsed
