"""Open the Optuna storage behind a study, failing with one line if it cannot be reached."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from explorer.errors import SpecError

if TYPE_CHECKING:
    import optuna

__all__ = ["mask_url", "open_storage", "redact"]

_CREATED_BY_ANOTHER = ("already exists", "UNIQUE constraint failed", "duplicate key value violates unique")
"""sqlite's and PostgreSQL's words when another process created Optuna's schema at the same moment."""


def mask_url(url: str) -> str:
    """The URL with any password replaced by ``***``, for logs and output."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def redact(text: str, url: str) -> str:
    """``text`` (a driver's error message, say) with the password of ``url`` replaced by ``***``."""
    from sqlalchemy.engine import make_url

    password = make_url(url).password
    return text.replace(str(password), "***") if password else text


def open_storage(url: str, *, field_file: str = "storage") -> optuna.storages.RDBStorage:
    """An :class:`optuna.storages.RDBStorage` for ``url``.

    The server is probed first (with a short connect timeout), so that an unreachable storage is
    reported before anything is written. SQLite files are switched to WAL with a busy timeout, so
    that readers (``optuna-dashboard``) do not lock out the running study.

    Raises:
        SpecError: the storage cannot be reached.
    """
    import optuna
    import sqlalchemy
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    sqlite = parsed.get_backend_name() == "sqlite"
    connect_args = {"timeout": 60} if sqlite else {"connect_timeout": 10}
    try:
        for attempt in range(5):
            probe = sqlalchemy.create_engine(url, connect_args=connect_args)
            try:
                with probe.connect() as conn:
                    if sqlite:  # switching to WAL takes a lock no busy timeout waits for
                        conn.exec_driver_sql("PRAGMA journal_mode=WAL")
                break
            except sqlalchemy.exc.OperationalError as exc:
                if "database is locked" not in str(exc) or attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))  # another process is switching it right now
            finally:
                probe.dispose()
    except Exception as exc:  # any driver error means "unreachable": report it as one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        problem = f"cannot reach {mask_url(url)}: {redact(first, url)}"
        raise SpecError(file=field_file, field="", problem=problem) from None
    for attempt in range(3):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": connect_args})
        except (
            sqlalchemy.exc.OperationalError,
            sqlalchemy.exc.IntegrityError,
            sqlalchemy.exc.ProgrammingError,
        ) as exc:
            # Processes creating Optuna's tables in a fresh file (or database) at once
            # (`optimize` and a reader polling it, or two drivers): the loser's CREATE TABLE finds the winner's table, or its version row
            # is already there. The schema exists now, so open again.
            if not any(m in str(exc) for m in _CREATED_BY_ANOTHER) or attempt == 2:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")
