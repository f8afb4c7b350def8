"""``explorer dashboard``: optuna-dashboard on a study's storage and artifact store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from explorer.errors import SpecError

if TYPE_CHECKING:
    from explorer.spec import LoadedStudy

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "artifact_dir", "serve"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


def artifact_dir(loaded: LoadedStudy) -> Path:
    """Where the study's artifacts (figures, files) are kept: ``<output_dir>/artifacts``."""
    return loaded.output_dir / "artifacts"


def serve(
    loaded: LoadedStudy,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    printer: Callable[[str], None] = print,
) -> None:
    """Serve optuna-dashboard for ``loaded``'s study until interrupted (blocks).

    The study must exist: it is looked up read-only first, so that a mistyped storage URL or study
    name is one line (exit 2) and creates nothing, at any moment of a study's start (no file yet,
    a file without Optuna's schema yet, the schema but no study yet: each is "no study"; Optuna's
    schema is created in one transaction, see :func:`explorer.study.open_storage`). The artifact store is a
    :class:`optuna.artifacts.FileSystemArtifactStore` on :func:`artifact_dir`, created if missing.

    Raises:
        SpecError: no such study, or optuna-dashboard is not installed.
    """
    from explorer.paths import inside
    from explorer.secrets import mask_url
    from explorer.status import load_readonly
    from explorer.study import open_storage

    try:
        import optuna_dashboard
    except ImportError:
        raise SpecError(
            file="dashboard",
            field="",
            problem="optuna-dashboard is not installed: pip install 'explorer[dashboard]'",
        ) from None
    from optuna.artifacts import FileSystemArtifactStore

    load_readonly(loaded)  # the study exists (else one line, nothing written)
    storage = open_storage(loaded.storage_url, field_file=str(loaded.file) + ": storage")
    artifacts = artifact_dir(loaded)
    inside(loaded.output_dir, [artifacts], file=str(loaded.file))
    artifacts.mkdir(parents=True, exist_ok=True)
    shown = f"[{host}]" if ":" in host else host
    printer(f"dashboard: http://{shown}:{port}/dashboard/ (study {loaded.spec.name!r})")
    printer(f"storage: {mask_url(loaded.storage_url)}; artifacts: {artifacts}")
    printer("Ctrl-C stops it")
    try:
        optuna_dashboard.run_server(
            storage, host=host, port=port, artifact_store=FileSystemArtifactStore(artifacts)
        )
    except OSError as exc:  # the address is taken, or not this machine's
        raise SpecError(
            file="--port", field="", problem=f"cannot serve on {shown}:{port}: {exc.strerror or exc}"
        ) from None
