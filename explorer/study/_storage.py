"""Open the Optuna storage behind a study, failing with one line if it cannot be reached."""

from __future__ import annotations

import functools
import os
import sqlite3
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

from explorer.errors import SpecError, storage_error
from explorer.secrets import mask_url, redact, remember_opened

if TYPE_CHECKING:
    import optuna
    import sqlalchemy

    from explorer.spec import LoadedStudy

__all__ = [
    "check_intact",
    "close_opened",
    "has_schema",
    "is_read_only",
    "load_readonly",
    "open_storage",
    "readonly_url",
    "writable_file",
]

RETRIES = 5
_BUSY = ("database is locked", "database is busy", "readonly database", "no such table")
"""sqlite's words for a file another process is writing (or still creating Optuna's tables in)."""
_NO_SCHEMA = "UndefinedTable"
"""PostgreSQL's error when the database has no Optuna tables (so no study)."""
_READ_ONLY: weakref.WeakSet[optuna.Study] = weakref.WeakSet()
"""The studies :func:`load_readonly` opened (nothing can be stored through them)."""
_OPENED: weakref.WeakSet[sqlalchemy.engine.Engine] = weakref.WeakSet()
"""The engines of the storages :func:`open_storage` and :func:`load_readonly` opened, for
:func:`close_opened` (an engine outlives its storage until the cyclic collector runs)."""

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
        check_intact(parsed.database or "", field_file=field_file)
        try:
            _sqlite_schema_at_once(parsed.database or "", timeout=connect_args["timeout"])
        except sqlite3.Error as exc:
            raise _unreachable(url, exc, field_file) from None
    for attempt in range(3):
        try:
            storage = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": connect_args})
            _OPENED.add(storage.engine)
            return storage
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


def check_intact(database: str, *, field_file: str = "storage") -> None:
    """Refuse an sqlite file with damaged pages, in one line, before anything reads or writes it.

    sqlite reads a page only when a query needs it, so damage in a table explorer never reads (or
    has not read yet) goes unseen, and a run writes on into the damaged file. ``PRAGMA
    quick_check`` reads every page once (milliseconds for a study's file), read-only.

    Raises:
        SpecError: the file's first problem, and what to do.
    """
    if database in ("", ":memory:") or database.startswith("file:") or not Path(database).is_file():
        return
    try:
        path = Path(database).resolve()
        immutable = "" if writable_file(path) else "&immutable=1"  # no WAL index can be made there
        con = sqlite3.connect(f"file:{path}?mode=ro{immutable}", uri=True, timeout=60)
        try:
            rows = [str(r[0]) for r in con.execute("PRAGMA quick_check(5)").fetchall()]
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:  # not a database, or damaged beyond its header
        rows = [str(exc)]
    if rows == ["ok"]:
        return
    raise SpecError(
        file=field_file,
        field="",
        problem=f"{database} is damaged (sqlite: {rows[0]}): nothing was read or written; restore it from "
        f"a copy, or recover what is readable with: sqlite3 {database} .recover | sqlite3 RECOVERED.db",
    )


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


def readonly_url(url: str, *, file: str = "storage") -> str:
    """``url`` for reading only: an sqlite file as a ``mode=ro`` URI; other databases unchanged.

    Args:
        file: what to name in an error (the study file).

    Raises:
        SpecError: an sqlite file that does not exist (it is not created), or an in-memory one.
    """
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return url
    database = parsed.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        if database.startswith("file:"):
            return url  # already a URI: taken as given
        raise SpecError(file=file, field="storage", problem=f"{url}: an in-memory database holds no study")
    path = Path(database).resolve()
    if not path.is_file():
        raise SpecError(file=file, field="storage", problem=f"no study: {path} does not exist")
    # a file (or folder) nobody may write: no WAL index can be made, and nothing changes it
    immutable = "" if writable_file(path) else "&immutable=1"
    return f"sqlite:///file:{path}?mode=ro{immutable}&uri=true"


def readonly_path(url: str) -> Path:
    """The sqlite file of ``url`` (a plain sqlite URL; see :func:`readonly_url`)."""
    from sqlalchemy.engine import make_url

    return Path(make_url(url).database or "").resolve()


def load_readonly(loaded: LoadedStudy) -> optuna.Study:
    """The study of ``loaded``, from its storage opened read-only (nothing is created).

    Raises:
        SpecError: the storage is absent or unreachable, or holds no such study.
    """
    import optuna
    import sqlalchemy

    from explorer.secrets import mask_url, redact, remember_opened

    remember_opened(loaded.storage_url)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = readonly_url(loaded.storage_url, file=str(loaded.file))
    if url.startswith("sqlite"):
        check_intact(str(readonly_path(loaded.storage_url)), field_file=str(loaded.file))
    sqlite = url.startswith("sqlite")
    connect_args = {"timeout": 10} if sqlite else {"connect_timeout": 10}
    where = mask_url(loaded.storage_url)
    missing = SpecError(
        file=str(loaded.file), field="name", problem=f"no study {loaded.spec.name!r} in {where}"
    )
    for attempt in range(RETRIES):
        try:
            storage = optuna.storages.RDBStorage(
                url,
                engine_kwargs={"connect_args": connect_args},
                skip_table_creation=True,
                skip_compatibility_check=True,
            )
            _OPENED.add(storage.engine)
            study = optuna.load_study(study_name=loaded.spec.name, storage=storage)
            _READ_ONLY.add(study)
            return study
        except KeyError:  # optuna: "Record does not exist."
            raise missing from None
        except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as exc:
            text = str(storage_error(exc) or exc)  # the driver's error (a refused password, say)
            if any(m in text for m in _BUSY) and attempt < RETRIES - 1:
                time.sleep(0.2 * (attempt + 1))
                continue
            if _NO_SCHEMA in text or "no such table" in text:  # a database without Optuna's tables
                raise missing from None
            first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
            raise SpecError(
                file=str(loaded.file),
                field="storage",
                problem=f"cannot read {where}: {redact(first, loaded.storage_url)}",
            ) from None
    raise AssertionError("unreachable")


def is_read_only(study: optuna.Study) -> bool:
    """Whether ``study`` was opened read-only (:func:`load_readonly`): nothing can be stored."""
    return study in _READ_ONLY


def writable_file(path: Path) -> bool:
    """Whether sqlite can write ``path`` and the files beside it (its journal, WAL index)."""
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK | os.X_OK)


def has_schema(path: Path) -> bool:
    """Whether the sqlite file ``path`` holds Optuna's tables (read without writing; a file that
    is no sqlite database, or a damaged one, answers ``True``: opening it says what is wrong)."""
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return con.execute("SELECT 1 FROM sqlite_master WHERE name = 'studies'").fetchone() is not None
        finally:
            con.close()
    except sqlite3.Error:
        return True


def close_opened() -> None:
    """Close the connections of every storage this process opened, at the end of a command: left
    to the collector, the last one to close folds sqlite's WAL into the file and removes it, which
    must not happen during a later command of the same process that promises to write nothing."""
    for engine in list(_OPENED):
        engine.dispose()
