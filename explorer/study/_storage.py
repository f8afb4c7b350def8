"""Open the Optuna storage behind a study, failing with one line if it cannot be reached."""

from __future__ import annotations

import functools
import os
import re
import sqlite3
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote, quote_plus, unquote, unquote_plus

from explorer.errors import SpecError

if TYPE_CHECKING:
    import optuna

__all__ = ["MASK", "has_secret", "mask_url", "open_storage", "redact", "secrets_of"]

_CREATED_BY_ANOTHER = ("already exists", "UNIQUE constraint failed", "duplicate key value violates unique")
"""sqlite's and PostgreSQL's words when another process created Optuna's schema at the same moment."""


_SECRET_KEY = re.compile(
    r"pass(word|wd|phrase)?$|pwd|secret|token|credential|(^|_)key$|apikey", re.IGNORECASE
)
"""Query-string keys whose value is a secret (``password``, ``sslpassword``, ``passwd``, ``pwd``,
``token``, ``secret``, ``key``, ``api_key``...); ``sslkey`` (a file path) is not one."""
_USERINFO = re.compile(r"(?P<user>[^:/]*)(?::(?P<password>[^@]*))?@(?P<host>[^/:?]*)")
"""SQLAlchemy's reading of what follows ``://`` (its own pattern, whose password stops at the first
``@``), so that a password with an unencoded ``@`` (``u:p@ss@host``, which SQLAlchemy reads as
password ``p`` on host ``ss@host``) is masked up to the last ``@`` before the host."""
_ASSIGNED = re.compile(
    r"""(?P<key>\b[\w-]*(?:password|passwd|pwd|secret|token)[\w-]*)(?P<eq>\s*=\s*|['"]?\s*:\s*)"""
    r"""(?P<value>'[^']*'|"[^"]*"|[^\s&,;)'"]+)""",
    re.IGNORECASE,
)
"""``password=VALUE`` (a libpq DSN, a URL query) or ``'password': 'VALUE'`` in a message."""
SECRET_ENV = ("PGPASSWORD",)
"""Environment variables holding a storage password (libpq reads ``PGPASSWORD``): their values
are masked in every message too."""
MASK = "***"


@dataclass(frozen=True)
class _Parts:
    """A storage URL cut where its secrets are: ``head`` (``scheme://``; of a string that is no
    URL, up to its last ``//``, else nothing), ``user`` and
    ``password`` (``None``: no password; the text between ``:`` and the last ``@`` before the
    host), ``tail`` (``@host:port/database`` or, without user-info, all of it up to the query)
    and ``query`` (after ``?``, ``None`` without one)."""

    head: str
    user: str | None
    password: str | None
    tail: str
    query: str | None


def _parts(url: str) -> _Parts:
    head, sep, rest = url.partition("://")
    if not sep:  # not a URL: a scheme written wrong (postgresql//u:p@h), a bare u:p@h, a DSN
        head, sep, rest = url.rpartition("//")
    user = password = None
    m = _USERINFO.match(rest)
    if m is not None:
        host = m.group("host")
        userinfo = rest[: m.start("host") - 1]  # up to the @ before the host SQLAlchemy reads
        if "@" in host:  # an unencoded @ in the password: the host starts after the last one
            userinfo += "@" + host[: host.rfind("@")]
        rest = rest[len(userinfo) :]  # "@host:port/database?query"
        user, colon, password = userinfo.partition(":")
        if not colon:  # no password (a user name may hold an @)
            user, password = userinfo, None
    path, q, query = rest.partition("?")
    return _Parts(head=head + sep, user=user, password=password, tail=path, query=query if q else None)


def _query_secrets(query: str) -> tuple[str, list[str]]:
    """``query`` with every secret value masked, and those values (as written)."""
    out: list[str] = []
    found: list[str] = []
    secret = False
    for item in query.split("&"):
        key, eq, value = item.partition("=")
        if eq:
            secret = bool(_SECRET_KEY.search(unquote_plus(key)))
        elif secret:  # an unencoded & inside a secret value: the rest of that value
            found[-1] += "&" + item
            continue
        if secret and eq:
            found.append(value)
            out.append(f"{key}={MASK}")
        else:
            out.append(item)
    return "&".join(out), found


def mask_url(url: str) -> str:
    """``url`` with every secret in it replaced by ``***``, for output and logs.

    The password of the user-info (all of it, up to the last ``@`` before the host, where an
    unencoded ``@`` sits in it) and the value of every secret-looking query parameter
    (``password``, ``sslpassword``, ``passwd``, ``pwd``, ``token``, ``secret``, ``key``...). The
    one place explorer turns a storage URL into text: every line and file that shows one goes
    through here (or :func:`redact`, for text that may hold it).
    """
    p = _parts(url)
    user = "" if p.user is None else p.user + (f":{MASK}" if p.password is not None else "")
    query = "" if p.query is None else "?" + _query_secrets(p.query)[0]
    shown = f"{p.head}{user}{p.tail}{query}"
    if "://" not in url:  # not a URL (a DSN, say): its password=... assignments too
        shown = _ASSIGNED.sub(lambda m: f"{m.group('key')}{m.group('eq')}{MASK}", shown)
    return shown


def has_secret(url: str) -> bool:
    """Whether ``url`` holds a password or another secret (:func:`mask_url` changes it)."""
    return mask_url(url) != url


def _variants(secret: str) -> set[str]:
    """``secret`` as written, decoded, and encoded (a URL's percent and plus forms), and the
    pieces an unencoded ``@`` splits it into (SQLAlchemy hands the driver a host that starts
    with the part after the first ``@``)."""
    out = {secret, unquote(secret), unquote_plus(secret)}
    for s in list(out):
        out |= {quote(s, safe=""), quote_plus(s, safe=""), quote(s)}
        out |= set(s.split("@"))
    return {s for s in out if s}


def secrets_of(url: str) -> set[str]:
    """Every form in which a secret of ``url`` could appear in a message (see :func:`redact`)."""
    p = _parts(url)
    found: list[str] = []
    if p.password:
        found.append(p.password)
    if p.query:
        found += _query_secrets(p.query)[1]
    try:  # and as SQLAlchemy reads the URL, whatever the reading above missed
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
    except Exception:  # not a URL SQLAlchemy reads: nothing more to find there
        parsed = None
    if parsed is not None:
        if parsed.password:
            found.append(str(parsed.password))
        for key, value in parsed.query.items():
            if _SECRET_KEY.search(key):
                found += [value] if isinstance(value, str) else list(value)
    return {v for s in found for v in _variants(s)}


def redact(text: str, url: str | None = None) -> str:
    """``text`` (a driver's error, a line about to be printed) with every secret of ``url`` masked:
    the URL itself wherever it appears, its password and secret query values in every form
    (:func:`secrets_of`: as written, percent-encoded or decoded, the pieces of one with an
    unencoded ``@``), ``password=...`` assignments of a DSN, and the values of
    :data:`SECRET_ENV` variables.

    A secret shorter than 4 characters is masked where it stands alone (between non-word
    characters), so that a one-letter password does not mask that letter in every word.
    """
    if url:
        text = text.replace(url, mask_url(url))
    secrets = secrets_of(url) if url else set()
    secrets |= {v for name in SECRET_ENV if (v := os.environ.get(name))}
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= 4:
            text = text.replace(secret, MASK)
        else:
            text = re.sub(rf"(?<!\w){re.escape(secret)}(?!\w)", MASK, text)
    return _ASSIGNED.sub(lambda m: f"{m.group('key')}{m.group('eq')}{MASK}", text)


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
