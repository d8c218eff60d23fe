"""Which plan a job trains on -- a saved plan file, Horovod's equal split (mode equal), or the
partitioner on given speeds or on the probe's models -- and the batch sizes the probe times
for it. Pure Python: the checks run it (on equal speeds) before TensorFlow is loaded."""
from __future__ import annotations

from typing import Sequence

from .config import TrainConfig
from .errors import ConfigError, HetgradError
from .partition import Plan, equal_plan, make_plan
from .perfmodel import probe_batches


def choose_plan(cfg: TrainConfig, size: int, n_train: int, probed: list | None) -> Plan:
    """The plan file if given, else equal batches (mode equal), else speeds -> partitioner
    (``probed`` None: equal speeds, what validation plans to find infeasible settings)."""
    if cfg.plan:
        plan = Plan.load(cfg.plan, world_size=size)
        if plan.dataset_size != n_train:
            raise ConfigError(f"plan file {cfg.plan} is for {plan.dataset_size} samples, the "
                              f"data has {n_train}", field="plan")
        return plan
    if cfg.mode == "equal":
        if cfg.global_batch % size:
            raise ConfigError(f"mode equal needs a global batch divisible by {size} ranks",
                              field="global_batch")
        return equal_plan(size, cfg.global_batch, n_train, cfg.drop_remainder)
    if cfg.speeds is not None and len(cfg.speeds) != size:
        raise ConfigError(f"{len(cfg.speeds)} speeds for {size} ranks", field="speeds")
    speeds = cfg.speeds if cfg.speeds is not None else \
        [r.model() for r in probed] if probed else [1.0] * size
    return make_plan(speeds, cfg.global_batch, n_train, min_batch=cfg.min_batch,
                     max_batch=cfg.max_batch, drop_remainder=cfg.drop_remainder)


def planner(global_batch: int, min_batch: int = 1,
            max_batch: Sequence[int] | int | None = None):
    """Every rank's step model -> every rank's batch of :func:`make_plan` (what the probe's
    refinement times)."""
    return lambda models: make_plan(models, global_batch, global_batch, min_batch=min_batch,
                                    max_batch=max_batch).batches


def probe_sizes(cfg: TrainConfig, rank: int, size: int) -> list[int]:
    """Rank ``rank``'s probe batches: geometric up to ``--probe-batch`` (default B), capped."""
    cap = cfg.max_batch[rank] if isinstance(cfg.max_batch, list) else cfg.max_batch
    top = min(cfg.probe_batch or cfg.global_batch, cap or cfg.global_batch)
    return probe_batches(top, cfg.global_batch, size, cfg.probe_sizes)


def check_plan(plan: Plan, size: int, n: int, global_batch: int) -> None:
    """A plan given to ``hk.fit`` (``plan=``) checked against the job."""
    if plan.world_size != size:
        raise HetgradError(f"the plan is for {plan.world_size} ranks, this job has {size}",
                           field="plan")
    if plan.dataset_size != n:
        raise HetgradError(f"the plan is for {plan.dataset_size} samples, the data has {n}",
                           field="plan")
    if plan.global_batch != global_batch:
        raise HetgradError(f"the plan is for a global batch of {plan.global_batch}, not "
                           f"{global_batch}", field="plan")
