"""Typed errors of the library. Each names the setting it is about by its ``TrainConfig``
field (``field="global_batch"``); only the command line turns that into a flag
(``--global-batch``), so the library never knows its own CLI."""
from __future__ import annotations


class HetgradError(Exception):
    """A problem with the user's input or environment; the CLI prints it as one line, exit 2.

    ``field`` is the setting (or file argument) at fault, or None; ``message`` the text alone.
    ``reported_elsewhere``: another rank raises the error that names the cause (this rank
    only learned of it), so the CLI lets that rank speak first.
    """

    reported_elsewhere = False

    def __init__(self, message: str, *, field: str | None = None):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)

    def render(self, flags: dict[str, str] | None = None) -> str:
        """The message with ``field`` shown as its flag (``flags[field]``, else ``--field``)."""
        if self.field is None:
            return self.message
        flag = (flags or {}).get(self.field) or "--" + self.field.replace("_", "-")
        return f"{flag}: {self.message}"


class ConfigError(HetgradError):
    """A setting out of range, of the wrong kind, or in a combination that does nothing."""


class InputFileError(HetgradError):
    """A file the user named (data, plan, probe, checkpoint) that cannot be used."""


class NonFiniteGradientError(HetgradError):
    """NaN or Inf in the gradients of a step; ``culprits``: the ranks whose local gradients
    held it (empty: their sum overflowed). Raised on every rank."""

    def __init__(self, message: str, *, culprits: list[int], rank: int,
                 field: str | None = None):
        self.culprits = list(culprits)
        self.reported_elsewhere = bool(culprits) and rank not in culprits
        super().__init__(message, field=field)


class PeerTimeoutError(HetgradError):
    """Other ranks did not report in time; ``ranks`` lists them. Raised on rank 0 alone while
    the others still wait: a caller must end the job (re-raise, or abort), not go on."""

    def __init__(self, message: str, *, ranks: list[int], field: str | None = None):
        self.ranks = list(ranks)
        super().__init__(message, field=field)


class AgreedError(HetgradError):
    """An error every rank knows (validation, agreed by :func:`hetgrad.runtime.agree`):
    rank 0 prints it once and every rank exits (under mpirun: rank 0 aborts, which is faster;
    :func:`hetgrad.runtime.fail_fast`). ``ranks``: where it was found (all of them, or some
    when e.g. a file is missing on some nodes)."""

    def __init__(self, message: str, *, field: str | None, ranks: list[int], size: int):
        self.ranks = list(ranks)
        if len(ranks) < size:
            message += f" (found on rank(s) {ranks} of {size})"
        super().__init__(message, field=field)


class Interrupted(HetgradError):
    """The rank got SIGINT or SIGTERM (Ctrl-C, ``scancel``, a launcher passing it on); exit
    code ``128 + signal`` as a shell reports it."""

    def __init__(self, signum: int):
        import signal
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name}; the last checkpoint "
                         "(--checkpoint-dir) resumes the run with --resume")
