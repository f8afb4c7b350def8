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
import re
import shutil
import stat
import sys
from collections.abc import Collection, Iterable, Iterator, Mapping
from functools import cache
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
    "write_set",
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


def write_set(
    folder: Path,
    contents: Mapping[str, str],
    *,
    keep: Collection[str] = (),
    executable: Collection[str] = (),
    claim: bool = False,
    file: str,
    field: str,
) -> None:
    """Write the files ``contents`` (name: text) into ``folder`` as one set: a reader, or a kill at
    any point, finds the complete old set or the complete new one, never a mix.

    The set, with :data:`OUT_MANIFEST` listing it, is written into a sibling folder
    (``.NAME.new-PID``, same filesystem) and flushed to disk; that folder then takes the place of
    ``folder`` in one step (Linux ``renameat2(RENAME_EXCHANGE)``; elsewhere two renames, between
    which a kill leaves no folder and the old one as ``.NAME.old-PID``, put back by the next
    write). Entries of the old folder named in ``keep`` (the outputs of the commands the files
    print) or listed in its manifest (another verb's files) move into the new folder; any other
    entry is the user's, and the folder is refused (nothing written): explorer replaces a folder
    only when it holds nothing but explorer's. So is the current folder or one holding it (a shell
    there would be left in the old one). A ``.NAME.new-PID`` or ``.NAME.old-PID`` of a process no
    longer running (a kill) is cleared first, what it kept moving into ``folder``. ``claim`` (a
    folder the user gave, ``--out``): a file under one of the set's names that explorer did not
    write (not in the manifest) is refused too, as :func:`claim_out` does. The folder holding
    ``folder`` must be writable (the sibling); the folder keeps its mode, not its owner.

    Raises:
        SpecError: naming ``file`` and ``field``, before anything is written.
    """
    real = folder.resolve()  # a symlink to a folder stays: the folder it names is replaced
    check_run_folder(folder, file=file, field=field)
    carried, ours = _set_folder_entries(
        folder, real, contents, keep=keep, claim=claim, file=file, field=field
    )
    _sweep(real, contents)
    listed = sorted(set(contents) | (ours & set(carried)))
    stage = _stage(real, {**contents, OUT_MANIFEST: "".join(f"{n}\n" for n in listed)}, executable)
    _swap_in(stage, real, contents)


def _set_folder_entries(
    folder: Path,
    real: Path,
    contents: Mapping[str, str],
    *,
    keep: Collection[str],
    claim: bool,
    file: str,
    field: str,
) -> tuple[list[str], set[str]]:
    """(the entries of ``folder`` that :func:`write_set` carries into the new one, the names its
    manifest lists); a folder it may not replace is refused."""

    def refuse(problem: str) -> SpecError:
        return SpecError(file=file, field=field, problem=f"{problem} (nothing written)")

    if not real.exists():
        return [], set()
    if not real.is_dir():
        raise refuse(f"{folder} is not a folder")
    with contextlib.suppress(OSError):  # a current folder that is gone holds nothing
        if Path.cwd().resolve().is_relative_to(real):
            raise refuse(
                f"{folder} holds the current folder, and explorer replaces {folder} as a whole "
                "(its files as one set): run it from another folder"
            )
    manifest = real / OUT_MANIFEST
    ours = (
        set(manifest.read_text(encoding="utf-8", errors="replace").split()) if manifest.is_file() else set()
    )
    entries = sorted(os.listdir(real))
    theirs = [n for n in entries if n in contents and n not in ours] if claim else []
    carried = [n for n in entries if n not in contents and n != OUT_MANIFEST and (n in ours or n in keep)]
    foreign = [n for n in entries if n not in contents and n != OUT_MANIFEST and n not in carried]
    foreign = [n for n in foreign if not _temporary(n, {*contents, *ours})]
    if theirs:
        raise refuse(
            f"{folder / theirs[0]} exists and was not written by explorer: give an empty or new folder"
        )
    if foreign:
        raise refuse(
            f"{folder / foreign[0]} exists and was not written by explorer, and explorer replaces its "
            f"files in {folder} as one set, in a folder that holds only its own: move it out, or give "
            "an empty or new folder"
        )
    return carried, ours


