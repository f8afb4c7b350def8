"""Search strategies behind one contract (``sampler.strategy``): every registered name runs a real
study on the quickstart space (the replay launcher on its measured CPU table), an unknown name is
refused in one line with the known ones, and the flags that named a search before load as the
strategy they were."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import optuna
import pytest
import yaml

from explorer.search import STRATEGY_CLASSES, Proposal, Strategy, StudyState, make_strategy
from explorer.spec import SamplerSpec
from explorer.spec._models import STRATEGIES
from explorer.study_file import load_study
from explorer.validity import invalid_reason
from tests.builders import run_cli

REPO = Path(__file__).resolve().parents[1]
N_TRIALS = 8
PROPOSING = {"default", "no-inference", "no-priors", "cover-start", "tpe-every-3", "walk"}
"""The strategies that propose trials themselves (the others leave every trial to a sampler)."""
SAMPLERS = {
    "no-local-search": optuna.samplers.TPESampler,
    "random": optuna.samplers.RandomSampler,
    "optuna": optuna.samplers.TPESampler,
    "gp": optuna.samplers.GPSampler,
}


@pytest.fixture(scope="module")
def quickstart():
    return load_study(
        REPO / "studies" / "quickstart.yaml",
        replay_table=REPO / "benchmarks" / "results" / "tables" / "cpu-quickstart.csv",
    )


def _with(loaded, name: str, **spec):
    sampler = SamplerSpec(seed=0, n_startup_trials=3, strategy=name)
    return dataclasses.replace(
        loaded, spec=loaded.spec.model_copy(update={"sampler": sampler, "n_trials": N_TRIALS, **spec})
    )


def test_the_registry_is_the_study_files_list():
    """Each name a study file accepts is one registered strategy, in the benchmark's order."""
    assert tuple(STRATEGY_CLASSES) == STRATEGIES
    assert all(issubclass(c, Strategy) and c.name == n for n, c in STRATEGY_CLASSES.items())
    assert PROPOSING | set(SAMPLERS) == set(STRATEGIES)


@pytest.mark.parametrize("name", STRATEGIES)
def test_every_strategy_runs_a_study_on_the_quickstart_space(quickstart, name):
    """The real optimize loop, in memory, on the replayed quickstart table: ``N_TRIALS`` counted
    trials, every one a valid configuration of the space; the proposing strategies propose the
    first trial and most of the others, the rest leave them to their sampler."""
    from explorer.study import config_of, open_study, optimize

    run = _with(quickstart, name)
    storage = optuna.storages.InMemoryStorage()
    result = optimize(run, printer=lambda _: None, storage=storage, write_ahead=False)
    assert result.counted == N_TRIALS
    trials = sorted(open_study(run, create=False, storage=storage).get_trials(), key=lambda t: t.number)
    for t in trials:
        assert invalid_reason(config_of(t), run.spec.resources) is None, t.number
    proposed = [t.user_attrs.get("proposed_by") for t in trials]
    if name in PROPOSING:
        assert proposed[0] in ("frontier", "start", "model"), proposed
        assert sum(p is not None for p in proposed) >= len(trials) // 2, proposed
    else:
        assert proposed == [None] * len(trials)


@pytest.mark.parametrize("name", STRATEGIES)
def test_each_strategy_answers_the_contract(quickstart, name):
    """Asked on an empty study, a proposing strategy proposes a valid configuration of the space,
    the others leave the trial to their sampler; each names its Optuna sampler and whether OOM
    inference answers its proposals."""
    strategy = make_strategy(quickstart.space, _with(quickstart, name).spec, per_gpu_ranked=True)
    assert type(strategy) is STRATEGY_CLASSES[name]
    empty = StudyState(
        asked=0,
        answered=set(),
        feasible={},
        ooms=[],
        peaks={},
        streak=0,
        params=lambda: [],
        proposed=lambda by: [],
    )
    proposal = strategy.propose(empty)
    if name in PROPOSING:
        assert isinstance(proposal, Proposal) and proposal.by in ("frontier", "start", "model")
        assert invalid_reason(proposal.config, quickstart.spec.resources) is None
    else:
        assert proposal is None
        assert type(strategy.sampler()) is SAMPLERS[name]
    assert strategy.infers_oom == (name not in ("no-inference", "random", "optuna", "gp"))


def _study_file(tmp_path: Path, sampler: dict) -> Path:
    data = yaml.safe_load((REPO / "studies" / "quickstart.yaml").read_text())
    data["sampler"] = sampler
    data["search_space"] = str(REPO / "search_spaces" / "quickstart.yaml")
    data["storage"] = f"sqlite:///{tmp_path}/study.db"
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_an_unknown_strategy_is_refused_with_the_known_ones(tmp_path):
    """``explorer optimize``: exit 2, one line naming the field and every known strategy, no
    traceback, nothing written."""
    proc = run_cli("optimize", str(_study_file(tmp_path, {"kind": "tpe", "strategy": "defualt"})))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert "study.yaml: sampler.strategy: unknown strategy 'defualt'" in lines[0], lines[0]
    assert f"(known: {', '.join(STRATEGIES)}); did you mean default" in lines[0], lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.yaml"]


@pytest.mark.parametrize(
    ("flags", "name"),
    [
        ({"local_search": False}, "no-local-search"),
        ({"local_search": False, "frontier_start": False}, "no-local-search"),
        ({"memory_prior": False, "throughput_prior": False}, "no-priors"),
        ({"frontier_start": False}, "cover-start"),
        ({"global_every": 3}, "tpe-every-3"),
        ({"local_search": True, "memory_prior": True}, "default"),
        ({"frontier_start": True, "strategy": "walk"}, "walk"),
    ],
)
def test_the_old_flags_load_as_the_strategy_they_were(tmp_path, flags, name):
    loaded = load_study(_study_file(tmp_path, {"kind": "tpe", **flags}), check_model=False)
    assert loaded.spec.sampler.strategy == name


@pytest.mark.parametrize(
    "flags",
    [
        {"memory_prior": False},
        {"global_every": 2},
        {"frontier_start": False, "memory_prior": False, "throughput_prior": False},
        {"frontier_start": False, "strategy": "walk"},
        {"local_search": "no"},
    ],
)
def test_old_flags_no_strategy_was_are_refused_naming_the_field(tmp_path, flags):
    """A setting of the old flags that is no strategy: one line naming ``sampler.strategy``."""
    from explorer.errors import SpecError

    with pytest.raises(SpecError) as err:
        load_study(_study_file(tmp_path, {"kind": "tpe", **flags}), check_model=False)
    line = str(err.value)
    assert "\n" not in line and ": sampler: " in line, line
    assert f"named by sampler.strategy now (one of {', '.join(STRATEGIES)})" in line, line
