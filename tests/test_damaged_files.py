"""Every file explorer reads back is checked where it is read: a damaged write-ahead measurement
or run-folder marker is named with what to do, never a traceback, and never blocks the study."""

from __future__ import annotations

from pathlib import Path

import pytest

from explorer.cli import main
from explorer.study import audit, open_study, optimize, status_of
from explorer.study._journal import DAMAGED_SUFFIX, JOURNAL_FILE, trial_dir
from explorer.study._run_folder import MARKER
from explorer.study_file import load_study
from tests.test_faults import _study, written_ahead_by_a_dead_driver

DAMAGE = {
    "truncated": b'{"study": "test", "trial": 0, "measurement": {"outcome": "o',
    "empty": b"",
    "garbage": bytes(range(256)) * 4,
    "no measurement": b'{"study": "test", "trial": 0, "trial_id": 1, "start": "x"}',
    "bad outcome": b'{"study": "test", "trial": 0, "trial_id": 1, "start": "x", "measurement": {"outcome": "?"}}',
}


def _audit(path: Path):
    loaded = load_study(path)
    spec = loaded.spec
    study = open_study(loaded, create=False)
    return audit(
        study, n_trials=spec.n_trials, max_retries=spec.launcher.max_retries, output_dir=loaded.output_dir
    )


@pytest.mark.parametrize(
    "damage",
    [d if d in ("truncated", "garbage") else pytest.param(d, marks=pytest.mark.slow) for d in DAMAGE],
)
def test_a_damaged_measurement_of_a_running_trial_never_blocks_the_study(write_study, tmp_path, damage):
    path = _study(write_study, tmp_path, n_trials=2, faults={"rate": 0.0})
    journal = written_ahead_by_a_dead_driver(path)
    journal.write_bytes(DAMAGE[damage])
    result = optimize(load_study(path), printer=lambda _: None)  # no JSONDecodeError, no UnicodeDecodeError
    assert result.counted == 2
    study = open_study(load_study(path), create=False)
    assert status_of(study.trials[0]) == "interrupted"  # re-run, its configuration measured again
    assert (journal.parent / (JOURNAL_FILE + DAMAGED_SUFFIX)).read_bytes() == DAMAGE[damage]  # kept, aside
    assert _audit(path).ok, _audit(path).problems
    assert (
        optimize(load_study(path), printer=lambda _: None).counted == 2
    )  # and again: nothing left to trip on


@pytest.mark.parametrize(
    "damage", [d if d == "truncated" else pytest.param(d, marks=pytest.mark.slow) for d in DAMAGE]
)
def test_audit_names_a_damaged_measurement_of_a_recorded_trial(write_study, tmp_path, capsys, damage):
    path = _study(write_study, tmp_path, n_trials=2, faults={"rate": 0.0})
    optimize(load_study(path), printer=lambda _: None)
    journal = trial_dir(load_study(path).output_dir, 0) / JOURNAL_FILE
    journal.write_bytes(DAMAGE[damage])
    capsys.readouterr()
    assert main(["audit", str(path)]) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.err.strip() == ""
    assert f"damaged: {journal} is " in captured.out and "delete it or restore it" in captured.out


@pytest.mark.parametrize("marker", [bytes(range(256)), b"\xff\xfe garbage", b"[1, 2]", b'{"study": 3'])
def test_a_garbage_marker_is_named_with_what_to_do(write_study, tmp_path, capsys, marker):
    path = _study(write_study, tmp_path, n_trials=2, faults={"rate": 0.0})
    folder = load_study(path).output_dir
    folder.mkdir(parents=True)
    (folder / MARKER).write_bytes(marker)
    assert main(["optimize", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "output_dir" in err[0] and "a marker explorer cannot read" in err[0], err
