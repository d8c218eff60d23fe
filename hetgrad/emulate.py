"""Emulated heterogeneity on one machine: a rank of speed ``s`` sleeps ``n * unit / s`` seconds
inside every train step of ``n`` samples, so slow ranks are really slow and the probe measures
it (it never reads the flag).

A schedule changes speeds at epoch boundaries: ``"1,2,4"`` (fixed) or
``"1,2,4;3:1,0.5,4"`` (from epoch 3 on, rank 1 runs at 0.5).
"""
from __future__ import annotations

import math
import time

import numpy as np
import tensorflow as tf

from .errors import HetgradError


def parse_schedule(spec: str, world_size: int, flag: str = "--emulate-speeds") -> dict[int, list[float]]:
    """``"1,2,4;3:1,0.5,4"`` -> ``{0: [1, 2, 4], 3: [1, 0.5, 4]}``, checked for ``world_size``."""
    out: dict[int, list[float]] = {}
    for i, part in enumerate(p.strip() for p in spec.split(";")):
        epoch_s, _, speeds_s = part.rpartition(":")
        try:
            epoch = int(epoch_s) if epoch_s else 0
            speeds = [float(v) for v in speeds_s.split(",")]
        except ValueError:
            raise HetgradError(f"cannot parse {part!r}; expected e.g. 1,2,4 or 3:1,0.5,4",
                               flag=flag) from None
        if i == 0 and epoch != 0:
            raise HetgradError("the first entry applies from epoch 0; give it without 'E:'", flag=flag)
        if len(speeds) != world_size:
            raise HetgradError(f"{len(speeds)} speeds given for {world_size} ranks", flag=flag)
        for r, s in enumerate(speeds):
            if not math.isfinite(s) or s <= 0:
                raise HetgradError(f"speed of rank {r} is {s}; must be finite and > 0", flag=flag)
        out[epoch] = speeds
    return out


def speed_at(schedule: dict[int, list[float]], epoch: int, rank: int) -> float:
    """The emulated speed of ``rank`` during ``epoch``."""
    start = max(e for e in schedule if e <= epoch)
    return schedule[start][rank]


def _sleep(seconds: np.ndarray) -> np.ndarray:
    time.sleep(float(seconds))
    return np.float32(seconds)


class SpeedEmulator:
    """Adds ``n * unit / speed`` seconds of sleep to a model's train step."""

    def __init__(self, speed: float, unit_s: float = 1e-3):
        self.unit_s = float(unit_s)
        self.speed = tf.Variable(float(speed), dtype=tf.float32, trainable=False,
                                 name="hetgrad_emulated_speed")

    def set_speed(self, speed: float) -> None:
        self.speed.assign(float(speed))

    def wrap(self, model: tf.keras.Model) -> None:
        inner = model.train_step

        def train_step(data):
            x = data[0] if isinstance(data, (tuple, list)) else data
            n = tf.cast(tf.shape(tf.nest.flatten(x)[0])[0], tf.float32)
            slept = tf.numpy_function(_sleep, [n * self.unit_s / self.speed], tf.float32,
                                      stateful=True)
            with tf.control_dependencies([slept]):
                return inner(data)

        model.train_step = train_step
        model.train_function = None
