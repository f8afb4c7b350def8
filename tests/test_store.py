"""The measurement store: measurements reused across studies in one storage (real sqlite files)."""

from __future__ import annotations

import csv
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from explorer.job import TrialJob
from explorer.launch import ReplayLauncher
from explorer.measurement import Measurement, Outcome, Properties
from explorer.spec import LoadedStudy
from explorer.store import TABLE_NAME, MeasurementStore, StoreScope, hardware_key, workload_key
from explorer.study import config_of, open_study, optimize, status_of
from explorer.study._confirm import verdict_lines
from explorer.study._run_folder import MARKER
from explorer.study_file import load_study
from tests.builders import properties

SCOPE = StoreScope(workload_key="w" * 16, hardware_key="h" * 16)


def _props(value: float) -> Properties:
    return properties(value)


def _store(tmp_path: Path) -> MeasurementStore:
    return MeasurementStore(engine=sa.create_engine(f"sqlite:///{tmp_path}/store.db"))


def _put(store: MeasurementStore, m: Measurement, *, key: str = "cfg", scope: StoreScope = SCOPE, n: int = 0):
    store.put(config_key=key, scope=scope, measurement=m, study_name="a", trial_number=n)


def test_put_then_lookup_gives_the_measurement_back(tmp_path):
    store = _store(tmp_path)
    ok = Measurement(outcome=Outcome.OK, properties=_props(123.5), wall_seconds=7.0, extra={"node": "n1"})
    _put(store, ok, n=3)
    _put(store, Measurement(outcome=Outcome.OOM, error="out of memory"), key="big", n=4)
    hit = store.lookup(config_key="cfg", scope=SCOPE)
    assert hit is not None and hit.measurement == ok
    assert (hit.study_name, hit.trial_number) == ("a", 3)
    oom = store.lookup(config_key="big", scope=SCOPE)
    assert oom is not None and oom.measurement.outcome is Outcome.OOM and oom.trial_number == 4
    # the table lives in the database itself, where any other study of the storage finds it
    again = MeasurementStore(engine=sa.create_engine(f"sqlite:///{tmp_path}/store.db"))
    assert again.count() == 2 and sa.inspect(again.engine).has_table(TABLE_NAME)
    with again.engine.connect() as conn:
        value, status = conn.execute(sa.text(f"SELECT value, status FROM {TABLE_NAME} WHERE id = 1")).one()
    assert (value, status) == (123.5, "ok")


@pytest.mark.parametrize("outcome", [Outcome.FAILED, Outcome.INVALID])
def test_failed_and_invalid_outcomes_are_refused(tmp_path, outcome):
    store = _store(tmp_path)
    with pytest.raises(ValueError, match="only ok and oom"):
        _put(store, Measurement(outcome=outcome, error="boom"))
    with pytest.raises(ValueError, match="without properties"):
        _put(store, Measurement(outcome=Outcome.OK))
    assert store.count() == 0 and store.lookup(config_key="cfg", scope=SCOPE) is None


def test_another_configuration_workload_or_hardware_misses_and_the_newest_wins(tmp_path):
    store = _store(tmp_path)
    _put(store, Measurement(outcome=Outcome.OK, properties=_props(100.0)), n=1)
    assert store.lookup(config_key="other", scope=SCOPE) is None
    assert (
        store.lookup(config_key="cfg", scope=StoreScope(workload_key="x" * 16, hardware_key="h" * 16)) is None
    )
    assert (
        store.lookup(config_key="cfg", scope=StoreScope(workload_key="w" * 16, hardware_key="x" * 16)) is None
    )
    time.sleep(0.01)
    _put(store, Measurement(outcome=Outcome.OK, properties=_props(200.0)), n=2)
    hit = store.lookup(config_key="cfg", scope=SCOPE)
    assert hit is not None and hit.trial_number == 2
    assert hit.measurement.properties is not None
    assert hit.measurement.properties.dataset_tokens_per_second_per_gpu == 200.0


def test_keys_follow_the_workload_the_measurement_and_the_hardware(write_study, tmp_path):
    base = load_study(write_study({"name": "one"}))
    renamed = load_study(write_study({"name": "two", "measurement": {"trial_timeout_s": 999}}, name="b.yaml"))
    assert workload_key(base) == workload_key(renamed) and hardware_key(base) == hardware_key(renamed)
    longer = load_study(write_study({"measurement": {"warmup_steps": 2}}, name="c.yaml"))
    lora = load_study(write_study({"workload": {"method": {"kind": "lora"}}}, name="d.yaml"))
    assert len({workload_key(base), workload_key(longer), workload_key(lora)}) == 3
    # the same numbers, another stop rule: `steps` when measured_steps is given, else `steady`
    steady = load_study(write_study({"measurement": {"measured_steps": None}}, name="e.yaml"))
    assert steady.spec.measurement.rule == "steady" and workload_key(steady) != workload_key(base)
    capped = load_study(write_study({"resources": {"device_memory_gib": 1.0}}, name="f.yaml"))
    other_gpu = load_study(write_study({"resources": {"gpu_model": "X"}}, name="g.yaml"))
    assert len({hardware_key(base), hardware_key(capped), hardware_key(other_gpu)}) == 3
    assert workload_key(capped) == workload_key(base)


