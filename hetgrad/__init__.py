"""hetgrad: heterogeneous data-parallel training on Horovod (see docs/design.md).

Importing hetgrad before TensorFlow keeps TF's C++ start-up lines (oneDNN, cpu_feature_guard,
CUDA stubs) off every rank's output; ``HETGRAD_VERBOSE=1`` (or ``hetgrad --verbose``), or an
explicit ``TF_CPP_MIN_LOG_LEVEL``, brings them back.
"""
import os

if not os.environ.get("HETGRAD_VERBOSE"):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
