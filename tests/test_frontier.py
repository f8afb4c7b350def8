"""The frontier walk (explorer.search._frontier): its probes, when it stops, and its place in a study."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from explorer.knobs import Rule, knob
from explorer.knobs._registry import KNOBS
from explorer.search._frontier import _undominated, frontier_probe, frontier_stopped, mode_of
from explorer.search._neighbours import LocalSearch
from explorer.search._throughput_prior import throughput_dominates
from explorer.study_file import load_study
from explorer.trial_config import TrialConfig

ROOT = Path(__file__).resolve().parents[1]
CPU_STUDY = ROOT / "studies" / "cpu-table.yaml"
CPU_TABLE = ROOT / "benchmarks" / "results" / "tables" / "cpu-quickstart.csv"


def _one(batch_size: int, *, seq: int = 64, ckpt: bool = False) -> TrialConfig:
    return TrialConfig(
        batch_size=batch_size,
        number_gpus=1,
        distributed_backend="NONE",
        gradient_checkpointing=ckpt,
        model_max_length=seq,
    )


@pytest.fixture(scope="module")
def cpu():
    return load_study(CPU_STUDY, replay_table=CPU_TABLE)


def test_a_probe_that_runs_out_of_memory_where_nothing_fits_stops_the_walk():
    assert not frontier_stopped([])
    assert frontier_stopped([(_one(32), "oom")])
    # an OOM above a batch that fitted is the bisection at work
    assert not frontier_stopped([(_one(32), "ok"), (_one(128), "oom")])
    # 32 at 128 tokens fitting shows that 64 tokens fit some batch too
    assert not frontier_stopped([(_one(32, seq=128), "ok"), (_one(128), "oom")])
    # but not that checkpointing off fits anything, where only checkpointing on was seen to fit
    assert frontier_stopped([(_one(32, ckpt=True), "ok"), (_one(8), "oom")])
    # probes still running or failed for another reason decide nothing
    assert not frontier_stopped([(_one(32), None), (_one(8), "failed")])


def test_probes_bisect_the_batch_of_the_fastest_mode(cpu):
    local = LocalSearch(space=cpu.space, resources=cpu.spec.resources)

    def probe(answered, ooms, fitted, last):
        return local.probe(
            seen=set(), seed="0", answered={c.key() for c in answered}, ooms=ooms, fitted=fitted, last=last
        )

    first = probe([], [], [], None)
    # one process, no checkpointing, the middle of 4..256
    assert first.number_gpus == 1 and not first.gradient_checkpointing and first.batch_size == 32
    # it fitted: the middle of what is above it (64, 128, 256), in the same mode
    second = probe([first], [], [first], first)
    assert mode_of(second) == mode_of(first) and second.batch_size == 128
    # 128 ran out of memory (256 is inferred): 64 is all that is left above 32
    third = probe([first, second], [(1, second)], [first], second)
    assert mode_of(third) == mode_of(first) and third.batch_size == 64
    # that mode is done: the other sequence length, above what the first one's fit proves
    fourth = probe([first, second, third], [(1, second)], [first, third], third)
    assert fourth.number_gpus == 1 and not fourth.gradient_checkpointing
    assert fourth.model_max_length != first.model_max_length
    # nothing but two processes is slower than one at the same per-device batch: still one GPU
    assert all(
        frontier_probe(
            space=cpu.space,
            valid=local.valid(),
            answered=set(),
            ooms=[],
            fitted=[],
            last=None,
            seen=set(),
            seed=str(seed),
        ).number_gpus
        == 1
        for seed in range(10)
    )


def test_when_the_fastest_modes_are_searched_out_the_walk_goes_on_with_the_next(cpu):
    """One process without checkpointing fits the largest batch at both lengths: nothing is left
    to try there, and every other mode is slower at the same per-device batch."""
    local = LocalSearch(space=cpu.space, resources=cpu.spec.resources)
    fitted = [_one(256, seq=64), _one(256, seq=128)]
    probe = local.probe(
        seen=set(), seed="0", answered={c.key() for c in fitted}, ooms=[], fitted=fitted, last=fitted[-1]
    )
    assert probe is not None
    assert probe.number_gpus == 2 or probe.gradient_checkpointing


def _run(loaded, *, n_trials: int, storage, seed: int = 0):
    from explorer.spec import SamplerSpec
    from explorer.study import open_study, optimize

    spec = loaded.spec.model_copy(
        update={"n_trials": n_trials, "infer_oom": True, "sampler": SamplerSpec(seed=seed)}
    )
    run = dataclasses.replace(loaded, spec=spec)
    optimize(run, printer=lambda _: None, storage=storage, write_ahead=False)
    return sorted(
        open_study(run, create=False, storage=storage).get_trials(deepcopy=False), key=lambda t: t.number
    )


def test_on_the_cpu_table_the_walk_finds_the_best_within_the_start_up_trials(cpu):
    """One process beats two on two cores: the walk measures one-process configurations only,
    and reaches 98% of the table's best within its 5 trials for every seed tried."""
    import optuna

    from explorer.search_benchmark import best_in_table

    best, _, _ = best_in_table(cpu, cpu.replay_table)
    for seed in range(6):
        trials = _run(cpu, n_trials=5, storage=optuna.storages.InMemoryStorage(), seed=seed)
        walked = [t for t in trials if t.user_attrs.get("proposed_by") == "frontier"]
        assert [t.number for t in walked] == list(range(5))
        assert all(t.user_attrs["number_gpus"] == 1 for t in walked)
        assert max(t.values[0] for t in walked if t.user_attrs["status"] == "ok") >= 0.98 * best


