"""Errors that explorer reports to users as one line."""

from __future__ import annotations

__all__ = ["SpecError"]


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
