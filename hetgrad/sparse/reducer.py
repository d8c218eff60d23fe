"""Sparse aggregation as a :class:`~hetgrad.reducers.Reducer` of hetgrad's
``DistributedOptimizer``: it runs inside the train step, in the graph, with the dense path's
weights, finite check and timers (the gradients arrive already weighted by ``w_i``)."""
from __future__ import annotations

import math

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from ..reducers import DenseReducer, Reducer
from ..errors import InputFileError
from .exchange import (Layout, Outcome, gather_and_sum, leaders_choice, reduce_all, reduce_on,
                       union_of)
from .memory import Memory
from .select import POLICIES
from .settings import Sparsify
from .stats import StepLog


def _flat(g) -> tf.Tensor:
    return tf.reshape(tf.convert_to_tensor(g), [-1])


class SparseReducer(Reducer):
    """Top-k with error feedback for tensors of ``dense_below`` entries or more; smaller ones
    (biases) are sent whole inside the same collective (float32 ones; others through the
    dense fused allreduce). ``settings`` (or its fields as keywords):
    :class:`~hetgrad.sparse.Sparsify`. Its variables are built on the first exchange (or by
    :meth:`build`); :meth:`state_dict` holds this rank's memory and selection history. The
    density warm-up happens where something calls :meth:`set_density` each epoch
    (``hetgrad train``, ``hk.fit``, or ``hetgrad.keras.callbacks.DensityWarmup``)."""

    check_local = True   # a NaN left unsent in the memory would never reach the sum

    def __init__(self, settings: Sparsify | None = None, *, name: str = "hetgrad", **fields):
        if settings is not None and fields:
            raise ValueError("give SparseReducer a Sparsify or its fields, not both")
        self.settings = settings if settings is not None else Sparsify(**fields)
        self.name = name
        self.dense = DenseReducer(name=f"{name}.small")
        self.density = self.settings.density   # warm-up: set_density each epoch
        self.shapes: list | None = None

    def build(self, shapes) -> None:
        """Create the variables for gradients of these shapes (None: no gradient)."""
        shapes = [None if s is None else tuple(tf.TensorShape(s).as_list()) for s in shapes]
        if self.shapes is not None:
            if shapes != self.shapes:
                raise ValueError(f"the sparse exchange was built for gradients {self.shapes}, "
                                 f"got {shapes}")
            return
        s = self.settings
        sizes = [None if sh is None else math.prod(sh) for sh in shapes]
        self.sparse_ids = [i for i, n in enumerate(sizes) if n is not None and n >= s.dense_below]
        self.dense_ids = [i for i, n in enumerate(sizes) if n is not None and n < s.dense_below]
        self.layout = Layout.of([sizes[i] for i in self.sparse_ids])
        self.n_small = sum(sizes[i] for i in self.dense_ids)
        if sum(self.layout.sizes) >= 2**31:
            raise ValueError("sparsified tensors hold 2**31 entries or more (int32 indices)")
        with tf.init_scope():
            self.rank, self.size = hvd.rank(), hvd.size()
            self.memory = Memory(self.layout.sizes, s.momentum, s.mask_momentum)
            self.policy = POLICIES[s.policy](s, self.layout.sizes, self.rank, self.size)
            self.step = tf.Variable(0, dtype=tf.int32, trainable=False, name="hetgrad_sparse_step")
            self.ks = tf.Variable(tf.zeros([len(self.layout.sizes)], tf.int32), trainable=False)
            self.fresh = tf.Variable(tf.zeros_like(self.ks), trainable=False)
            self.send_all = tf.Variable(False, trainable=False)   # a dense warm-up step
            self.log = StepLog(s.log_steps)
            self.shapes = shapes
            self.set_density(self.density)

    def set_density(self, density: float) -> None:
        """Send ``density`` of each tensor from the next exchange on (DGC's warm-up)."""
        self.density = float(density)
        if self.shapes is not None:
            ks = [self.settings.k_of(n, self.density) for n in self.layout.sizes]
            self.ks.assign(ks)
            self.fresh.assign([self.settings.fresh_of(k) for k in ks])
            self.send_all.assign(self.settings.dense_at(self.density))

    def reduce(self, grads) -> list:
        self.build([None if g is None else g.shape for g in grads])
        out: list = list(grads)
        if self.settings.clip_norm is not None:
            out = self._clipped(out)
        small = [_flat(out[i]) for i in self.dense_ids]
        # the small tensors ride in the sparse exchange's collective when they can (float32)
        inside = bool(self.sparse_ids and small) and all(g.dtype == tf.float32 for g in small)
        summed = [] if inside or not small else self.dense.reduce(
            [out[i] for i in self.dense_ids])
        if self.sparse_ids:
            extra = tf.concat(small, 0) if inside else tf.zeros([0])
            dense, extra_sum = self._exchange([_flat(out[i]) for i in self.sparse_ids], extra)
            out = self._placed(out, self.sparse_ids, dense, grads)
            if inside:
                summed = tf.split(extra_sum, [int(g.shape[0]) for g in small], num=len(small))
        return self._placed(out, self.dense_ids, summed, grads)

    @staticmethod
    def _placed(out: list, ids: list[int], values, grads) -> list:
        """``out`` with ``values`` at ``ids``, each in its gradient's shape (IndexedSlices
        from the dense reducer as they are)."""
        out = list(out)
        for i, v in zip(ids, values):
            out[i] = tf.reshape(v, grads[i].shape) if isinstance(v, tf.Tensor) else v
        return out

    def _clipped(self, grads: list) -> list:
        """DGC's local clipping: this rank's share to norm ``clip_norm / sqrt(P)``."""
        present = [i for i, g in enumerate(grads) if g is not None]
        clipped, _ = tf.clip_by_global_norm([tf.convert_to_tensor(grads[i]) for i in present],
                                            self.settings.clip_norm / math.sqrt(self.size))
        out = list(grads)
        for i, g in zip(present, clipped):
            out[i] = g
        return out

    def _exchange(self, flats: list[tf.Tensor], extra: tf.Tensor) -> tuple[list, tf.Tensor]:
        """The sparsified tensors' dense aggregates, and ``extra`` (sent whole) summed."""
        step, T = self.step.read_value(), len(flats)
        accs = [self.memory.compensate(t, g) for t, g in enumerate(flats)]
        ks, fresh = tf.unstack(self.ks.read_value(), T), tf.unstack(self.fresh.read_value(), T)
        send_all = self.send_all.read_value()
        # only the combination is conditional; memory and policies are updated after it
        result = tf.cond(send_all, lambda: reduce_all(accs, extra, self.layout, self.name),
                         lambda: self._selected(accs, ks, fresh, step, extra))
        for t in range(T):
            self.memory.forget(t, result.sent[t], keep_velocity=send_all)
            self.policy.observe(t, result.union[t], result.aggregate[t], step)
        self.step.assign_add(1)
        union = tf.add_n([tf.size(u) for u in result.union])
        self.log.write(self._stats(tf.where(send_all, union, tf.add_n(ks)), union, send_all,
                                   int(extra.shape[0])))
        return result.dense, result.extra

    def _selected(self, accs: list[tf.Tensor], ks: list, fresh: list, step,
                  extra: tf.Tensor) -> Outcome:
        """A sparse step: each rank's choice per tensor, combined by the exchange."""
        idx = [self.policy.select(t, acc, ks[t], fresh[t], step) for t, acc in enumerate(accs)]
        return self._combine(idx, accs, step, extra)

    def _combine(self, idx: list[tf.Tensor], accs: list[tf.Tensor], step,
                 extra: tf.Tensor) -> Outcome:
        s, name = self.settings, f"{self.name}.sparse"
        if self._pairs():
            return gather_and_sum(idx, accs, extra, self.layout, name)
        gidx = tf.concat([i + off for i, off in zip(idx, self.layout.offsets)], 0)
        if s.policy == "leader":
            union = leaders_choice(gidx, tf.equal(step % self.size, self.rank), name)
        else:
            union = union_of(gidx, name)
        return reduce_on(union, accs, extra, self.layout, name)

    def _stats(self, k: tf.Tensor, union: tf.Tensor, dense: tf.Tensor,
               extra: int) -> list[tf.Tensor]:
        """k, |U|, and the bytes one rank sends and receives in this exchange (a ring
        allreduce moves ``2 (P-1)/P`` of its vector each way; an allgather delivers the
        other ``P-1`` ranks' parts), the biases included: ``extra`` of them ride in the
        exchange (as pairs in a sparse allgather step), the rest in a ring allreduce.
        ``dense``: the step sent everything (k = |U| = the entries) by one allreduce."""
        P, F, I = self.size, 4.0, 4.0
        ring = 2.0 * (P - 1) / P
        k, u = tf.cast(k, tf.float64), tf.cast(union, tf.float64)
        if self._pairs():   # a sparse step sends k entries and the extra ones as pairs
            sent, recv = (k + extra) * (I + F), (P - 1) * (k + extra) * (I + F)
            small = ring * (self.n_small - extra) * F
        else:
            small = ring * self.n_small * F
            if self.settings.policy == "leader":
                sent = recv = ring * k * (I + F)
            else:
                sent, recv = k * I + ring * u * F, (P - 1) * k * I + ring * u * F
        all_ring = ring * (k + self.n_small) * F   # a dense step: one allreduce of everything
        return [k, u, tf.where(dense, all_ring, sent + small),
                tf.where(dense, all_ring, recv + small)]

    def _pairs(self) -> bool:
        """Whether a sparse step exchanges (index, value) pairs by one allgather."""
        return self.settings.policy != "leader" and self.settings.exchange == "allgather"

    def take_log(self) -> list[dict]:
        """Per-exchange statistics since the last call (one host read)."""
        return self.log.take()

    def state_dict(self) -> dict[str, np.ndarray]:
        if self.shapes is None:
            return {}
        return {name: v.numpy() for name, v in self._variables().items()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Continue bit for bit from :meth:`state_dict` (call :meth:`build` first)."""
        mine = self._variables() if self.shapes is not None else {}
        if set(state) != set(mine):
            raise InputFileError(f"checkpointed sparse state has {sorted(state)}, this run's "
                                 f"sparse exchange {sorted(mine)}", field="resume")
        for name, var in mine.items():
            if state[name].ndim != len(var.shape) or (
                    var.shape.is_fully_defined() and state[name].shape != tuple(var.shape)):
                raise InputFileError(f"checkpointed {name} has shape {state[name].shape}, "
                                     f"the model needs {tuple(var.shape)}", field="resume")
            var.assign(state[name])

    def _variables(self) -> dict[str, tf.Variable]:
        return {"step": self.step, **self.memory.variables(), **self.policy.variables()}
