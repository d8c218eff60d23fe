"""Everything a job's settings and files must satisfy, checked before any rank does work:
flags (ranges, combinations, flags that would do nothing), the data, plan, probe and
checkpoint files, and that every output can be written. Each rank runs the same checks;
:func:`hetgrad.runtime.agree` then ends every rank with the same one-line error."""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field as dc_field
from pathlib import Path

from . import data as data_mod
from .config import SETTINGS, TrainConfig
from .errors import ConfigError, HetgradError, InputFileError
from .io import typed

# setting -> (when it does something, what it needs): given otherwise, it is an error
NEEDS = {
    "density": (lambda c: c.sparsify is not None, "--sparsify"),
    "exchange": (lambda c: c.sparsify is not None, "--sparsify"),
    "dense_below": (lambda c: c.sparsify is not None, "--sparsify"),
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
                    "plan", "speeds", "min_batch", "max_batch", "probe_file", "probe_batch",
                    "probe_sizes", "probe_steps", "probe_refine")


def given(cfg: TrainConfig) -> list[str]:
    """The settings that differ from their defaults."""
    return [n for n, f in SETTINGS.items() if getattr(cfg, n) != f.default]


def check_flags(cfg: TrainConfig) -> None:
    """Every flag's own rule and combination rule, then: no flag given that does nothing."""
    cfg.check()
    for name in given(cfg):
        if name in NEEDS and not NEEDS[name][0](cfg):
            raise ConfigError(f"does nothing without {NEEDS[name][1]}", field=name)


def check_writable(path: str | os.PathLike, field: str) -> None:
    """``path`` can be created or replaced: not a directory, in an existing directory where a
    file can be created (tried with a temporary file, removed at once)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{p} is a directory; give a file path", field=field)
    parent = p.resolve().parent
    if not parent.is_dir():
        raise ConfigError(f"directory {parent} does not exist", field=field)
    _try_create(parent, field)


def _try_create(directory: Path, field: str) -> None:
    try:
        fd, name = tempfile.mkstemp(dir=directory, prefix=".hetgrad-check")
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        raise ConfigError(f"cannot write in {directory}: {exc.strerror}", field=field) from None


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
    _try_create(existing, "checkpoint_dir")


def check_resume(cfg: TrainConfig, world_size: int, n_train: int) -> dict | None:
    """The state of ``--resume``, checked against this job: complete, consistent with its
    checkpoint, and from a job with the same ranks, data, global batch and settings."""
    if not cfg.resume:
        return None
    state, plan = _checked_state(Path(cfg.resume))

    def bad(text: str, field: str = "resume"):
        raise InputFileError(text, field=field)

    if plan.world_size != world_size:
        bad(f"the checkpoint is of a {plan.world_size}-rank job, this job has {world_size} "
            f"ranks; resume with {plan.world_size} ranks")
    if plan.global_batch != cfg.global_batch:
        bad(f"the checkpoint trained with global batch {plan.global_batch}; resume with "
            f"-B {plan.global_batch}", "global_batch")
    if plan.dataset_size != n_train:
        bad(f"the checkpoint trained on {plan.dataset_size} samples, --data has {n_train}",
            "data")
    for name, saved in state.get("job", {}).items():
        if name in RESUMED_AS_SAVED and getattr(cfg, name) != saved:
            bad(f"the checkpoint's job had {_shown(saved)}, this job asks for "
                f"{_shown(getattr(cfg, name))}; resume with the same setting", name)
    if state["epoch"] >= cfg.epochs:
        bad(f"the checkpoint is at epoch {state['epoch']}; ask for more epochs", "epochs")
    return state


def _checked_state(directory: Path) -> tuple[dict, "Plan"]:
    """``state.json`` of a checkpoint dir, with its plan, checked to be whole and to name the
    checkpoint of its own epoch."""
    from .checkpoint import read_state
    from .partition import Plan
    path = directory / "state.json"
    state = read_state(directory)
    try:
        typed(_State, state, "checkpoint state")
        plan = Plan(**typed(Plan, state["plan"], "plan"))
        plan.validate()
    except (TypeError, ValueError, KeyError, HetgradError) as exc:
        raise InputFileError(f"{path} is not a hetgrad checkpoint state: {exc}",
                             field="resume") from None
    if state["checkpoint"] != f"ckpt-{state['epoch']}" or \
            not (directory / state["checkpoint"]).is_dir():
        raise InputFileError(f"{path} says epoch {state['epoch']} in {state['checkpoint']}, "
                             "which is missing or of another epoch: the checkpoint directory "
                             "was changed by hand", field="resume")
    return state, plan


@dataclass
class _State:
    """The fields of ``state.json`` (types for :func:`hetgrad.io.typed`)."""

    epoch: int
    checkpoint: str
    plan: dict
    probe: list
    job: dict = dc_field(default_factory=dict)


def _shown(value) -> str:
    return "none" if value is None else repr(value)


def job_identity(cfg: TrainConfig) -> dict:
    """What a checkpoint remembers of its job, for :func:`check_resume`."""
    return {name: getattr(cfg, name) for name in RESUMED_AS_SAVED}


def check_train(cfg: TrainConfig, rank: int, world_size: int) -> tuple:
    """Every check of ``hetgrad train``; returns the loaded data and the resumed state."""
    check_flags(cfg)
    if rank == 0:
        check_writable(cfg.out, "out")
    check_checkpoint_dir(cfg)
    data = data_mod.load(cfg.data)
    state = check_resume(cfg, world_size, len(data.y_train))
    if state is None:
        from .trainer import choose_plan   # the partitioner's own checks, on equal speeds
        choose_plan(cfg, world_size, len(data.y_train), None)
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


def check_probe(cfg: TrainConfig, rank: int) -> data_mod.Dataset:
    """Every check of ``hetgrad probe`` (a flag that would do nothing included); returns the
    loaded data."""
    check_flags(cfg)
    if rank == 0:
        check_writable(cfg.out, "out")
    return data_mod.load(cfg.data)


__all__ = ["check_train", "check_probe", "check_flags", "check_writable", "check_resume",
           "check_checkpoint_dir", "job_identity"]
