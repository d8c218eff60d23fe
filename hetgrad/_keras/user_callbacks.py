"""The user's Keras callbacks in :func:`hetgrad.keras.fit`: seeing the loop's per-epoch
``model.fit`` calls as one ``fit`` (:class:`OneFit`; the assembly runs only those that belong
on this rank, :func:`.callbacks.on_this_rank`), Keras' progress on rank 0, and a Keras
``BackupAndRestore`` served by hk.fit's own checkpoints, which restore every rank
(:func:`from_backup`)."""
from __future__ import annotations

from typing import Sequence

from .. import compat
from ..errors import HetgradError

keras = compat.keras


def from_backup(callbacks: Sequence, checkpoint_dir: str | None,
                resume: bool) -> tuple[list, str | None, bool, bool]:
    """A Keras ``BackupAndRestore`` among ``callbacks`` as hk.fit's own checkpoints: its
    ``backup_dir`` the checkpoint directory, resumed from when it holds one. Returns the other
    callbacks, the checkpoint directory, ``resume``, and whether to delete the directory when
    training ends (the callback's ``delete_checkpoint``)."""
    backups = [cb for cb in callbacks if isinstance(cb, keras.callbacks.BackupAndRestore)]
    if not backups:
        return list(callbacks), checkpoint_dir, resume, False
    backup = backups[0]
    if len(backups) > 1 or checkpoint_dir:
        raise HetgradError("give hk.fit one BackupAndRestore or a checkpoint_dir, not both",
                           field="callbacks")
    if getattr(backup, "save_freq", "epoch") != "epoch":
        raise HetgradError(f"BackupAndRestore(save_freq={backup.save_freq!r}): hk.fit backs up "
                           "at the end of every epoch; use save_freq='epoch'", field="callbacks")
    rest = [cb for cb in callbacks if cb is not backup]
    return rest, backup.backup_dir, True, bool(getattr(backup, "delete_checkpoint", True))


def progress_callbacks(verbose: int, rank: int) -> list:
    """Keras's progress bar (``verbose`` 1) or epoch lines (2), on rank 0 only."""
    if not verbose or rank != 0:
        return []
    bar = compat.progbar_logger()
    bar.hetgrad_verbose = verbose
    return [bar]


class OneFit(keras.callbacks.Callback):
    """Keras callbacks that see many ``model.fit`` calls of one epoch each as one ``fit``:
    ``on_train_begin`` once, ``on_train_end`` at :meth:`finish`, ``params["epochs"]`` the
    run's epochs, ``params["steps"]`` the epoch's (``steps``) and batch indices counted from
    its start (``first``: a resumed epoch's first step), an epoch split in two fits
    (``progress``, :class:`hetgrad.run.Progress`) begun and ended once. The loop adds it
    after the metric average: they see metrics over all ranks."""

    def __init__(self, callbacks: Sequence, epochs: int):
        super().__init__()
        self.inner, self.total = list(callbacks), epochs
        self.started, self.last_logs, self.forwarded = False, None, None
        self.first, self.steps, self.progress = 0, None, None

    def on_epoch_begin(self, epoch, logs=None):
        if not (self.progress and self.progress.continued):
            self._call("on_epoch_begin", epoch, logs)

    def on_epoch_end(self, epoch, logs=None):
        if not (self.progress and self.progress.split_step):
            self._call("on_epoch_end", epoch, logs)

    def set_model(self, model):
        if model is not self.forwarded:   # once a run (TensorBoard opens its writers there)
            self.forwarded = model
            for cb in self.inner:
                cb.set_model(model)
        super().set_model(model)

    def set_params(self, params):
        super().set_params(params)
        for cb in self.inner:
            verbose = getattr(cb, "hetgrad_verbose", params.get("verbose"))
            cb.set_params({**params, "epochs": self.total, "verbose": verbose,
                           **({"steps": self.steps} if self.steps else {})})
            bar = getattr(cb, "progbar", None)   # Keras' progress bar, made at the epoch's
            if bar is not None and getattr(cb, "target", None):   # begin: a split epoch's
                bar.target = cb.target                              # rest ends elsewhere

    def on_train_begin(self, logs=None):
        if not self.started:
            self.started = True
            self._call("on_train_begin", logs)

    def on_train_end(self, logs=None):
        self.last_logs = logs

    def finish(self) -> None:
        if self.started:
            self._call("on_train_end", self.last_logs)

    def _call(self, hook: str, *args) -> None:
        for cb in self.inner:
            getattr(cb, hook)(*args)


def _forward(hook: str, batch: bool = False):
    def method(self, *args, **kwargs):
        if batch:   # the step's index in the whole epoch
            args = (args[0] + self.first, *args[1:])
        self._call(hook, *args)
    method.__name__ = hook
    return method


for _hook in ("on_test_begin", "on_test_end",
              "on_test_batch_begin", "on_test_batch_end"):
    setattr(OneFit, _hook, _forward(_hook))
for _hook in ("on_train_batch_begin", "on_train_batch_end"):
    setattr(OneFit, _hook, _forward(_hook, batch=True))
