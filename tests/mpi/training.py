"""``hetgrad train`` in a test world (tests/world.py): what the command runs after parsing its
flags, on the world's ranks, without a launch of its own."""
import os

from hetgrad.config import TrainConfig
from hetgrad.trainer import train as run_train


def train(cwd: str | None = None, **settings) -> dict:
    """Train with these :class:`TrainConfig` settings (field names, e.g. ``speeds=[1, 3]``);
    rank 0 returns the record, the other ranks ``{}``. ``cwd``: the working directory for
    the run (a user's model module is imported from there)."""
    here = os.getcwd()
    os.chdir(cwd or here)
    try:
        return run_train(TrainConfig(**settings))
    finally:
        os.chdir(here)


def digest(spec: str) -> str:
    """SHA-256 of dataset ``spec``'s train and test arrays as this rank loads them."""
    import hashlib

    import numpy as np

    from hetgrad.data import load
    d, h = load(spec), hashlib.sha256()
    for split in (d.train, d.test):
        for a in split.take(np.arange(len(split))):
            h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()
