"""Where explorer may write for a study: inside its output folder, with no symlink leading out.

``output_dir`` (the study file's field; default ``explorer-runs/<name>`` next to the study file)
may be anywhere, itself a symlink included: it is the user's choice. Everything explorer writes
there (trial folders and logs, the report, artifacts, ``best`` files, the default export) must
resolve, with every symlink followed, inside ``output_dir`` as resolved. A ``trial-00003`` or a
``report/history.png`` that is a symlink to somewhere else is refused, not followed. A folder
given on the command line (``--out``) is the user's choice too; the files explorer writes in it
must still resolve inside it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from explorer.errors import SpecError

__all__ = [
    "atomic_file",
    "default_output_dir",
    "escape",
    "inside",
    "open_table",
    "storage_identity",
    "table_file",
    "write_atomic",
]


def escape(root: Path, path: Path) -> str | None:
    """``None`` when ``path`` resolves inside ``root`` (or is it); else the problem, in words."""
    real_root = root.resolve()
    real = path.resolve()
    if real == real_root or real.is_relative_to(real_root):
        return None
    return f"{path} resolves to {real}, outside {real_root} (a symlink?); nothing written"


def inside(root: Path, paths: Iterable[Path], *, file: str, field: str = "output_dir") -> None:
    """Check that every one of ``paths`` resolves inside ``root``, before anything is written.

    Raises:
        SpecError: naming ``file`` and ``field``, for the first path that leads out.
    """
    for path in paths:
        problem = escape(root, path)
        if problem is not None:
            raise SpecError(file=file, field=field, problem=problem)


def storage_identity(url: str) -> str:
    """Which storage ``url`` names, without credentials or options: ``sqlite:////abs/path.db``,
    ``postgresql://host:port/database``. Two URLs of one storage (other drivers, another user,
    other options) have one identity."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        database = parsed.database or ""
        return f"sqlite:///{Path(database).resolve() if database not in ('', ':memory:') else database}"
    port = f":{parsed.port}" if parsed.port else ""
    host = (parsed.host or "").rsplit("@", 1)[-1]  # ``u:p@ss@host``: sqlalchemy's host holds ``ss@``
    return f"{backend}://{host}{port}/{parsed.database or ''}"


def default_output_dir(base: Path, name: str, storage_url: str, file_storage_url: str) -> Path:
    """The run folder of study ``name`` when the study file sets no ``output_dir``.

    ``explorer-runs/<name>`` next to the study file for the study file's own storage
    (``file_storage_url``); ``explorer-runs/<name>.<storage>-<hash>`` for any other storage
    (``--storage``), so that two storages of one study file never share trial files.
    """
    import hashlib
    import re

    folder = base / "explorer-runs"
    identity = storage_identity(storage_url)
    if identity == storage_identity(file_storage_url):
        return folder / name
    from sqlalchemy.engine import make_url

    parsed = make_url(storage_url)
    label = Path(parsed.database or "memory").stem if parsed.get_backend_name() == "sqlite" else ""
    label = re.sub(r"[^\w.-]", "_", label or parsed.get_backend_name()).lstrip(".") or "storage"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:8]
    return folder / f"{name}.{label}-{digest}"


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "w", **kwargs: Any) -> Iterator[IO[Any]]:
    """A file open for writing whose content reaches ``path`` whole or not at all.

    It is written as a temporary file beside ``path`` (``.NAME.tmpPID``), flushed to disk, then
    renamed over ``path`` (``os.replace``: atomic on one filesystem). A reader sees the old file or
    the new one, never a part; a write that fails (a full disk, a kill) leaves ``path`` as it was
    and no temporary file behind (a SIGKILL excepted: its ``.tmp`` file is never read)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.unlink(missing_ok=True)  # a killed run's: created anew below, never followed if a symlink
    try:
        with open(tmp, mode.replace("w", "x"), **kwargs) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: Path, data: str | bytes, *, encoding: str = "utf-8") -> Path:
    """Write ``data`` to ``path`` whole or not at all (:func:`atomic_file`); returns ``path``."""
    if isinstance(data, bytes):
        with atomic_file(path, "wb") as fh:
            fh.write(data)
    else:
        with atomic_file(path, "w", encoding=encoding) as fh:
            fh.write(data)
    return path


def table_file(path: str | Path) -> Path:
    """``path``, or its gzipped copy ``path.gz`` where only that exists: a large replay table is
    kept compressed in git (every device call carries the tracked tree, 64 MiB in all) and
    still named by its ``.csv`` name."""
    path = Path(path)
    packed = path.with_name(path.name + ".gz")
    return packed if not path.is_file() and packed.is_file() else path


def open_table(path: str | Path) -> IO[str]:
    """Open a replay table (``.csv``, or ``.csv.gz`` through :func:`table_file`) as text for
    :class:`csv.DictReader`."""
    import gzip

    found = table_file(path)
    if found.suffix == ".gz":
        return gzip.open(found, "rt", newline="", encoding="utf-8", errors="replace")
    return found.open(newline="", encoding="utf-8", errors="replace")
