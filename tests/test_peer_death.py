"""A peer driver that dies while another waits on its trial: the survivor measures the
configuration once (its two proposals of it had both waited on the dead peer, not on each
other), reclaims the dead driver's trial, and the study audits."""

from __future__ import annotations

import datetime
import signal
import subprocess
import sys
import time

import pytest

from explorer.study import answered_without_running, open_study, status_of
from explorer.study_file import load_study
from tests.builders import REPO, start_cli
from tests.test_faults import _audit, _study

PEER = """
import sys, time
from explorer.study import open_study
from explorer.study._peers import Drivers
from explorer.study._record import record_driver
from explorer.study_file import load_study

loaded = load_study(sys.argv[1])
study = open_study(loaded, create=True)
drivers = Drivers.join(study)
with drivers.turn():
    trial = study.ask()
    record_driver(trial, loaded.space.suggest(trial), 0)
print("measuring", trial.number, flush=True)
time.sleep(600)
"""


@pytest.mark.slow  # a real driver and a peer process: 15 to 50 s on two busy cores
def test_two_proposals_waiting_on_a_dead_peer_measure_once(write_study, tmp_path):
    path = _study(write_study, tmp_path, faults={"rate": 0.0}, n_trials=3, parallel_trials=2)
    loaded = load_study(path)
    study = open_study(loaded, create=True)
    params = {"batch_size": 8, "number_gpus": 1}
    study.enqueue_trial(params)  # the peer's
    peer = subprocess.Popen(
        [sys.executable, "-c", PEER, str(path)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert peer.stdout is not None and peer.stdout.readline().split() == ["measuring", "0"]
    study.enqueue_trial(params, skip_if_exists=False)  # the survivor's two proposals of it
    study.enqueue_trial(params, skip_if_exists=False)
    survivor = start_cli("optimize", str(path))
    assert survivor.stdout is not None
    seen = []
    deadline = time.monotonic() + 120
    while sum("waits for trial 0" in line for line in seen) < 2:
        assert time.monotonic() < deadline and survivor.poll() is None, "".join(seen)
        seen.append(survivor.stdout.readline())
    peer.send_signal(signal.SIGKILL)
    peer.wait(timeout=30)
    out, _ = survivor.communicate(timeout=120)
    out = "".join(seen) + out
    assert survivor.returncode == 0, out
    assert "waits for trial 1: same configuration" in out or "waits for trial 2: same configuration" in out, (
        out
    )
    trials = open_study(load_study(path), create=False).get_trials(deepcopy=False)
    measured = [
        t.number
        for t in trials
        if t.user_attrs.get("config_key") == trials[0].user_attrs["config_key"]
        and status_of(t) in ("ok", "oom")
        and not answered_without_running(t)
    ]
    assert len(measured) == 1, (measured, out)
    assert trials[0].state.name == "FAIL" and status_of(trials[0]) == "interrupted", out  # reclaimed
    found = _audit(path)
    assert found.ok, found.describe()


def test_a_trial_of_a_driver_on_another_host_is_reclaimed_when_its_heartbeat_stops(
    write_study, tmp_path, storage_url
):
    """A RUNNING trial whose driver ran on another host (its liveness unknown here): left alone
    while its heartbeat is fresh, reclaimed (interrupted, re-enqueued) once the heartbeat is older
    than STALE_AFTER_S (the heartbeat moved back in the database, as time passing would)."""
    import sqlalchemy

    from explorer.study._peers import STALE_AFTER_S, beat, stale_trials
    from explorer.study._recover import reclaim_interrupted

    path = _study(write_study, tmp_path, faults={"rate": 0.0}, storage=storage_url)
    study = open_study(load_study(path), create=True)
    trial = study.ask()
    trial.set_user_attr("driver", {"host": "another-host", "pid": 1, "start": 0.0})
    beat(study, [trial._trial_id])
    assert stale_trials(study) == set()
    assert reclaim_interrupted(study, stale=stale_trials(study), live=True).left == [trial.number]
    engine = study._storage._backend.engine
    with engine.begin() as conn:
        now = conn.execute(sqlalchemy.select(sqlalchemy.func.now())).scalar()
        now = datetime.datetime.fromisoformat(now) if isinstance(now, str) else now  # sqlite: text
        then = now - datetime.timedelta(seconds=STALE_AFTER_S + 5)
        conn.execute(sqlalchemy.text("UPDATE trial_heartbeats SET heartbeat = :t"), {"t": then})
    assert stale_trials(study) == {trial.number}
    found = reclaim_interrupted(study, stale=stale_trials(study), live=True)
    assert found.requeued == [trial.number]
    frozen = study.trials[trial.number]
    assert frozen.state.name == "FAIL" and status_of(frozen) == "interrupted"
    assert study.trials[-1].state.name == "WAITING" and study.trials[-1].user_attrs["requeued_from"] == 0
