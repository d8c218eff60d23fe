"""Poison rank 1's inputs with NaN in epoch 2 of a real `hetgrad train` run on 3 ranks.

Usage: nonfinite.py OUT.json abort|ignore [dense|sparse]
"""
import sys

import numpy as np

from hetgrad import run, trainer
from hetgrad.config import TrainConfig
from hetgrad.runtime import fail_fast

out, policy = sys.argv[1], sys.argv[2]
sparse = len(sys.argv) > 3 and sys.argv[3] == "sparse"
clean = run.epoch_batches


def poisoned(xy, plan, rank, seed, epoch):
    ds = clean(xy, plan, rank, seed, epoch)
    if rank == 1 and epoch == 1:
        return ds.map(lambda x, y: (x * np.float32(np.nan), y))
    return ds


run.epoch_batches = poisoned
with fail_fast():
    trainer.train(TrainConfig(speeds=[1, 2, 1], epochs=3, on_nonfinite=policy, out=out,
                              sparsify="topk" if sparse else None, quiet=True))
