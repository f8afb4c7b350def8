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

from collections.abc import Iterable
from pathlib import Path

from explorer.errors import SpecError

__all__ = ["escape", "inside"]


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
