"""Gradient sparsification inside hetgrad's ``DistributedOptimizer``, in the TF graph.

Three parts, each swappable (GRACE's split): :mod:`.memory` (error feedback, DGC momentum
correction), :mod:`.select` (exact top-k, selection policies that make ranks agree), and
:mod:`.exchange` (Horovod ``allgather``, or agree on the union ``U`` and ``allreduce`` on it);
:class:`SparseReducer` plugs them into the aggregation layer as its reducer::

    opt = hetgrad.keras.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                             sparsify=Sparsify("sticky", density=0.01))

(:mod:`.settings` imports no TensorFlow, so the CLI can check flags before loading it.)
"""
from .settings import EXCHANGES, POLICIES, Sparsify

__all__ = ["Sparsify", "SparseReducer", "POLICIES", "EXCHANGES"]


def __getattr__(name: str):
    if name == "SparseReducer":
        from .reducer import SparseReducer
        return SparseReducer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
