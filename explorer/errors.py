"""Errors that explorer reports to users as one line."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["SpecError", "did_you_mean"]


class SpecError(Exception):
    """A problem with user input: a study file, a search space, or a command-line value.

    The CLI prints ``str(error)`` as a single line and exits with status 2, before anything is
    written to the study's storage.

    Args:
        file: The file (or ``--option``) the problem is in.
        field: Dotted path of the offending field, or ``""`` for the whole file.
        problem: What is wrong, in a few words.
    """

    def __init__(self, *, file: str, field: str, problem: str) -> None:
        self.file = file
        self.field = field
        self.problem = " ".join(problem.split())
        where = f"{file}: {field}" if field else file
        super().__init__(f"{where}: {self.problem}")


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"; did you mean X"`` for the known name closest to ``name`` (case ignored), or ``""``."""
    by_lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1)
    return f"; did you mean {by_lower[close[0]]}" if close else ""
