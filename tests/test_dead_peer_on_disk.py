"""A driver killed between writing its measurement to disk and recording it in the storage, while
this driver waits for that trial: its measurement is recorded from disk and reused, never measured
a second time.

Driver A is a real process that asks the trial, writes its measurement ahead (as every driver does
before recording it) and is SIGKILLed there; this process is driver B, whose trial of the same
configuration waits for A's. B notices A's death when it looks around: before its waiting trial
takes the configuration over, A's trial is reclaimed (recorded from disk)."""

from __future__ import annotations

import signal
import subprocess
import sys

import optuna

from explorer.record import TrialRecord
from explorer.study import open_study
from explorer.study._peers import Drivers
from explorer.study_file import load_study
from tests.builders import REPO
from tests.test_faults import _study
from tests.test_two_driver_race import driver_loop

C = {"batch_size": 8, "number_gpus": 1}

DRIVER_A = """
import sys, time
from explorer.measurement import Measurement, Outcome
from explorer.search._strategy import make_strategy
from explorer.study import open_study
from explorer.study._flight import ask_trial
from explorer.study._journal import write_ahead
from explorer.study._known import Known
from explorer.study._peers import Drivers
from explorer.study_file import load_study
from tests.builders import properties

loaded = load_study(sys.argv[1])
study = open_study(loaded, create=False)
drivers = Drivers.join(study)
strategy = make_strategy(loaded.space, loaded.spec, per_gpu_ranked=True)
with drivers.turn():
    trial, *_ = ask_trial(study, loaded, Known.from_study(study), strategy, {}, [], 0, False)
measured = Measurement(outcome=Outcome.OK, properties=properties(4321.0))
write_ahead(loaded.output_dir, loaded.spec.name, trial, measured)
print("written", trial.number, flush=True)
time.sleep(600)  # killed here: measured and on disk, not recorded
"""


def test_a_measurement_on_disk_of_a_dead_driver_is_reused_not_measured_again(write_study, tmp_path):
    path = _study(write_study, tmp_path, faults={"rate": 0.0}, n_trials=4)
    loaded = load_study(path)
    study = open_study(loaded, create=True)
    study.enqueue_trial(C)  # trial 0: A's
    a = subprocess.Popen(
        [sys.executable, "-c", DRIVER_A, str(path)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    drivers = Drivers.join(study)
    try:
        assert a.stdout is not None and a.stdout.readline().split() == ["written", "0"]
        loop = driver_loop(loaded, study, drivers, journal=loaded.output_dir)
        study.enqueue_trial(C, skip_if_exists=False)  # trial 1: B's, waits for A's trial 0
        asked = loop._ask(room=True)
        assert asked is not None and asked[0].number == 1 and asked[3] is not None and asked[3].number == 0
        loop._answer(*asked)
        assert [(f.trial.number, source.number) for f, source in loop.remote] == [(1, 0)]
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=30)

        loop._look_around()

        assert not loop.pending, "B measures the configuration that A measured and wrote to disk"
        assert not loop.remote
        trials = open_study(loaded, create=False).get_trials(deepcopy=False)
        assert trials[0].state is optuna.trial.TrialState.COMPLETE
        assert TrialRecord.of(trials[0]).recovered
        assert trials[1].state is optuna.trial.TrialState.COMPLETE
        assert TrialRecord.of(trials[1]).reused_from == 0
    finally:
        if a.poll() is None:
            a.kill()
            a.wait(timeout=30)
        drivers.leave()
