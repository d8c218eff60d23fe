"""The one source of ``hetgrad train``'s settings: each :class:`TrainConfig` field carries its
help, choices, range check and string parser; the CLI generates its options from them
(``hetgrad.cli``) and the library validates with the same rules (:func:`check_value`)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

from .errors import ConfigError
from .goodput import LR_RULES, check_range
from .sparse.settings import EXCHANGES, POLICIES, SPARSIFY_SETTING  # noqa: F401

MODES = ("weighted", "uneven-avg", "equal")
WEIGHTINGS = ("plan", "samples")
OPTIMIZERS = ("sgd", "adam")
DEVICES = ("cpu", "gpu", "auto")
NONFINITE_POLICIES = ("abort", "ignore")
BUILTIN_MODELS = ("mlp", "cnn", "cnn1d", "resnet", "wide-mlp", "big-mlp")   # models.MODELS

Check = Callable[[Any], "str | None"]  # the problem with a value, or None


def at_least(low: int) -> Check:
    return lambda v: None if v >= low else f"must be >= {low}, got {v}"


def positive(v) -> str | None:
    return None if math.isfinite(v) and v > 0 else f"must be a positive number, got {v}"


def non_negative(v) -> str | None:
    return None if math.isfinite(v) and v >= 0 else f"must be a number >= 0, got {v}"


def fraction(v) -> str | None:
    return None if 0.0 < v <= 1.0 else f"must be in (0, 1], got {v}"


def _split(name: str, text: str, kind: type, what: str) -> list:
    try:
        return [kind(v) for v in text.split(",")]
    except ValueError:
        raise ConfigError(f"expected comma-separated {what}, got {text!r}", field=name) from None


def floats(name: str, text: str) -> list[float]:
    """``"1,2,4"`` -> ``[1.0, 2.0, 4.0]``."""
    return _split(name, text, float, "numbers")


def ints(name: str, text: str) -> list[int]:
    """``"64,2048"`` -> ``[64, 2048]``."""
    return _split(name, text, int, "integers")


def int_or_ints(name: str, text: str) -> int | list[int]:
    """``"64"`` -> ``64`` (one value for every rank); ``"64,32"`` -> ``[64, 32]``."""
    values = _split(name, text, int, "integers")
    return values[0] if len(values) == 1 else values


def setting(default, help: str, *, choices: tuple | None = None, check: Check | None = None,
            parse: Callable[[str, str], Any] | None = None, flag: str | None = None,
            short: str | None = None):
    """A dataclass field with what the CLI and the validation need to know about it."""
    meta = dict(help=help, choices=choices, check=check, parse=parse, flag=flag, short=short)
    return field(default=default, metadata=meta)


@dataclass
class TrainConfig:
    """Everything one ``hetgrad train`` job needs; ``TrainConfig(**kwargs).check()`` validates
    what needs no TensorFlow (:func:`hetgrad.validate.check_model` imports a user's model)."""

    data: str = setting("digits", "digits (embedded), synthetic, mnist1d, a Keras-format .npz "
                        "path or a dataset directory")
    model: str = setting("mlp", "mlp | cnn | cnn1d | resnet | wide-mlp | big-mlp, or your "
                         "own: an import path module:function, called as "
                         "function(input_shape, num_classes)")
    loss: str | None = setting(None, "a Keras loss name, e.g. categorical_hinge (default: "
                               "sparse categorical cross-entropy on logits)")
    mode: str = setting("weighted", "weighted: hetgrad; uneven-avg: uneven batches with "
                        "Horovod's average; equal: Horovod's equal batches", choices=MODES)
    weighting: str = setting("plan", "weighted mode: the plan's per-step shares (exact, free) "
                             "or the samples counted in each step", choices=WEIGHTINGS)
    global_batch: int = setting(96, "global batch (sum of the ranks' batches)",
                                check=at_least(1), short="-B")
    epochs: int = setting(10, "epochs to train", check=at_least(1))
    lr: float = setting(0.05, "learning rate", check=positive)
    optimizer: str = setting("sgd", "SGD with momentum 0.9, or Adam", choices=OPTIMIZERS)
    seed: int = setting(0, "seed of weights and data order (same on every rank)")
    speeds: list[float] | None = setting(None, "skip the probe's verdict: plan for these "
                                         "per-rank speeds, e.g. 1,2,4", parse=floats)
    plan: str | None = setting(None, "use a saved plan (from `hetgrad plan`)")
    probe_file: str | None = setting(None, "reuse a saved probe (from `hetgrad probe`)")
    emulate_speeds: str | None = setting(None, "emulated per-rank speeds, e.g. 1,2,4 or "
                                         "'1,2,4;3:1,0.5,4' (from epoch 3)")
    emulate_unit: float = setting(1e-3, "emulated seconds per sample at speed 1", check=positive)
    probe_batch: int | None = setting(None, "largest batch the probe times (default: the "
                                      "global batch, capped by --max-batch)", check=at_least(1))
    probe_sizes: int = setting(3, "batch sizes the probe times, geometric from B/(4P) up to "
                               "--probe-batch", check=at_least(1))
    probe_steps: int = setting(8, "timed probe steps (after 3 warm-up steps)", check=at_least(1))
    probe_refine: int = setting(0, "rounds of timing every rank at its planned batch, all "
                                "in lockstep, to correct its model there (0: none)",
                                check=at_least(0))
    probe_timeout: float = setting(300.0, "seconds rank 0 waits for every rank's probe before "
                                   "naming the missing ones", check=positive)
    min_batch: int = setting(1, "smallest per-rank batch", check=at_least(1))
    max_batch: int | list[int] | None = setting(None, "per-rank batch cap: one int or one per "
                                                "rank", parse=int_or_ints)
    drop_remainder: bool = setting(False, "leave out each epoch's last N mod B samples "
                                   "(reported) instead of a smaller final step")
    sparsify: str | None = setting(None, "send only top-k gradient entries, chosen by this "
                                   "policy", choices=tuple(POLICIES))
    density: float = setting(0.01, "fraction of each tensor's entries sent", check=fraction)
    exchange: str = setting("union", "how sparse entries are combined", choices=EXCHANGES)
    dense_below: int = setting(1024, "tensors with fewer entries stay dense", check=at_least(0))
    momentum_correction: bool = setting(False, "sparse SGD: run its momentum (0.9) in the "
                                        "error-feedback memory, cleared where sent (DGC)")
    momentum_unmasked: bool = setting(False, "momentum correction: keep the velocity where "
                                      "sent (DGC's momentum factor masking clears it)")
    density_warmup: int = setting(0, "sparse: epochs over which the density falls "
                                  "geometrically from dense to --density (DGC)",
                                  check=at_least(0))
    dense_above: float = setting(0.05, "sparse warm-up: an epoch at this density or more "
                                 "exchanges every entry by one dense allreduce (1: never)",
                                 check=fraction)
    fresh: float = setting(0.1, "sticky: share of each tensor's k chosen fresh by local "
                           "magnitude (the rest kept from the last union)", check=fraction)
    local_clip: float | None = setting(None, "sparse: clip each rank's gradient share to "
                                       "this norm / sqrt(ranks) before error feedback (DGC)",
                                       check=positive)
    rebalance: bool = setting(False, "re-plan between epochs from each rank's measured busy "
                              "time")
    rebalance_threshold: float = setting(0.03, "re-plan when the new plan's predicted epoch "
                                         "time is shorter by more than this fraction (and "
                                         "than the measured noise)", check=non_negative)
    steps_per_execution: int = setting(1, "train steps per call into the TF graph (Keras' "
                                       "steps_per_execution): less Python per step; callbacks "
                                       "and --step-timeout see one call", check=at_least(1))
    step_timeout: float = setting(600.0, "seconds a training step may take before every "
                                  "rank is ended (a stuck or dead rank)", check=positive)
    on_nonfinite: str = setting("abort", "NaN/Inf in a rank's local gradients: end the job "
                                "naming the rank, or go on", choices=NONFINITE_POLICIES)
    checkpoint_dir: str | None = setting(None, "rank 0 saves checkpoints here")
    checkpoint_every: int = setting(1, "epochs between checkpoints", check=at_least(1))
    overwrite: bool = setting(False, "let --checkpoint-dir replace an earlier run's "
                              "checkpoints (without it such a directory is refused)")
    resume: str | None = setting(None, "continue from this checkpoint dir")
    threads: int = setting(1, "TF compute (intra-op) threads per rank; inter-op gets "
                           "max(2, threads)", check=at_least(1))
    device: str = setting("cpu", "where each rank computes", choices=DEVICES)
    out: str = setting("run.json", "JSON record (written by rank 0)")
    tensorboard: str | None = setting(None, "rank 0 writes every epoch's TensorBoard scalars, "
                                      "the run's and each rank's, in a new run dir here")
    timeline: str | None = setting(None, "rank 0 writes each rank's compute and exchange spans "
                                   "of sampled steps here (Chrome trace JSON)")
    gns: bool = setting(False, "record the gradient noise scale B_noise each epoch")
    gns_every: int | None = setting(None, "measure every N-th step (4; adaptive: 1, then "
                                    "<= 4 after its first choice)", check=at_least(1))
    adaptive_batch: bool = setting(False, "choose each epoch's global batch by goodput (from "
                                   "B_noise and the step models), scaling the learning rate")
    batch_range: list[int] | None = setting(None, "LO,HI of the adaptive batch (B..16 B)", parse=ints)
    lr_rule: str | None = setting(None, "how the rate follows the adaptive batch (default: "
                                  "gain for SGD, else sqrt-batch)", choices=LR_RULES)
    timeline_steps: int = setting(100, "timeline: every step of the first N", check=at_least(0))
    timeline_window: int = setting(10, "timeline: then N steps mid-epoch (in every 2nd, 4th.. "
                                   "epoch of a long run)", check=at_least(0))
    quiet: bool = setting(False, "no progress lines")

    def check(self) -> None:
        """Every field's own rule, then the rules that tie fields together."""
        for f in fields(self):
            check_value(f.name, getattr(self, f.name))
        if self.rebalance and self.mode != "weighted":
            raise ConfigError("rebalancing needs mode 'weighted' (the baselines keep their "
                              "batches)", field="rebalance")
        if self.sparsify is not None and self.mode != "weighted":
            raise ConfigError("sparsification runs with mode 'weighted' only", field="sparsify")
        self._check_sparse()
        if self.adaptive_batch:
            check_range(self.batch_range or self.default_range(), self.global_batch)
        if self.resume and not (Path(self.resume) / "state.json").is_file():
            raise ConfigError(f"no checkpoint in {self.resume} (state.json missing)",
                              field="resume")
        if ":" not in self.model and self.model not in BUILTIN_MODELS:
            raise ConfigError(unknown_model(self.model), field="model")

    def _check_sparse(self) -> None:
        if self.momentum_correction and self.optimizer != "sgd":
            raise ConfigError("momentum correction is for SGD's momentum; --optimizer is "
                              f"{self.optimizer}", field="momentum_correction")
        if self.sparsify is not None:
            self.sparse_settings()   # its own checks (e.g. leader with exchange allgather)

    def sparse_settings(self, log_steps: int = 4096):
        """The :class:`~hetgrad.sparse.Sparsify` of ``--sparsify`` and its options."""
        from .sparse.settings import Sparsify
        return Sparsify.of_settings(self, log_steps)

    def default_range(self) -> list[int]:
        """``--batch-range`` when not given: the global batch to 16 times it."""
        return [self.global_batch, 16 * self.global_batch]

    def emulation_spec(self) -> str | None:
        """What a probe of this job is timed under (None: real speeds; a saved probe of
        other speeds is never used)."""
        return f"{self.emulate_speeds}@{self.emulate_unit:g}" if self.emulate_speeds else None

    @property
    def planned_by_probe(self) -> bool:
        """Whether the plan comes from the probe (no plan file, given speeds or mode equal)."""
        return not (self.plan or self.speeds or self.mode == "equal")

    def to_dict(self) -> dict:
        return asdict(self)


SETTINGS = {f.name: f for f in fields(TrainConfig)}


def unknown_model(name: str) -> str:
    return (f"unknown model {name!r}; choose from {sorted(BUILTIN_MODELS)} or give an import "
            "path module:function")


def check_value(name: str, value) -> None:
    """Apply the rule of setting ``name`` to ``value`` (None passes: 'not given')."""
    meta = SETTINGS[name].metadata
    if value is None:
        return
    if meta["choices"] is not None and value not in meta["choices"]:
        raise ConfigError(f"unknown {name.replace('_', ' ')} {value!r}; choose from "
                          f"{', '.join(meta['choices'])}", field=name)
    problem = meta["check"](value) if meta["check"] else None
    if problem:
        raise ConfigError(problem, field=name)


def parse_settings(values: dict) -> dict:
    """``values`` with each text given for a list-valued setting parsed (``"1,2"`` -> list)."""
    out = dict(values)
    for name, value in values.items():
        parse = SETTINGS[name].metadata["parse"]
        if parse is not None and isinstance(value, str):
            out[name] = parse(name, value)
    return out
