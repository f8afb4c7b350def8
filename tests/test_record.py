"""The trial and study record (:mod:`explorer.record`): what the writers put into a real sqlite
Optuna storage reads back through the typed view, under the keys stored studies already use; a
key a trial never got reads as its default."""

from __future__ import annotations

import optuna
import pytest

from explorer.measurement import Measurement, Outcome
from explorer.record import (
    CONSTRAINTS_KEY,
    Key,
    Status,
    StudyKey,
    StudyRecord,
    TrialRecord,
    enqueue,
    infeasibility,
    write,
    write_status,
    write_study,
)
from explorer.study._record import record_driver, record_outcome, record_reuse
from explorer.trial_config import TrialConfig
from tests.builders import properties


@pytest.fixture
def url(tmp_path):
    return f"sqlite:///{tmp_path / 'record.db'}"


@pytest.fixture
def study(url):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(study_name="record", storage=url, direction="maximize")


def _reload(url: str) -> optuna.Study:
    """The study as another process would read it: a storage of its own on the same file."""
    return optuna.load_study(study_name="record", storage=url)


def test_a_written_record_reads_back_typed(study, url):
    trial = study.ask()
    write(
        trial,
        {
            Key.STATUS: Status.OOM,
            Key.ERROR: "CUDA out of memory",
            Key.ATTEMPT: 2,
            Key.DRIVER: {"host": "node-1", "pid": 42, "start": 1.5},
            Key.CONFIG_KEY: "abc",
            Key.INFERRED_FROM: 3,
            Key.WAITS_FOR: 7,
            Key.PEAK_MEMORY_GIB: 12.25,
            Key.NUMBER_GPUS: 4,
            Key.GPU_MODEL: "H100",
            "batch_size": 8,
        },
        system={CONSTRAINTS_KEY: [1.0]},
    )
    study.tell(trial, 0.0)

    (frozen,) = _reload(url).get_trials()
    record = TrialRecord.of(frozen)
    assert record.number == frozen.number
    assert record.status == "oom" and record.error == "CUDA out of memory"
    assert record.attempt == 2
    assert record.driver == {"host": "node-1", "pid": 42, "start": 1.5}
    assert record.config_key == "abc"
    assert record.inferred_from == 3 and record.reused_from is None
    assert record.waits_for == 7
    assert record.peak_memory_gib == pytest.approx(12.25)
    assert record.number_gpus == 4 and record.gpu_model == "H100"
    assert record.get("batch_size") == 8 and record.fields(["batch_size", "absent"]) == {"batch_size": 8}
    assert record.answered_without_running and not record.counts  # inferred: a free answer
    assert infeasibility(frozen) == pytest.approx(1.0)
    assert frozen.system_attrs[CONSTRAINTS_KEY] == [1.0]  # the list form the dashboard reads


def test_the_stored_keys_keep_their_spelling(study, url):
    """An old study must still read: the keys go into the storage exactly as they always have."""
    trial = study.ask()
    write(
        trial,
        {
            Key.STATUS: Status.OK,
            Key.REUSED_FROM: 0,
            Key.REUSED_FROM_STORE: {"study": "other", "trial": 5},
            Key.REQUEUED_FROM: 1,
            Key.PER_GPU: 100.0,
            Key.TOTAL: 200.0,
            Key.WALL_SECONDS: 0.0,
        },
    )
    study.tell(trial, 100.0)
    (frozen,) = _reload(url).get_trials()
    assert set(frozen.user_attrs) == {
        "status",
        "reused_from",
        "reused_from_store",
        "requeued_from",
        "dataset_tokens_per_second_per_gpu",
        "dataset_tokens_per_second",
        "wall_seconds",
    }
    record = TrialRecord.of(frozen)
    assert record.reused_from == 0 and record.requeued_from == 1
    assert record.reused_from_store == {"study": "other", "trial": 5}
    assert record.per_gpu == pytest.approx(100.0) and record.total == pytest.approx(200.0)
    assert record.wall_seconds == 0.0


def test_a_record_written_by_hand_reads_as_the_view_reads_it(study, url):
    """A study written before this package (plain ``set_user_attr`` calls) reads the same."""
    trial = study.ask()
    trial.set_user_attr("status", "failed")
    trial.set_user_attr("error", "boom")
    trial.set_user_attr("attempt", 1)
    trial.set_user_attr("injected_fault", "crash")
    trial.set_user_attr("recovered", "the driver died after the trial finished")
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    record = TrialRecord.of(_reload(url).get_trials()[0])
    assert record.status == Status.FAILED and record.error == "boom" and record.attempt == 1
    assert record.injected_fault == "crash"
    assert record.recovered == "the driver died after the trial finished"
    assert record.counts  # failed for good, not a free answer


