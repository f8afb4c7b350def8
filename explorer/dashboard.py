"""``explorer dashboard``: optuna-dashboard on a study's storage and artifact store."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from explorer.errors import SpecError

if TYPE_CHECKING:
    from explorer.spec import LoadedStudy

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "artifact_dir", "dashboard_view", "read_only", "serve"]

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


def _view_class() -> type:
    """:class:`optuna.storages.BaseStorage` subclass ``DashboardView`` (built on first use, so that
    importing this module does not import Optuna)."""
    from optuna.distributions import CategoricalDistribution, IntDistribution
    from optuna.storages import BaseStorage
    from optuna.trial import FrozenTrial, TrialState

    from explorer.record import copy_trial

    class DashboardView(BaseStorage):
        """The study's storage as optuna-dashboard should read it; the record itself unchanged.

        explorer stores an infeasible trial (out of memory, invalid) as COMPLETE with a placeholder
        value 0 and a constraint > 0, and a power-of-two knob as ``log2_<knob>``: that is what
        Optuna's samplers and explorer's search read, and a resumed study must read the same. The
        dashboard, though, lists every COMPLETE trial as a result, picks its best card, history and
        importances from their values, and prints parameters as stored. So the dashboard is given
        this view: an infeasible trial of the study reads PRUNED with no value, and each encoded
        parameter reads in user units (``log2_batch_size`` 6 as ``batch_size`` 64, ``<knob>_index``
        as the listed value), and a value to six significant figures (1792.49, not
        1792.4949785748365). Every other call goes to the storage as it is."""

        def __init__(
            self, storage: BaseStorage, study_id: int, encoded: dict[str, tuple[str, tuple[int, ...]]]
        ):
            self._storage, self._study_id, self._encoded = storage, study_id, encoded
            self._ours: set[int] = set()  # the study's trial ids, as far as known

        def _param(self, name: str, value: Any, dist: Any) -> tuple[str, Any, Any]:
            if name not in self._encoded:
                return name, value, dist
            knob, values = self._encoded[name]
            if name.startswith("log2_"):
                return knob, 2 ** int(value), IntDistribution(2**dist.low, 2**dist.high, log=True)
            return knob, values[int(value)], CategoricalDistribution(values)

        def _view(self, t: FrozenTrial, study_id: int) -> FrozenTrial:
            if study_id != self._study_id:
                return t
            shown = [self._param(n, v, t.distributions[n]) for n, v in t.params.items()]
            infeasible = t.state == TrialState.COMPLETE and max(t.constraints.values(), default=0.0) > 0
            return copy_trial(
                t,
                state=TrialState.PRUNED if infeasible else t.state,
                values=None if infeasible or t.values is None else [float(f"{v:.6g}") for v in t.values],
                params={n: v for n, v, _ in shown},
                distributions={n: d for n, _, d in shown},
            )

        def get_all_trials(
            self, study_id: int, deepcopy: bool = True, states: Any = None
        ) -> list[FrozenTrial]:
            viewed = [
                self._view(t, study_id) for t in self._storage.get_all_trials(study_id, deepcopy=deepcopy)
            ]
            return viewed if states is None else [t for t in viewed if t.state in states]

        def get_trial(self, trial_id: int) -> FrozenTrial:
            if trial_id not in self._ours:  # a new trial of the study, or another study's
                self._ours = {
                    t._trial_id for t in self._storage.get_all_trials(self._study_id, deepcopy=False)
                }
            trial = self._storage.get_trial(trial_id)
            return self._view(trial, self._study_id if trial_id in self._ours else -1)

        def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
            if template_trial is not None:  # the dashboard's rename copies trials: never the view
                raise RuntimeError("explorer dashboard does not copy trials; rename the study with Optuna")
            return self._storage.create_new_trial(study_id)

    return _pass_through(DashboardView, BaseStorage.__abstractmethods__)


def _delegate(name: str) -> Any:
    """A method that calls the wrapped storage's ``name``."""

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._storage, name)(*args, **kwargs)

    call.__name__ = name
    return call


def _pass_through(cls: Any, names: Iterable[str]) -> type:
    """``cls`` with every method of ``names`` it does not define itself calling its storage's."""
    import abc

    for name in names:
        if name not in cls.__dict__:
            setattr(cls, name, _delegate(name))
    abc.update_abstractmethods(cls)
    return cls


def dashboard_view(storage: Any, loaded: LoadedStudy) -> Any:
    """``storage`` as optuna-dashboard should read ``loaded``'s study (the class's docstring)."""
    from explorer.space._domain import Ordered

    encoded = {}
    for name, domain in loaded.space.domains.items():
        if isinstance(domain, Ordered) and domain.param_name(name) != name:
            encoded[domain.param_name(name)] = (name, domain.values)
    study_id = storage.get_study_id_from_name(loaded.spec.name)
    return _view_class()(storage, study_id, encoded)


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
    from explorer.study import check_same_job, open_storage

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

    check_same_job(load_readonly(loaded), loaded)  # the study exists and is this job (else one line)
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
    view = dashboard_view(storage, loaded)
    app = optuna_dashboard.wsgi(view, artifact_store=FileSystemArtifactStore(artifacts))
    try:
        run(app if allow_writes else read_only(app), host=host, port=port)
    except OSError as exc:  # the address is taken, or not this machine's
        raise SpecError(
            file="--port", field="", problem=f"cannot serve on {shown}:{port}: {exc.strerror or exc}"
        ) from None
