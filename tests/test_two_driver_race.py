"""Two drivers on one study, stepped through the interleavings in which both measured one
configuration: a trial that waited for another trial of it, which failed and is retried, takes the
configuration over while another driver takes it over too (asks the retry, or its own trial that
waited). Whichever decides second must see the first: exactly one trial measures it, the others
wait for that one.

Driver B is a real process (its own Optuna handle, its own driver lock) driven line by line over
stdin; driver A is this test process, on the same storage."""

from __future__ import annotations

import subprocess
import sys
import threading
from dataclasses import dataclass, field

import pytest

from explorer.launch import launcher_for
from explorer.measurement import Measurement, Outcome
from explorer.search._strategy import make_strategy
from explorer.study import open_study
from explorer.study._flight import InFlight, ask_trial, settle_remote
from explorer.study._known import Known
from explorer.study._loop import Loop
from explorer.study._peers import Drivers
from explorer.study._record import config_of, record_outcome
from explorer.study_file import load_study
from tests.builders import REPO
from tests.test_faults import _study

DRIVER_B = """
import fcntl, sys
import sqlalchemy
from explorer.measurement import Measurement, Outcome
from explorer.search._strategy import make_strategy
from explorer.study import open_study
from explorer.study._flight import InFlight, ask_trial, settle_remote
from explorer.study._known import Known
from explorer.study._peers import Drivers
from explorer.study._record import frozen, record_outcome
from explorer.study._recover import requeue
from explorer.study_file import load_study

loaded = load_study(sys.argv[1])
study = open_study(loaded, create=False)
drivers = Drivers.join(study)
strategy = make_strategy(loaded.space, loaded.spec, per_gpu_ranked=True)
known = Known.from_study(study)
trials, remote = {}, []

def turn_is_free():
    if drivers._fd is not None:  # sqlite: held from here on when free (turn() takes it again)
        try:
            fcntl.lockf(drivers._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, drivers._turn_at)
        except OSError:
            return False
        return True
    with drivers._engine.begin() as conn:  # PostgreSQL: free now and then (nobody else asks)
        query = sqlalchemy.text("SELECT pg_try_advisory_xact_lock(:key)")
        return bool(conn.execute(query, {"key": drivers._key}).scalar())

for line in sys.stdin:
    cmd, *arg = line.split()
    if cmd == "ask":
        print("turn", "free" if turn_is_free() else "busy", flush=True)
        with drivers.turn():
            trial, config, attempt, elsewhere = ask_trial(study, loaded, known, strategy, {}, [], 0, True)
        trials[trial.number] = trial
        if elsewhere is not None:
            remote.append((InFlight(trial, config, attempt), elsewhere))
        print("asked", trial.number, -1 if elsewhere is None else elsewhere.number, flush=True)
    elif cmd == "settle":
        rerun = []
        settle_remote(study, remote, rerun.append, known, lambda line: None, drivers.turn)
        print("rerun", *[f.trial.number for f in rerun], flush=True)
    elif cmd == "oom":
        record_outcome(study, trials[int(arg[0])], Measurement(outcome=Outcome.OOM, error="out of memory"))
        print("done", flush=True)
    elif cmd == "retry":
        trial = trials[int(arg[0])]
        record_outcome(study, trial, Measurement(outcome=Outcome.FAILED, error="crash"), retry=True)
        requeue(study, frozen(study, trial), attempt=1, why="failed")
        print("done", flush=True)
"""

C = {"batch_size": 8, "number_gpus": 1}
"""The configuration both drivers come to measure."""
D = {"batch_size": 12, "number_gpus": 1}
"""Another one, measured by B while A waits: what A learns when it reads the study next."""


@dataclass(kw_only=True)
class PausingKnown(Known):
    """What driver A knows, pausing A once (when armed) at the first measurement it learns from a
    read of the study: A has read the trials then and not yet decided anything from them."""

    armed: bool = False
    read: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)

    def learn(self, trial, config) -> None:
        if self.armed:
            self.armed = False
            self.read.set()
            assert self.go.wait(timeout=120), "never told to go on"
        super().learn(trial, config)


