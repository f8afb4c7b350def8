"""What explorer tells users when something goes wrong: a bad input as one line
(:class:`SpecError`), a crash with no secret in it (:func:`crash_text`), and a library's log
record as one masked line (:func:`library_log_lines`)."""

from __future__ import annotations

import difflib
import logging
import sys
import traceback
from collections.abc import Iterable, Iterator

__all__ = ["SpecError", "crash_text", "did_you_mean", "library_log_lines", "run_error_line", "storage_error"]

_STORAGE_MODULES = ("sqlalchemy", "psycopg", "psycopg2", "pymysql", "sqlite3")
"""Packages whose exceptions mean the storage failed (its driver, or SQLAlchemy above it)."""


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


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling."""
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen:
        seen.add(id(at))
        yield at
        at = at.__cause__ or at.__context__


def storage_error(exc: BaseException) -> BaseException | None:
    """The storage's own exception in ``exc``'s chain (Optuna wraps a driver's error in
    ``StorageInternalError``), or ``None`` when the storage is not what failed."""
    optuna_exceptions = sys.modules.get("optuna.exceptions")
    wrapper = getattr(optuna_exceptions, "StorageInternalError", None)
    for at in _chain(exc):
        if type(at).__module__.split(".")[0] in _STORAGE_MODULES:
            return at
        if wrapper is not None and isinstance(at, wrapper):
            return at.__cause__ or at
    return None


_DAMAGED = ("database disk image is malformed", "file is not a database", "file is encrypted or is not")
"""sqlite's words for a file whose pages are damaged: running again will not help."""


def crash_text(exc: BaseException) -> str:
    """What the CLI prints for an exception nothing else handled, with no secret in it.

    A storage that fails mid-command (a server gone, a password changed) is one line: what the
    driver said. Anything else is a bug: its traceback, for the report. Either way the secrets of
    every storage this process opened are masked (:func:`explorer.secrets.redact_opened`).
    """
    from explorer.secrets import redact_opened

    failed = storage_error(exc)
    if failed is not None:
        said = str(failed).strip().splitlines()
        first = said[0] if said else type(failed).__name__
        damaged = any(words in first for words in _DAMAGED)
        advice = (
            "the sqlite file is damaged: restore it from a backup, or recover what it holds with "
            "`sqlite3 FILE .recover`"
            if damaged
            else "what it stored is kept; run the command again when it answers"
        )
        return redact_opened(f"explorer: error: the storage failed: {first} ({advice})\n")
    return redact_opened("".join(traceback.format_exception(exc)))


def run_error_line(exc: BaseException) -> str:
    """What ``explorer optimize`` prints for any error that ends it (a full disk, Ray failing to
    start or answer, a timeout, a bug): one masked line, its trials already marked interrupted by
    the loop (:class:`explorer.study.Loop`). ``--debug`` prints :func:`crash_text` instead."""
    from explorer.secrets import redact_opened

    if storage_error(exc) is not None:
        return crash_text(exc)
    said = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    what = f"{type(exc).__name__}: {said[0]}" if said else type(exc).__name__
    notes = "".join(f"; {' '.join(note.split())}" for note in getattr(exc, "__notes__", ()))
    return redact_opened(
        f"explorer: error: {what}{notes} (what the study stored is kept: run optimize again to resume;"
        " --debug prints the traceback)\n"
    )


_LOGGED = (*_STORAGE_MODULES, "optuna")
"""Libraries whose log records :func:`library_log_lines` prints: the storage's, and Optuna (which
logs a storage error with its SQL and parameters when it falls back to a slower query)."""


class _OneLine(logging.Handler):
    """A library's log record as one masked line on stderr, without its traceback."""

    def emit(self, record: logging.LogRecord) -> None:
        from explorer.secrets import redact_opened

        said = record.getMessage().strip().splitlines()[:1]
        if record.exc_info and record.exc_info[1] is not None:
            said += str(record.exc_info[1]).strip().splitlines()[:1]
        text = ": ".join(line for line in said if line)
        try:
            sys.stderr.write(redact_opened(f"explorer: {record.name}: {text}") + "\n")
        except (OSError, ValueError):  # stderr closed (a hung-up terminal): nothing to tell
            self.handleError(record)


def library_log_lines() -> None:
    """Print what Optuna, SQLAlchemy and the database drivers log as one masked line each (the
    message and its error's first line): not Optuna's handler writing the SQL and its parameters,
    nor Python's last-resort handler writing SQLAlchemy's pool traceback when a connection it
    hands back has died."""
    import optuna.logging

    optuna.logging.disable_default_handler()  # else Optuna adds it back when first imported
    for name in _LOGGED:
        logger = logging.getLogger(name)
        if not any(isinstance(h, _OneLine) for h in logger.handlers):
            logger.addHandler(_OneLine(logging.WARNING))
            logger.propagate = False
