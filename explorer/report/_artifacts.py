"""Attach the report's figures to the study as Optuna artifacts, for optuna-dashboard."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import optuna

__all__ = ["attach_artifacts"]


def attach_artifacts(study: optuna.Study, files: Sequence[Path], store_dir: Path) -> dict[str, str]:
    """Upload ``files`` to a :class:`optuna.artifacts.FileSystemArtifactStore` at ``store_dir``.

    A file whose name the study already has an artifact for replaces that artifact's content
    under the same id (Optuna cannot delete a study's artifact record), so a second report does
    not pile up copies.

    Args:
        study: The study the artifacts belong to.
        files: The figures.
        store_dir: The artifact store's folder (created if missing).

    Returns:
        The artifact id of each file, by file name.
    """
    from optuna.artifacts import FileSystemArtifactStore, get_all_artifact_meta, upload_artifact

    store_dir.mkdir(parents=True, exist_ok=True)
    store = FileSystemArtifactStore(store_dir)
    existing = {meta.filename: meta.artifact_id for meta in get_all_artifact_meta(study)}
    ids = {}
    for path in files:
        artifact_id = existing.get(path.name)
        if artifact_id is None:
            artifact_id = upload_artifact(artifact_store=store, file_path=str(path), study_or_trial=study)
        else:
            with path.open("rb") as fh:
                store.write(artifact_id, fh)
        ids[path.name] = artifact_id
    return ids
