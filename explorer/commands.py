"""The commands explorer prints for the user to run next, with the options the user passed.

A printed command has to work when copied: it names the study file as given, and the storage
when the command line gave one (``--storage``: a storage the study file does not name), quoted
for the shell. A storage URL with a password (or another secret) is never printed: if an
environment variable holds the URL (``--storage "$DB_URL"``, expanded by the shell), the command
names the variable; otherwise the password is masked as ``***`` (:func:`explorer.study.mask_url`)
and a note says so once.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from explorer.spec import LoadedStudy

__all__ = ["MASKED_NOTE", "Shown", "command", "file_says", "hint_lines", "shown_url"]


@dataclass(frozen=True)
class Shown:
    """A storage URL as shell text: ``text`` (quoted, ``"$VAR"``, or with ``***`` for its
    password, when ``masked``)."""

    text: str
    masked: bool = False


def shown_url(url: str, environ: Mapping[str, str] | None = None) -> Shown:
    """``url`` for a printed command: as is (quoted) without a secret; else the environment
    variable that holds it, if one does; else masked."""
    from explorer.secrets import has_secret, mask_url

    if not has_secret(url):
        return Shown(shlex.quote(url))
    env = os.environ if environ is None else environ
    holders = sorted(name for name, value in env.items() if value == url and name.isidentifier())
    if holders:
        return Shown(f'"${holders[0]}"')
    return Shown(shlex.quote(mask_url(url)), masked=True)


def file_says(loaded: LoadedStudy) -> tuple[str | None, int | None]:
    """The storage URL (resolved) and ``n_trials`` the study file itself says, so that what the
    command line overrode can be told apart; ``None`` where it cannot be read back."""
    from explorer.errors import SpecError
    from explorer.spec._load import _check_storage_url, read_yaml

    try:
        raw = read_yaml(loaded.file, label=str(loaded.file))
    except (SpecError, OSError):  # the file changed since it was loaded: say everything
        return None, None
    if not isinstance(raw, dict):
        return None, None
    storage = raw.get("storage")
    n_trials = raw.get("n_trials")
    url: str | None = None
    if storage is None or isinstance(storage, str):
        try:
            url = _check_storage_url(
                str(loaded.file), storage, loaded.file.resolve().parent, loaded.spec.name, False
            )
        except SpecError:  # the file's own storage is not a URL: --storage replaced it
            url = None
    return url, n_trials if isinstance(n_trials, int) and not isinstance(n_trials, bool) else None


def _options(loaded: LoadedStudy, *, n_trials: bool) -> tuple[list[str], bool]:
    """The options to repeat (as shell words) and whether a password in them is masked."""
    stated_url, stated_trials = file_says(loaded)
    words: list[str] = []
    masked = False
    if loaded.storage_url != stated_url:
        shown = shown_url(loaded.storage_url)
        words += ["--storage", shown.text]
        masked = shown.masked
    if n_trials and loaded.spec.n_trials != stated_trials:
        words += ["--n-trials", str(loaded.spec.n_trials)]
    return words, masked


def command(verb: str, loaded: LoadedStudy, *extra: str, n_trials: bool = False) -> tuple[str, bool]:
    """``explorer VERB STUDY.yaml [--storage URL] [--n-trials N] EXTRA...`` as shell text, and
    whether a password in it is masked (``***``).

    Args:
        n_trials: the command takes ``--n-trials`` (``optimize``, ``validate``): repeat it when
            the command line overrode the study file's.
    """
    words, masked = _options(loaded, n_trials=n_trials)
    quoted = " ".join(shlex.quote(w) for w in ["explorer", verb, str(loaded.file)])
    rest = " ".join([*words, *(shlex.quote(e) for e in extra)])  # words are shell text already
    return (f"{quoted} {rest}" if rest else quoted), masked


MASKED_NOTE = (
    "note: the storage password is shown as *** above: put it back before running, or keep it "
    'out of the URL (PGPASSWORD, ~/.pgpass), or pass the URL in an environment variable (--storage "$VAR"), '
    "which explorer then prints instead"
)


def hint_lines(loaded: LoadedStudy, *, dashboard: bool = True, then: Sequence[str] = ()) -> list[str]:
    """The commands to run next, one a line: ``dashboard: explorer dashboard STUDY.yaml ...`` and
    ``dashboard: optuna-dashboard URL`` (with ``dashboard``), ``next: explorer VERB STUDY.yaml ...``
    for each verb of ``then``; and, once, :data:`MASKED_NOTE` if any of them masks a password."""
    lines: list[str] = []
    masked = False
    if dashboard:
        text, masked = command("dashboard", loaded)
        url = shown_url(loaded.storage_url)
        lines += [f"dashboard: {text}", f"dashboard: optuna-dashboard {url.text}"]
        masked = masked or url.masked
    for verb in then:
        text, hidden = command(verb, loaded)
        lines.append(f"next: {text}")
        masked = masked or hidden
    if masked:
        lines.append(MASKED_NOTE)
    return lines
