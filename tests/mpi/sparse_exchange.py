"""The in-graph sparse exchange on real ranks, against the numpy oracle and the dense sum.

The case ``sparse_exchange:exchanges`` of a test world (tests/world.py), or under a launcher
(e.g. ``horovodrun --gloo``): ``sparse_exchange.py OUT.json``, rank 0 writes the results.
"""
import json
import sys

import numpy as np
import tensorflow as tf

from hetgrad.runtime import init
from hetgrad.sparse import SparseReducer, Sparsify
from sparse_oracle import OracleExchanger

comm = init()
rank, size = comm.rank, comm.size
SHAPES = [(60, 50), (500,), (7,), (40, 30)]        # (7,) stays dense (dense_below=100)
SPARSE = [0, 1, 3]
weights = np.array([1, 2, 4][:size], float)
weights /= weights.sum()
CONFIGS = {f"{p}/{e}": dict(policy=p, exchange=e) for p in ("topk", "recent", "sticky")
           for e in ("union", "allgather")}
CONFIGS.update({
    "leader/union": dict(policy="leader"),
    "topk/union/sampled": dict(policy="topk", sample_above=1000),
    "sticky/union/momentum": dict(policy="sticky", momentum=0.9),
    "topk/allgather/momentum-unmasked": dict(policy="topk", exchange="allgather",
                                             momentum=0.9, mask_momentum=False),
    "topk/union/clip": dict(policy="topk", clip_norm=0.5, dense_below=1),
    # two dense warm-up steps (density 0.5 >= dense_above), then sparse at 0.02
    "topk/allgather/dense-warmup": dict(policy="topk", exchange="allgather", warmup_epochs=1,
                                        dense_above=0.3),
    "sticky/union/momentum/dense-warmup": dict(policy="sticky", momentum=0.9, warmup_epochs=1,
                                               dense_above=0.3),
})
WARMUP = [0.5, 0.5]   # the densities of the first steps of the configs with a warm-up


def grads(step):
    """Every rank can rebuild every rank's weighted gradients (seeded by step and rank)."""
    return [[np.float32(weights[r]) * np.random.default_rng([step, r, t]).normal(size=s)
             .astype(np.float32) for t, s in enumerate(SHAPES)] for r in range(size)]


def flat(gs, ids):
    return np.concatenate([gs[t].reshape(-1) for t in ids])


def run(settings: Sparsify, steps: int = 5) -> dict:
    reducer = SparseReducer(settings)
    step_fn = tf.function(lambda *g: reducer.reduce(list(g)))
    ids = SPARSE if settings.dense_below > 7 else list(range(len(SHAPES)))
    oracle = OracleExchanger(comm, [int(np.prod(SHAPES[t])) for t in ids], settings)
    worst = dict(vs_oracle=0.0, residual_vs_oracle=0.0, mass=0.0, union_exact=0.0,
                 small_exact=0.0)
    unions, oracle_unions = [], []
    for step in range(steps):
        if settings.warmup_epochs:
            density = WARMUP[step] if step < len(WARMUP) else settings.density
            reducer.set_density(density)
            oracle.set_density(density)
        g = grads(step)
        before = comm.allreduce_sum(oracle.residual.astype(np.float64))
        out = [o.numpy() for o in step_fn(*[tf.constant(x) for x in g[rank]])]
        want, u = oracle.step_once(flat(g[rank], ids))
        oracle_unions.append(u)
        got = flat(out, ids)
        mine = np.concatenate([reducer.memory.residuals[t].numpy() for t in range(len(ids))])
        worst["vs_oracle"] = max(worst["vs_oracle"], float(np.max(np.abs(got - want))))
        worst["residual_vs_oracle"] = max(worst["residual_vs_oracle"],
                                          float(np.max(np.abs(mine - oracle.residual))))
        dense = sum(flat(g[r], ids).astype(np.float64) for r in range(size)) + before
        after = comm.allreduce_sum(mine.astype(np.float64))
        worst["mass"] = max(worst["mass"], float(np.max(np.abs(got + after - dense))))
        union = np.zeros(got.size, bool)
        union[np.flatnonzero(got)] = True
        worst["union_exact"] = max(worst["union_exact"],
                                   float(np.max(np.abs(got[union] - dense[union]))))
        if ids == SPARSE:
            exact = sum(g[r][2] for r in range(size))
            worst["small_exact"] = max(worst["small_exact"], float(np.max(np.abs(out[2] - exact))))
    log = reducer.take_log()
    unions = [row["union"] for row in log]
    return {**worst, "unions": unions, "oracle_unions": oracle_unions, "k": log[0]["k"],
            "fresh": sum(settings.fresh_of(settings.k_of(int(np.prod(SHAPES[t]))))
                         for t in ids), "log": log[-1], "first_log": log[0]}


def exchanges() -> dict:
    """Every config's results, by config name."""
    return {key: run(Sparsify(**{"density": 0.02, "dense_below": 100, **cfg}))
            for key, cfg in CONFIGS.items()}


if __name__ == "__main__":
    res = exchanges()
    if rank == 0:
        json.dump(res, open(sys.argv[1], "w"), indent=2)
