"""Fault injection on the replay launcher: each fault's defined outcome, retries, write-ahead
recovery, and the accounting invariant after a SIGKILL and a SIGINT of the real driver."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from explorer.launch import SLOT_ATTR, GpuSlot
from explorer.measurement import Measurement, Outcome
from explorer.study import audit, counted_trials, open_study, optimize, status_of
from explorer.study._journal import JOURNAL_FILE, trial_dir, write_ahead
from explorer.study._record import record_driver
from explorer.study_file import load_study
from explorer.trial_config import TrialConfig
from tests.builders import run_cli, start_cli

BATCHES = [4 * k for k in range(1, 41)]  # 40 one-GPU and 40 two-GPU configurations


def _table(path: Path) -> Path:
    """Every configuration measured; one-GPU batches from 120 up ran out of memory."""
    rows = [["tiny-llama", 1, bs, "NONE", 1000.0 + bs, int(bs < 120)] for bs in BATCHES]
    rows += [["tiny-llama", 2, bs, "DDP", 900.0 + bs, 1] for bs in BATCHES]
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(
            ["model_name", "number_gpus", "batch_size", "distributed_backend"]
            + ["dataset_tokens_per_second_per_gpu", "is_valid"]
        )
        writer.writerows(rows)
    return path


def _study(
    write_study, tmp_path: Path, *, faults: dict, n_trials: int = 12, storage: str | None = None, **patch
) -> Path:
    base = {
        "storage": storage or f"sqlite:///{tmp_path}/faults.db",
        "sampler": {"kind": "random", "seed": 0},
        "n_trials": n_trials,
        "parallel_trials": 4,
        "infer_oom": False,
        "when_converged": "explore",
        "resources": {"gpus_per_node": 4},
        "measurement": {"warmup_steps": 1, "measured_steps": 3, "trial_timeout_s": 600},
        "launcher": {
            "kind": "replay",
            "table": str(_table(tmp_path / "table.csv")),
            "max_retries": 1,
            "durations": {"ok_s": 100.0, "oom_s": 20.0, "failed_s": 30.0, "jitter": 0.3},
        },
        "faults": faults,
        "search_space": {
            "parameters": {
                "batch_size": {"values": BATCHES},
                "number_gpus": {"values": [1, 2]},
                "distributed_backend": "DDP",
                "gradient_checkpointing": False,
            }
        },
    }
    return write_study(base | patch)


def _audit(path: Path):
    loaded = load_study(path)
    study = open_study(loaded, create=False)
    spec = loaded.spec
    return audit(
        study, n_trials=spec.n_trials, max_retries=spec.launcher.max_retries, output_dir=loaded.output_dir
    )


def test_each_fault_ends_as_defined_and_is_retried(write_study, tmp_path, storage_url):
    """Trials 0-4 (asked at once) get one fault each; OOM is infeasible, every other fault fails
    the attempt, whose configuration then runs again (``requeued_from``) and is measured."""
    plan = {0: "oom", 1: "crash", 2: "segfault", 3: "hang", 4: "actor_kill"}
    path = _study(
        write_study,
        tmp_path,
        faults={"schedule": plan, "kill_after_s": 10.0},
        storage=storage_url,
        parallel_trials=5,
        resources={"gpus_per_node": 10},
    )
    result = optimize(load_study(path), printer=lambda _: None)
    assert result.counted == 12
    study = open_study(load_study(path), create=False)
    trials = {t.number: t for t in study.get_trials()}
    retried_from = {
        t.user_attrs["requeued_from"]: t for t in trials.values() if "requeued_from" in t.user_attrs
    }
    assert trials[0].user_attrs["injected_fault"] == "oom" and status_of(trials[0]) == "oom"
    assert "can't allocate memory" in trials[0].user_attrs["error"]
    assert trials[0].state is optuna.trial.TrialState.COMPLETE and trials[0].system_attrs["constraints"] == [
        1.0
    ]
    errors = {1: "exit status 17", 2: "killed by signal 11", 3: "timed out after 600 s", 4: "actor died"}
    for number, words in errors.items():
        t = trials[number]
        assert t.user_attrs["injected_fault"] == plan[number]
        assert status_of(t) == "retry" and t.state is optuna.trial.TrialState.FAIL, (number, t.user_attrs)
        assert words in t.user_attrs["error"], (number, t.user_attrs["error"])
        again = retried_from[number]
        assert again.params == t.params and again.user_attrs["attempt"] == 1
        assert "injected_fault" not in again.user_attrs
        assert status_of(again) in ("ok", "oom"), again.user_attrs  # the table's own answer
    assert trials[3].user_attrs["wall_seconds"] == pytest.approx(600.0)  # held its GPUs until the timeout
    assert trials[4].user_attrs["wall_seconds"] == pytest.approx(10.0)  # killed 10 s in
    found = _audit(path)
    assert found.ok, found.describe()
    assert found.faults["oom"] == {"oom": 1} and found.bookkeeping["retry"] == 4
    assert {k: dict(v) for k, v in found.faults.items() if k != "oom"} == {
        kind: {"retry": 1} for kind in ("crash", "segfault", "hang", "actor_kill")
    }


def test_a_node_restart_loses_every_trial_running_on_it(write_study, tmp_path):
    path = _study(
        write_study, tmp_path, n_trials=6, faults={"schedule": {2: "node_restart"}, "kill_after_s": 10.0}
    )
    optimize(load_study(path), printer=lambda _: None)
    trials = {t.number: t for t in open_study(load_study(path), create=False).get_trials()}
    lost = sorted(n for n, t in trials.items() if "node restarted" in str(t.user_attrs.get("error")))
    # every trial running when trial 2's node went down (10 s after trial 2 started) was lost
    # with it (ended then), and no other: none ran across that moment
    slots = {
        n: GpuSlot.from_attr(t.user_attrs[SLOT_ATTR]) for n, t in trials.items() if SLOT_ATTR in t.user_attrs
    }
    restart_at = slots[2].start + 10.0
    assert lost == sorted(n for n, slot in slots.items() if slot.start < restart_at <= slot.end + 1e-9)
    assert 2 in lost and len(lost) >= 2
    assert all(status_of(trials[n]) == "retry" and slots[n].end == pytest.approx(restart_at) for n in lost)
    found = _audit(path)
    assert found.ok, found.describe()
    assert found.bookkeeping["retry"] == len(lost) and found.counted == 6


def test_a_fault_on_every_attempt_fails_the_trial_for_good(write_study, tmp_path):
    path = _study(
        write_study, tmp_path, n_trials=4, faults={"rate": 1.0, "retry_rate": 1.0, "kinds": ["crash"]}
    )
    result = optimize(load_study(path), printer=lambda _: None)
    assert result.counted == 4
    study = open_study(load_study(path), create=False)
    final = counted_trials(study)
    assert [status_of(t) for t in final] == ["failed"] * 4
    assert all(t.user_attrs["attempt"] == 1 and "exit status 17" in t.user_attrs["error"] for t in final)
    found = _audit(path)
    assert found.ok, found.describe()
    assert found.states == {"failed": 4} and found.bookkeeping["retry"] == 4


def written_ahead_by_a_dead_driver(path: Path, measurement: Measurement | None = None) -> Path:
    """Trial 0 of the study at ``path`` RUNNING under a driver that died after its trial finished:
    its measurement (``measurement``, else the table's answer) written ahead on disk; returns that
    file."""
    loaded = load_study(path)
    study = open_study(loaded, create=True)
    config = TrialConfig(
        batch_size=8,
        number_gpus=1,
        distributed_backend="NONE",
        gradient_checkpointing=False,
        model_max_length=64,
    )
    study.enqueue_trial(loaded.space.params_for(config))
    trial = study.ask()
    record_driver(trial, loaded.space.suggest(trial), 0)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    me = study._storage.get_trial(trial._trial_id).user_attrs["driver"]
    trial.set_user_attr("driver", {**me, "pid": dead.pid})  # the driver is gone
    frozen_trial = study._storage.get_trial(trial._trial_id)
    assert loaded.replay_table is not None
    answer = measurement or loaded.replay_table.measurement(config)
    written = write_ahead(loaded.output_dir, loaded.spec.name, frozen_trial, answer)
    assert written is not None
    return written


def test_a_measurement_written_ahead_is_recovered_not_rerun(write_study, tmp_path):
    """A driver that died after its trial finished (the measurement on disk, the trial RUNNING):
    the resume records the trial from disk and does not run the configuration again."""
    path = _study(write_study, tmp_path, n_trials=1, faults={"rate": 0.0})
    written_ahead_by_a_dead_driver(path)
    loaded = load_study(path)
    lines: list[str] = []
    result = optimize(load_study(path), printer=lines.append)
    assert any("recorded trial(s) [0] from their measurement on disk" in line for line in lines), lines
    assert not any("started" in line for line in lines), lines
    assert result.counted == 1
    t0 = open_study(loaded, create=False).trials[0]
    assert status_of(t0) == "ok" and t0.values == [1008.0] and "recovered" in t0.user_attrs


def test_a_failed_attempt_written_ahead_is_recorded_as_the_retry_it_was(write_study, tmp_path):
    """A driver that died after a failed attempt was written ahead: the resume records the failure
    from disk as a retry (its error kept) and runs the configuration again as attempt 1. It was
    marked interrupted instead, its failure lost (the two-driver chaos test's audit: "trial 7
    failed on disk but is 'interrupted' in the storage")."""
    path = _study(write_study, tmp_path, n_trials=1, faults={"rate": 0.0})
    written_ahead_by_a_dead_driver(
        path, Measurement(outcome=Outcome.FAILED, error="rank 0: RuntimeError: boom")
    )
    lines: list[str] = []
    result = optimize(load_study(path), printer=lines.append)
    assert any("recorded trial(s) [0] from their measurement on disk" in line for line in lines), lines
    assert any("re-enqueued interrupted trial(s) [0]" in line for line in lines), lines
    first, second = open_study(load_study(path), create=False).trials
    assert (
        status_of(first) == "retry"
        and "boom" in first.user_attrs["error"]
        and "recovered" in first.user_attrs
    )
    assert status_of(second) == "ok" and second.user_attrs["attempt"] == 1
    assert result.counted == 1 and _audit(path).ok, _audit(path).describe()


def test_the_audit_finds_what_is_wrong(write_study, tmp_path):
    path = _study(write_study, tmp_path, n_trials=3, faults={"rate": 0.0})
    optimize(load_study(path), printer=lambda _: None)
    assert _audit(path).ok
    loaded = load_study(path)
    study = open_study(loaded, create=True)
    orphan = study.ask()  # RUNNING, under this live process
    ghost = json.loads((trial_dir(loaded.output_dir, 0) / JOURNAL_FILE).read_text())
    ghost["trial"], ghost["trial_id"] = 999, 999
    (trial_dir(loaded.output_dir, 999)).mkdir()
    (trial_dir(loaded.output_dir, 999) / JOURNAL_FILE).write_text(json.dumps(ghost))
    found = _audit(path)
    assert not found.ok
    assert f"trial {orphan.number}: stuck RUNNING" in found.problems
    assert any(p.startswith("lost:") and "999" in p for p in found.problems), found.problems
    proc = run_cli("audit", str(path), timeout=60)
    assert proc.returncode == 1 and "stuck RUNNING" in proc.stdout, proc.stdout + proc.stderr


def _counted(path: Path) -> int:
    try:
        study = open_study(load_study(path), create=False)
    except KeyError:
        return 0
    return len(counted_trials(study))


def _until(path: Path, proc: subprocess.Popen, counted: int, limit_s: float = 120.0) -> None:
    deadline = time.monotonic() + limit_s
    while _counted(path) < counted:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, f"{counted} trials not reached"
        time.sleep(0.2)


def _explorer(path: Path) -> subprocess.Popen:
    return start_cli("optimize", str(path))


@pytest.mark.slow_postgresql
def test_sigkill_and_sigint_of_the_driver_then_resume_lose_nothing(write_study, tmp_path, storage_url):
    """40 counted trials, 20% with faults, paced in real time; the driver is SIGKILLed after 10,
    resumed, interrupted with SIGINT after 25, and resumed again to the end."""
    path = _study(
        write_study,
        tmp_path,
        n_trials=40,
        storage=storage_url,
        faults={"rate": 0.2, "retry_rate": 0.3, "seed": 1, "kill_after_s": 15.0},
        launcher={
            "kind": "replay",
            "table": str(_table(tmp_path / "table.csv")),
            "max_retries": 1,
            "durations": {"ok_s": 100.0, "oom_s": 20.0, "failed_s": 30.0, "jitter": 0.3, "time_scale": 0.004},
        },
    )
    first = _explorer(path)
    _until(path, first, 10)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    running = [t for t in open_study(load_study(path), create=False).trials if t.state.name == "RUNNING"]
    assert running, "the kill left trials RUNNING, for the resume to reclaim"

    second = _explorer(path)
    _until(path, second, 25)
    second.send_signal(signal.SIGINT)
    out, _ = second.communicate(timeout=60)
    assert second.returncode == 130, out
    assert "Traceback" not in out and "interrupted: in-flight trials are marked" in out, out
    assert "resume:" in out

    third = _explorer(path)
    out, _ = third.communicate(timeout=120)
    assert third.returncode == 0, out
    found = _audit(path)
    assert found.ok, found.describe()
    assert found.counted == 40
    assert found.bookkeeping["interrupted"] >= 1
    assert sum(found.states.values()) == 40
    assert sum(sum(c.values()) for c in found.faults.values()) >= 4


def test_first_attempts_get_faults_evenly_and_in_turn():
    """Of any 100 launches in a row at rate 0.2, exactly 20 get a fault, every kind 3 or 4 times;
    the schedule overrides; retries draw by trial number at retry_rate."""
    from collections import Counter

    from explorer.fault import pick_fault
    from explorer.spec import FAULT_KINDS, FaultSpec

    spec = FaultSpec(rate=0.2, seed=1, schedule={7: "hang"})
    for start in (0, 13, 250):
        kinds = Counter(
            f.kind
            for n in range(start, start + 100)
            if (f := pick_fault(spec, trial_number=10_000, attempt=0, launch=n)) is not None
        )
        assert sum(kinds.values()) == 20 and set(kinds) == set(FAULT_KINDS)
        assert set(kinds.values()) <= {3, 4}
    fault = pick_fault(spec, trial_number=7, attempt=0, launch=3)
    assert fault is not None and fault.kind == "hang"
    assert pick_fault(spec, trial_number=7, attempt=1, launch=3) is None  # retry_rate 0
    again = FaultSpec(rate=0.0, retry_rate=0.5, seed=2)
    retried = [pick_fault(again, trial_number=n, attempt=1, launch=0) for n in range(200)]
    assert 70 < sum(f is not None for f in retried) < 130
    assert retried == [pick_fault(again, trial_number=n, attempt=1, launch=0) for n in range(200)]


def test_the_first_sigint_is_a_request_the_second_stops_at_once():
    from explorer.study._interrupt import StopRequest

    before = signal.getsignal(signal.SIGINT)
    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs between bytecodes
        assert stop.requested  # and nothing was raised
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.0)
    assert signal.getsignal(signal.SIGINT) is before


def test_the_write_ahead_never_follows_a_symlink_out_of_the_output_folder(tmp_path):
    import optuna

    from explorer.measurement import Measurement, Outcome

    study = optuna.create_study()
    trial = study.ask()
    out, elsewhere = tmp_path / "runs", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "trial-00000").symlink_to(elsewhere)
    assert write_ahead(out, "s", trial, Measurement(outcome=Outcome.OOM, error="x")) is None
    assert list(elsewhere.iterdir()) == []
    trial = study.ask()
    written = write_ahead(out, "s", trial, Measurement(outcome=Outcome.OOM, error="x"))
    assert written == out / "trial-00001" / JOURNAL_FILE and written.is_file()


def test_a_study_that_runs_out_of_configurations_says_so_and_audits(write_study, tmp_path):
    """4 configurations, n_trials 10: the study stops after 30 answered proposals in a row and
    records why; the audit accepts 4 counted trials then, and refuses them without that record."""
    path = _study(
        write_study,
        tmp_path,
        n_trials=10,
        faults={"rate": 0.0},
        when_converged="stop",
        search_space={
            "parameters": {
                "batch_size": {"values": [4, 8]},
                "number_gpus": {"values": [1, 2]},
                "distributed_backend": "DDP",
                "gradient_checkpointing": False,
            }
        },
    )
    result = optimize(load_study(path), printer=lambda _: None)
    assert result.counted == 4
    study = open_study(load_study(path), create=False)
    assert study.user_attrs["stopped_early"]["counted"] == 4
    found = _audit(path)
    assert found.ok, found.describe()
    assert "nothing new to try" in str(found.stopped_early)
    study.set_user_attr("stopped_early", None)
    found = _audit(path)
    assert found.problems == ["4 trials counted, n_trials is 10"]