def test_a_resumed_study_goes_on_with_its_walk(cpu, tmp_path):
    import optuna

    url = f"sqlite:///{tmp_path / 'walk.db'}"
    first = _run(cpu, n_trials=2, storage=optuna.storages.RDBStorage(url))
    resumed = _run(cpu, n_trials=5, storage=optuna.storages.RDBStorage(url))
    assert [t.user_attrs["proposed_by"] for t in resumed[:5]] == ["frontier"] * 5
    assert [t.params for t in resumed[:2]] == [t.params for t in first]
    # the same five probes as a study that never stopped
    fresh = _run(cpu, n_trials=5, storage=optuna.storages.InMemoryStorage())
    assert [t.params for t in resumed[:5]] == [t.params for t in fresh[:5]]


def test_a_configuration_that_failed_for_good_is_not_proposed_again(cpu, tmp_path):
    """The walk's first probe is missing from the table (the replay answers it FAILED): it runs
    once and is retried once, and then local search goes on elsewhere instead of probing it again."""
    import csv

    import optuna

    first = _run(cpu, n_trials=1, storage=optuna.storages.InMemoryStorage())[0]
    from explorer.study import config_of

    key = config_of(first).key()
    with open(CPU_TABLE, newline="") as f:
        rows = list(csv.DictReader(f))
    kept = [r for r in rows if r["identifier"] != key]
    assert len(kept) < len(rows)
    table = tmp_path / "without-first-probe.csv"
    with open(table, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(kept)
    holed = load_study(CPU_STUDY, replay_table=table)
    trials = _run(holed, n_trials=4, storage=optuna.storages.InMemoryStorage())
    runs = [t for t in trials if config_of(t).key() == key]
    assert [t.user_attrs["status"] for t in runs] == ["retry", "failed"]
    assert sum(t.user_attrs["status"] in ("ok", "oom") for t in trials) >= 2


@pytest.fixture(scope="module")
def knob_modes():
    """The modes of a 15,552-configuration table over every knob (issue 23's compile table)."""
    loaded = load_study(
        ROOT / "benchmarks/search_studies/knobs/granite-2b-a100-80x4-compile.yaml", check_model=False
    )
    local = LocalSearch(space=loaded.space, resources=loaded.spec.resources, workload=loaded.spec.workload)
    return list(dict.fromkeys(mode_of(c) for c in local.valid()))


def _brute_undominated(modes, by):
    return [m for m in modes if not any(o != m and throughput_dominates(o, m) for o in by)]


@pytest.mark.parametrize("tabulated", [True, False], ids=["rules-tabulated", "a-plain-comparison"])
def test_undominated_is_the_pairwise_definition(knob_modes, tabulated, monkeypatch):
    """The bit-table shortcut gives what testing every pair gives; also where a knob's speed
    order is a plain function (compared pair by pair in Python)."""
    if not tabulated:
        backend = knob("distributed_backend")
        assert isinstance(backend.speed, Rule)
        monkeypatch.setitem(KNOBS, backend.name, dataclasses.replace(backend, speed=backend.speed.compare))
    rng = random.Random(23)
    for _ in range(3):
        by = rng.sample(knob_modes, 300)
        modes = rng.sample(knob_modes, 100) + by[:50]  # some modes are in ``by`` too
        expected = _brute_undominated(modes, by)
        assert _undominated(modes, by) == expected
        assert 0 < len(expected) < len(modes)  # the test can tell a wrong answer either way
    assert _undominated([], knob_modes[:5]) == [] and _undominated(knob_modes[:5], []) == knob_modes[:5]
