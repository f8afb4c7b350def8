"""optuna-dashboard, started on a study's storage, serves the trials with explorer's user_attrs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
import pytest

from explorer.launch._command import free_port
from explorer.measurement import Measurement, Outcome, Properties
from explorer.study import record_outcome
from tests.builders import properties, start_dashboard


def _props(value: float) -> Properties:
    return properties(
        value,
        train_runtime=5.0,
        train_samples_per_second=10.0,
        train_steps_per_second=1.0,
        peak_memory_gib=0.3,
        peak_memory_allocated_gib=0.3,
        measured_seconds=3.0,
        warmup_seconds=1.0,
        step_time_mean=1.0,
        step_time_rel_ci=0.02,
        stop_reason="stable",
        hfu=0.1,
        system={},
        measured_dataset_tokens=int(6 * value),
        measured_train_tokens=int(9 * value),
        measured_samples=30,
    )


def _study_detail(base: str, name: str, server: subprocess.Popen) -> tuple[int, dict]:
    """The id and detail of study ``name`` as the dashboard at ``base`` serves it, once the
    server answers."""
    deadline = time.monotonic() + 60
    while True:
        try:
            studies = _get(f"{base}/api/studies")
            break
        except OSError:
            assert server.poll() is None and time.monotonic() < deadline, "dashboard did not start"
            time.sleep(0.5)
    [summary] = [s for s in studies["study_summaries"] if s["study_name"] == name]
    return summary["study_id"], _get(f"{base}/api/studies/{summary['study_id']}?after=0")


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_dashboard_serves_trials_and_user_attrs(tmp_path):
    url = f"sqlite:///{tmp_path}/d.db"
    study = optuna.create_study(study_name="dash", storage=url, direction="maximize")
    for m in (
        Measurement(
            outcome=Outcome.OK, properties=_props(1234.5), extra={"wrapper": "DistributedDataParallel"}
        ),
        Measurement(outcome=Outcome.OOM, error="DefaultCPUAllocator: can't allocate memory"),
        Measurement(outcome=Outcome.INVALID, error="batch_size 6 is not divisible by number_gpus 4"),
        Measurement(outcome=Outcome.FAILED, error="NCCL error"),
    ):
        trial = study.ask()
        trial.suggest_int("batch_size", 1, 64)
        record_outcome(study, trial, m)

    port = free_port()
    server = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "optuna-dashboard"),
            url,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        _, detail = _study_detail(base, "dash", server)
        trials = detail["trials"]
        assert len(trials) == 4
        attrs = [{a["key"]: a["value"] for a in t["user_attrs"]} for t in trials]
        assert [a["status"] for a in attrs] == ["ok", "oom", "invalid", "failed"]
        assert attrs[0]["dataset_tokens_per_second_per_gpu"] == "1234.5"
        assert "can't allocate memory" in attrs[1]["error"]
        assert [t["state"] for t in trials] == ["Complete", "Complete", "Complete", "Fail"]
        assert trials[0]["values"] == [1234.5] and trials[1]["values"] == [0.0]
        # the constraint in the form the dashboard reads: oom and invalid infeasible (> 0)
        assert [t["constraints"] for t in trials] == [[0.0], [1.0], [1.0], []]
        assert "### Trial 1: oom" in trials[1]["note"]["body"] and "Infeasible" in trials[1]["note"]["body"]
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_explorer_dashboard_serves_trials_user_attrs_and_artifacts(write_study, tmp_path):
    """`explorer dashboard STUDY.yaml`: the study's trials, explorer's user_attrs and the artifacts
    in <output_dir>/artifacts, over the dashboard's HTTP API, on 127.0.0.1."""
    from optuna.artifacts import FileSystemArtifactStore, upload_artifact

    from explorer.dashboard import artifact_dir
    from explorer.study import open_study
    from explorer.study_file import load_study

    path = write_study({"storage": f"sqlite:///{tmp_path}/s.db", "output_dir": str(tmp_path / "runs")})
    loaded = load_study(path)
    study = open_study(loaded, create=True)
    for m in (
        Measurement(outcome=Outcome.OK, properties=_props(2345.5), extra={"log_file": "/x/train.log"}),
        Measurement(outcome=Outcome.FAILED, error="rank 0: NCCL error"),
    ):
        trial = study.ask()
        trial.suggest_int("batch_size", 1, 64)
        record_outcome(study, trial, m)
    figure = tmp_path / "history.txt"
    figure.write_text("a figure")
    store_dir = artifact_dir(loaded)
    store_dir.mkdir(parents=True)
    artifact_id = upload_artifact(
        artifact_store=FileSystemArtifactStore(store_dir),
        file_path=str(figure),
        study_or_trial=study,  # as `explorer report` keeps its figures: on the study
    )

    port = free_port()
    server = start_dashboard(path, port)
    try:
        assert server.stdout is not None
        first = server.stdout.readline()
        assert first.startswith(f"dashboard: http://127.0.0.1:{port}/dashboard/"), first
        base = f"http://127.0.0.1:{port}"
        study_id, detail = _study_detail(base, "test", server)
        trials = detail["trials"]
        attrs = [{a["key"]: a["value"] for a in t["user_attrs"]} for t in trials]
        assert [a["status"] for a in attrs] == ["ok", "failed"]
        assert attrs[0]["dataset_tokens_per_second_per_gpu"] == "2345.5"
        assert attrs[0]["log_file"] == "/x/train.log" and "NCCL error" in attrs[1]["error"]
        [artifact] = detail["artifacts"]
        assert artifact["artifact_id"] == artifact_id and artifact["filename"] == "history.txt"
        with urllib.request.urlopen(f"{base}/artifacts/{study_id}/{artifact_id}", timeout=10) as r:
            assert r.read() == b"a figure"
    finally:
        server.terminate()
        server.wait(timeout=10)


