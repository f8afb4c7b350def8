"""Eight trials at once on sqlite, with ``explorer status`` and ``explorer dashboard`` reading.

The mechanism under test (``explorer/study/_storage.py``, ``explorer/status.py``): the study's
sqlite file is in WAL mode, so readers never block the writer nor the writer the readers; every
connection of the writer has a 60 s busy timeout, so a write that meets another write waits
instead of failing; there is one writer process per study (``explorer optimize``: its trials are
recorded by the driver, never by the trial processes); ``explorer status`` opens the file
read-only (a ``mode=ro`` URI). A real ``explorer optimize`` runs a replay study paced in real
time (8 one-GPU trials on an 8-GPU pool, 40 counted trials, about 25 s) while ``explorer status``
runs back to back and the dashboard's trials API is polled over HTTP.
"""

from __future__ import annotations

import csv
import json
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import optuna
import pytest

from explorer.launch import SLOT_ATTR, GpuSlot
from explorer.study import counted_trials, open_study
from explorer.study_file import load_study
from tests.builders import peak_held

REPO = Path(__file__).resolve().parents[1]
BATCHES = [8 * k for k in range(1, 31)]
N_TRIALS = 40
POOL = 8


def _table(path: Path) -> Path:
    """60 one-GPU configurations (30 batch sizes, checkpointing on and off), all feasible."""
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(
            ["model_name", "number_gpus", "batch_size", "gradient_checkpointing", "distributed_backend"]
            + ["dataset_tokens_per_second_per_gpu", "is_valid"]
        )
        for bs in BATCHES:
            for ckpt in (0, 1):
                writer.writerow(["tiny-llama", 1, bs, ckpt, "NONE", 1000.0 + bs - 50 * ckpt, 1])
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _explorer(*args: str) -> list[str]:
    return [sys.executable, "-m", "explorer", *args]


def _running_rows(status_out: str) -> int:
    return sum(1 for line in status_out.splitlines()[1:] if line.split()[1:2] == ["RUNNING"])


