"""Checkpoint/resume: rank 0 saves model, optimizer state, epoch, plan and probe atomically.

Layout of a checkpoint directory::

    ckpt-<epoch>/       tf.train.Checkpoint files (model + optimizer, incl. iterations);
                        ckpt-<epoch>-<step>/ when saved in the middle of an epoch
      rank-<r>.npz      per-rank state (sparse mode: residuals and selection history)
    state.json          {"epoch", "step", "checkpoint", "plan", "probe", "job"[, "adaptive",
                        "shift"]} -- written last, by rename, so it always names a complete
                        checkpoint (:class:`State`)
    final_weights.npz   the model's weights when training ended

The data position is ``(seed, epoch, step)``: epochs done, and steps done of the next one.
The global order (:mod:`hetgrad.data.order`) depends on nothing else, so resuming there --
on any number of ranks -- continues exactly the sequence of batches an uninterrupted run sees.

Reading and checking ``state.json`` needs no TensorFlow (the start-up checks do it first);
TensorFlow is imported when a :class:`Checkpointer` is made.
"""
from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field as dc_field
from pathlib import Path

import numpy as np

from .errors import HetgradError, InputFileError
from .io import read_json, typed, write_json, write_npz
from .partition import Plan


@dataclass
class State:
    """The fields of ``state.json``, which :meth:`Checkpointer.save` writes."""

    epoch: int                                   # epochs done
    checkpoint: str
    plan: dict
    probe: list
    job: dict = dc_field(default_factory=dict)   # the job's settings (validate.job_identity)
    step: int = 0                                # steps done of epoch ``epoch + 1``
    adaptive: dict | None = None                 # --adaptive-batch: lr_factor, b0 (adapt.py)
    shift: int = 0                               # in a split epoch's rest: Progress.shift


def checkpoint_name(epoch: int, step: int = 0) -> str:
    """The directory of the checkpoint after ``epoch`` epochs and ``step`` more steps."""
    return f"ckpt-{epoch}-{step}" if step else f"ckpt-{epoch}"


def read_state(directory: str | os.PathLike) -> dict:
    """The ``state.json`` of a checkpoint directory (errors name it and ``resume``)."""
    return read_json(Path(directory) / "state.json", field="resume", what="checkpoint state")


def checked_state(directory: Path) -> tuple[dict, Plan]:
    """``state.json`` of a checkpoint dir, with its plan, checked to be whole and to name the
    checkpoint of its own epoch."""
    path = directory / "state.json"
    state = read_state(directory)
    try:
        typed(State, state, "checkpoint state")
        plan = Plan(**typed(Plan, state["plan"], "plan"))
        plan.validate()
    except (TypeError, ValueError, KeyError, HetgradError) as exc:
        raise InputFileError(f"{path} is not a hetgrad checkpoint state: {exc}",
                             field="resume") from None
    if state["checkpoint"] != checkpoint_name(state["epoch"], state.get("step", 0)) or \
            not (directory / state["checkpoint"]).is_dir():
        raise InputFileError(f"{path} says epoch {state['epoch']} in {state['checkpoint']}, "
                             "which is missing or of another epoch: the checkpoint directory "
                             "was changed by hand", field="resume")
    return state, plan


class Checkpointer:
    """Saves every ``every`` epochs (rank 0 only) and restores on every rank; with no
    ``directory`` every call is a no-op."""

    def __init__(self, directory: str | None, model, optimizer, rank: int, *, every: int = 1,
                 state: dict | None = None):
        import tensorflow as tf
        self.dir = Path(directory) if directory else None
        self.rank = rank
        self.every = every
        self.state = dict(state or {})
        self.model = model
        self.optimizer = optimizer
        self.ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer)
        self.last_save: tuple[float, float] | None = None   # Unix start and end, rank 0

    def due(self, epoch: int, last: bool = False) -> bool:
        """Whether to save after ``epoch`` epochs: every ``every``, and after the ``last``."""
        return self.dir is not None and (epoch % self.every == 0 or last)

    def save(self, epoch: int, per_rank: list[dict] | None = None, step: int = 0,
             **state) -> None:
        """Write the checkpoint after ``epoch`` epochs and ``step`` steps of the next under a
        temporary name, rename it, then commit state.json (``state`` adds to or replaces the
        fixed state, e.g. the plan in effect). ``per_rank[r]`` (arrays gathered to rank 0)
        goes to ``<checkpoint>/rank-<r>.npz``."""
        if self.dir is None or self.rank != 0:
            return
        started = time.time()
        self.dir.mkdir(parents=True, exist_ok=True)
        final = self.dir / checkpoint_name(epoch, step)
        tmp = self.dir / f".{final.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            self.ckpt.write(str(tmp / "ckpt"))
            for r, arrays in enumerate(per_rank or []):
                write_npz(tmp / f"rank-{r}.npz", **arrays)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
        finally:   # a failed save leaves no half-written directory behind
            shutil.rmtree(tmp, ignore_errors=True)
        write_json({**self.state, **state, "epoch": epoch, "step": step,
                    "checkpoint": final.name},
                   self.dir / "state.json")
        for old in self.dir.glob("ckpt-*"):
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
        self.last_save = (started, time.time())

    def save_final_weights(self) -> None:
        if self.dir is None or self.rank != 0:
            return
        write_npz(self.dir / "final_weights.npz", *self.model.get_weights())

    def restore(self, state: dict, rank_state: bool = True) -> None:
        """Load model and optimizer (slots included) of ``state`` on this rank, and (with
        ``rank_state``: the same world size) this rank's exchange state (sparse memory) where
        the optimizer's reducer keeps one."""
        from .compat import build_optimizer
        build_optimizer(self.optimizer, self.model.trainable_variables)
        path = self.dir / state["checkpoint"] / "ckpt"
        try:
            self.ckpt.read(str(path)).assert_existing_objects_matched()
        except (tf_errors() + (AssertionError, ValueError)) as exc:
            raise InputFileError(f"cannot restore {path}: {exc}", field="resume") from None
        reducer = getattr(getattr(self.optimizer, "hetgrad", None), "reducer", None)
        if reducer is not None and rank_state:
            reducer.build([v.shape for v in self.model.trainable_variables])
            if reducer.state_dict():
                reducer.load_state_dict(self.rank_state(state))

    def rank_state(self, state: dict) -> dict:
        """This rank's arrays saved with ``per_rank`` (e.g. sparse residuals)."""
        path = self.dir / state["checkpoint"] / f"rank-{self.rank}.npz"
        try:
            with np.load(path) as f:
                return {k: f[k] for k in f.files}
        except OSError as exc:
            raise InputFileError(f"cannot read {path}: {exc}", field="resume") from None


def tf_errors() -> tuple:
    import tensorflow as tf
    return (tf.errors.NotFoundError, tf.errors.InvalidArgumentError)
