"""Sparse exchanges on real ranks: union == dense weighted sum on U, mass conserved.

Usage: sparse_exchange.py OUT.json
"""
import json
import sys

import numpy as np

from hetgrad.runtime import init
from hetgrad.sparsify import SparseExchanger

comm = init()  # the control channel of Horovod's world (mpi4py here, Horovod under Gloo)
rank, size = comm.rank, comm.size
SIZES = [3000, 500, 1200]
N = sum(SIZES)
weights = np.array([1, 2, 4][:size], float)
weights /= weights.sum()
w = float(weights[rank])
res = {}


def grads(step):
    """Every rank can rebuild every rank's gradient (seeded by step and rank)."""
    return [np.random.default_rng(1000 * step + r).normal(size=N).astype(np.float32)
            for r in range(size)]


for policy in ("topk", "recent", "sticky", "leader"):
    for exchange in ("union", "allgather"):
        ex = SparseExchanger(comm, SIZES, policy=policy, density=0.02, exchange=exchange)
        err_u, err_mass, unions = 0.0, 0.0, []
        for step in range(4):
            g = grads(step)
            before = comm.allreduce_sum(ex.memory.residual.astype(np.float64))
            out, st = ex.step(g[rank], w)
            after = comm.allreduce_sum(ex.memory.residual.astype(np.float64))
            dense = sum(weights[r] * g[r].astype(np.float64) for r in range(size)) + before
            # mass: what was delivered plus what is kept equals what there was to send
            err_mass = max(err_mass, float(np.max(np.abs(out + after - dense))))
            if exchange == "union" or policy == "leader":
                U = ex.state.prev_union
                mask = np.zeros(N, bool)
                mask[U] = True
                err_u = max(err_u, float(np.max(np.abs(out[mask] - dense[mask]))),
                            float(np.max(np.abs(out[~mask]))))
            unions.append(st.union)
        res[f"{policy}/{exchange}"] = {"err_union": err_u, "err_mass": err_mass,
                                       "unions": unions, "k": st.k}

if rank == 0:
    json.dump(res, open(sys.argv[1], "w"), indent=2)
