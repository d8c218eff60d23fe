"""Everything a job's settings and files must satisfy, checked before any rank does work:
flags (ranges, combinations, flags that would do nothing), the data, plan, probe and
checkpoint files, and that every output can be written. Each rank runs the same checks;
:func:`hetgrad.runtime.agree` then ends every rank with the same one-line error.

All of it runs before TensorFlow is imported (:func:`checked_train`, :func:`checked_probe`),
except :func:`check_model`, which imports the user's model module and Keras."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import data as data_mod
from .checkpoint import checked_state
from .config import SETTINGS, TrainConfig
from .emulate import parse_schedule
from .errors import ConfigError, InputFileError
from .goodput import default_lr_rule
from .planning import choose_plan
from .runtime import agree, control
from .targets import kind_of
from .writable import can_create, check_observers, check_writable

# setting -> (when it does something, what it needs): given otherwise, it is an error
NEEDS = {
    "density": (lambda c: c.sparsify is not None, "--sparsify"),
    "exchange": (lambda c: c.sparsify is not None, "--sparsify"),
    "dense_below": (lambda c: c.sparsify is not None, "--sparsify"),
    **{name: (lambda c: c.sparsify is not None, "--sparsify")
       for name in ("momentum_correction", "density_warmup", "local_clip")},
    "fresh": (lambda c: c.sparsify == "sticky", "--sparsify sticky"),
    "momentum_unmasked": (lambda c: c.momentum_correction, "--momentum-correction"),
    "dense_above": (lambda c: c.sparsify is not None and c.density_warmup > 0,
                    "--sparsify and --density-warmup"),
    "weighting": (lambda c: c.mode == "weighted", "--mode weighted"),
    "rebalance_threshold": (lambda c: c.rebalance, "--rebalance"),
    "checkpoint_every": (lambda c: bool(c.checkpoint_dir or c.resume),
                         "--checkpoint-dir or --resume"),
    "overwrite": (lambda c: c.checkpoint_dir is not None, "--checkpoint-dir"),
    "emulate_unit": (lambda c: bool(c.emulate_speeds), "--emulate-speeds"),
    "gns": (lambda c: c.mode == "weighted", "--mode weighted"),
    "adaptive_batch": (lambda c: c.mode == "weighted" and c.sparsify is None,
                       "--mode weighted (and without --sparsify)"),
    "batch_range": (lambda c: c.adaptive_batch, "--adaptive-batch"),
    "lr_rule": (lambda c: c.adaptive_batch, "--adaptive-batch"),
    "gns_every": (lambda c: c.gns or c.adaptive_batch, "--gns or --adaptive-batch"),
    **{name: (lambda c: c.timeline is not None, "--timeline")
       for name in ("timeline_steps", "timeline_window")},
    **{name: (lambda c: not c.probe_file, "a probe (not --probe-file)")
       for name in ("probe_batch", "probe_sizes", "probe_steps", "probe_timeout")},
    "probe_refine": (lambda c: c.planned_by_probe and not c.probe_file,
                     "a probe that plans (not --probe-file, --plan, --speeds or --mode equal)"),
    **{name: (lambda c: not c.plan and c.mode != "equal",
              "the partitioner (not --plan or --mode equal)")
       for name in ("speeds", "min_batch", "max_batch")},
}

# settings a resumed job must share with its checkpoint's job (the same command line plus
# --resume is accepted; a changed one is an error, never silently ignored)
RESUMED_AS_SAVED = ("data", "model", "loss", "mode", "weighting", "optimizer", "seed",
                    "sparsify", "density", "exchange", "dense_below", "momentum_correction",
                    "momentum_unmasked", "density_warmup", "dense_above", "fresh",
                    "plan", "speeds", "min_batch", "max_batch", "drop_remainder", "probe_file",
                    "probe_batch", "probe_sizes", "probe_steps", "probe_refine",
                    "adaptive_batch", "batch_range", "lr_rule")


def given(cfg: TrainConfig) -> list[str]:
    """The settings that differ from their defaults."""
    return [n for n, f in SETTINGS.items() if getattr(cfg, n) != f.default]


def check_flags(cfg: TrainConfig, world_size: int) -> None:
    """Every flag's own rule and combination rule, the per-rank lists for ``world_size``
    ranks, then: no flag given that does nothing."""
    cfg.check()
    if cfg.emulate_speeds:
        parse_schedule(cfg.emulate_speeds, world_size)
    for name in given(cfg):
        if name in NEEDS and not NEEDS[name][0](cfg):
            raise ConfigError(f"does nothing without {NEEDS[name][1]}", field=name)
    if cfg.adaptive_batch and world_size < 2:
        raise ConfigError("needs 2 or more ranks (the noise scale compares their gradients)",
                          field="adaptive_batch")
    if cfg.gns and cfg.sparsify and not cfg.sparse_settings().dense_warmup():
        raise ConfigError("with --sparsify the noise scale is measured in the dense warm-up "
                          "steps only: give --density-warmup (without --momentum-correction "
                          "or --local-clip)", field="gns")


def check_checkpoint_dir(cfg: TrainConfig) -> None:
    """The checkpoint directory can be written and holds no other run's checkpoints (unless
    it is the one resumed from, or ``--overwrite``)."""
    if cfg.checkpoint_dir is None:
        return
    d = Path(cfg.checkpoint_dir)
    if d.exists() and not d.is_dir():
        raise ConfigError(f"{d} is a file, not a directory", field="checkpoint_dir")
    held = d.is_dir() and ((d / "state.json").exists() or any(d.glob("ckpt-*")))
    resumed_here = cfg.resume is not None and Path(cfg.resume).resolve() == d.resolve()
    if held and not (resumed_here or cfg.overwrite):
        raise ConfigError(f"{d} holds checkpoints of an earlier run; continue it with --resume "
                          f"{d}, replace them with --overwrite, or choose another directory",
                          field="checkpoint_dir")
    existing = d if d.is_dir() else next(p for p in d.resolve().parents if p.exists())
    can_create(existing, "checkpoint_dir")


def check_resume(cfg: TrainConfig, world_size: int, n_train: int) -> dict | None:
    """The state of ``--resume``, checked against this job (:func:`check_resumed`)."""
    if not cfg.resume:
        return None
    state, _ = checked_state(Path(cfg.resume))
    check_resumed(state, cfg.resume, job_identity(cfg), global_batch=cfg.global_batch,
                  n_train=n_train, epochs=cfg.epochs,
                  batch_range=(cfg.batch_range or cfg.default_range()) if cfg.adaptive_batch
                  else None)
    return state


def check_resumed(state: dict, directory, identity: dict, *, global_batch: int, n_train: int,
                  epochs: int, batch_range: tuple[int, int] | None = None) -> None:
    """A checkpoint's state against the job resuming it (``hetgrad train`` and ``hk.fit``
    alike): the same global batch (one in ``batch_range`` when it adapts), data size and
    ``identity`` settings (by the names the user typed), and epochs left to train. Another
    world size is fine: the run re-plans and goes on with the same global order of samples."""
    plan = state["plan"]

    def bad(text: str, field: str = "resume"):
        raise InputFileError(text, field=field)

    started = state.get("adaptive", {}).get("b0", global_batch)
    if batch_range and started != global_batch:
        bad(f"the checkpoint's adaptive batch started at {started}; resume with global batch "
            f"{started}", "global_batch")
    if batch_range and batch_range[0] <= plan["global_batch"] <= batch_range[1]:
        global_batch = plan["global_batch"]     # the batch it had chosen

    if plan["global_batch"] != global_batch:
        bad(f"the checkpoint trained with global batch {plan['global_batch']}; resume with "
            f"global batch {plan['global_batch']}", "global_batch")
    if plan["dataset_size"] != n_train:
        bad(f"the checkpoint trained on {plan['dataset_size']} samples, the data has "
            f"{n_train}", "data")
    for name, saved in state.get("job", {}).items():
        if name in identity and identity[name] != saved:
            bad(f"the checkpoint's job had {_shown(saved)}, this job asks for "
                f"{_shown(identity[name])}; resume with the same setting", name)
    if state["epoch"] >= epochs:
        bad(f"the checkpoint in {directory} is at epoch {state['epoch']}; ask for more epochs",
            "epochs")


def _shown(value) -> str:
    return "none" if value is None else repr(value)


def job_identity(cfg: TrainConfig) -> dict:
    """What a checkpoint remembers of its job, for :func:`check_resume` (the learning-rate
    rule as in effect: a default and its name resume alike)."""
    return {**{name: getattr(cfg, name) for name in RESUMED_AS_SAVED},
            "lr_rule": lr_rule_in_effect(cfg)}


def lr_rule_in_effect(cfg: TrainConfig) -> str | None:
    """``--lr-rule``, or its default for ``--optimizer`` (None without an adaptive batch)."""
    if not cfg.adaptive_batch:
        return None
    return cfg.lr_rule or default_lr_rule(cfg.optimizer == "sgd")


def check_train(cfg: TrainConfig, rank: int, world_size: int) -> tuple:
    """Every check of ``hetgrad train`` that needs no TensorFlow; returns the loaded data
    and the resumed state."""
    check_flags(cfg, world_size)
    if rank == 0:
        check_writable(cfg.out, "out")
        check_observers(cfg.tensorboard, cfg.timeline)
    check_checkpoint_dir(cfg)
    data = data_mod.load(cfg.data, kind_of(cfg.loss))
    state = check_resume(cfg, world_size, len(data.train))
    if state is None:   # the partitioner's own checks, on equal speeds
        choose_plan(cfg, world_size, len(data.train), None)
    if cfg.probe_file:
        check_probe_file(cfg, world_size)
    return data, state


def check_probe_file(cfg: TrainConfig, world_size: int) -> None:
    """The probe file fits the ranks, and was timed under this job's emulated speeds (or
    none): its rates are the ideal the run's efficiency is judged against."""
    from .probe import load
    timed, now = load(cfg.probe_file, world_size=world_size)[0].emulation, cfg.emulation_spec()
    if timed != now:
        raise InputFileError(f"{cfg.probe_file} was timed under emulated speeds {_shown(timed)}, "
                             f"this job runs under {_shown(now)}; probe again or emulate the "
                             "same speeds", field="probe_file")


