"""Per-rank busy and wait time of a synchronous step, measured inside the training graph.

A step on rank ``i`` is *busy* (load data, forward, backward: its own speed) and then *waits*
in the gradient exchange for the slowest rank. Two ``tf.timestamp`` ops split the two, so the
measurement costs no extra step; :mod:`hetgrad.rebalance` turns it into speeds.
"""
from __future__ import annotations

import time

import tensorflow as tf


class StepTimer:
    """Per-rank busy and wait seconds, accumulated by the train step itself.

    busy: from the end of the previous exchange to this rank's local gradients being ready;
    wait: from then to the end of this step's exchange (idle time + communication).
    Call :meth:`start` when an epoch begins and :meth:`read` when it ends; :meth:`span` gives
    the last step's own three times (for the timeline, :mod:`hetgrad.timeline`).
    """

    def __init__(self):
        var = lambda name: tf.Variable(0.0, dtype=tf.float64, trainable=False,  # noqa: E731
                                       name=f"hetgrad_{name}")
        self.busy, self.wait, self.last_done = var("busy_s"), var("wait_s"), var("last_done")
        self.step_start, self.step_ready = var("step_start"), var("step_ready")

    def start(self) -> None:
        self.busy.assign(0.0)
        self.wait.assign(0.0)
        self.last_done.assign(time.time())  # tf.timestamp() counts from the same Unix epoch

    def ready(self, grads):
        """In the graph, once the local gradients exist: count busy time, return the time."""
        deps = [t for t in tf.nest.flatten(grads, expand_composites=True) if t is not None]
        with tf.control_dependencies(deps):
            now = tf.timestamp()
        self.busy.assign_add(now - self.last_done)
        self.step_start.assign(self.last_done)
        self.step_ready.assign(now)
        return now

    def done(self, t_ready, reduced) -> None:
        """In the graph, once the exchanged gradients exist: count wait time."""
        deps = [t for t in tf.nest.flatten(reduced, expand_composites=True) if t is not None]
        with tf.control_dependencies(deps):
            now = tf.timestamp()
        self.wait.assign_add(now - t_ready)
        self.last_done.assign(now)

    def read(self) -> tuple[float, float]:
        return float(self.busy.numpy()), float(self.wait.numpy())

    def span(self) -> tuple[float, float, float]:
        """The last step's start (the exchange before it ended), local gradients ready and
        exchange done, in Unix seconds."""
        return (float(self.step_start.numpy()), float(self.step_ready.numpy()),
                float(self.last_done.numpy()))
