"""Per-exchange statistics kept in the graph and read by the host once per epoch."""
from __future__ import annotations

import tensorflow as tf

FIELDS = ("k", "union", "bytes_sent", "bytes_received")


class StepLog:
    """A ring of the last ``capacity`` exchanges' :data:`FIELDS`, written by the train step
    (no host round trip); :meth:`take` reads and clears it."""

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self.rows = tf.Variable(tf.zeros([self.capacity, len(FIELDS)], tf.float64),
                                trainable=False, name="hetgrad_sparse_log")
        self.count = tf.Variable(0, dtype=tf.int64, trainable=False,
                                 name="hetgrad_sparse_log_count")

    def write(self, values: list[tf.Tensor]) -> None:
        slot = tf.math.floormod(self.count.read_value(), self.capacity)
        self.rows.scatter_nd_update([[slot]], [tf.stack(values)])
        self.count.assign_add(1)

    def take(self) -> list[dict]:
        """The exchanges since the last call, oldest first (only the last ``capacity``)."""
        n, rows = int(self.count.numpy()), self.rows.numpy()
        self.count.assign(0)
        kept = min(n, self.capacity)
        order = [(n - kept + j) % self.capacity for j in range(kept)]
        out = []
        for i in order:
            row = dict(zip(FIELDS, (float(v) for v in rows[i])))
            row["k"], row["union"] = int(row["k"]), int(row["union"])
            row["buildup"] = row["union"] / row["k"]
            out.append(row)
        return out