def _wsgi_get(app, path: str, query: str = "") -> dict:
    """GET ``path`` from optuna-dashboard's own web app (its WSGI callable), as the browser would."""
    from wsgiref.util import setup_testing_defaults

    environ: dict = {"PATH_INFO": path, "QUERY_STRING": query}
    setup_testing_defaults(environ)
    status: list[str] = []
    body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
    assert status == ["200 OK"], (path, status, body[:500])
    return json.loads(body)


def test_a_replayed_quickstart_reads_right_in_the_dashboard(tmp_path):
    """A study of the CPU quickstart space, replayed from its measured table (no training) into
    sqlite, read through optuna-dashboard's own web app: OOM and invalid trials carry a
    constraint > 0 (the dashboard's "infeasible"), feasible ones constraints <= 0; each trial's
    note gives batch_size in user units beside Optuna's ``log2_batch_size``; the study's user attrs
    and note say model, method, dataset, GPU model and device memory."""
    import dataclasses

    import optuna_dashboard

    from explorer.spec import SamplerSpec
    from explorer.study import optimize
    from explorer.study_file import load_study

    root = Path(__file__).resolve().parents[1]
    loaded = load_study(
        root / "studies" / "cpu-table.yaml",
        replay_table=root / "benchmarks" / "results" / "tables" / "cpu-quickstart.csv",
    )
    # random proposals (seed 6) reach OOM and invalid (FSDP2 without sharding) configurations
    sampler = SamplerSpec(kind="random", seed=6, local_search=False, frontier_start=False)
    spec = loaded.spec.model_copy(update={"n_trials": 10, "infer_oom": True, "sampler": sampler})
    url = f"sqlite:///{tmp_path}/quickstart.db"
    optimize(
        dataclasses.replace(loaded, spec=spec),
        printer=lambda _: None,
        storage=optuna.storages.RDBStorage(url),
        write_ahead=False,
    )

    app = optuna_dashboard.wsgi(url)
    [summary] = _wsgi_get(app, "/api/studies")["study_summaries"]
    detail = _wsgi_get(app, f"/api/studies/{summary['study_id']}", "after=0")

    study_attrs = {a["key"]: a["value"] for a in detail["user_attrs"]}
    assert "tiny-llama" in study_attrs["model"] and study_attrs["method"] == "full"
    assert study_attrs["dataset"].startswith("synthetic") and "4096 entries" in study_attrs["dataset"]
    assert study_attrs["gpu_model"] == "CPU-logical" and study_attrs["device"] == "cpu"
    assert float(study_attrs["device_memory_gib"]) == pytest.approx(0.5)
    study_note = detail["note"]["body"]
    assert "CPU-logical" in study_note and "explorer report" in study_note

    by_status: dict[str, list[dict]] = {}
    for t in detail["trials"]:
        attrs = {a["key"]: a["value"] for a in t["user_attrs"]}
        by_status.setdefault(attrs["status"], []).append(t)
        assert t["state"] == "Complete"
        if attrs["status"] in ("oom", "invalid"):
            assert t["constraints"] and max(t["constraints"]) > 0, t["number"]
            assert "**Infeasible**" in t["note"]["body"]
        else:
            assert t["constraints"] and all(c <= 0 for c in t["constraints"]), t["number"]
        # the parameter in user units: log2_batch_size p is batch_size 2**p, in the trial's note
        [log2] = [p for p in t["params"] if p["name"] == "log2_batch_size"]
        batch = 2 ** int(log2["param_external_value"])
        assert int(attrs["batch_size"]) == batch
        assert (
            f"| batch_size | {batch} | `log2_batch_size` = {log2['param_external_value']} |"
            in (t["note"]["body"])
        )
    assert by_status.keys() >= {"ok", "oom", "invalid"}, by_status.keys()

    # Optuna's samplers see the same constraint: one value, infeasible above 0
    study = optuna.load_study(study_name="cpu-table", storage=url)
    for t in study.trials:
        assert list(t.constraints.values()) == [0.0 if t.user_attrs["status"] == "ok" else 1.0]
    assert study.best_trial.user_attrs["status"] == "ok"


