"""The goodput-driven global batch as an action of the run (:mod:`hetgrad.actions`): after
each epoch (the first time inside the first, :func:`~hetgrad.goodput.split_step`), from the
noise scale (:class:`hetgrad.observe.Noise`) and the ranks'
step models (:class:`hetgrad.rebalance.Rebalancer`), :class:`~hetgrad.goodput.BatchChooser`
picks the next epoch's global batch; a new one is re-planned over the ranks at once, and the
learning rate the user set (for the starting batch) is multiplied by
:func:`~hetgrad.goodput.lr_factor` during the epochs (:class:`_ScaledRate`)."""
from __future__ import annotations

import math

from . import compat
from .actions import Action
from .compat import keras
from .errors import ConfigError
from .goodput import (BatchChoice, BatchChooser, aligned, candidates, full_tail, lr_factor,
                      split_step, thin)
from .noise import every_for
from .partition import Plan, make_plan, plan_batches
from ._keras.optimizer import set_plan


class _ScaledRate(keras.callbacks.Callback):
    """The learning rate times the factor from the first step of each epoch to its end
    (after the user's callbacks set theirs at the epoch's begin; back before theirs read it
    at its end, so a LearningRateScheduler or ReduceLROnPlateau keeps working at ``B_0``)."""

    def __init__(self, owner: "AdaptiveBatch", optimizer):
        super().__init__()
        self.owner, self.optimizer, self.base = owner, optimizer, None

    def on_train_batch_begin(self, batch, logs=None):
        if self.base is None:
            self.base = compat.learning_rate(self.optimizer)
            compat.set_learning_rate(self.optimizer, self.base * self.owner.factor)

    def on_epoch_end(self, epoch, logs=None):
        if self.restore():
            self.owner.last_lr = compat.learning_rate(self.optimizer) * self.owner.factor

    def restore(self) -> bool:
        """The user's rate back (at an epoch's end, or when it raised); whether it was scaled."""
        if self.base is None:
            return False
        compat.set_learning_rate(self.optimizer, self.base)
        self.base = None
        return True


