"""The shared storage suite: every test here runs against each storage backend, sqlite files and a
real PostgreSQL server (``tests/_postgres.py``), through the ``storage_url`` fixture of
``tests/conftest.py`` (the way Optuna's own tests parametrize over its storages).

It holds the optimize spine end to end (real Optuna, real Ray actors, real torchrun on the CPU):
ok / OOM / invalid outcomes and resume, a failed trial retried then failed, and resume after a
SIGKILL of the driver; the replay launcher's path; the measurement store; the one-transaction
user-attribute upsert; and what only a server database has: two ``explorer optimize`` processes
sharing one study, and credentials that never leave the URL.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from explorer.secrets import mask_url
from explorer.study import (
    config_of,
    counted_trials,
    open_storage,
    open_study,
    optimize,
    status_of,
)
from explorer.study_file import load_study
from explorer.trial_config import TrialConfig
from tests._postgres import PASSWORD
from tests.builders import run_cli
from tests.conftest import merge

REPO = Path(__file__).resolve().parents[1]


def _enqueue(loaded, configs: list[TrialConfig]) -> None:
    study = open_study(loaded, create=True)
    for c in configs:
        study.enqueue_trial(loaded.space.params_for(c))


def _cfg(**kw) -> TrialConfig:
    base = dict(batch_size=4, number_gpus=1, distributed_backend="NONE", gradient_checkpointing=False)
    return TrialConfig(model_max_length=64, **(base | kw))


# -- the optimize spine on real workers ------------------------------------------------------------


@pytest.mark.slow_postgresql
def test_optimize_records_ok_oom_invalid_and_resumes_without_starting_over(write_study, storage_url):
    path = write_study(
        {
            "storage": storage_url,
            "n_trials": 4,
            "search_space": {
                "parameters": {
                    "batch_size": {"values": [3, 4, 8, 1024]},
                    "number_gpus": {"values": [1, 2]},
                    "distributed_backend": {"choices": ["DDP", "FSDP"]},
                    "fsdp_version": {"choices": [1, 2]},
                    "fsdp_sharding_strategy": {"choices": ["FULL_SHARD", "SHARD_GRAD_OP"]},
                    "gradient_checkpointing": {"choices": [False, True]},
                }
            },
        }
    )
    loaded = load_study(path)
    fsdp = _cfg(
        number_gpus=2, distributed_backend="FSDP", fsdp_version=1, fsdp_sharding_strategy="FULL_SHARD"
    )
    _enqueue(
        loaded,
        [
            _cfg(number_gpus=2, distributed_backend="DDP", batch_size=3),  # invalid: 3 % 2
            _cfg(batch_size=1024),  # OOM under the 0.5 GiB cap
            fsdp,
            fsdp,  # proposed again: answered from the first measurement, not run, not counted
            _cfg(batch_size=8),
        ],
    )
    lines: list[str] = []
    result = optimize(loaded, printer=lines.append)
    assert result.counted == 4
    assert result.statuses == {"invalid": 1, "oom": 1, "ok": 2, "reused": 1}
    study = open_study(loaded, create=False)
    reused = [t for t in study.get_trials() if "reused_from" in t.user_attrs]
    assert len(reused) == 1 and reused[0].user_attrs["config_key"] == fsdp.key()
    original = study.trials[reused[0].user_attrs["reused_from"]]
    assert reused[0].value == original.value and reused[0].user_attrs["wall_seconds"] == 0.0
    # headline figures only; reused_from leads to the rest (each attribute is a storage commit)
    assert reused[0].user_attrs["status"] == status_of(original)
    assert "train_runtime" in original.user_attrs and "train_runtime" not in reused[0].user_attrs
    assert not (loaded.output_dir / f"trial-{reused[0].number:05d}").exists()
    trials = {t.user_attrs["config_key"]: t for t in study.get_trials() if "reused_from" not in t.user_attrs}
    assert len(trials) == 4

    invalid = next(t for t in trials.values() if status_of(t) == "invalid")
    assert "batch_size 3 is not divisible by number_gpus 2" in invalid.user_attrs["error"]
    assert invalid.state == optuna.trial.TrialState.COMPLETE and invalid.system_attrs["constraints"] == [1.0]
    assert invalid.user_attrs["is_valid"] == 0 and invalid.user_attrs["wall_seconds"] == 0
    assert not (loaded.output_dir / f"trial-{invalid.number:05d}").exists()  # never launched

    oom = next(t for t in trials.values() if status_of(t) == "oom")
    assert oom.user_attrs["batch_size"] == 1024 and "can't allocate memory" in oom.user_attrs["error"]
    assert oom.state == optuna.trial.TrialState.COMPLETE and oom.system_attrs["constraints"] == [1.0]
    assert oom.value == 0.0

    ok = trials[fsdp.key()]
    assert config_of(ok) == fsdp
    assert status_of(ok) == "ok" and ok.system_attrs["constraints"] == [0.0]
    assert ok.value == pytest.approx(ok.user_attrs["dataset_tokens_per_second_per_gpu"]) and ok.value > 0
    assert ok.user_attrs["wrapper"] == "FullyShardedDataParallel:FULL_SHARD"
    assert ok.user_attrs["number_gpus"] == 2 and ok.user_attrs["is_valid"] == 1
    assert (loaded.output_dir / f"trial-{ok.number:05d}" / "train.log").is_file()
    slot = ok.user_attrs["slot"]  # the Ray launcher's wall-clock hold of the trial's GPUs
    assert (slot["clock"], slot["gpus"], slot["pool"]) == ("wall", 2, 2)
    assert slot["end"] - slot["start"] >= 0.9 * ok.user_attrs["wall_seconds"] > 0
    assert "slot" not in invalid.user_attrs and "slot" not in reused[0].user_attrs
    assert study.best_trial.number in {t.number for t in trials.values() if status_of(t) == "ok"}
    assert any("[  4/4]" in line for line in lines)

    # Running again with the same n_trials adds nothing; a larger n_trials continues.
    again = optimize(load_study(path), printer=lines.append)
    assert again.counted == 4 and len(open_study(loaded, create=False).trials) == 5
    more = optimize(load_study(path, n_trials=5), printer=lines.append)
    assert more.counted == 5 and len(counted_trials(open_study(loaded, create=False))) == 5


@pytest.mark.slow_postgresql
def test_failed_trial_is_retried_then_failed(write_study, storage_url):
    path = write_study(
        {
            "storage": storage_url,
            "n_trials": 1,
            "launcher": {"max_retries": 1},
            # device auto: the study cannot know the device, the rank finds itself on the CPU
            "resources": {"device": "auto"},
            "search_space": {
                "parameters": {
                    "batch_size": 4,
                    "number_gpus": 1,
                    "gradient_checkpointing": False,
                    "attn_implementation": "flash_attention_2",
                }
            },
        }
    )
    loaded = load_study(path)
    result = optimize(loaded, printer=lambda _: None)
    assert result.counted == 1
    trials = open_study(loaded, create=False).get_trials()
    assert [status_of(t) for t in trials] == ["retry", "failed"]
    assert all(t.state == optuna.trial.TrialState.FAIL for t in trials)
    assert trials[1].user_attrs["requeued_from"] == 0 and trials[1].user_attrs["attempt"] == 1
    assert "'flash_attention_2' needs a CUDA device" in trials[1].user_attrs["error"]


def _worker_pids(exclude: frozenset[int] = frozenset()) -> set[int]:
    """Training processes and warm-start zygotes (their command line names explorer.worker)."""
    import psutil

    pids = set()
    for p in psutil.process_iter(["pid", "cmdline"]):
        if "explorer.worker" in " ".join(p.info["cmdline"] or []):
            pids.add(p.pid)
    return pids - exclude


@pytest.mark.slow  # a real multi-trial study: in `make test-slow` (CI runs it after `make test`)
def test_resume_after_sigkill_of_the_driver(write_study, tmp_path, storage_url):
    """SIGKILL `explorer optimize` mid-trial; the rerun re-measures that configuration."""
    path = write_study(
        {
            "storage": storage_url,
            "n_trials": 3,
            "measurement": {"warmup_steps": 1, "stop": "seconds", "stop_after_seconds": 6},
            "search_space": {
                "parameters": {
                    "batch_size": {"values": [4, 8]},
                    "number_gpus": 1,
                    "gradient_checkpointing": {"choices": [False, True]},
                }
            },
        }
    )
    # zygotes of earlier tests in this pytest process are theirs, not the driver's
    before = frozenset(_worker_pids())
    cmd = [sys.executable, "-m", "explorer", "optimize", str(path)]
    log = (tmp_path / "driver.log").open("wb")  # a file, not a pipe nobody reads
    driver = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    loaded = load_study(path)
    deadline = time.monotonic() + 240
    running: list = []
    while time.monotonic() < deadline and driver.poll() is None:
        if not storage_url.startswith("sqlite") or Path(tmp_path / "s.db").exists():
            try:
                study = open_study(loaded, create=False)
                running = study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
                # asked and tagged are two commits: wait for the tag (config_key, driver)
                running = [t for t in running if "config_key" in t.user_attrs]
            except Exception:  # the study may not exist yet, or the database is busy
                running = []
            if running and _worker_pids(before):
                break
        time.sleep(0.5)
    else:
        driver.kill()
        driver.wait()
        pytest.fail(f"no trial was running with its processes: {(tmp_path / 'driver.log').read_text()}")
    interrupted_key = running[0].user_attrs["config_key"]
    time.sleep(2)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    # The training processes notice their owner is gone and exit (no orphans burn the GPUs).
    deadline = time.monotonic() + 60
    while _worker_pids(before) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _worker_pids(before) == set()

    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "re-enqueued interrupted trial" in rerun.stdout
    assert (
        "best: trial" in rerun.stdout
        and "top 5:" in rerun.stdout
        and f"optuna-dashboard {shlex.quote(mask_url(storage_url))}" in rerun.stdout
    )
    output = rerun.stdout + rerun.stderr + (tmp_path / "driver.log").read_text()
    _no_password_anywhere(loaded.output_dir, [output], PASSWORD)  # trial logs included
    study = open_study(loaded, create=False)
    trials = study.get_trials()
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    assert len(counted_trials(study)) == 3
    interrupted = [t for t in trials if status_of(t) == "interrupted"]
    assert len(interrupted) == 1 and interrupted[0].user_attrs["config_key"] == interrupted_key
    remeasured = [
        t
        for t in trials
        if t.user_attrs.get("requeued_from") == interrupted[0].number and status_of(t) in ("ok", "oom")
    ]
    assert len(remeasured) == 1 and remeasured[0].user_attrs["config_key"] == interrupted_key


# -- one transaction of user attributes (explorer.record.write) -------------------------------------


def _check_user_attrs(storage: optuna.storages.BaseStorage) -> None:
    from explorer.record import write as set_user_attrs

    study = optuna.create_study(storage=storage)
    trial = study.ask()
    trial.set_user_attr("status", "running")
    attrs = {"status": "ok", "n": 3, "nested": {"a": [1, 2.5]}, "none": None, "text": "é"}
    set_user_attrs(trial, attrs, system={"constraints": [1.0]})
    assert study.trials[0].user_attrs == attrs  # the earlier value was replaced, not duplicated
    assert study.trials[0].system_attrs["constraints"] == [1.0]  # in the same transaction
    assert trial.user_attrs == attrs  # the live trial says so too (record_outcome reads number_gpus there)
    study.tell(trial, 1.0)
    with pytest.raises(RuntimeError):
        set_user_attrs(trial, {"late": 1})
    assert "late" not in study.trials[0].user_attrs


def test_user_attrs_written_together_read_back_and_finished_trials_refuse_them(storage_url):
    storage = optuna.storages.RDBStorage(storage_url)
    assert storage.engine.name == storage_url.split(":")[0].split("+")[0]  # the dialect's own upsert
    _check_user_attrs(storage)


def test_user_attrs_in_memory_take_the_public_call():
    _check_user_attrs(optuna.storages.InMemoryStorage())


# -- the replay launcher and the measurement store --------------------------------------------------

TABLE_BATCHES = (4, 8, 16, 32, 64)


def _tput(bs: int, gpus: int, ckpt: bool) -> float:
    return 1000.0 + 10 * bs - 300 * (gpus - 1) - 100 * ckpt


def _replay_table(path: Path) -> Path:
    """Every (batch, 1 or 2 GPUs, checkpointing) measured; one GPU at batch 64 ran out of memory."""
    import csv

    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(
            ["model_name", "gpu_model", "model_max_length", "number_gpus", "batch_size"]
            + [
                "distributed_backend",
                "gradient_checkpointing",
                "dataset_tokens_per_second_per_gpu",
                "is_valid",
            ]
        )
        for bs in TABLE_BATCHES:
            for gpus in (1, 2):
                for ckpt in (False, True):
                    oom = gpus == 1 and bs == 64
                    row = ["tiny-llama", "CPU-logical", 64, gpus, bs, "DDP" if gpus > 1 else "NONE", ckpt]
                    writer.writerow(row + [0.0 if oom else _tput(bs, gpus, ckpt), int(not oom)])
    return path


def _replay_study(
    write_study, tmp_path: Path, storage_url: str | None, name: str = "replay", **patch
) -> Path:
    """A study of the table's configurations, answered by the replay launcher (no Ray)."""
    table = _replay_table(tmp_path / "table.csv")
    base = {
        "name": name,
        "n_trials": 8,
        "launcher": {"kind": "replay", "table": str(table)},
        "search_space": {
            "parameters": {
                "batch_size": {"values": list(TABLE_BATCHES)},
                "number_gpus": {"values": [1, 2]},
                "distributed_backend": "DDP",
                "gradient_checkpointing": {"choices": [False, True]},
            }
        },
    }
    if storage_url is not None:
        base["storage"] = storage_url
    return write_study(merge(base, patch), name=f"{name}.yaml")


