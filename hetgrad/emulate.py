"""Emulated heterogeneity on one machine: a rank of speed ``s`` sleeps ``n * unit / s`` seconds
in every train step of ``n`` samples, so slow ranks are really slow and the probe measures
it (it never reads the setting).

A schedule changes speeds at epoch boundaries: ``"1,2,4"`` (fixed) or
``"1,2,4;3:1,0.5,4"`` (from epoch 3 on, rank 1 runs at 0.5).
"""
from __future__ import annotations

import math
import os
import time

from typing import Callable

from .errors import ConfigError


def parse_schedule(spec: str, world_size: int, field: str = "emulate_speeds") -> dict[int, list[float]]:
    """``"1,2,4;3:1,0.5,4"`` -> ``{0: [1, 2, 4], 3: [1, 0.5, 4]}``, checked for ``world_size``."""
    out: dict[int, list[float]] = {}
    for i, part in enumerate(p.strip() for p in spec.split(";")):
        epoch_s, _, speeds_s = part.rpartition(":")
        try:
            epoch = int(epoch_s) if epoch_s else 0
            speeds = [float(v) for v in speeds_s.split(",")]
        except ValueError:
            raise ConfigError(f"cannot parse {part!r}; expected e.g. 1,2,4 or 3:1,0.5,4",
                              field=field) from None
        if i == 0 and epoch != 0:
            raise ConfigError("the first entry applies from epoch 0; give it without 'E:'", field=field)
        if len(speeds) != world_size:
            raise ConfigError(f"{len(speeds)} speeds given for {world_size} ranks", field=field)
        for r, s in enumerate(speeds):
            if not math.isfinite(s) or s <= 0:
                raise ConfigError(f"speed of rank {r} is {s}; must be finite and > 0", field=field)
        out[epoch] = speeds
    return out


ENV_SPEEDS, ENV_UNIT = "HETGRAD_EMULATE_SPEEDS", "HETGRAD_EMULATE_UNIT"


def from_env(world_size: int) -> tuple[dict[int, list[float]], float] | None:
    """The schedule and unit of ``HETGRAD_EMULATE_SPEEDS`` / ``HETGRAD_EMULATE_UNIT`` (a
    testing aid: ``hk.probe`` and ``hk.fit`` then emulate heterogeneity), or None."""
    spec = os.environ.get(ENV_SPEEDS)
    if not spec:
        return None
    text = os.environ.get(ENV_UNIT, "1e-3")
    try:
        unit = float(text)
    except ValueError:
        unit = -1.0
    if not math.isfinite(unit) or unit <= 0:
        raise ConfigError(f"must be a positive number of seconds, got {text!r}", field=ENV_UNIT)
    return parse_schedule(spec, world_size, field=ENV_SPEEDS), unit


def speed_at(schedule: dict[int, list[float]], epoch: int, rank: int) -> float:
    """The emulated speed of ``rank`` during ``epoch``."""
    start = max(e for e in schedule if e <= epoch)
    return schedule[start][rank]


class SpeedEmulator:
    """Sleeps ``n * unit / speed`` seconds before every train step of ``n`` samples.

    The sleep happens in Python right before the step (a sleep inside the TF graph via
    ``numpy_function`` was measured to overshoot by up to 2x), so it is exact and costs no CPU.
    With ``steps_per_execution`` N it sleeps once per call for all N steps, so ranks sleep
    their steps' compute in one piece before N exchanges rather than before each.
    """

    def __init__(self, speed: float, unit_s: float = 1e-3):
        self.unit_s = float(unit_s)
        self.speed = float(speed)

    def set_speed(self, speed: float) -> None:
        self.speed = float(speed)

    def pause(self, n: int) -> None:
        time.sleep(n * self.unit_s / self.speed)

    def callback(self, batch_size: Callable[[int], int]):
        """Keras callback pausing before each call into the train step for the samples of
        the steps it runs (step ``i`` has ``batch_size(i)``): one step, or the model's
        ``steps_per_execution``, the last call of an epoch maybe fewer."""
        from . import compat
        from .compat import keras
        emulator = self

        class Emulate(keras.callbacks.Callback):
            per_call, steps = 1, None

            def on_epoch_begin(self, epoch, logs=None):  # per epoch, not in every step
                self.per_call = compat.steps_per_execution(self.model)
                self.steps = (self.params or {}).get("steps")

            def on_train_batch_begin(self, batch, logs=None):
                end = min(batch + self.per_call, self.steps or batch + self.per_call)
                emulator.pause(sum(batch_size(i) for i in range(batch, end)))

        return Emulate()