def check_probe(cfg: TrainConfig, rank: int, world_size: int) -> data_mod.Dataset:
    """Every check of ``hetgrad probe`` that needs no TensorFlow (a flag that would do nothing
    included); returns the loaded data."""
    check_flags(cfg, world_size)
    if rank == 0:
        check_writable(cfg.out, "out")
    return data_mod.load(cfg.data, kind_of(cfg.loss))


def check_model(cfg: TrainConfig) -> None:
    """``--model`` and ``--loss``: imports the user's model module (and Keras with it), so it
    runs after every other check."""
    from . import models
    models.resolve(cfg.model)
    models.loss(cfg.loss)


@dataclass(frozen=True)
class Checked:
    """A job's settings that passed every check needing no TensorFlow, on every rank, with
    the dataset and checkpoint state the checks read."""

    cfg: TrainConfig
    data: data_mod.Dataset
    state: dict | None = None


def checked_train(cfg: TrainConfig) -> Checked:
    """Every ``hetgrad train`` check that needs no TensorFlow, agreed by every rank."""
    comm = control(cfg.threads, cfg.device)
    data, state = agree(comm, lambda: check_train(cfg, comm.rank, comm.size))
    return Checked(cfg, data, state)


def checked_probe(cfg: TrainConfig) -> Checked:
    """Every ``hetgrad probe`` check that needs no TensorFlow, agreed by every rank."""
    comm = control(cfg.threads, cfg.device)
    return Checked(cfg, agree(comm, lambda: check_probe(cfg, comm.rank, comm.size)))


__all__ = ["check_train", "check_probe", "check_flags", "check_writable", "check_resume",
           "check_checkpoint_dir", "check_model", "job_identity", "lr_rule_in_effect", "Checked",
           "checked_train", "checked_probe"]