def _measured(trials) -> list:
    """Trials whose configuration was measured (ran, or came from the store), not free answers."""
    from explorer.study._record import answered_without_running

    return [t for t in trials if status_of(t) in ("ok", "oom") and not answered_without_running(t)]


def test_replay_optimize_resume_and_the_store_across_studies(write_study, tmp_path, storage_url):
    """A replayed study records the table's values, continues to a larger n_trials, and a second
    study in the same storage is answered from the measurement store without running."""
    import ray
    import sqlalchemy as sa

    from explorer.store import TABLE_NAME, MeasurementStore, StoreScope

    a = load_study(_replay_study(write_study, tmp_path, storage_url, name="a", n_trials=6))
    result = optimize(a, printer=lambda _: None)
    assert result.counted == 6 and not ray.is_initialized()
    more = optimize(load_study(a.file, n_trials=9), printer=lambda _: None)
    assert more.counted == 9
    study = open_study(a, create=False)
    assert len(counted_trials(study)) == 9
    measured = _measured(study.get_trials())
    for t in measured:
        c = config_of(t)
        if status_of(t) == "ok":
            assert t.values[0] == _tput(c.batch_size, c.number_gpus, c.gradient_checkpointing)
        else:
            assert (c.batch_size, c.number_gpus) == (64, 1)
    keys = [t.user_attrs["config_key"] for t in measured]
    assert len(keys) == len(set(keys))  # nothing measured twice

    store = MeasurementStore.for_storage(open_storage(storage_url))
    assert store is not None and store.count() == len(measured)
    assert sa.inspect(store.engine).has_table(TABLE_NAME)
    scope = StoreScope.for_study(a)
    hit = store.lookup(config_key=keys[0], scope=scope)
    assert hit is not None and (hit.study_name, hit.trial_number) == ("a", measured[0].number)

    # study B enqueues A's measured configurations: all answered from the store, none run
    b = load_study(_replay_study(write_study, tmp_path, storage_url, name="b", n_trials=len(measured)))
    study_b = open_study(b, create=True)
    for t in measured:
        study_b.enqueue_trial(b.space.params_for(config_of(t)))
    lines: list[str] = []
    result_b = optimize(b, printer=lines.append)
    assert result_b.statuses == {"stored": len(measured)}, lines
    assert not any(" started: " in line for line in lines)
    assert store.count() == len(measured)  # B measured nothing