class AdaptiveBatch(Action):
    """Choose each epoch's global batch by goodput (needs the noise scale measured); the
    factor on the learning rate, and whether the first choice was made, are kept in the
    checkpoint's state (``adaptive``). From the fit after the first choice the noise scale is
    measured in one step of up to ``then_every`` (:func:`~hetgrad.noise.every_for`; None: as
    the user set it): the first choice goes by the first few dozen steps, every one of them
    measured; later ones by whole epochs, the estimate smoothed over them."""

    def __init__(self, chooser: BatchChooser, rebalancer, lr_rule: str, verbose: int,
                 saved: dict | None = None, then_every: int | None = None):
        self.chooser, self.rebalancer, self.verbose = chooser, rebalancer, verbose
        self.then_every = then_every
        self.lr_rule = lr_rule   # one of goodput.LR_RULES
        self.factor = float((saved or {}).get("lr_factor", 1.0))
        self.chosen = bool((saved or {}).get("chosen", False))
        self.last_lr = None
        self.measured: dict[int, float] = {}   # global batch -> seconds per step (rank 0's)
        self.rate: _ScaledRate | None = None

    def callbacks(self, job):
        self.rate = _ScaledRate(self, job.optimizer)
        return [self.rate]

    def on_error(self, job):
        if self.rate is not None:   # the user's rate, not the scaled one, in what they save
            self.rate.restore()

    def on_epoch_begin(self, job, epoch):
        self._keep(job)   # in every checkpoint, also those before the first decision
        progress = job.progress
        if self.chosen and self.then_every is not None:   # (the rate of this fit's steps)
            job.aggregation.noise.every.assign(every_for(job.plan.steps_per_epoch,
                                                         self.then_every))
        if epoch == 0 and not progress.first_step and self.rebalancer.in_seconds():
            b0, lo, hi = self.chooser.b0, self.chooser.lo, self.chooser.hi
            grid = [b for b in candidates(lo, hi, b0) if b <= b0 * self.chooser.reach]
            progress.split_at = split_step(job.plan.steps_per_epoch, b0, grid)

    def _keep(self, job) -> None:
        job.checkpointer.state["adaptive"] = {"lr_factor": self.factor, "b0": self.chooser.b0,
                                              "chosen": self.chosen}

    def on_epoch_end(self, job, epoch, row):
        plan = job.plan
        row.update(global_batch=plan.global_batch, lr_factor=self.factor, lr=self.last_lr)
        b_noise, interval = _noise(row)
        balance = self.rebalancer.history[-1] if self.rebalancer.history else None
        if (b_noise is None or balance is None
                or balance.epoch != epoch + 1 or epoch + 1 == job.spec.epochs
                or (balance.warmup and balance.predicted_step_s is None)):
            return   # no estimate yet, no epoch measured (a partial one), none left, or
            #          an epoch that traced the step and no step models in seconds
        models = [m.model() for m in self.rebalancer.online]
        choice = None
        if job.rank == 0:   # (its step times and its measured ones: rank 0's alone)
            c, samples = self.chooser, plan.dataset_size - plan.dropped
            grid = sorted({b if self.rebalancer.drop_remainder   # (dropped: no step of a few)
                           else full_tail(b, samples, c.lo)      # no last step of a few
                           for b in candidates(c.lo, c.hi, plan.global_batch)})
            choice = c.choose(plan.global_batch, b_noise,
                              self._step_time(models, plan, balance, row), interval, grid=grid)
        self._apply(job, choice, models, row, f"epoch {epoch + 1}")

    def on_split(self, job, epoch, row):
        """The first choice, after ``progress.split_step`` steps of the first epoch (its
        time the probe's models' alone: the steps traced), among the batches the epoch can
        go on with (:func:`~hetgrad.goodput.aligned`); where it goes on."""
        plan, k = job.plan, job.progress.split_step
        row.update(global_batch=plan.global_batch, lr_factor=self.factor, lr=self.last_lr)
        b_noise, interval = _noise(row)
        if b_noise is None:
            return
        models = [m.model() for m in self.rebalancer.online]
        exchange_s = min(job.comm.allgather(float(row.get("wait_s", 0.0)))) / k
        choice = None
        if job.rank == 0:
            samples, drop = plan.dataset_size - plan.dropped, self.rebalancer.drop_remainder
            grid = [b for b in aligned(k * plan.global_batch, candidates(   # the batch stays:
                        self.chooser.lo, self.chooser.hi, plan.global_batch))  # no thin tail
                    if b == plan.global_batch or drop or not thin(b, samples)]
            choice = self.chooser.choose(
                plan.global_batch, b_noise,
                lambda b: _step_s(models, b, plan, self.rebalancer, exchange_s), interval,
                grid=grid)
        choice = self._apply(job, choice, models, row, f"step {k} of epoch 1", inside=True)
        if choice.changed:
            job.progress.continue_step = k * plan.global_batch // choice.batch

    def _apply(self, job, choice, models, row: dict, when: str,
               inside: bool = False) -> BatchChoice:
        """Rank 0's choice (None elsewhere: weighing the candidates is rank 0's work alone,
        and the measured step times are each rank's own clock) for all: into the row, the
        rate's factor, a re-plan if the batch changed, said on a line of its own (``inside``
        an epoch, Keras' bar, ``verbose`` 1, is mid-line); the choice, as every rank has it."""
        choice = job.comm.bcast(choice, root=0)
        self.chosen = True
        row.update(batch_next=choice.batch, efficiency=choice.efficiency,
                   goodput_predicted=choice.goodput, batch_changed=choice.changed)
        self.factor = lr_factor(choice.batch, choice.b_noise, self.chooser.b0,
                                self.lr_rule)
        self._keep(job)
        if choice.changed:
            plan = job.plan
            new = _replanned(models, choice.batch, plan, self.rebalancer)
            if job.rank == 0 and self.verbose:
                least = "" if row.get("b_noise_smoothed") else ">= "   # the interval's end
                lead = "\n" if inside and self.verbose == 1 else ""
                print(f"{lead}hetgrad: global batch {plan.global_batch} -> {choice.batch} "
                      f"after {when}: B_noise {least}{choice.b_noise:.0f}, predicted goodput "
                      f"{_gain(choice)}, "
                      f"learning rate x{self.factor:.3g}, batches {new.batches}", flush=True)
            job.progress.plan = new
            set_plan(job.optimizer, new)
        return choice

    def _step_time(self, models, plan: Plan, balance, row: dict):
        """Seconds per step at a global batch: as measured, at a batch this run has trained
        at (the epoch's wall time over its steps: everything a step costs); elsewhere the
        slowest rank's model time of the batch's equal-time plan plus the exchange (the
        slowest rank's wait), scaled by how far that prediction misses at the current batch.
        An epoch that traced the step (a process's first, unless the probe ran the step, or
        one that traced it anew) is not a measurement: the models alone."""
        now = plan.global_batch
        if not balance.warmup:
            self.measured[now] = row["time_s"] / plan.steps_per_epoch
        exchange_s = min(balance.wait_s) / plan.steps_per_epoch

        def predicted(b: int) -> float | None:
            return _step_s(models, b, plan, self.rebalancer, exchange_s)

        scale = (self.measured[now] / (predicted(now) or self.measured[now])
                 if now in self.measured else 1.0)

        def step_s(b: int) -> float | None:
            if b in self.measured:
                return self.measured[b]
            guess = predicted(b)
            return None if guess is None else guess * scale
        return step_s


