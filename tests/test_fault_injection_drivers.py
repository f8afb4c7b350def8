"""The chaos run of issue 24: 100 trials, 20% of first attempts given a fault of every kind (the
replay launcher's: OOM, crash, segfault, hang, actor kill, node restart), two drivers on one
study (sqlite, PostgreSQL), one SIGKILLed mid-run, the survivor SIGTERMed, then a resume to the
end. Afterwards: 0 trials lost, 0 RUNNING, nothing WAITING, ``audit`` ok, no configuration
measured twice."""

from __future__ import annotations

import csv
import signal
import time
from pathlib import Path

import pytest

from explorer.study import open_study
from explorer.study_file import load_study
from tests.builders import start_cli
from tests.test_faults import _audit, _counted

BATCHES = [4 * k for k in range(1, 101)]  # 100 one-GPU and 100 two-GPU configurations


def _table(path: Path) -> Path:
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(
            ["model_name", "number_gpus", "batch_size", "distributed_backend"]
            + ["dataset_tokens_per_second_per_gpu", "is_valid"]
        )
        for gpus, backend in ((1, "NONE"), (2, "DDP")):
            writer.writerows(["tiny-llama", gpus, bs, backend, 1000.0 + bs, int(bs < 300)] for bs in BATCHES)
    return path


def _until(path: Path, procs, counted: int, limit_s: float = 180.0) -> None:
    deadline = time.monotonic() + limit_s
    while _counted(path) < counted:
        for proc in procs:
            assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, f"{counted} trials not reached"
        time.sleep(0.2)


def _running_of(path: Path, pid: int) -> list[int]:
    study = open_study(load_study(path), create=False)
    return [
        t.number
        for t in study.get_trials(deepcopy=False)
        if t.state.name == "RUNNING" and (t.user_attrs.get("driver") or {}).get("pid") == pid
    ]


@pytest.mark.slow  # about a minute: three phases of paced replay trials
def test_two_drivers_faults_sigkill_sigterm_and_resume_lose_nothing(write_study, tmp_path, storage_url):
    """On sqlite (drivers seen by their lock) and PostgreSQL (always assumed present)."""
    path = write_study(
        {
            "storage": storage_url,
            "sampler": {"kind": "random", "seed": 3},
            "n_trials": 100,
            "parallel_trials": 4,
            "infer_oom": False,
            "when_converged": "explore",
            "resources": {"gpus_per_node": 4},
            "measurement": {"warmup_steps": 1, "measured_steps": 3, "trial_timeout_s": 600},
            "launcher": {
                "kind": "replay",
                "table": str(_table(tmp_path / "table.csv")),
                "max_retries": 1,
                "durations": {
                    "ok_s": 100.0,
                    "oom_s": 20.0,
                    "failed_s": 30.0,
                    "jitter": 0.3,
                    "time_scale": 0.015,
                },
            },
            "faults": {"rate": 0.2, "retry_rate": 0.25, "seed": 3, "kill_after_s": 15.0},
            "search_space": {
                "parameters": {
                    "batch_size": {"values": BATCHES},
                    "number_gpus": {"values": [1, 2]},
                    "distributed_backend": "DDP",
                    "gradient_checkpointing": False,
                }
            },
        }
    )
    first, second = start_cli("optimize", str(path)), start_cli("optimize", str(path))
    _until(path, [first, second], 25)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    orphaned = _running_of(path, first.pid)
    deadline = time.monotonic() + 60  # the survivor's sweep (every 10 s) reclaims them
    while _running_of(path, first.pid):
        assert second.poll() is None and time.monotonic() < deadline, second.communicate()[0]
        time.sleep(0.5)
    assert _counted(path) < 90, "the survivor nearly finished before the SIGTERM: pace the trials slower"
    _until(path, [second], _counted(path) + 5)
    second.send_signal(signal.SIGTERM)
    out, _ = second.communicate(timeout=60)
    assert second.returncode == 143 and "Traceback" not in out, out
    if orphaned:
        assert "of an explorer process that died" in out, out

    third = start_cli("optimize", str(path))
    out, _ = third.communicate(timeout=300)
    assert third.returncode == 0 and "Traceback" not in out, out
    study = open_study(load_study(path), create=False)
    states = [t.state.name for t in study.get_trials(deepcopy=False)]
    assert "RUNNING" not in states and "WAITING" not in states
    found = _audit(path)
    assert found.ok, found.describe()
    assert found.counted == 100 and sum(found.states.values()) == 100
    assert found.bookkeeping["interrupted"] >= 1
    assert sum(sum(c.values()) for c in found.faults.values()) >= 15
    print(found.describe(), f"\nreclaimed from the killed driver while the survivor ran: {orphaned}")
