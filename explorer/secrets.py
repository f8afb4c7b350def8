"""Storage URLs as text: every secret in one masked for output and logs.

The one place explorer turns a storage URL (or a driver's message about one) into text that is
printed or written: :func:`mask_url` for a URL, :func:`redact` for text that may hold one. It sits
below every sub-package (it imports nothing of explorer's), so that the study-file loader, the
storage opener and the printed commands share it without an import cycle. Hand-written, not a
library's: SQLAlchemy's ``URL.render_as_string(hide_password=True)`` masks only the user-info
password, and only as SQLAlchemy reads it (the part before an unencoded ``@``), not query-string
secrets or a libpq DSN.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import quote, quote_plus, unquote, unquote_plus

__all__ = [
    "MASK",
    "SECRET_ENV",
    "has_secret",
    "mask_url",
    "redact",
    "redact_opened",
    "remember_opened",
    "secrets_of",
]

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


_OPENED: set[str] = set()
"""The storage URLs this process has opened (:func:`remember_opened`)."""


def remember_opened(url: str) -> None:
    """Note that this process opened the storage at ``url``, so that :func:`redact_opened` masks
    its secrets in whatever is printed later (a storage that fails mid-run, a crash)."""
    _OPENED.add(url)


def redact_opened(text: str) -> str:
    """``text`` with the secrets of every storage this process opened masked (see :func:`redact`),
    and the values of :data:`SECRET_ENV` variables."""
    for url in sorted(_OPENED, key=len, reverse=True):
        text = redact(text, url)
    return redact(text)
