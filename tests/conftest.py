"""Helpers to launch real MPI ranks from pytest."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MPI_DIR = Path(__file__).parent / "mpi"


def mpirun_cmd(np_: int, args: list[str]) -> list[str]:
    cmd = ["mpirun", "-np", str(np_), "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd + [sys.executable, *args]


LAUNCHERS = ("mpirun", "horovodrun-mpi", "horovodrun-gloo")


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


@pytest.fixture
def mpi():
    return run_mpi
