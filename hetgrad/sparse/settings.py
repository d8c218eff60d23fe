"""What a sparse exchange is asked to do: :class:`Sparsify`, checked once, used everywhere."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..errors import ConfigError

POLICIES = ("topk", "recent", "sticky", "leader")
EXCHANGES = ("allgather", "union")


@dataclass(frozen=True)
class Sparsify:
    """Top-k sparsification with error feedback, per tensor of ``dense_below`` entries or more.

    ``policy``: which entries a rank offers -- ``topk`` (largest magnitudes), ``recent``
    (magnitude x ``boost`` for entries in a global union of the last ``window`` exchanges),
    ``sticky`` (the ``1 - fresh`` share of k from the last union, ranked by the last *aggregated*
    magnitude, which every rank knows alike, so they all keep the same entries; the rest fresh
    by local magnitude), ``leader`` (a rotating rank chooses for everyone: ``|U| = k``).
    ``exchange``: ``allgather`` (every rank's values and indices) or ``union`` (agree on the
    union ``U`` of the indices, then one allreduce of every rank's values on ``U``).
    DGC's accuracy tricks: ``momentum`` (momentum correction: the optimizer's SGD momentum is
    kept in the error-feedback memory instead; use the optimizer without momentum),
    ``mask_momentum`` (clear that momentum where sent), ``clip_norm`` (clip each rank's share
    of the gradient to ``clip_norm / sqrt(P)`` before it enters the memory), ``warmup_epochs``
    (density rises geometrically from dense to ``density`` over these epochs).
    ``dense_above``: a warm-up density at or above it (and above ``density``) is exchanged
    whole, by one dense allreduce: near the start of a warm-up the union of P ranks' top-k is
    most of the model, and selecting and sending it costs more than the dense allreduce (1 turns
    it off). A dense step empties the memory and keeps the velocity (it is then plain momentum
    SGD; masking exists for entries whose sending is delayed).
    Tensors of ``sample_above`` entries or more are selected through DGC's sampled threshold
    (exact top-k of the entries above it; a full top-k when too few are)."""

    policy: str = "topk"
    density: float = 0.01
    exchange: str = "union"
    dense_below: int = 1024
    momentum: float = 0.0
    mask_momentum: bool = True
    clip_norm: float | None = None
    warmup_epochs: int = 0
    dense_above: float = 0.05
    window: int = 5
    boost: float = 2.0
    fresh: float = 0.1
    sample_above: int = 200_000
    log_steps: int = 4096

    def __post_init__(self):
        for field, problem in self._problems():
            if problem:
                raise ConfigError(problem, field=field)

    def _problems(self) -> list[tuple[str, str | bool]]:
        """(field, what is wrong or False) for every rule, by this class's own field names
        (``hetgrad train`` shows them as its flags: :data:`SPARSIFY_SETTING`)."""
        clip = self.clip_norm
        return [
            ("policy", self.policy not in POLICIES and
             f"unknown policy {self.policy!r}; choose from {', '.join(POLICIES)}"),
            ("exchange", self.exchange not in EXCHANGES and
             f"unknown exchange {self.exchange!r}; choose from {', '.join(EXCHANGES)}"),
            ("exchange", self.policy == "leader" and self.exchange != "union" and
             "policy leader reduces on the leader's indices: use exchange union"),
            ("density", not 0.0 < self.density <= 1.0 and
             f"must be in (0, 1], got {self.density}"),
            ("dense_below", self.dense_below < 0 and f"must be >= 0, got {self.dense_below}"),
            ("momentum", not 0.0 <= self.momentum < 1.0 and
             f"momentum must be in [0, 1), got {self.momentum}"),
            ("clip_norm", clip is not None and not (math.isfinite(clip) and clip > 0) and
             f"must be a positive number, got {clip}"),
            ("warmup_epochs", self.warmup_epochs < 0 and
             f"must be >= 0, got {self.warmup_epochs}"),
            ("fresh", not 0.0 <= self.fresh <= 1.0 and f"must be in [0, 1], got {self.fresh}"),
            ("dense_above", not 0.0 < self.dense_above <= 1.0 and
             f"must be in (0, 1], got {self.dense_above}"),
            ("log_steps", self.log_steps < 1 and f"must be >= 1, got {self.log_steps}"),
        ]

    def density_at(self, epoch: int) -> float:
        """DGC's warm-up: ``density ** ((epoch + 1) / (warmup_epochs + 1))`` during the
        warm-up epochs (e.g. 1 %, 3 epochs: 32 %, 10 %, 3.2 %), then ``density``."""
        if epoch >= self.warmup_epochs:
            return self.density
        return self.density ** ((epoch + 1) / (self.warmup_epochs + 1))

    def dense_at(self, density: float) -> bool:
        """Whether a step at ``density`` (a warm-up one: above the target) goes dense."""
        return self.density < density and density >= self.dense_above

    def dense_warmup(self) -> bool:
        """Whether some steps send every entry of the mean gradient itself: warm-up epochs at
        a density of at least ``dense_above``, no momentum, no clipping (where the gradient
        noise scale is measured, :mod:`hetgrad.noise`)."""
        return (self.warmup_epochs > 0 and self.dense_above < 1.0
                and self.density_at(0) >= self.dense_above
                and self.momentum == 0.0 and self.clip_norm is None)

    def k_of(self, size: int, density: float | None = None) -> int:
        """Entries a tensor of ``size`` entries sends: ``ceil(density x size)``, at least 1."""
        d = self.density if density is None else density
        return max(1, min(size, math.ceil(d * size - 1e-9)))

    def fresh_of(self, k: int) -> int:
        """``sticky``: how many of a tensor's k entries are chosen fresh (at least one)."""
        return min(k, max(1, math.floor(self.fresh * k)))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def of_settings(cls, cfg, log_steps: int = 4096) -> "Sparsify":
        """The sparsification of ``hetgrad train``'s settings ``cfg``
        (:class:`hetgrad.config.TrainConfig`), its errors named by those settings."""
        try:
            return cls(policy=cfg.sparsify, density=cfg.density, exchange=cfg.exchange,
                       dense_below=cfg.dense_below,
                       momentum=0.9 if cfg.momentum_correction else 0.0,
                       mask_momentum=not cfg.momentum_unmasked, clip_norm=cfg.local_clip,
                       warmup_epochs=cfg.density_warmup, dense_above=cfg.dense_above,
                       fresh=cfg.fresh, log_steps=log_steps)
        except ConfigError as exc:
            raise ConfigError(exc.message, field=SPARSIFY_SETTING.get(exc.field, exc.field)) \
                from None


# Sparsify's fields that ``hetgrad train``'s settings name otherwise
SPARSIFY_SETTING = {"policy": "sparsify", "momentum": "momentum_correction",
                    "mask_momentum": "momentum_unmasked", "clip_norm": "local_clip",
                    "warmup_epochs": "density_warmup"}
