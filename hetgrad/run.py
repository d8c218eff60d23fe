"""One training run as :func:`hetgrad.assembly.assemble` builds it: :class:`RunSpec` is what
a front end (``hetgrad train``, ``hk.fit``) asks for, checked; :class:`Run` the assembled run
the epoch loop (:mod:`hetgrad.loop`) and its actions (:mod:`hetgrad.actions`) work on -- built
whole, never changed -- with :class:`Progress`, the little that changes as it trains."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    import tensorflow as tf

    from .checkpoint import Checkpointer
    from .data.sources import Source
    from .partition import Plan


@dataclass(frozen=True)
class ProbeSpec:
    """How to measure every rank (:func:`hetgrad._keras.probing.probe`) -- only where the plan
    needs it unless ``always`` -- or the saved ``results`` of an earlier probe to use
    instead."""

    steps: int = 8
    warmup: int = 3
    sizes: int = 3                       # batch sizes timed, geometric up to ``top``
    top: int | None = None               # largest batch timed (default: the global batch)
    refine: int = 0                      # rounds at the planned batches
    timeout: float = 300.0
    results: tuple = ()                  # saved ProbeResults: no timing
    always: bool = False                 # time even when the plan is given (for the record)
    tag: str | None = None               # what the timing ran under (emulated speeds)
    verbose: bool = False


@dataclass(frozen=True)
class RunSpec:
    """Everything one run needs, checked by its front end. ``model`` is compiled with the
    user's optimizer (hetgrad wraps it, or keeps it if it is hetgrad's already); the plan is
    ``plan``, else from ``speeds``, else from the probe. ``weight``: ``"plan"``, ``"samples"``
    or ``"average"`` (Horovod's plain average ``1/P``, the baselines). ``identity``: the
    settings a resumed run must share with its checkpoint, by the names the user typed."""

    model: Any
    data: "Source"
    global_batch: int
    epochs: int
    seed: int = 0
    plan: "Plan | None" = None
    speeds: Sequence[float] | None = None
    probe: ProbeSpec = ProbeSpec()
    min_batch: int = 1
    max_batch: int | Sequence[int] | None = None
    drop_remainder: bool = False
    weight: str = "plan"
    sparsify: Any = None
    check_finite: bool = True
    rebalance_threshold: float | None = None   # None: measure the balance, never re-plan
    checkpoint_dir: str | None = None
    checkpoint_every: int = 1
    resume: bool = False
    identity: dict = field(default_factory=dict)
    emulation: tuple | None = None             # (schedule, seconds per sample)
    test: "Source | None" = None               # scored by rank 0 after every epoch
    validation: Any = None                     # model.fit's validation_data, every rank
    callbacks: Sequence = ()                   # the user's Keras callbacks
    verbose: int = 2
    step_timeout: float | None = None
    device: str = ""
    tensorboard: str | None = None             # rank 0 writes TensorBoard scalars here
    timeline: str | None = None                # rank 0 writes the step timeline here
    timeline_steps: int = 100                  # every step of the first ones, then
    timeline_window: int = 10                  # a window of steps per epoch
    gns: bool = False                          # measure the gradient noise scale
    gns_every: int | None = None               # in every N-th step (4; adaptive: 1, then <= 4)
    adaptive_batch: tuple[int, int] | None = None   # choose the global batch in this range
    lr_rule: str | None = None                 # how the rate follows it (goodput.LR_RULES;
                                               # given with adaptive_batch)


@dataclass
class Progress:
    """What changes while a run trains: the plan in effect (a re-plan replaces it), the
    epochs done (their record rows), the sparse exchange's per-step log, the step the epoch
    in progress started at (not 0 when resumed mid-epoch), and whether the ranks agreed to
    stop (:mod:`hetgrad.preempt`) -- with ``stopped_at_step`` the step of the epoch where
    they did, 0 at its end. An action may split an epoch to decide inside it
    (:meth:`hetgrad.actions.Action.on_split`): it sets ``split_at`` (the step its fit ends
    at), the fit ``split_step`` when it got there; ``continue_step``: where the epoch goes on,
    under the plan then in effect (the action's re-plan may move it); ``continued``: the fit
    in progress is such an epoch's rest; ``shift``: what :meth:`counted` adds to the plan's
    step numbers in the rest (also resumed in it: kept in the checkpoint)."""

    plan: "Plan"
    epochs: list[dict] = field(default_factory=list)
    sparse_steps: list[dict] = field(default_factory=list)
    first_step: int = 0
    stop_requested: bool = False
    stopped_at_step: int = 0
    split_at: int = 0
    split_step: int = 0
    continue_step: int = 0
    continued: bool = False
    shift: int = 0

    def go_on(self) -> int:
        """A split epoch's rest follows: where it starts, its steps counted on from the first
        fit's last."""
        self.continued, self.shift = True, self.split_step - self.continue_step
        return self.continue_step

    def counted(self, steps: int) -> tuple[int, int]:
        """The fit's first step and the epoch's steps (``steps`` under the plan in effect) as
        the user's callbacks and the timeline count them: a split epoch's rest, which runs
        on in the new plan's steps from ``continue_step``, is counted on from the first
        fit's last step (``shift`` = that minus ``continue_step``)."""
        return self.first_step + self.shift, steps + self.shift


@dataclass(frozen=True)
class Run:
    """An assembled run: what the loop and the actions read. ``start_epoch``, ``start_step``:
    epochs done before (resumed) and steps done of the next; ``probe``: every rank's step
    model (empty with a given plan)."""

    spec: RunSpec
    comm: Any
    model: Any
    optimizer: Any
    checkpointer: "Checkpointer"
    actions: tuple
    progress: Progress
    first_plan: "Plan"
    probe: tuple = ()
    probe_time_s: float = 0.0
    start_epoch: int = 0
    device: str = ""
    start_step: int = 0

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def size(self) -> int:
        return self.comm.size

    @property
    def plan(self) -> "Plan":
        return self.progress.plan

    @property
    def aggregation(self):
        return self.optimizer.hetgrad

    @property
    def reducer(self):
        return self.aggregation.reducer

    def batches(self, epoch: int, first_step: int = 0) -> "tf.data.Dataset":
        """This rank's batches of ``epoch`` from ``first_step`` under the plan in effect."""
        from .data.reader import rank_batches
        return rank_batches(self.spec.data, self.plan, self.rank, self.spec.seed, epoch,
                            first_step)
