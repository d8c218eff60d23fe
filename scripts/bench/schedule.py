"""The order a benchmark runs its arms in: every round (repeat, seed, block) runs each arm
once, in a fresh random order drawn from a seeded generator.

Why random, and not a fixed or a turning order (``bench_overhead.py`` found it): runs on one
machine leave things behind (caches, page cache, allocator and CPU frequency state, a
process still exiting, Horovod's background thread), and what one arm leaves behind slows
whichever arm comes next. With a fixed order each arm always follows the same arm; turning
the order (reversed every other repeat, or rotated every block) still pairs each arm with
the same one or two neighbours, so the after-effect lands on the same arms every time and
shows up as a systematic difference between them. A fresh random order per round makes the
predecessor of every arm random, so the after-effect becomes noise that the repeats average
out. The generator is seeded: the same seed gives the same orders (on every rank of an MPI
job, and on a rerun that resumes a results file).
"""
from __future__ import annotations

from typing import Iterator, Sequence, TypeVar

import numpy as np

T = TypeVar("T")


def rounds(arms: Sequence[T], n: int, seed: int = 0) -> Iterator[list[T]]:
    """``n`` rounds of ``arms``, each a permutation of them drawn from ``default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        yield [arms[i] for i in rng.permutation(len(arms))]


def interleaved(arms: Sequence[T], n: int, seed: int = 0) -> Iterator[tuple[int, T]]:
    """``(round, arm)`` for the ``n`` :func:`rounds` of ``arms``, in running order."""
    for r, order in enumerate(rounds(arms, n, seed)):
        for arm in order:
            yield r, arm