def _temporary(name: str, names: Collection[str]) -> bool:
    """Whether ``name`` is the temporary file of a write of one of ``names`` that a kill ended
    (:func:`atomic_file`'s ``.NAME.tmpPID``)."""
    found = re.fullmatch(r"\.(.+)\.tmp\d+", name)
    return found is not None and found.group(1) in names


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (this one excepted: what it left is from an earlier call)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def _sweep(real: Path, names: Collection[str]) -> None:
    """Clear what a killed :func:`write_set` into ``real`` left beside it: an old folder set
    aside with no folder in its place is put back; from any other, what it kept moves into
    ``real``, and it is removed."""
    if not real.parent.is_dir():
        return
    pattern = re.compile(rf"\.{re.escape(real.name)}\.(new|old)-(\d+)")
    found = [m for m in map(pattern.fullmatch, os.listdir(real.parent)) if m and not _alive(int(m.group(2)))]
    for match in sorted(found, key=lambda m: m.group(1) != "old"):  # an old folder first
        left = real.parent / match.group(0)
        if match.group(1) == "old" and not os.path.lexists(real):
            os.rename(left, real)
        else:
            _carry(left, real, names)


def _carry(old: Path, real: Path, names: Collection[str]) -> None:
    """Move what ``old`` holds beside the set (``names``) and its manifest into ``real`` (where
    ``real`` has no entry of that name), then remove ``old``; one that cannot move keeps it."""
    left = False
    for name in sorted(os.listdir(old)):
        if name in names or name == OUT_MANIFEST or _temporary(name, names):
            continue
        if real.is_dir() and not os.path.lexists(real / name):
            os.rename(old / name, real / name)
        else:
            left = True
    if not left:
        shutil.rmtree(old)


def _stage(real: Path, files: Mapping[str, str], executable: Collection[str]) -> Path:
    """``files`` written and flushed to disk in a new sibling folder of ``real`` (its mode
    ``real``'s where that exists); returns the folder."""
    real.parent.mkdir(parents=True, exist_ok=True)
    stage = real.parent / f".{real.name}.new-{os.getpid()}"
    os.mkdir(stage)
    try:
        for name, text in files.items():
            with open(stage / name, "x", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            if name in executable:
                os.chmod(stage / name, 0o755)
        if real.is_dir():
            os.chmod(stage, stat.S_IMODE(real.stat().st_mode))
        _fsync_folder(stage)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)  # the error is raised on; the stage is never read
        raise
    return stage


def _swap_in(stage: Path, real: Path, names: Collection[str]) -> None:
    """Put the written ``stage`` in the place of ``real`` in one step; what the old folder held
    beside its set moves into the new one, and the old folder is removed."""
    if not os.path.lexists(real):
        os.rename(stage, real)
        _fsync_folder(real.parent)
        return
    if _exchange(stage, real):
        old = stage
    else:  # two renames: a kill between leaves the old folder aside (:func:`_sweep` puts it back)
        old = real.parent / f".{real.name}.old-{os.getpid()}"
        os.rename(real, old)
        os.rename(stage, real)
    _fsync_folder(real.parent)
    _carry(old, real, names)


@cache
def _renameat2() -> Any:
    """glibc's ``renameat2``, or ``None`` off Linux or without it."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    function = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if function is not None:
        function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        function.restype = ctypes.c_int
    return function


def _exchange(a: Path, b: Path) -> bool:
    """Swap folders ``a`` and ``b`` in one step (``RENAME_EXCHANGE``); ``False`` where the system
    or the filesystem cannot (nothing done then)."""
    import ctypes
    import errno

    function = _renameat2()
    if function is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if function(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _fsync_folder(folder: Path) -> None:
    """Flush ``folder``'s entries (a rename, a new file) to disk."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
