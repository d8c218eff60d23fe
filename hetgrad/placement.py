"""Where a rank runs, for the record: host, Slurm node, heterogeneous-job component, device."""
from __future__ import annotations

import os
import socket


def here(device: str, env: dict | None = None) -> dict:
    """This rank's host name, Slurm node name (None outside Slurm), component of a Slurm
    heterogeneous job (None outside one) and device."""
    env = os.environ if env is None else env
    return {"host": socket.gethostname(), "node": env.get("SLURMD_NODENAME"),
            "component": component(env), "device": device}


def component(env) -> int | None:
    """The hetjob component of this task: ``HETGRAD_COMPONENT`` if set, else from its global
    task id and the components' task counts, when the step spans every component in order
    (``srun --het-group=0 ... : --het-group=1 ...``); None when that cannot be told."""
    if env.get("HETGRAD_COMPONENT", "").isdigit():
        return int(env["HETGRAD_COMPONENT"])
    counts = []
    while f"SLURM_NTASKS_HET_GROUP_{len(counts)}" in env:
        counts.append(int(env[f"SLURM_NTASKS_HET_GROUP_{len(counts)}"]))
    if not counts or "SLURM_PROCID" not in env or \
            int(env.get("SLURM_STEP_NUM_TASKS", -1)) != sum(counts):
        return None
    task, first = int(env["SLURM_PROCID"]), 0
    for c, n in enumerate(counts):
        if task < first + n:
            return c
        first += n
    return None
