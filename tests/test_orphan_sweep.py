"""The orphan sweep never fails a trial whose driver is alive but slow to record itself.

A driver asks a trial and records itself on it in its turn; a RUNNING trial with no driver after
``ORPHAN_AFTER_S`` was asked by a driver that died, and the sweep fails it (and enqueues its
configuration again). Driver A here is a real process whose ask takes longer than that (it pauses
between asking and recording, as a busy storage or a long proposal would); this process is driver B
and sweeps meanwhile. In the turn (as the driver's loop sweeps) B waits for A and leaves the trial
alone; the same sweep outside the turn (as the loop swept before) abandons a live trial."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time

import optuna
import pytest

from explorer.record import TrialRecord
from explorer.study import open_study
from explorer.study._peers import Drivers
from explorer.study._recover import ORPHAN_AFTER_S, reclaim_orphans
from explorer.study_file import load_study
from tests.builders import REPO
from tests.test_faults import _study

SLOW_ASK = ORPHAN_AFTER_S + 2.0
"""How long driver A's ask takes, asking to recording itself (past the orphan threshold)."""

DRIVER_A = f"""
import sys, time
import explorer.study._flight as flight
from explorer.search._strategy import make_strategy
from explorer.study import open_study
from explorer.study._known import Known
from explorer.study._peers import Drivers
from explorer.study_file import load_study

loaded = load_study(sys.argv[1])
study = open_study(loaded, create=False)
drivers = Drivers.join(study)
record = flight.record_driver

def slow_record(trial, config, attempt):  # the slow ask: asked, not yet recorded
    print("asked", trial.number, flush=True)
    time.sleep({SLOW_ASK})
    record(trial, config, attempt)

flight.record_driver = slow_record
strategy = make_strategy(loaded.space, loaded.spec, per_gpu_ranked=True)
with drivers.turn():
    flight.ask_trial(study, loaded, Known.from_study(study), strategy, {{}}, [], 0, True)
print("recorded", flush=True)
sys.stdin.read()  # alive (its trial running) until the test closes stdin
"""


@pytest.mark.parametrize(
    "in_turn",
    [pytest.param(True, id="in-turn"), pytest.param(False, id="outside-the-turn", marks=pytest.mark.slow)],
)
def test_a_slow_ask_is_not_an_orphan(write_study, tmp_path, in_turn):
    path = _study(write_study, tmp_path, faults={})
    loaded = load_study(path)
    study = open_study(loaded, create=True)
    drivers = Drivers.join(study)
    a = subprocess.Popen(
        [sys.executable, "-c", DRIVER_A, str(path)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert a.stdout is not None
        word, number = a.stdout.readline().split()
        assert word == "asked"
        time.sleep(ORPHAN_AFTER_S + 0.5)  # the trial is older than the threshold, still unrecorded
        turn = drivers.turn if in_turn else contextlib.nullcontext
        abandoned = reclaim_orphans(study, turn)
        if in_turn:  # B waited for A's turn to end: A recorded itself, its trial runs on
            assert a.stdout.readline().split() == ["recorded"]
            assert abandoned == []
            trial = study.get_trials(deepcopy=False)[int(number)]
            assert trial.state is optuna.trial.TrialState.RUNNING
            assert TrialRecord.of(trial).driver["pid"] == a.pid
        else:  # the window the turn closes: a live driver's trial failed under it, the driver crashes
            assert abandoned == [int(number)]
            trial = study.get_trials(deepcopy=False)[int(number)]
            assert trial.state is optuna.trial.TrialState.FAIL
            assert a.wait(timeout=60) != 0
            assert a.stderr is not None and "UpdateFinishedTrialError" in a.stderr.read()
    finally:
        if a.stdin is not None:
            a.stdin.close()
        a.wait(timeout=30)
        drivers.leave()
