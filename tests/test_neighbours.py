"""Local search (explorer.search._neighbours): the moves, the filters, and its place in a study."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from explorer.search._neighbours import LocalSearch
from explorer.study_file import load_study
from explorer.trial_config import TrialConfig
from tests.builders import GRANITE_FSDP2, config

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "benchmarks" / "search_studies" / "granite-3.1-2b.yaml"
TABLE = ROOT / "benchmarks" / "results" / "tables" / "model-granite-3.1-2b.csv"


@pytest.fixture(scope="module")
def loaded():
    return load_study(STUDY, replay_table=TABLE)


def _config(**kw) -> TrialConfig:
    return config(GRANITE_FSDP2, **kw)


def test_moves_are_one_step_or_a_memory_trade(loaded):
    local = LocalSearch(space=loaded.space, resources=loaded.spec.resources)
    c = _config()
    moves = set(local.moves(c))
    space = set(loaded.space.enumerate())
    assert c not in moves and moves <= space
    assert _config(batch_size=16) in moves and _config(batch_size=64) in moves
    assert _config(batch_size=128) not in moves  # two steps, and not a trade
    assert _config(number_gpus=8) in moves  # same global batch
    assert _config(number_gpus=8, batch_size=64) in moves  # same per-device batch
    assert _config(fsdp_version=1) in moves and _config(fsdp_sharding_strategy="FULL_SHARD") in moves
    # checkpointing off buys memory back with any smaller batch
    assert {_config(gradient_checkpointing=False, batch_size=b) for b in (8, 16, 32)} <= moves
    # more sharding with a larger batch
    assert _config(fsdp_sharding_strategy="FULL_SHARD", batch_size=128) in moves
    # leaving FSDP drops its settings; DDP is one move away
    ddp = c.replace(distributed_backend="DDP", fsdp_version=None, fsdp_sharding_strategy=None)
    assert ddp in moves
    # from two GPUs, one GPU (no backend at all) is a move
    two = _config(number_gpus=2)
    single = TrialConfig(
        batch_size=32,
        number_gpus=1,
        distributed_backend="NONE",
        gradient_checkpointing=True,
        model_max_length=2048,
    )
    assert single in local.moves(two) and _config(number_gpus=1) not in space


def test_proposals_skip_what_is_answered_inferred_or_in_flight(loaded):
    local = LocalSearch(space=loaded.space, resources=loaded.spec.resources)
    best = _config()
    oom = _config(
        gradient_checkpointing=False, batch_size=16
    )  # dominates every no-checkpointing move with bs >= 16
    answered = {best.key(), oom.key()}
    seen = []
    for _ in range(len(local.moves(best))):
        proposal = local.propose(feasible=[(best, 100.0)], answered=answered, ooms=[(7, oom)])
        if proposal is None:
            break
        config, base = proposal
        assert base == best and config in local.moves(best)
        assert config.key() not in answered
        assert not (
            not config.gradient_checkpointing
            and config.per_device_batch_size >= 4
            and config.number_gpus == 4
            and config.fsdp_sharding_strategy == "SHARD_GRAD_OP"
            and config.fsdp_version == 2
        )
        seen.append(config)
        answered.add(config.key())
    assert seen and len(set(seen)) == len(seen)
    assert local.propose(feasible=[(best, 100.0)], answered=answered, ooms=[(7, oom)]) is None


def test_a_study_climbs_from_its_best_trials(loaded):
    """The walk strategy (the default before issue 23): the frontier walk, covering start-up
    trials, then neighbours of the best."""
    import optuna

    from explorer.study import open_study, optimize
    from explorer.study._record import config_of

    walk = loaded.spec.sampler.model_copy(update={"strategy": "walk"})
    spec = loaded.spec.model_copy(update={"n_trials": 25, "sampler": walk})
    run = dataclasses.replace(loaded, spec=spec)
    storage = optuna.storages.InMemoryStorage()
    optimize(run, printer=lambda _: None, storage=storage)
    trials = open_study(run, create=False, storage=storage).get_trials(deepcopy=False)
    by_number = {t.number: t for t in trials}
    local = LocalSearch(space=loaded.space, resources=loaded.spec.resources)
    # granite does not fit one GPU: the frontier walk's first probe (one GPU, no checkpointing, a
    # middle batch) runs out of memory, and five covering start-up trials follow it
    first = by_number[0]
    assert first.user_attrs["proposed_by"] == "frontier" and first.user_attrs["status"] == "oom"
    assert config_of(first).number_gpus == 1 and not config_of(first).gradient_checkpointing
    starts = [t for t in trials if t.user_attrs.get("proposed_by") == "start"]
    assert [t.number for t in starts] == [1, 2, 3, 4, 5]
    proposed = [t for t in trials if t.user_attrs.get("proposed_by", "").startswith("neighbour of trial")]
    assert len(proposed) >= 15
    for t in proposed:
        base = by_number[int(t.user_attrs["proposed_by"].rsplit(" ", 1)[1])]
        assert base.number < t.number and base.user_attrs["status"] == "ok"
        assert config_of(t) in local.moves(config_of(base))
    # TPE is asked only when no neighbour is left: every trial after the start-up is a neighbour,
    # or a repeat of one answered without running
    after = [t for t in trials if t.number > 5 and t.user_attrs.get("status") not in ("reused", "inferred")]
    assert all(t.user_attrs.get("proposed_by", "").startswith("neighbour") for t in after)
    off = dataclasses.replace(
        run,
        spec=spec.model_copy(
            update={"sampler": spec.sampler.model_copy(update={"strategy": "no-local-search"})}
        ),
    )
    storage = optuna.storages.InMemoryStorage()
    optimize(off, printer=lambda _: None, storage=storage)
    assert not any(
        "proposed_by" in t.user_attrs for t in open_study(off, create=False, storage=storage).get_trials()
    )


def test_start_up_trials_cover_every_value_they_can(loaded):
    """Five covering start-up configurations see both checkpointing settings, both FSDP versions,
    DDP and FSDP, and four GPU counts; five random ones seldom do."""
    local = LocalSearch(space=loaded.space, resources=loaded.spec.resources)
    seen: list[tuple[str, object]] = []
    starts = []
    for i in range(5):
        c = local.start(seen=seen, seed=f"0:{i}")
        starts.append(c)
        seen += list(loaded.space.params_for(c).items())
    assert len(set(starts)) == 5
    assert {c.gradient_checkpointing for c in starts} == {False, True}
    assert {c.number_gpus for c in starts} == {1, 2, 4, 8}
    assert {c.distributed_backend for c in starts} >= {"DDP", "FSDP"}
    assert {c.fsdp_version for c in starts if c.fsdp_version} == {1, 2}
    assert {c.batch_size for c in starts} == {8, 16, 32, 64, 128}