class DriverB:
    def __init__(self, path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", DRIVER_B, str(path)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def reply(self) -> list[str]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"driver B ended: {self.proc.wait(timeout=30)}"
        return line.split()

    def __call__(self, line: str) -> list[str]:
        self.send(line)
        return self.reply()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


def driver_loop(loaded, study, drivers: Drivers, journal=None) -> Loop:
    """A driver's loop on ``study`` in this process, its trials stepped by the test."""
    return Loop(
        loaded,
        study,
        drivers=drivers,
        launcher=launcher_for(loaded, output_dir=loaded.output_dir),
        strategy=make_strategy(loaded.space, loaded.spec, per_gpu_ranked=True),
        owns_launcher=False,
        printer=print,
        progress=None,
        store=None,
        scope=None,
        journal=journal,
        started=0.0,
        done=0,
    )


@pytest.fixture
def driver_b():
    started: list[DriverB] = []
    yield lambda path: started.append(DriverB(path)) or started[-1]
    for b in started:
        b.close()


@pytest.mark.slow  # a second driver process and its storage: 45 to 130 s on two busy cores
def test_a_waiting_trial_and_the_retry_of_its_source_never_both_measure(
    write_study, tmp_path, storage_url, driver_b
):
    path = _study(write_study, tmp_path, faults={"rate": 0.0}, storage=storage_url, n_trials=10)
    loaded = load_study(path)
    study = open_study(loaded, create=True)
    study.enqueue_trial(C)  # trial 0: B's
    b = driver_b(path)
    assert b("ask") == ["turn", "free"] and b.reply() == ["asked", "0", "-1"]

    drivers = Drivers.join(study)
    assert drivers.others()
    known = PausingKnown.from_study(study)
    strategy = make_strategy(loaded.space, loaded.spec, per_gpu_ranked=True)
    study.enqueue_trial(C, skip_if_exists=False)  # trial 1: A's, waits for B's trial 0
    with drivers.turn():
        trial, config, attempt, elsewhere = ask_trial(study, loaded, known, strategy, {}, [], 0, True)
    assert trial.number == 1 and elsewhere is not None and elsewhere.number == 0
    remote = [(InFlight(trial, config, attempt), elsewhere)]

    study.enqueue_trial(D)  # trial 2: B measures it (OOM) while A waits
    assert b("ask")[1:] == ["free"] and b.reply() == ["asked", "2", "-1"]
    assert b("oom 2") == ["done"]
    assert b("retry 0") == ["done"]  # trial 0 failed, its retry (trial 3) waits in the queue

    rerun: list[InFlight] = []
    known.armed = True
    a = threading.Thread(target=settle_remote, args=(study, remote, rerun.append, known, print, drivers.turn))
    a.start()
    assert known.read.wait(timeout=120), "driver A never read the study"
    turn = b("ask")  # B asks the retry while A has read the study and decided nothing yet
    if turn == ["turn", "free"]:
        asked = b.reply()
        known.go.set()
    else:
        known.go.set()
        asked = b.reply()
    a.join(timeout=120)
    assert not a.is_alive()
    assert asked[:2] == ["asked", "3"]

    a_measures = [f.trial.number for f in rerun]
    b_measures = [3] if asked[2] == "-1" else []
    assert len(a_measures + b_measures) == 1, f"configuration measured by trials {a_measures + b_measures}"
    # A, in its turn first, took the configuration; B's retry then waits for A's trial
    assert a_measures == [1] and asked[2] == "1" and not remote
    trials = open_study(loaded, create=False).get_trials(deepcopy=False)
    assert config_of(trials[3]).key() == config.key()
    assert trials[1].user_attrs.get("waits_for") is None and trials[3].user_attrs.get("waits_for") == 1


@pytest.mark.slow  # a second driver process and its storage: 45 to 130 s on two busy cores
def test_the_retry_handed_to_a_twin_waits_for_the_driver_that_took_the_configuration_over(
    write_study, tmp_path, storage_url, driver_b
):
    """A runs trial 0 with a twin (trial 1) waiting for it; B's trial 2 waits for trial 0 too.
    Trial 0 fails and is retried: B takes the configuration over first (its trial 2 runs it),
    then A hands the retry to its twin, which must wait for B's trial 2 instead of running."""
    path = _study(write_study, tmp_path, faults={"rate": 0.0}, storage=storage_url, n_trials=10)
    loaded = load_study(path)
    study = open_study(loaded, create=True)
    b = driver_b(path)
    loop = driver_loop(loaded, study, Drivers.join(study))
    study.enqueue_trial(C)  # trial 0: A runs it (in flight, not launched: its end is told below)
    asked = loop._ask(room=True)
    assert asked is not None and asked[0].number == 0 and asked[3] is None
    loop._answer(*asked)
    flight = loop.pending.pop()
    loop.in_flight[0] = flight
    study.enqueue_trial(C, skip_if_exists=False)  # trial 1: A's twin of it
    asked = loop._ask(room=True)
    assert asked is not None and asked[0].number == 1
    loop._answer(*asked)
    assert [t.trial.number for t in loop.twins[flight.config.key()]] == [1]
    study.enqueue_trial(C, skip_if_exists=False)  # trial 2: B's, waits for A's trial 0
    assert b("ask") == ["turn", "free"] and b.reply() == ["asked", "2", "0"]

    # A's Loop._settle of trial 0, step by step, with B's settle between its first steps
    del loop.in_flight[0]
    failed = Measurement(outcome=Outcome.FAILED, error="crash")
    assert record_outcome(study, flight.trial, failed, retry=True) == "retry"
    assert b("settle") == ["rerun", "2"]  # B saw no trial measuring it: its trial 2 runs it
    loop._settle_twins(flight, 0, "retry", True, loop.twins.pop(flight.config.key()))

    assert not loop.pending, "A runs the configuration that B's trial 2 runs"
    assert [(f.trial.number, source.number) for f, source in loop.remote] == [(1, 2)]
    trials = open_study(loaded, create=False).get_trials(deepcopy=False)
    assert trials[1].user_attrs.get("waits_for") == 2 and trials[1].user_attrs.get("requeued_from") == 0
    assert trials[2].user_attrs.get("waits_for") is None


def test_an_injected_fault_beaten_by_another_trials_node_restart_is_a_lost_attempt():
    """The chaos run's audit: a trial lost with the node another trial's injected restart took
    down, before its own injected fault struck, ended as a lost attempt (retried, or failed for
    good on its last attempt), not as its own fault; its own fault's wrong ending still shows."""
    import optuna

    from explorer.record import TrialRecord
    from explorer.study._audit import _fault_ended_as_expected

    lost = "Ray: the node restarted; every trial on it was lost (simulated)"

    def ended(status: str, attempt: int, error: str) -> TrialRecord:
        attrs = {"status": status, "attempt": attempt, "error": error, "injected_fault": "oom"}
        return TrialRecord.of(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, user_attrs=attrs))

    assert _fault_ended_as_expected("oom", ended("failed", 1, lost), max_retries=1)
    assert _fault_ended_as_expected("oom", ended("retry", 0, lost), max_retries=1)
    assert not _fault_ended_as_expected("oom", ended("failed", 0, lost), max_retries=1)
    assert not _fault_ended_as_expected("oom", ended("failed", 1, "injected fault 'crash'"), max_retries=1)