# -- studies over a replay table ------------------------------------------------------------------

RECORDED = {(4, False): 300.0, (4, True): 250.0, (8, False): 280.0, (8, True): 240.0, (32, True): 150.0}
"""Throughput per (batch_size, gradient_checkpointing); (32, False) is an OOM row, bs 64 is absent."""


def _table(path: Path, extra_rows: int = 0) -> Path:
    rows = [
        dict(batch_size=bs, gradient_checkpointing=ckpt, dataset_tokens_per_second_per_gpu=v, is_valid=1)
        for (bs, ckpt), v in RECORDED.items()
    ]
    rows.append(
        dict(batch_size=32, gradient_checkpointing=False, dataset_tokens_per_second_per_gpu=0, is_valid=0)
    )
    rows += [
        dict(batch_size=128 + i, gradient_checkpointing=True, dataset_tokens_per_second_per_gpu=1, is_valid=1)
        for i in range(extra_rows)
    ]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=[*rows[0], "model_name", "gpu_model", "number_gpus"])
        writer.writeheader()
        writer.writerows(
            r | dict(model_name="tiny-llama", gpu_model="CPU-logical", number_gpus=1) for r in rows
        )
    return path


class RecordingReplay(ReplayLauncher):
    """The real replay launcher, remembering which configurations it was asked to answer."""

    def __init__(self, loaded: LoadedStudy) -> None:
        assert loaded.replay_table is not None
        super().__init__(table=loaded.replay_table, total_gpus=loaded.spec.resources.total_gpus)
        self.submitted: list[str] = []

    def submit(self, job: TrialJob) -> None:
        self.submitted.append(job.config.key())
        super().submit(job)


def _replay_study(write_study, tmp_path: Path, name: str, table: str = "table.csv", **patch) -> LoadedStudy:
    path = write_study(
        {
            "name": name,
            "storage": f"sqlite:///{tmp_path}/shared.db",
            "n_trials": 8,
            "sampler": {"kind": "grid", "seed": 0},
            "infer_oom": False,
            "launcher": {"kind": "replay", "table": table, "max_retries": 0},
            "search_space": {
                "parameters": {
                    "batch_size": {"values": [4, 8, 32, 64]},
                    "number_gpus": 1,
                    "gradient_checkpointing": {"choices": [False, True]},
                }
            },
            **patch,
        },
        name=f"{name}.yaml",
    )
    return load_study(path)


def _run(loaded: LoadedStudy) -> tuple[RecordingReplay, list[str], dict[str, int]]:
    launcher = RecordingReplay(loaded)
    lines: list[str] = []
    result = optimize(loaded, printer=lines.append, launcher=launcher)
    assert result.counted == loaded.spec.n_trials
    return launcher, lines, result.statuses


def test_a_second_study_is_answered_from_the_store_and_runs_only_what_failed(write_study, tmp_path):
    _table(tmp_path / "table.csv")
    a = _replay_study(write_study, tmp_path, "a")
    launcher_a, _, statuses_a = _run(a)
    assert len(launcher_a.submitted) == 8 and statuses_a == {"ok": 5, "oom": 1, "failed": 2}
    trials_a = {t.user_attrs["config_key"]: t for t in open_study(a, create=False).get_trials()}
    absent = {k for k, t in trials_a.items() if status_of(t) == "failed"}
    assert {config_of(trials_a[k]).batch_size for k in absent} == {64}

    b = _replay_study(write_study, tmp_path, "b")
    launcher_b, lines_b, statuses_b = _run(b)
    # only the configurations that failed in A were launched again; a failure is never reused
    assert sorted(launcher_b.submitted) == sorted(absent)
    assert statuses_b == {"stored": 6, "failed": 2}
    assert sum(" started: " in line for line in lines_b) == 2
    assert sum("from the store: study 'a' trial" in line for line in lines_b) == 6
    trials_b = open_study(b, create=False).get_trials()
    for t in trials_b:
        key = t.user_attrs["config_key"]
        if key in absent:
            assert status_of(t) == "failed" and "reused_from_store" not in t.user_attrs
            continue
        source = trials_a[key]
        assert t.user_attrs["reused_from_store"] == {"study": "a", "trial": source.number}
        assert status_of(t) == status_of(source) and t.values == source.values
        assert t.constraints == source.constraints and t.user_attrs["wall_seconds"] == 0.0
        if status_of(t) == "ok":
            c = config_of(t)
            assert t.values[0] == RECORDED[(c.batch_size, c.gradient_checkpointing)]
            assert t.user_attrs["replay_lines"] == source.user_attrs["replay_lines"]
    # B's answers count, and B's best is A's best configuration
    assert open_study(b, create=False).best_trial.value == max(RECORDED.values())

    # the export says where each answer came from
    from explorer.export import export_rows

    rows = export_rows(b)  # one row per finished trial: 6 from the store, 2 failed
    stored = [r for r in rows if r["status"] != "failed"]
    assert len(rows) == 8 and len(stored) == 6
    assert all(r["reused_from_store"].startswith("a:") for r in stored)
    assert all(r["reused_from_store"] == "" for r in rows if r["status"] == "failed")

    # reuse_measurements: false: C runs everything, and leaves the store as it was
    store = MeasurementStore(engine=sa.create_engine(f"sqlite:///{tmp_path}/shared.db"))
    assert store.count() == 6  # A's six measurements; B measured nothing new that could be stored
    c = _replay_study(write_study, tmp_path, "c", reuse_measurements=False)
    launcher_c, _, statuses_c = _run(c)
    assert len(launcher_c.submitted) == 8 and statuses_c == statuses_a
    assert not any("reused_from_store" in t.user_attrs for t in open_study(c, create=False).get_trials())
    assert store.count() == 6

    # another table is other hardware, even for the same configurations: D runs everything
    _table(tmp_path / "other.csv", extra_rows=1)
    d = _replay_study(write_study, tmp_path, "d", table="other.csv")
    launcher_d, _, statuses_d = _run(d)
    assert len(launcher_d.submitted) == 8 and statuses_d == statuses_a
    assert store.count() == 12


