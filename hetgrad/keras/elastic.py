"""``horovod.tensorflow.keras.elastic`` for hetgrad (``hvd.elastic`` after
``import hetgrad.keras as hvd``): the training state, Horovod's ``run`` and the callbacks that
keep the state current. Under an elastic ``horovodrun`` the ranks that stay keep their
weights; the wrapped function runs again on the new world, where ``hk.fit`` (or a new plan)
splits the global batch over the ranks there are, and ``weight="samples"`` weighs whatever
batches they get exactly."""
from .._keras.elastic import (CommitStateCallback, KerasState, TensorFlowKerasState,
                              UpdateBatchStateCallback, UpdateEpochStateCallback, run)

__all__ = ["KerasState", "TensorFlowKerasState", "run", "CommitStateCallback",
           "UpdateBatchStateCallback", "UpdateEpochStateCallback"]
