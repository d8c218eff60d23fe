"""The small regression problem that tests/mpi/library.py and tests/mpi/fit.py train on."""
import numpy as np

N, B, LR = 100, 24, 0.1   # samples, global batch (5 steps, the last one partial), learning rate


def regression_data(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``N`` samples of 5 features and a noisy linear target (the same on every rank)."""
    x = rng.normal(size=(N, 5)).astype(np.float32)
    y = (x @ rng.normal(size=(5, 1)) + 0.1 * rng.normal(size=(N, 1))).astype(np.float32)
    return x, y
