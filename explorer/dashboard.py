"""``explorer dashboard``: optuna-dashboard on a study's storage and artifact store."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from explorer.errors import SpecError

if TYPE_CHECKING:
    from explorer.spec import LoadedStudy

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "artifact_dir", "read_only", "serve"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


_READS = frozenset({"GET", "HEAD", "OPTIONS"})
READ_ONLY_REASON = "explorer dashboard serves the study read-only; start it with --allow-writes to change it"


def read_only(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """``app`` (a WSGI application) answering every request that could change something (POST,
    PUT, PATCH, DELETE: deleting or renaming the study, telling a trial, editing notes or user
    attrs, uploading or deleting artifacts) with 403 and one line of JSON.

    optuna-dashboard has no read-only mode and no authentication: on a shared login node any local
    user who reaches its port could ``DELETE /api/studies/1``. Its reads are all GETs, so the
    method alone tells them apart."""

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if str(environ.get("REQUEST_METHOD", "GET")).upper() in _READS:
            return app(environ, start_response)
        body = json.dumps({"reason": READ_ONLY_REASON}).encode()
        start_response(
            "403 Forbidden", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        )
        return [body]

    return guarded


def artifact_dir(loaded: LoadedStudy) -> Path:
    """Where the study's artifacts (figures, files) are kept: ``<output_dir>/artifacts``."""
    return loaded.output_dir / "artifacts"


def serve(
    loaded: LoadedStudy,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    allow_writes: bool = False,
    printer: Callable[[str], None] = print,
) -> None:
    """Serve optuna-dashboard for ``loaded``'s study until interrupted (blocks).

    The study must exist: it is looked up read-only first, so that a mistyped storage URL or study
    name is one line (exit 2) and creates nothing, at any moment of a study's start (no file yet,
    a file without Optuna's schema yet, the schema but no study yet: each is "no study"; Optuna's
    schema is created in one transaction, see :func:`explorer.study.open_storage`). The artifact store is a
    :class:`optuna.artifacts.FileSystemArtifactStore` on :func:`artifact_dir`, created if missing.
    Unless ``allow_writes``, the dashboard cannot change the study (:func:`read_only`).

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
    from bottle import run  # optuna-dashboard's own server (wsgiref), as its run_server uses it
    from optuna.artifacts import FileSystemArtifactStore

    load_readonly(loaded)  # the study exists (else one line, nothing written)
    storage = open_storage(loaded.storage_url, field_file=str(loaded.file) + ": storage")
    artifacts = artifact_dir(loaded)
    inside(loaded.output_dir, [artifacts], file=str(loaded.file))
    artifacts.mkdir(parents=True, exist_ok=True)
    shown = f"[{host}]" if ":" in host else host
    printer(f"dashboard: http://{shown}:{port}/dashboard/ (study {loaded.spec.name!r})")
    printer(f"storage: {mask_url(loaded.storage_url)}; artifacts: {artifacts}")
    printer(
        "read and write (--allow-writes)" if allow_writes else f"read-only: {READ_ONLY_REASON.split('; ')[1]}"
    )
    printer("Ctrl-C stops it")
    app = optuna_dashboard.wsgi(storage, artifact_store=FileSystemArtifactStore(artifacts))
    try:
        run(app if allow_writes else read_only(app), host=host, port=port)
    except OSError as exc:  # the address is taken, or not this machine's
        raise SpecError(
            file="--port", field="", problem=f"cannot serve on {shown}:{port}: {exc.strerror or exc}"
        ) from None