def test_missing_and_unknown_keys_read_as_their_defaults(study, url):
    trial = study.ask()
    trial.set_user_attr("driver", "not a dict")  # a value of the wrong type reads as missing
    trial.set_user_attr("peak_memory_gib", "12")
    trial.set_user_attr("some_future_key", [1, 2])
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    record = TrialRecord.of(_reload(url).get_trials()[0])
    assert record.status is None and record.error is None
    assert record.attempt == 0 and record.number_gpus == 1
    assert record.driver is None and record.peak_memory_gib is None
    assert record.config_key is None and record.proposed_by is None and record.gpu_model is None
    assert record.reused_from is None and record.inferred_from is None and record.waits_for is None
    assert record.reused_from_store is None and record.requeued_from is None
    assert record.per_gpu is None and record.wall_seconds is None and record.nodes is None
    assert not record.answered_without_running and not record.counts
    assert record.get("absent") is None and record.get("absent", 3) == 3 and not record.has("absent")
    assert record.get("some_future_key") == [1, 2]  # unknown keys are kept, read as stored
    with pytest.raises(KeyError):
        record["absent"]

    empty = StudyRecord.of(study)
    assert empty.identity is None and empty.run_folder is None and empty.n_trials is None
    assert empty.stopped_early is None and empty.doctor is None and empty.settings == {}


def test_the_view_is_read_only(study):
    trial = study.ask()
    write(trial, {Key.STATUS: Status.OK})
    record = TrialRecord.of(trial)
    with pytest.raises(TypeError):
        record.attrs[Key.STATUS] = "oom"  # type: ignore[index]
    with pytest.raises(AttributeError):
        record.number = 5  # type: ignore[misc]


def test_status_error_enqueue_and_study_record_round_trip(study, url):
    trial = study.ask()
    write_status(trial, Status.INTERRUPTED, "explorer was interrupted; re-run on resume")
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    enqueue(
        study, {"x": 1}, {Key.ATTEMPT: 1, Key.REQUEUED_FROM: trial.number, Key.REQUEUED_WHY: "interrupted"}
    )
    write_study(study, StudyKey.N_TRIALS, 12)
    write_study(study, StudyKey.STOPPED_EARLY, {"counted": 3, "why": "timeout_s ran out"})
    write_study(study, StudyKey.RUN_FOLDER, "/runs/record")

    reread = _reload(url)
    first, waiting = reread.get_trials()
    assert TrialRecord.of(first).status == "interrupted"
    assert TrialRecord.of(first).error == "explorer was interrupted; re-run on resume"
    assert waiting.state is optuna.trial.TrialState.WAITING
    queued = TrialRecord.of(waiting)
    assert queued.attempt == 1 and queued.requeued_from == first.number
    assert queued.get(Key.REQUEUED_WHY) == "interrupted"
    record = StudyRecord.of(reread)
    assert record.n_trials == 12 and record.run_folder == "/runs/record"
    assert record.stopped_early == {"counted": 3, "why": "timeout_s ran out"}
    assert reread.user_attrs == {
        "n_trials": 12,
        "stopped_early": record.stopped_early,
        "run_folder": "/runs/record",
    }


def test_the_recording_code_writes_what_the_view_reads(study, url):
    """``record_driver``, ``record_outcome`` and ``record_reuse`` (the study's writers) read back
    through the view: a measured trial counts, its reuse does not."""
    config = TrialConfig(
        model_max_length=64,
        batch_size=4,
        number_gpus=1,
        distributed_backend="NONE",
        gradient_checkpointing=False,
    )
    measured = study.ask()
    record_driver(measured, config, attempt=0)
    measurement = Measurement(
        outcome=Outcome.OK, properties=properties(250.0, peak_memory_gib=3.0), wall_seconds=1.25
    )
    record_outcome(study, measured, measurement)
    source = _reload(url).get_trials()[0]
    repeat = study.ask()
    record_driver(repeat, config, attempt=0)
    assert record_reuse(study, repeat, source) == "ok"

    first, second = (TrialRecord.of(t) for t in _reload(url).get_trials())
    assert first.status == Status.OK and first.counts and not first.answered_without_running
    assert first.config_key == config.key() and first.attempt == 0 and first.driver is not None
    assert first.per_gpu == pytest.approx(250.0) and first.peak_memory_gib == pytest.approx(3.0)
    assert first.wall_seconds == pytest.approx(1.25)
    assert second.status == Status.OK and second.reused_from == first.number
    assert second.answered_without_running and not second.counts
    assert second.per_gpu == pytest.approx(250.0) and second.wall_seconds == 0.0


def test_only_the_record_package_touches_user_attrs():
    """``grep -rl user_attrs explorer``: the record package alone reads and writes them."""
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "explorer"
    touching = sorted(
        str(p.relative_to(package.parent)) for p in package.rglob("*.py") if "user_attrs" in p.read_text()
    )
    assert touching and all(p.startswith("explorer/record/") for p in touching), touching


def test_the_record_package_imports_nothing_of_explorers():
    """Low in the layering: every module above may read the record, and it reads none of them
    (lazy and type-only imports included)."""
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "explorer" / "record"
    imported = set()
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                imported.add(node.module or "")
    theirs = {
        n for n in imported if n.split(".")[0] == "explorer" and n.split(".")[:2] != ["explorer", "record"]
    }
    assert "optuna" in imported and not theirs, sorted(theirs)