def test_measurement_store_put_and_lookup(storage_url):
    from explorer.measurement import Measurement, Outcome
    from explorer.store import MeasurementStore, StoreScope
    from tests.builders import properties

    scope = StoreScope(workload_key="w" * 16, hardware_key="h" * 16)
    store = MeasurementStore.for_storage(open_storage(storage_url))
    assert store is not None
    ok = Measurement(outcome=Outcome.OK, properties=properties(123.5), wall_seconds=7.0, extra={"node": "n1"})
    for n, m in enumerate([ok, Measurement(outcome=Outcome.OOM, error="out of memory")]):
        store.put(config_key=f"cfg{n}", scope=scope, measurement=m, study_name="a", trial_number=n)
    newer = Measurement(outcome=Outcome.OK, properties=properties(130.0), wall_seconds=6.0)
    store.put(config_key="cfg0", scope=scope, measurement=newer, study_name="b", trial_number=5)
    hit = store.lookup(config_key="cfg0", scope=scope)
    assert hit is not None and hit.measurement == newer and (hit.study_name, hit.trial_number) == ("b", 5)
    oom = store.lookup(config_key="cfg1", scope=scope)
    assert oom is not None and oom.measurement.outcome is Outcome.OOM
    assert store.lookup(config_key="cfg2", scope=scope) is None
    # a second handle on the same database (another process would open it so) finds the same rows
    assert MeasurementStore.for_storage(open_storage(storage_url)).count() == 3  # type: ignore[union-attr]


