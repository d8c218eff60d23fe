"""User-facing errors: one exception type whose message names the bad flag, file or rank."""
from __future__ import annotations


class HetgradError(Exception):
    """A problem with the user's input or environment; printed as one line, exit code 2."""

    def __init__(self, message: str, *, flag: str | None = None):
        self.flag = flag
        super().__init__(f"{flag}: {message}" if flag else message)
