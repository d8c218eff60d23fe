"""A user's training script (e.g. ``examples/*.py``) run as ``python SCRIPT ARGS`` would run it,
on the ranks of a test world (tests/world.py): as ``__main__``, with its arguments in
``sys.argv`` and the repository as working directory."""
import os
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(script: str, *args: str) -> None:
    """Run ``script`` (relative to the repository) with ``args``; what it prints is the
    result."""
    argv, here = sys.argv, os.getcwd()
    sys.argv = [script, *args]
    os.chdir(ROOT)
    try:
        runpy.run_path(str(ROOT / script), run_name="__main__")
    finally:
        sys.argv = argv
        os.chdir(here)
