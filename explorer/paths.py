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
    "OUT_MANIFEST",
    "atomic_file",
    "check_run_folder",
    "claim_out",
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


_SYSTEM_TREES = (
    "/etc",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/boot",
    "/dev",
    "/proc",
    "/sys",
    "/run",
)
"""Folders of the operating system: a run folder is never one of them nor inside one."""
_SHARED_TOPS = ("/", "/home", "/tmp", "/var", "/opt", "/srv", "/mnt", "/media", "/root", "/var/tmp")
"""Folders that hold other people's or the system's files: a run folder is never one of them
itself (a folder inside one is fine: ``/tmp/my-study``)."""


def check_run_folder(folder: Path, *, file: str, field: str = "output_dir") -> None:
    """Refuse a run folder at the filesystem root, a system folder or a shared top folder (the
    user's home itself included): explorer writes ``.explorer-study``, ``trial-*``, ``best``
    and ``report`` into it, beside whatever is there.

    Raises:
        SpecError: naming ``file`` and ``field``.
    """
    real = folder.resolve()
    home = Path.home().resolve()
    system = next((t for t in _SYSTEM_TREES if real == Path(t) or real.is_relative_to(t)), None)
    if system is not None:
        problem = f"{folder} is in the system folder {system}: give a folder of your own"
    elif str(real) in _SHARED_TOPS or real == home:
        problem = f"{folder} is {'your home folder' if real == home else 'a shared top folder'}: give a folder of its own, e.g. {real / 'explorer-runs'}"
    else:
        return
    raise SpecError(file=file, field=field, problem=problem)


OUT_MANIFEST = ".explorer-out"
"""The file, in a folder given with ``--out``, that lists what explorer wrote there (one name a
line): the files it may overwrite on the next run."""


def claim_out(folder: Path, names: Iterable[str], *, field: str) -> None:
    """Check, before anything is written, that writing ``names`` into ``folder`` (``--out``)
    overwrites no file explorer did not write, then record them in :data:`OUT_MANIFEST`.

    A file of the user's (present, and not listed by an earlier run) is never overwritten: the
    run is refused in one line and nothing is written.

    Raises:
        SpecError: naming ``field`` (``--out``) and the first such file.
    """
    names = list(names)
    manifest = folder / OUT_MANIFEST
    ours: set[str] = set()
    if manifest.is_file():
        ours = {line for line in manifest.read_text(encoding="utf-8", errors="replace").splitlines() if line}
    theirs = sorted(n for n in names if n not in ours and (folder / n).exists())
    if theirs:
        problem = (
            f"{folder / theirs[0]} exists and was not written by explorer: give an empty or new folder "
            "(nothing written)"
        )
        raise SpecError(file=field, field="", problem=problem)
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(manifest, "".join(f"{n}\n" for n in sorted(ours | set(names))))


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