# -- several drivers, several storages ------------------------------------------------------------


def _explorer(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=timeout, env={"PYTHONPATH": str(REPO), **(env or {})})


def _audit_ok(path: Path, *extra: str) -> None:
    run = _explorer("audit", str(path), *extra)
    assert run.returncode == 0 and "accounting: ok" in run.stdout, run.stdout + run.stderr


def test_two_optimize_processes_share_one_study(write_study, tmp_path, storage_url):
    """Two ``explorer optimize`` processes started at once on one study (same sampler seed, so
    they propose the same configurations): together exactly ``n_trials`` counted trials, no
    configuration measured twice, nothing left RUNNING, both did some of the work, and the audit
    is ok. On sqlite the drivers meet through a lock file next to the database; on PostgreSQL
    through an advisory lock."""
    path = _replay_study(
        write_study,
        tmp_path,
        storage_url,
        n_trials=10,
        parallel_trials=2,
        # trials long enough that a driver whose start lags the other's (imports on a loaded
        # machine: one driver ran all ten 1.5 s trials before the other's first in a slow-suite
        # run) still finds work: one driver alone needs about 25 s
        launcher={"durations": {"ok_s": 5.0, "oom_s": 0.5, "failed_s": 0.5, "time_scale": 1.0}},
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "explorer", "optimize", str(path)]
    logs = [tmp_path / f"driver{i}.log" for i in (0, 1)]
    drivers = []
    for log in logs:
        with log.open("wb") as fh:  # a file, not a pipe nobody reads
            drivers.append(subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=REPO))
    codes = [d.wait(timeout=300) for d in drivers]
    outputs = [log.read_text() for log in logs]
    assert codes == [0, 0], outputs

    study = open_study(load_study(path), create=False)
    trials = study.get_trials()
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING], outputs
    assert len(counted_trials(study)) == 10, outputs
    keys = [t.user_attrs["config_key"] for t in _measured(trials)]
    assert len(keys) == len(set(keys)), outputs  # no configuration measured twice
    pids = {d.pid for d in drivers}
    workers = {t.user_attrs["driver"]["pid"] for t in counted_trials(study)}
    assert workers == pids, outputs  # both drivers ran counted trials
    for t in trials:  # a trial that waited for another's answer copies it, it did not run
        if "waits_for" in t.user_attrs and t.user_attrs["waits_for"] is not None:
            assert "reused_from" in t.user_attrs or status_of(t) == "interrupted", t.user_attrs
    assert all(PASSWORD not in out for out in outputs)
    _audit_ok(path)


