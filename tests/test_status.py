"""``explorer status``: the trial table, read-only, safe beside a running ``explorer optimize``."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from explorer.cli import main
from explorer.measurement import Measurement, Outcome
from explorer.study import counted_trials, open_study, status_of
from explorer.study._record import record_driver, record_outcome
from explorer.study_file import load_study
from explorer.trial_config import TrialConfig


def _cfg(**kw) -> TrialConfig:
    base = dict(batch_size=4, number_gpus=1, distributed_backend="NONE", gradient_checkpointing=False)
    return TrialConfig(model_max_length=64, **(base | kw))


def test_status_of_a_missing_study_exits_2_and_creates_nothing(write_study, tmp_path, capsys):
    db = tmp_path / "absent.db"
    path = write_study({"storage": f"sqlite:///{db}"})
    assert main(["status", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no study" in err[0] and "does not exist" in err[0]
    assert not db.exists() and not Path(f"{db}-wal").exists()

    other = tmp_path / "other.db"
    optuna.create_study(study_name="someone-else", storage=f"sqlite:///{other}")
    before = other.read_bytes()
    assert main(["status", str(path), "--storage", f"sqlite:///{other}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"explorer: error: {path}: name: no study 'test' in sqlite:///{other}"]
    assert other.read_bytes() == before


def test_status_table_shows_configuration_throughput_and_reasons(write_study, tmp_path, capsys):
    path = write_study({"storage": f"sqlite:///{tmp_path}/s.db"})
    loaded = load_study(path)
    study = open_study(loaded, create=True)
    log = tmp_path / "trial-00002" / "train.log"
    outcomes = [
        (
            _cfg(),
            Measurement(outcome=Outcome.INVALID, error="batch_size 4 is not divisible by number_gpus 3"),
        ),
        (
            _cfg(batch_size=1024),
            Measurement(outcome=Outcome.OOM, error="[rank0]: RuntimeError: [enforce fail] can't allocate"),
        ),
        (
            _cfg(batch_size=8),
            Measurement(
                outcome=Outcome.FAILED,
                error="rank 1: ValueError: no_such_optimizer\n  is not a known optimizer " + "x" * 200,
                wall_seconds=3.25,
                extra={"log_file": str(log)},
            ),
        ),
    ]
    for config, m in outcomes:
        trial = study.ask()
        record_driver(trial, config, 0)
        record_outcome(study, trial, m)
    running = study.ask()  # asked, configuration not yet recorded: shown without one
    assert main(["status", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:8] == [
        "trial",
        "state",
        "status",
        "configuration",
        "tok/s/gpu",
        "95%",
        "CI",
        "wall",
    ]
    rows = out[1:5]
    assert rows[0].split()[:3] == ["0", "COMPLETE", "invalid"]
    assert "bs=4 gpus=1 single ckpt=off len=64" in rows[0]
    assert rows[0].endswith("batch_size 4 is not divisible by number_gpus 3")
    assert (
        "bs=1024" in rows[1] and "[rank0]: RuntimeError: [enforce fail] can't allocate" in rows[1]
    )  # not markup
    assert rows[2].split()[:3] == ["2", "FAIL", "failed"] and " 3.2" in rows[2]
    assert "rank 1: ValueError: no_such_optimizer is not a known optimizer xxx" in rows[2]
    assert rows[2].endswith("...") and len(rows[2]) < 200  # one line, truncated
    assert rows[3].split() == ["3", "RUNNING", "-", "-", "-", "-", "-"]
    assert out[5] == "4 trials (- 1, failed 1, invalid 1, oom 1); best: -"
    assert out[6] == f"trial 2 log: {log}"
    assert running.number == 3


def _wait_for(cond, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.2)


@pytest.mark.slow  # a real multi-trial study: in `make test-slow` (CI runs it after `make test`)
def test_status_polled_every_second_does_not_disturb_a_running_study(write_study, tmp_path):
    """`explorer status` once a second beside a real `explorer optimize` (Ray, torchrun, sqlite)."""
    db = tmp_path / "s.db"
    path = write_study(
        {
            "storage": f"sqlite:///{db}",
            "n_trials": 3,
            "sampler": {"kind": "tpe", "seed": 0, "n_startup_trials": 3},
            "search_space": {
                "parameters": {
                    "batch_size": {"values": [4, 8]},
                    "number_gpus": {"values": [1, 2]},
                    "distributed_backend": "DDP",
                    "gradient_checkpointing": {"choices": [False, True]},
                }
            },
        }
    )
    log = (tmp_path / "driver.log").open("wb")
    driver = subprocess.Popen(
        [sys.executable, "-m", "explorer", "optimize", str(path)], stdout=log, stderr=subprocess.STDOUT
    )
    status = [sys.executable, "-m", "explorer", "status", str(path)]
    live: list[subprocess.Popen[str]] = []
    done: list[tuple[int, str, str]] = []

    def reap(block: bool) -> None:
        for p in list(live):
            if block or p.poll() is not None:
                out, err = p.communicate(timeout=120)
                done.append((p.returncode, out, err))
                live.remove(p)

    started: list[float] = []
    try:
        # a new reader every second (a call takes well under a second, but on 2 busy cores a few
        # may overlap: up to 3 run at once)
        while driver.poll() is None:
            reap(block=False)
            if len(live) < 3:
                started.append(time.monotonic())
                live.append(
                    subprocess.Popen(status, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                )
            time.sleep(1.0)
        reap(block=True)
        final = subprocess.run(status, capture_output=True, text=True, timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
        driver.wait(timeout=60)
        for p in live:
            p.kill()
    polls = sorted(done, key=lambda d: d[0] != 2)  # the "no study yet" ones first, if any
    driver_out = (tmp_path / "driver.log").read_text()
    assert driver.returncode == 0, driver_out
    assert "Traceback" not in driver_out and "database is locked" not in driver_out
    # before optimize has created the study: one line, exit 2; from then on, every call succeeds
    early = [d for d in polls if d[0] == 2]
    assert all("no study" in err and err.count("\n") == 1 for _, _, err in early), early
    ok = [d for d in polls if d[0] != 2]
    for rc, out, err in ok:
        assert rc == 0 and "Traceback" not in out + err, out + err
    assert len(ok) >= 5 and any(" RUNNING " in out for _, out, _ in ok)
    print(
        f"{len(done)} status calls ({len(early)} before the study existed) in {started[-1] - started[0]:.0f} s"
    )
    assert final.returncode == 0, final.stderr

    study = open_study(load_study(path), create=False)
    trials = study.get_trials()
    assert len(counted_trials(study)) == 3
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    ran = [t for t in trials if status_of(t) in ("ok", "oom") and "reused_from" not in t.user_attrs]
    assert ran and all(Path(t.user_attrs["log_file"]).is_file() for t in ran)
    lines = final.stdout.splitlines()
    assert lines[-1].startswith(f"{len(trials)} trials (") and "best: trial" in lines[-1]
    assert len(lines) == 1 + len(trials) + 1