def _noise(row: dict) -> tuple[float | None, tuple[float, float] | None]:
    """The noise scale to choose by and its interval (the row's ``b_noise_interval``, its
    upper end None: unbounded): the smoothed one, or -- where noise outweighed the signal's
    estimate, which leaves no point estimate -- the interval's low end, the cautious one for
    a larger batch (a smaller one must pay at the unbounded end: never)."""
    recorded, b_noise = row.get("b_noise_interval"), row.get("b_noise_smoothed")
    if b_noise is not None:   # (S <= 0 smoothed: no noise to go by)
        return (b_noise, _interval(recorded)) if b_noise > 0 else (None, None)
    interval = _interval(recorded)
    return (interval[0], interval) if interval and interval[0] > 0 else (None, None)


def _interval(recorded) -> tuple[float, float] | None:
    """The row's ``b_noise_interval`` (its upper end None: unbounded)."""
    if recorded is None:
        return None
    low, high = recorded
    return low, math.inf if high is None else high


def _gain(choice) -> str:
    """The predicted goodput gain of a move, as a percentage (the current batch may have no
    prediction: no step time in seconds there)."""
    if not choice.current_goodput:
        return "n/a"
    return f"{100 * (choice.goodput / choice.current_goodput - 1):+.0f}%"


def _replanned(models, batch: int, plan: Plan, rebalancer) -> Plan:
    return make_plan(models, batch, plan.dataset_size, min_batch=rebalancer.min_batch,
                     max_batch=rebalancer.max_batch, drop_remainder=rebalancer.drop_remainder)


def _step_s(models, batch: int, plan: Plan, rebalancer, exchange_s: float) -> float | None:
    """Predicted seconds per step at global batch ``batch``: the slowest rank's of the
    equal-time split :func:`_replanned` would give (without its shards), plus the exchange;
    None where no split fits (caps, data size)."""
    try:
        _, batches, _ = plan_batches(models, batch, plan.dataset_size,
                                     min_batch=rebalancer.min_batch,
                                     max_batch=rebalancer.max_batch)
    except ConfigError:
        return None
    return max(m.time(b) for m, b in zip(models, batches)) + exchange_s

