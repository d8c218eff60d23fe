"""The state one training run shares between the epoch loop (:mod:`hetgrad.loop`) and the
actions around it (:mod:`hetgrad.actions`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .pipeline import epoch_batches

if TYPE_CHECKING:
    import tensorflow as tf

    from .checkpoint import Checkpointer
    from .partition import Plan


class Run:
    """What the loop and the actions share of one training run: :class:`hetgrad.trainer.Job`
    (``hetgrad train``) and :func:`hetgrad.keras.fit` (a user's own model) fill it in. An
    action may replace ``plan``; every epoch appends its row to ``epochs``."""

    comm: Any
    device: str
    plan: "Plan"
    model: Any
    optimizer: Any
    checkpointer: "Checkpointer | None"
    train_xy: Any            # (inputs, targets): tensors or nested structures of tensors
    seed: int                # of the data order
    num_epochs: int          # train until this many epochs are done
    start_epoch: int         # epochs already done (resumed from a checkpoint)
    epochs: list[dict]
    validation: Any = None   # ``model.fit``'s validation_data, scored on every rank
    stop_requested = False   # agreed at the last epoch end (:mod:`hetgrad.preempt`)

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def size(self) -> int:
        return self.comm.size

    @property
    def aggregation(self):
        """The hetgrad optimizer's aggregation (None for the Horovod baselines)."""
        return getattr(self.optimizer, "hetgrad", None)

    @property
    def reducer(self):
        return self.aggregation.reducer if self.aggregation is not None else None

    def batches(self, epoch: int) -> tf.data.Dataset:
        """This rank's batches of ``epoch`` under the plan in effect."""
        return epoch_batches(self.train_xy, self.plan, self.rank, self.seed, epoch)
