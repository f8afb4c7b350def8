"""Two objectives (issue 5): tokens per second per GPU with a second one from the study file."""

from __future__ import annotations

import optuna
import pytest

from explorer.errors import SpecError
from explorer.study import open_study, optimize, status_of
from explorer.study._objectives import INFEASIBLE_MINIMIZED
from explorer.study_file import load_study


def test_a_two_objective_quickstart_has_a_pareto_front(write_study, tmp_path, ray_local, capsys):
    """Real CPU trials; batch 512 runs out of memory and is on no front. The front is the set of
    measured trials that no other measured trial dominates (recomputed here from the stored values:
    whether batch 8 also beats batch 4 on speed depends on the machine's load)."""
    path = write_study(
        {
            "storage": f"sqlite:///{tmp_path}/p.db",
            "n_trials": 3,
            "sampler": {"kind": "grid"},
            "second_objective": "peak_memory_gib",
            "search_space": {
                "parameters": {
                    "batch_size": {"values": [4, 8, 512]},
                    "number_gpus": 1,
                    "gradient_checkpointing": False,
                }
            },
        }
    )
    optimize(load_study(path), printer=lambda _: None)
    study = open_study(load_study(path), create=False)
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    assert study.metric_names == ["dataset_tokens_per_second_per_gpu", "peak_memory_gib"]
    trials = study.get_trials(deepcopy=False)
    for t in trials:
        if status_of(t) == "ok":
            assert t.values == [
                t.user_attrs["dataset_tokens_per_second_per_gpu"],
                t.user_attrs["peak_memory_gib"],
            ]
        else:
            assert status_of(t) == "oom" and t.values == [0.0, INFEASIBLE_MINIMIZED]
    front = study.best_trials
    ok = [t for t in trials if status_of(t) == "ok"]
    assert sorted(status_of(t) for t in trials) == ["ok", "ok", "oom"]

    def dominates(a, b) -> bool:  # faster-or-equal and smaller-or-equal, better in one
        (ra, ma), (rb, mb) = a.values, b.values
        return ra >= rb and ma <= mb and (ra > rb or ma < mb)

    expected = {t.number for t in ok if not any(dominates(o, t) for o in ok)}
    assert {t.number for t in front} == expected and expected

    from explorer.cli import main
    from explorer.report import pareto_lines

    lines = pareto_lines(study)
    assert lines[0].startswith(f"Pareto front ({len(front)} trials)") and len(lines) == 1 + len(front)
    assert main(["best", str(path), "--steps", "1", "--out", str(tmp_path / "best")]) == 0
    printed = capsys.readouterr().out
    assert "Pareto front" in printed and (tmp_path / "best" / "accelerate.yaml").is_file()


def test_a_stored_study_with_other_objectives_is_refused(write_study, tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    single = load_study(write_study({"storage": url}))
    open_study(single, create=True)
    double = load_study(write_study({"storage": url, "second_objective": "number_gpus"}, name="two.yaml"))
    with pytest.raises(SpecError, match="second_objective"):
        open_study(double, create=True)


@pytest.mark.parametrize("where", ["memory", "sqlite"])
def test_number_of_gpus_is_a_real_value_even_when_infeasible(write_study, tmp_path, where):
    """The GPU count comes from the configuration written with the driver's one transaction
    (on sqlite it bypasses Optuna's ``set_user_attr``: the live trial must still say it)."""
    from explorer.measurement import Measurement, Outcome
    from explorer.record import write as set_user_attrs
    from explorer.study import record_outcome

    storage = f"sqlite:///{tmp_path}/s.db" if where == "sqlite" else None
    study = optuna.create_study(directions=["maximize", "minimize"], storage=storage)
    study.set_metric_names(["dataset_tokens_per_second_per_gpu", "number_gpus"])
    trial = study.ask()
    set_user_attrs(trial, {"number_gpus": 2})
    record_outcome(study, trial, Measurement(outcome=Outcome.OOM, error="x"))
    assert study.trials[0].values == [0.0, 2.0]
