"""Open the Optuna storage behind a study, failing with one line if it cannot be reached."""

from __future__ import annotations

import functools
import sqlite3
import time
from typing import TYPE_CHECKING

from explorer.errors import SpecError
from explorer.secrets import mask_url, redact, remember_opened

if TYPE_CHECKING:
    import optuna

__all__ = ["open_storage"]

_CREATED_BY_ANOTHER = ("already exists", "UNIQUE constraint failed", "duplicate key value violates unique")
"""sqlite's and PostgreSQL's words when another process created Optuna's schema at the same moment."""


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

    remember_opened(url)
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
        raise _unreachable(url, exc, field_file) from None
    if sqlite:
        try:
            _sqlite_schema_at_once(parsed.database or "", timeout=connect_args["timeout"])
        except sqlite3.Error as exc:
            raise _unreachable(url, exc, field_file) from None
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
                raise _unreachable(url, exc, field_file) from None
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def _unreachable(url: str, exc: BaseException, field_file: str) -> SpecError:
    """The one-line error for a storage that cannot be opened; no secret of ``url`` in it."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return SpecError(file=field_file, field="", problem=f"cannot reach {mask_url(url)}: {redact(first, url)}")


@functools.cache
def _schema_template() -> tuple[tuple[str, ...], tuple[tuple[str, tuple[tuple[object, ...], ...]], ...]]:
    """Optuna's sqlite schema, as the statements that create it and the rows it starts with (the
    schema version and the alembic revision), read from a fresh in-memory RDBStorage."""
    import optuna

    template = optuna.storages.RDBStorage("sqlite:///:memory:")
    try:
        with template.engine.connect() as conn:
            objects = conn.exec_driver_sql(
                "SELECT type, name, sql FROM sqlite_master "
                "WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' ORDER BY rowid"
            ).all()
            rows = [
                (name, tuple(tuple(r) for r in conn.exec_driver_sql(f'SELECT * FROM "{name}"')))
                for kind, name, _ in objects
                if kind == "table"
            ]
    finally:
        template.engine.dispose()
    return tuple(sql for _, _, sql in objects), tuple((name, data) for name, data in rows if data)


def _sqlite_schema_at_once(database: str, *, timeout: float) -> None:
    """Create Optuna's schema in the sqlite file ``database`` in one transaction, if it has none.

    Optuna's RDBStorage creates its tables one statement at a time (sqlite's Python driver
    commits each CREATE TABLE on its own), then the version row, then the alembic table: a reader
    opening the file in between (``optuna-dashboard URL`` started as a study begins) met half a
    schema and failed (``no such table: version_info``), or wrote the version row itself. Here
    every table, index and starting row is committed at once, under sqlite's write lock, so any
    reader sees no schema or all of it. A file that has some tables already is left to Optuna.
    """
    if database in ("", ":memory:") or database.startswith("file:"):
        return
    con = sqlite3.connect(database, timeout=timeout, isolation_level=None)
    try:
        if _has_tables(con):
            return
        statements, rows = _schema_template()
        con.execute("BEGIN IMMEDIATE")  # the write lock; readers keep seeing the empty file
        try:
            if not _has_tables(con):  # another process may have created it while we waited
                for sql in statements:
                    con.execute(sql)
                for table, data in rows:
                    marks = ", ".join("?" * len(data[0]))
                    con.executemany(f'INSERT INTO "{table}" VALUES ({marks})', data)
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise
    finally:
        con.close()


def _has_tables(con: sqlite3.Connection) -> bool:
    return bool(con.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0])
