"""optuna-dashboard, as `explorer dashboard` serves it, shows what happened: out-of-memory and
invalid trials are never completed trials with value 0 (not in the trial list, the best card, the
history or the importances), and parameters read in user units (batch_size 64, not log2 6). The
record itself, which the search reads, is unchanged. Read through the dashboard's own WSGI app."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from explorer.measurement import Measurement, Outcome
from tests.builders import properties
from tests.test_dashboard import _wsgi_get as _get

ROOT = Path(__file__).resolve().parents[1]
RUN = [  # log2 batch, GPUs, outcome, tok/s/GPU
    (3, 1, Outcome.OK, 1500.0),
    (7, 2, Outcome.OOM, None),
    (6, 2, Outcome.OK, 3475.0),
    (8, 1, Outcome.OOM, None),
    (5, 2, Outcome.OK, 2900.0),
    (2, 1, Outcome.OK, 900.0),
]


@pytest.fixture
def quickstart(tmp_path: Path):
    from explorer.study import open_study, record_outcome
    from explorer.study_file import load_study

    url = f"sqlite:///{tmp_path}/q.db"
    loaded = load_study(ROOT / "studies" / "quickstart.yaml", storage=url, check_model=False)
    study = open_study(loaded, create=True)
    for log2, gpus, outcome, rate in RUN:
        study.enqueue_trial({"number_gpus": gpus, "log2_batch_size": log2})
        trial = study.ask()
        trial.suggest_int("number_gpus", 1, 2)
        trial.suggest_int("log2_batch_size", 2, 8)
        m = (
            Measurement(outcome=outcome, properties=properties(rate))
            if outcome is Outcome.OK
            else Measurement(outcome=outcome, error="DefaultCPUAllocator: can't allocate memory")
        )
        record_outcome(study, trial, m)
    return loaded, url


def test_oom_trials_are_not_results_and_parameters_read_in_user_units(quickstart) -> None:
    import optuna_dashboard

    from explorer.dashboard import dashboard_view

    loaded, url = quickstart
    raw = optuna.storages.RDBStorage(url)
    app = optuna_dashboard.wsgi(dashboard_view(raw, loaded))
    [summary] = _get(app, "/api/studies")["study_summaries"]
    detail = _get(app, f"/api/studies/{summary['study_id']}", "after=0")
    trials = detail["trials"]
    assert len(trials) == len(RUN)
    for t, (log2, _, outcome, rate) in zip(trials, RUN, strict=True):
        params = {p["name"]: p["param_external_value"] for p in t["params"]}
        assert params["batch_size"] == str(2**log2) and "log2_batch_size" not in params
        if outcome is Outcome.OOM:
            assert t["state"] == "Pruned" and not t.get("values"), t
            assert t["constraints"] == [1.0]  # the infeasibility is kept
        else:
            assert t["state"] == "Complete" and t["values"] == [pytest.approx(rate)]
    # the best card: the fastest measured trial, in user units
    [best] = detail["best_trials"]
    assert best["values"] == [pytest.approx(3475.0)]
    assert {p["name"]: p["param_external_value"] for p in best["params"]}["batch_size"] == "64"
    # the importances are computed from the measured trials, by the user's names
    importances = _get(app, f"/api/studies/{summary['study_id']}/param_importances")["param_importances"]
    assert {i["name"] for i in importances[0]} <= {"batch_size", "number_gpus"}
    # the record itself is unchanged: the search reads COMPLETE, 0 and log2 as before
    stored = optuna.load_study(study_name=loaded.spec.name, storage=url).trials
    assert [t.state for t in stored] == [optuna.trial.TrialState.COMPLETE] * len(RUN)
    assert [t.params["log2_batch_size"] for t in stored] == [r[0] for r in RUN]
    assert [t.values[0] for t in stored if max(t.constraints.values()) > 0] == [0.0, 0.0]


def test_the_raw_storage_is_what_the_view_fixes(quickstart) -> None:
    """The same study served raw (plain optuna-dashboard): the OOM trials read as Complete 0 and
    the parameter in log2, which is what users saw."""
    import optuna_dashboard

    _, url = quickstart
    app = optuna_dashboard.wsgi(optuna.storages.RDBStorage(url))
    [summary] = _get(app, "/api/studies")["study_summaries"]
    trials = _get(app, f"/api/studies/{summary['study_id']}", "after=0")["trials"]
    assert trials[1]["state"] == "Complete" and trials[1]["values"] == [0.0]
    assert "log2_batch_size" in {p["name"] for p in trials[1]["params"]}
