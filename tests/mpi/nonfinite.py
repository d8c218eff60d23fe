"""Poison rank 1's inputs with NaN in epoch 2 of a real `hetgrad train` run on 3 ranks.

The case ``nonfinite:train`` of a test world (tests/world.py), or under mpirun (what abort
needs: it ends the job): ``nonfinite.py OUT.json abort|ignore [dense|sparse]``.
"""
import sys

import numpy as np

from hetgrad import trainer
from hetgrad.config import TrainConfig
from hetgrad.run import Run
from hetgrad.runtime import fail_fast

clean = Run.batches


def poisoned(run, epoch, first_step=0):
    ds = clean(run, epoch, first_step)
    if run.rank == 1 and epoch == 1:
        return ds.map(lambda x, y: (x * np.float32(np.nan), y))
    return ds


def train(out: str, policy: str, sparse: bool = False) -> dict:
    """The poisoned run's record (rank 0; ``{}`` elsewhere)."""
    Run.batches = poisoned
    try:
        return trainer.train(TrainConfig(speeds=[1, 2, 1], epochs=3, on_nonfinite=policy,
                                         probe_steps=1, out=out, quiet=True,
                                         sparsify="topk" if sparse else None))
    finally:
        Run.batches = clean


if __name__ == "__main__":
    with fail_fast():
        train(sys.argv[1], sys.argv[2], len(sys.argv) > 3 and sys.argv[3] == "sparse")
