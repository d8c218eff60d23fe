"""hetgrad: heterogeneous data-parallel training on Horovod (see docs/design.md).

Library use, in a script under ``mpirun``/``srun``/``horovodrun``::

    import hetgrad, hetgrad.keras as hk
    hetgrad.init()
    perf = hk.probe(model, x, y, global_batch=256)       # every rank's step-time model
    plan = hetgrad.make_plan(perf, 256, len(x))
    ds = hk.shard(x, y, plan)                            # this rank's local batches
    model.compile(optimizer=hk.DistributedOptimizer(opt, plan=plan), loss=...)
    model.fit(ds, epochs=E, steps_per_epoch=plan.steps_per_epoch, callbacks=[...])

Importing hetgrad before TensorFlow keeps TF's C++ start-up lines (oneDNN, cpu_feature_guard,
CUDA stubs) off every rank's output (:mod:`hetgrad.quiet`); ``HETGRAD_VERBOSE=1`` (or
``hetgrad --verbose``) brings them back.
"""
import os

if not os.environ.get("HETGRAD_VERBOSE"):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from . import quiet
    quiet.install()

from .partition import Plan, fixed_plan, make_plan  # noqa: E402  (pure Python, no TF)

__all__ = ["init", "make_plan", "fixed_plan", "Plan"]


def init():
    """Start MPI (where it is the launcher's world) and Horovod once; return the control
    channel of Horovod's world (:class:`hetgrad.comm.Comm`). Idempotent."""
    from .runtime import init as _init
    return _init()
