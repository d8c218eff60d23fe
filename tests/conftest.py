"""Helpers to launch real MPI ranks from pytest."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from world import Worlds, WorldOf, world_env

ROOT = Path(__file__).resolve().parents[1]
MPI_DIR = Path(__file__).parent / "mpi"

# Horovod's background thread negotiates with the other ranks every cycle, busy or idle; at its
# 1 ms default, 3 ranks on 2 cores spend a sixth of the suite's wall time on it (measured with
# test_fit.py + test_weighted_allreduce.py: 50 s -> 41 s at 5 ms). Every launch inherits it.
os.environ.setdefault("HOROVOD_CYCLE_TIME", "5")


def mpirun_cmd(np_: int, args: list[str]) -> list[str]:
    cmd = ["mpirun", "-np", str(np_), "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd + [sys.executable, *args]


LAUNCHERS = ("mpirun", "horovodrun-mpi", "horovodrun-gloo")

# mpirun waits 2 s (odls_base_sigkill_timeout 1 s, twice) before it ends the ranks of a job in
# which a rank failed; for launches that are to fail and whose ranks have nothing more to say
FAST_ABORT = {"OMPI_MCA_odls_base_sigkill_timeout": "0"}


def launch_cmd(launcher: str, np_: int, args: list[str]) -> list[str]:
    """``python ARGS`` on ``np_`` local ranks under ``launcher`` (one of :data:`LAUNCHERS`)."""
    if launcher == "mpirun":
        return mpirun_cmd(np_, args)
    horovodrun = str(Path(sys.executable).parent / "horovodrun")
    controller = {"horovodrun-mpi": "--mpi", "horovodrun-gloo": "--gloo"}[launcher]
    return [horovodrun, "-np", str(np_), "-H", f"localhost:{np_}", controller,
            sys.executable, *args]


def run_mpi(np_: int, args: list[str], timeout: float = 300, cwd=None,
            env_update: dict | None = None, launcher: str = "mpirun"
            ) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` on ``np_`` ranks; return the finished process (text output).
    ``env_update``: variables to set, or to remove where the value is None."""
    if shutil.which("mpirun") is None:
        pytest.fail("mpirun not on PATH: run scripts/setup.sh")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    for key, value in (env_update or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return subprocess.run(launch_cmd(launcher, np_, args), capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or ROOT, env=env)


def hetgrad_mpi(np_: int, args: list[str], **kw) -> subprocess.CompletedProcess:
    return run_mpi(np_, ["-m", "hetgrad.cli", *args], **kw)


def read_json(path) -> dict:
    return json.loads(Path(path).read_text())


# modules that share a session fixture's launches (conftest's under_horovodrun)
TOGETHER = {"test_sparsify": "test_launchers"}


@pytest.hookimpl(tryfirst=True)   # before xdist reads the marks
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (README's ``-n 2 --dist loadgroup``) a test module runs whole on
    one worker, so its module fixtures and the session fixtures it uses start once there; the
    modules of :data:`TOGETHER` run on the same worker (xdist hands the groups out largest
    first, by number of tests: ``--loadscope-reorder``, its default)."""
    # xdist sets ``loadgroup`` on its workers only (where the marks are read): False on the
    # controller, without -n and without xdist
    if not config.getoption("loadgroup", False):
        return
    for item in items:
        module = getattr(getattr(item, "module", None), "__name__", item.nodeid)
        item.add_marker(pytest.mark.xdist_group(TOGETHER.get(module, module)))


@pytest.fixture
def mpi():
    return run_mpi


@pytest.fixture(scope="session")
def worlds():
    """The session's test worlds (tests/world.py), ended when the session ends."""
    w = Worlds(mpirun_cmd, world_env())
    yield w
    w.close()


@pytest.fixture(scope="session")
def world2(worlds):
    """A world of 2 ranks for in-process cases (tests/mpi/*.py functions)."""
    return WorldOf(worlds, 2)


@pytest.fixture(scope="session")
def world3(worlds):
    """A world of 3 ranks for in-process cases."""
    return WorldOf(worlds, 3)


def launch_cases(launcher: str, np_: int, cases: list, directory: Path) -> list:
    """Run test-world cases (``[case, kwargs]``, tests/mpi/launch_cases.py) in one launch
    under ``launcher``; rank 0's return values."""
    spec, out = directory / f"{launcher}-cases.json", directory / f"{launcher}-out.json"
    spec.write_text(json.dumps(cases))
    proc = run_mpi(np_, [str(MPI_DIR / "launch_cases.py"), str(spec), str(out)], timeout=400,
                   launcher=launcher)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return [proc.stdout, *read_json(out)]


# what tests/test_launchers.py trains under every launcher (2 ranks, fixed plan 1,3, the
# rebalancer measuring every epoch with a threshold too high to re-plan, a checkpoint every
# epoch), dense and sparse
TRAIN_ARMS = {"dense": {}, "sparse": {"sparsify": "sticky", "density": 0.05}}


def train_arm(directory: Path, launcher: str, arm: str) -> dict:
    tag = f"{launcher}-{arm}"
    return dict(speeds=[1, 3], epochs=3, rebalance=True, rebalance_threshold=1000, probe_steps=1,
                checkpoint_dir=str(directory / f"{tag}-ckpt"), out=str(directory / f"{tag}.json"),
                **TRAIN_ARMS[arm])


@pytest.fixture(scope="session")
def under_horovodrun(tmp_path_factory) -> dict:
    """One launch per horovodrun controller (MPI, Gloo) of 2 ranks, running every case that
    must run under it: the training arms of tests/test_launchers.py and, under Gloo, the
    sparse exchanges of tests/test_sparsify.py. ``{launcher: {name: result}}``, with
    ``"stdout"`` what the launch printed."""
    d = tmp_path_factory.mktemp("horovodrun")
    runs = {}
    for launcher in LAUNCHERS[1:]:
        cases = [["training:train", train_arm(d, launcher, arm)] for arm in TRAIN_ARMS]
        if launcher == "horovodrun-gloo":
            cases.append(["sparse_exchange:exchanges", {}])
        stdout, *results = launch_cases(launcher, 2, cases, d)
        runs[launcher] = {"stdout": stdout, "dir": d, **dict(zip(TRAIN_ARMS, results)),
                          **({"exchanges": results[-1]} if len(results) > len(TRAIN_ARMS)
                             else {})}
    return runs
