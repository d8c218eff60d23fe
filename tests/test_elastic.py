"""Elastic training under horovodrun (Gloo, a host-discovery script): ranks join and leave
while hetgrad's state and weighted exchange carry on (tests/mpi/elastic_train.py)."""
import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

from conftest import ROOT

SCRIPT = ROOT / "tests" / "mpi" / "elastic_train.py"


def _rows(log: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def _change_hosts(hosts: Path, log: Path, stop: threading.Event) -> None:
    """localhost:2 -> 3 slots after 3 epochs on 2 ranks -> 2 after 3 epochs on 3 ranks."""
    for size, after in ((2, 3), (3, 3)):
        while not stop.is_set():
            if sum(r.get("size") == size and "epoch" in r for r in _rows(log)) >= after:
                hosts.write_text(f"localhost:{5 - size}\n")
                break
            time.sleep(0.2)


def test_ranks_join_and_leave_and_training_goes_on(tmp_path):
    hosts, log = tmp_path / "hosts", tmp_path / "log.jsonl"
    hosts.write_text("localhost:2\n")
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(discover.stat().st_mode | stat.S_IEXEC)
    horovodrun = str(Path(sys.executable).parent / "horovodrun")
    stop = threading.Event()
    watcher = threading.Thread(target=_change_hosts, args=(hosts, log, stop), daemon=True)
    watcher.start()
    try:
        proc = subprocess.run(
            [horovodrun, "--network-interfaces", "lo", "-np", "2", "--min-np", "1",
             "--max-np", "3", "--host-discovery-script", str(discover), sys.executable,
             str(SCRIPT), str(log), "24"],
            capture_output=True, text=True, timeout=400, cwd=tmp_path,
            env=dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2"))
    finally:
        stop.set()
    rows = _rows(log)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sizes = [r["size"] for r in rows if "epoch" in r]
    changes = [s for i, s in enumerate(sizes) if i == 0 or s != sizes[i - 1]]
    assert changes == [2, 3, 2], sizes
    for r in rows[:-1]:
        assert len(r["batches"]) == r["size"] and sum(r["batches"]) == 48, r
    epochs = [r["epoch"] for r in rows if "epoch" in r]
    assert epochs[-1] == 24 and sorted(set(epochs)) == list(range(1, 25)), epochs
    assert rows[-1] == {"done": True, "size": 2, "agree": True}, rows[-1]