def test_two_storages_of_one_study_file_keep_their_own_run_folders(write_study, tmp_path):
    """The same study file run on its own storage and with ``--storage`` another one: each
    study's trial files are in a folder of its own, recorded in its storage, and both audits are
    ok (before, the second run overwrote the first one's ``trial-NNNNN`` files)."""
    path = _replay_study(write_study, tmp_path, None, n_trials=6)
    other = f"sqlite:///{tmp_path}/other.db"
    for extra in ((), ("--storage", other)):
        run = _explorer("optimize", str(path), *extra)
        assert run.returncode == 0, run.stdout + run.stderr
    own, second = load_study(path), load_study(path, storage=other)
    assert own.output_dir != second.output_dir
    for loaded in (own, second):
        study = open_study(loaded, create=False)
        assert study.user_attrs["run_folder"] == str(loaded.output_dir)
        journals = sorted(p.parent.name for p in loaded.output_dir.glob("trial-*/measurement.json"))
        assert len(journals) == len(counted_trials(study)) == 6, journals
    _audit_ok(path)
    _audit_ok(path, "--storage", other)


def test_an_output_dir_of_another_storage_is_refused(write_study, tmp_path, capsys):
    """A study file whose ``output_dir`` is already the run folder of the same study in another
    storage: one line naming the owner, exit 2, and the second storage is not created (the CLI in
    this process: test_bad_input runs the real process for one-line errors)."""
    from explorer.cli import main

    path = _replay_study(write_study, tmp_path, None, n_trials=2, output_dir="runs")
    assert main(["optimize", str(path)]) == 0, capsys.readouterr()
    capsys.readouterr()
    other = tmp_path / "other.db"
    assert main(["optimize", str(path), "--storage", f"sqlite:///{other}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "output_dir" in err and "replay.db" in err, err
    assert not other.exists()


# -- PostgreSQL only: credentials ------------------------------------------------------------------


def _no_password_anywhere(root: Path, texts: list[str], password: str) -> None:
    leaks = [i for i, text in enumerate(texts) if password in text]
    assert not leaks, [texts[i] for i in leaks]
    for f in root.rglob("*"):
        if f.is_file():
            assert password.encode() not in f.read_bytes(), f


def _database_text(url: str) -> str:
    """Every row of every table of the database behind ``url``, as text."""
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            tables = sa.inspect(conn).get_table_names()
            return "\n".join(
                str(row) for table in tables for row in conn.execute(sa.text(f'SELECT * FROM "{table}"'))
            )
    finally:
        engine.dispose()


@pytest.mark.slow  # tests/test_secrets.py covers the password cases in the default suite
def test_credentials_never_leave_the_url(write_study, tmp_path, postgres_server, postgres_url):
    """The password of a PostgreSQL URL (on the command line, or in ``PGPASSWORD``) appears in
    no output, error line, file written (exports, report, best, logs) or stored attribute."""
    path = _replay_study(write_study, tmp_path, None, n_trials=5)  # the study file names no storage
    out = tmp_path / "out"
    runs = [
        _explorer("optimize", str(path), "--storage", postgres_url),
        _explorer("status", str(path), "--storage", postgres_url),
        _explorer(
            "export", str(path), "--storage", postgres_url, "--format", "csv", "--out", str(out / "t.csv")
        ),
        _explorer(
            "export", str(path), "--storage", postgres_url, "--format", "json", "--out", str(out / "t.json")
        ),
        _explorer("report", str(path), "--storage", postgres_url, "--out", str(out / "report")),
        _explorer("best", str(path), "--storage", postgres_url, "--out", str(out / "best")),
        _explorer("utilization", str(path), "--storage", postgres_url),
    ]
    assert [r.returncode for r in runs] == [0] * len(runs), [r.stdout + r.stderr for r in runs]
    masked = mask_url(postgres_url)
    assert "***" in masked and masked in runs[0].stdout  # the URL is shown, its password masked
    assert (out / "t.csv").is_file() and (out / "report" / "index.html").is_file()
    assert masked in (out / "report" / "index.html").read_text()
    assert any((out / "best").iterdir())

    # the password in the environment (libpq reads PGPASSWORD), the URL without it
    bare = postgres_url.replace(f":{PASSWORD}@", "@")
    assert PASSWORD not in bare
    with_env = _explorer(
        "optimize", str(path), "--storage", bare, "--n-trials", "6", env={"PGPASSWORD": PASSWORD}
    )
    assert with_env.returncode == 0, with_env.stdout + with_env.stderr
    assert "6/6 trials done" in with_env.stdout or "[  6/6]" in with_env.stdout, with_env.stdout
    without = _explorer(
        "status",
        str(path),
        "--storage",
        bare,
        env={"PGPASSWORD": "", "PGPASSFILE": str(tmp_path / "no-pgpass")},
    )
    assert without.returncode == 2 and without.stderr.count("\n") == 1, without.stderr
    assert "no password supplied" in without.stderr and "Traceback" not in without.stderr

    # error lines: a wrong password and a study that is not there
    wrong = postgres_url.replace(PASSWORD, "wr0ng-pw-31d5")
    bad = _explorer("optimize", str(path), "--storage", wrong)
    assert bad.returncode == 2 and "cannot reach" in bad.stderr and "Traceback" not in bad.stderr
    assert "wr0ng-pw-31d5" not in bad.stdout + bad.stderr
    missing = _explorer("status", str(path), "--storage", postgres_server.url("postgres"))
    assert missing.returncode == 2 and "no study" in missing.stderr

    texts = [r.stdout + r.stderr for r in [*runs, with_env, without, bad, missing]]
    _no_password_anywhere(tmp_path, texts, PASSWORD)
    assert PASSWORD not in _database_text(postgres_url)  # user attrs, system attrs, the store