def test_the_study_note_is_written_once_and_an_edit_in_the_dashboard_is_kept(write_study, tmp_path):
    from optuna_dashboard import get_note, save_note

    from explorer.study import open_study
    from explorer.study._notes import describe_study
    from explorer.study_file import load_study

    loaded = load_study(write_study({"storage": f"sqlite:///{tmp_path}/n.db"}))
    study = open_study(loaded, create=True)
    describe_study(study, loaded)
    assert (
        "explorer report" in get_note(study)
        and study.user_attrs["gpu_model"] == loaded.spec.resources.gpu_model
    )
    save_note(study, "my own words")
    describe_study(study, loaded)
    assert get_note(study) == "my own words"


def test_audit_flags_an_oom_trial_that_the_dashboard_would_show_as_feasible(tmp_path):
    from explorer.study import audit

    study = optuna.create_study(study_name="a", storage=f"sqlite:///{tmp_path}/a.db", direction="maximize")
    for outcome in (Outcome.OOM, Outcome.INVALID):
        trial = study.ask()
        trial.suggest_int("log2_batch_size", 0, 6)
        record_outcome(study, trial, Measurement(outcome=outcome, error="out of memory or invalid"))
    assert audit(study, n_trials=3, max_retries=1, output_dir=None).problems == [
        "2 trials counted, n_trials is 3"
    ]
    # an OOM told without its constraint: a real-looking 0 in the dashboard
    trial = study.ask()
    trial.suggest_int("log2_batch_size", 0, 6)
    trial.set_user_attr("status", "oom")
    trial.set_user_attr("error", "out of memory")
    trial.set_user_attr("config_key", "another configuration")
    study.tell(trial, [0.0])
    assert audit(study, n_trials=3, max_retries=1, output_dir=None).problems == [
        "trial 2: oom but its constraint does not mark it infeasible"
    ]


def test_a_trial_note_written_at_once_reads_back_as_save_note_would_leave_it(storage_url):
    """The trial note explorer writes in one transaction (explorer.study._notes) is what
    optuna-dashboard's own ``save_note`` would store: a long note in chunks, a shorter one after it
    with the version one up and no stale chunk; the other trial's note and the study's untouched."""
    from optuna_dashboard import get_note, save_note
    from optuna_dashboard._note import SYSTEM_ATTR_MAX_LENGTH

    from explorer.study._notes import _save_note_at_once

    study = optuna.create_study(storage=storage_url)
    first, second = study.ask(), study.ask()
    save_note(study, "the study's")
    save_note(second, "the second's")
    long = "x" * (2 * SYSTEM_ATTR_MAX_LENGTH + 5)
    assert _save_note_at_once(study, first._trial_id, long)
    assert get_note(first) == long
    assert _save_note_at_once(study, first._trial_id, "short")
    attrs = study._storage.get_study_system_attrs(study._study_id)
    assert get_note(first) == "short" and attrs[f"dashboard:{first._trial_id}:note_ver"] == 2
    save_note(first, "an edit in the dashboard")  # the dashboard's own next version still fits
    assert get_note(first) == "an edit in the dashboard"
    assert get_note(second) == "the second's" and get_note(study) == "the study's"