@pytest.mark.slow  # a real multi-trial study: in `make test-slow` (CI runs it after `make test`)
def test_eight_parallel_trials_with_status_and_dashboard_reading(write_study, tmp_path):
    db = tmp_path / "c.db"
    path = write_study(
        {
            "storage": f"sqlite:///{db}",
            "sampler": {"kind": "random", "seed": 0},
            "n_trials": N_TRIALS,
            "parallel_trials": POOL,
            "when_converged": "explore",
            "infer_oom": False,
            "resources": {"gpus_per_node": POOL},
            "launcher": {
                "kind": "replay",
                "table": str(_table(tmp_path / "table.csv")),
                # 100 virtual s x 0.05 = 5 s a trial (+-30%): 40 trials in 5 waves of 8, about 25 s
                "durations": {"ok_s": 100.0, "jitter": 0.3, "seed": 1, "time_scale": 0.05},
            },
            "search_space": {
                "parameters": {
                    "batch_size": {"values": BATCHES},
                    "number_gpus": 1,
                    "gradient_checkpointing": {"choices": [False, True]},
                }
            },
        }
    )
    driver_log = tmp_path / "optimize.log"
    dash_err = tmp_path / "dashboard.err"
    statuses: list[tuple[int, str, str, float]] = []  # rc, stdout, stderr, seconds
    polls: list[tuple[int, int]] = []  # HTTP status, trials served
    errors: list[str] = []
    stop = threading.Event()

    def status_loop() -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            p = subprocess.run(_explorer("status", str(path)), capture_output=True, text=True, timeout=120)
            statuses.append((p.returncode, p.stdout, p.stderr, time.monotonic() - t0))

    def dashboard_loop(base: str, study_id: int) -> None:
        while not stop.is_set():
            try:
                with urllib.request.urlopen(f"{base}/api/studies/{study_id}?after=0", timeout=30) as r:
                    polls.append((r.status, len(json.loads(r.read())["trials"])))
            except Exception as exc:  # recorded and asserted on below: every poll must succeed
                errors.append(f"{type(exc).__name__}: {exc}")
            time.sleep(0.2)

    started = time.monotonic()
    with driver_log.open("wb") as log:
        driver = subprocess.Popen(_explorer("optimize", str(path)), stdout=log, stderr=subprocess.STDOUT)
    dashboard: subprocess.Popen[str] | None = None
    threads: list[threading.Thread] = []
    try:
        # the dashboard needs the study to exist: wait for the first status call that finds it
        while True:
            p = subprocess.run(_explorer("status", str(path)), capture_output=True, text=True, timeout=120)
            if p.returncode == 0:
                break
            assert p.returncode == 2 and "no study" in p.stderr, p.stderr
            assert driver.poll() is None and time.monotonic() - started < 60, driver_log.read_text()
            time.sleep(0.2)
        threads.append(threading.Thread(target=status_loop, daemon=True))
        threads[-1].start()
        port = _free_port()
        with dash_err.open("w") as err:
            dashboard = subprocess.Popen(
                _explorer("dashboard", str(path), "--port", str(port)),
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        assert dashboard.stdout is not None
        first = dashboard.stdout.readline()
        assert first.startswith(f"dashboard: http://127.0.0.1:{port}/"), first + dash_err.read_text()
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/studies", timeout=10) as r:
                    [study_id] = [s["study_id"] for s in json.loads(r.read())["study_summaries"]]
                break
            except OSError:
                assert dashboard.poll() is None and time.monotonic() < deadline, dash_err.read_text()
                time.sleep(0.3)
        threads.append(threading.Thread(target=dashboard_loop, args=(base, study_id), daemon=True))
        threads[-1].start()
        driver.wait(timeout=300)
        wall = time.monotonic() - started
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=150)
        if driver.poll() is None:
            driver.kill()
            driver.wait(timeout=60)
        if dashboard is not None:
            dashboard.terminate()
            dashboard.wait(timeout=30)

    driver_out = driver_log.read_text()
    dash_text = dash_err.read_text()
    print(f"optimize took {wall:.1f} s; {len(statuses)} status calls; {len(polls)} dashboard polls")
    assert driver.returncode == 0, driver_out
    assert "locked" not in driver_out.lower() and "Traceback" not in driver_out, driver_out
    assert "locked" not in dash_text.lower() and "Traceback" not in dash_text, dash_text
    for rc, out, err, _ in statuses:
        assert rc == 0, err
        assert "locked" not in (out + err).lower() and "Traceback" not in out + err, out + err
    assert not errors, errors[:3]
    assert all(code == 200 for code, _ in polls)
    assert len(statuses) >= 5 and len(polls) >= 20, (len(statuses), len(polls))
    # the readers saw the study move while it ran, with at least eight trials RUNNING at once
    # (Optuna's RUNNING also holds trials asked and waiting for GPUs, or being answered without
    # running; the slots below show exactly 8 holding GPUs)
    assert max(_running_rows(out) for _, out, _, _ in statuses) >= POOL
    assert len({n for _, n in polls}) > 1

    # the writer's mechanism: WAL on the file (readers and the writer do not block each other)
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    study = open_study(load_study(path), create=False)
    trials = study.get_trials()
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    assert all(t.state.is_finished() for t in trials)
    assert len(counted_trials(study)) == N_TRIALS
    slots = [GpuSlot.from_attr(t.user_attrs[SLOT_ATTR]) for t in trials if SLOT_ATTR in t.user_attrs]
    assert len(slots) == N_TRIALS and peak_held(slots) == POOL  # 8 trials held their GPUs at one time
    # 5 waves of about 5 s of virtual time in real time (the parallelism is shown by peak_held)
    assert wall > 15.0, wall


def test_the_writer_waits_on_a_busy_file_and_status_cannot_write(write_study, tmp_path):
    """The two halves of the mechanism, each on its own: the writer's connections carry a 60 s
    busy timeout (and the file is switched to WAL), and ``status``'s connection is read-only."""
    import sqlalchemy

    from explorer.status import load_readonly
    from explorer.study import open_storage

    db = tmp_path / "w.db"
    path = write_study({"storage": f"sqlite:///{db}"})
    loaded = load_study(path)
    study = open_study(loaded, create=True)
    storage = open_storage(loaded.storage_url)
    with storage.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 60_000
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    storage.engine.dispose()
    study.ask()

    reader = load_readonly(loaded)
    storage_of_reader = reader._storage
    engine = getattr(storage_of_reader, "engine", None) or storage_of_reader._backend.engine
    assert "mode=ro" in str(engine.url)
    with engine.connect() as conn, pytest.raises(sqlalchemy.exc.OperationalError, match="readonly database"):
        conn.exec_driver_sql("DELETE FROM trials")
    assert len(reader.get_trials()) == 1
