"""A large declared speed-up is measured both ways once: with ``torch_compile`` (declared 1.16x) on
in every feasible trial, the default search's next proposal is the best one with it off; once an
uncompiled trial is feasible, or when the best is uncompiled, nothing is contrasted. On the knob
table where compile loses to Liger alone, the contrast is proposed in every seeded run that
measured compiled configurations only."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import optuna

from explorer.record import TrialRecord
from explorer.search import _neighbours, make_strategy
from explorer.search._neighbours import CONTRAST, CONTRAST_AFTER, UNCHECKPOINTED_AFTER
from explorer.spec import SamplerSpec
from explorer.study import optimize
from explorer.study_file import load_study

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "benchmarks/results/tables/knobs-granite-2b-a100-80x4-compile.csv.gz"
STUDY = ROOT / "benchmarks/search_studies/knobs/granite-2b-a100-80x4-compile.yaml"


def _loaded():
    return load_study(STUDY, replay_table=TABLE, check_model=False)


def _replayed(loaded, *, seed: int, n_trials: int):
    """A fresh in-memory study of the default search on the replayed table: its trials, records."""
    spec = loaded.spec.model_copy(update={"n_trials": n_trials, "sampler": SamplerSpec(seed=seed)})
    storage = optuna.storages.InMemoryStorage()
    optimize(
        dataclasses.replace(loaded, spec=spec), printer=lambda _: None, storage=storage, write_ahead=False
    )
    trials = optuna.load_study(study_name=spec.name, storage=storage).trials
    return trials, [TrialRecord.of(t) for t in trials]


def test_the_best_compiled_configuration_is_contrasted_with_its_uncompiled_twin():
    from explorer.knobs import knob

    assert knob("torch_compile").efficiency[True] >= CONTRAST
    loaded = _loaded()
    local = make_strategy(loaded.space, loaded.spec, per_gpu_ranked=True).local  # type: ignore[attr-defined]
    compiled = [c for c in local.valid() if c.torch_compile][: CONTRAST_AFTER + 1]
    best, others = compiled[0], compiled[1:CONTRAST_AFTER]
    feasible = [(best, 2.0), *((c, 1.0) for c in others)]
    answered = {c.key() for c, _ in feasible}
    assert local.contrast(feasible=feasible[:-1], answered=answered, ooms=[]) is None  # too few yet
    twin = local.contrast(feasible=feasible, answered=answered, ooms=[])
    assert twin is not None and not twin.torch_compile
    differ = {k for k, v in twin.to_dict().items() if best.to_dict().get(k) != v}
    assert differ == {"torch_compile"}  # only the switch differs
    # answered already: the next twin that fits the rule, never the same one twice
    again = local.contrast(feasible=feasible, answered={*answered, twin.key()}, ooms=[])
    assert again is None or (not again.torch_compile and again.key() != twin.key())
    # an uncompiled configuration measured feasible: the switch has been tested
    assert local.contrast(feasible=[*feasible, (twin, 1.5)], answered=set(), ooms=[]) is None
    # the best is uncompiled: the prior does not hold the search on one side
    assert local.contrast(feasible=[(twin, 3.0), *feasible], answered=set(), ooms=[]) is None


def test_a_replayed_study_proposes_the_contrast_once_after_compiled_trials_only():
    loaded = _loaded()
    ran = 0
    for seed in range(2):
        trials, records = _replayed(loaded, seed=seed, n_trials=16)
        contrasts = [i for i, r in enumerate(records) if r.proposed_by == "contrast"]
        assert len(contrasts) <= 1, [r.proposed_by for r in records]
        for i in contrasts:
            ran += 1
            before = [
                t for t in trials[:i] if t.state == optuna.trial.TrialState.COMPLETE and t.values[0] > 0
            ]
            assert before and all(t.params.get("torch_compile") is True for t in before)
            assert trials[i].params.get("torch_compile") is False
    assert ran >= 1  # the table's compiled start makes at least one seed contrast


GRANITE = ROOT / "benchmarks/search_studies/granite-3.1-2b.yaml"
GRANITE_TABLE = ROOT / "benchmarks/results/tables/model-granite-3.1-2b.csv"


def test_after_checkpointed_trials_only_the_next_proposal_is_without_checkpointing():
    """Trials with activation checkpointing leave the activation multiplier unmeasured: once
    UNCHECKPOINTED_AFTER feasible trials all had it, the joint models propose the best configuration
    without it that is likely enough to fit; before that, or once one without it is feasible, they
    propose as they always do."""
    loaded = load_study(GRANITE, replay_table=GRANITE_TABLE, check_model=False)
    local = make_strategy(loaded.space, loaded.spec, per_gpu_ranked=True).local  # type: ignore[attr-defined]
    checkpointed = [c for c in local.valid() if c.gradient_checkpointing][:UNCHECKPOINTED_AFTER]
    feasible = [(c, 1000.0 + i) for i, c in enumerate(checkpointed)]
    answered = {c.key() for c, _ in feasible}

    def proposal(feasible):
        return local.modelled_proposal(feasible=feasible, answered=answered, ooms=[])

    config, by = proposal(feasible)
    assert by == "uncheckpointed" and not config.gradient_checkpointing
    assert proposal(feasible[:-1])[1] == "model"  # too few yet
    assert proposal([*feasible, (config, 900.0)])[1] == "model"  # one without it ran
    # the rule's pick is the best by the acquisition among those likely enough to fit
    import numpy as np

    surrogate = _neighbours.Surrogate.fit(local.encoding(), feasible=feasible, ooms=[], fitted=[], peaks=[])
    allowed = local._uncheckpointed(surrogate)
    row = local.encoding().index[config]
    assert allowed[row]
    rows = np.flatnonzero(
        allowed & ~np.isin(np.arange(len(allowed)), [local.encoding().index[c] for c in checkpointed])
    )
    assert surrogate.acquisition(np.array([row]))[0] >= surrogate.acquisition(rows).max() - 1e-12


def test_a_replayed_study_runs_one_uncheckpointed_trial_after_checkpointed_ones():
    """On the modelled granite table the frontier walk's first probe runs out of memory and the
    next trials fit with checkpointing: the trial after UNCHECKPOINTED_AFTER of them is proposed by
    the rule, runs without checkpointing, and the rule proposes nothing after it."""
    loaded = load_study(GRANITE, replay_table=GRANITE_TABLE, check_model=False)
    trials, records = _replayed(loaded, seed=0, n_trials=8)
    rule = [i for i, r in enumerate(records) if r.proposed_by == "uncheckpointed"]
    assert len(rule) == 1, [r.proposed_by for r in records]
    before = [t for t in trials[: rule[0]] if t.state == optuna.trial.TrialState.COMPLETE and t.values[0] > 0]
    assert len(before) == UNCHECKPOINTED_AFTER
    assert all(t.params.get("gradient_checkpointing") is True for t in before)
    assert trials[rule[0]].params.get("gradient_checkpointing") is False