def test_an_in_memory_study_has_no_store(write_study, tmp_path):
    """benchmark-search replays in Optuna's in-memory storage: nothing is written next to it."""
    import optuna

    _table(tmp_path / "table.csv")
    a = _replay_study(write_study, tmp_path, "a")
    _run(a)
    b = _replay_study(write_study, tmp_path, "b")
    launcher = RecordingReplay(b)
    result = optimize(b, printer=lambda _: None, launcher=launcher, storage=optuna.storages.InMemoryStorage())
    assert len(launcher.submitted) == 8 and "stored" not in result.statuses


# -- the must-show: real trials on the CPU worker --------------------------------------------------


@pytest.mark.slow  # a real multi-trial study: in `make test-slow` (CI runs it after `make test`)
def test_a_second_study_reuses_real_measurements_and_runs_nothing(write_study, tmp_path):
    """Study A measures three configurations with real torchrun workers (Ray, CPU); study B, over
    the same configurations in the same storage, is answered entirely from the store: no trial is
    started, no log is written, Ray is never initialised, and every figure is A's to the bit."""
    import ray

    def study(name: str) -> LoadedStudy:
        return load_study(
            write_study(
                {
                    "name": name,
                    "storage": f"sqlite:///{tmp_path}/shared.db",
                    "n_trials": 3,
                    "sampler": {"kind": "grid", "seed": 0},
                    "search_space": {
                        "parameters": {
                            "batch_size": {"values": [4, 8, 2048]},  # 2048: OOM under the 0.5 GiB cap
                            "number_gpus": 1,
                            "gradient_checkpointing": False,
                        }
                    },
                },
                name=f"{name}.yaml",
            )
        )

    a = study("a")
    lines_a: list[str] = []
    result_a = optimize(a, printer=lines_a.append)
    assert result_a.statuses == {"ok": 2, "oom": 1}, lines_a
    assert sum(" started: " in line for line in lines_a) == 3
    trials_a = {t.user_attrs["config_key"]: t for t in open_study(a, create=False).get_trials()}
    assert not ray.is_initialized()  # A's launcher started Ray and shut it down

    b = study("b")
    lines_b: list[str] = []
    result_b = optimize(b, printer=lines_b.append)
    assert result_b.counted == 3 and result_b.statuses == {"stored": 3}
    assert not any(" started: " in line for line in lines_b), lines_b
    assert sum("from the store: study 'a'" in line for line in lines_b) == 3
    assert not ray.is_initialized()
    # B claimed its run folder (the marker) but wrote no trial into it, not even a confirmation job
    assert [p.name for p in b.output_dir.iterdir()] == [MARKER], "\n".join(lines_b)
    (line,) = verdict_lines(open_study(b, create=False), "b.yaml")  # a rival within noise, or none
    assert line.startswith("clear: ") or line.startswith("not confirmed (never confirmed)"), line
    assert (
        line.startswith("clear: ")
        or "set confirm_budget_gpu_s in b.yaml (its answers came from the measurement store" in line
    ), line
    assert (a.output_dir / "trial-00000" / "train.log").is_file()
    trials_b = open_study(b, create=False).get_trials()
    assert {t.user_attrs["config_key"] for t in trials_b} == set(trials_a)
    for t in trials_b:
        source = trials_a[t.user_attrs["config_key"]]
        assert t.user_attrs["reused_from_store"] == {"study": "a", "trial": source.number}
        assert status_of(t) == status_of(source) and t.values == source.values
        if status_of(t) == "ok":
            assert t.values[0] > 0
            # the same measurement, not a new one: step times and phases are A's, to the bit
            for attr in ("train_runtime", "step_times", "phases", "fingerprint", "peak_memory_gib"):
                assert t.user_attrs[attr] == source.user_attrs[attr], attr
