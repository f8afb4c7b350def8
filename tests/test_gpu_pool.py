"""Parallel trials on a GPU pool: the replay launcher's virtual clock, packing, utilization."""

from __future__ import annotations

import csv
import random
from pathlib import Path

import pytest

from explorer.errors import SpecError
from explorer.launch import SLOT_ATTR, GpuSlot
from explorer.study import config_of, open_study, optimize, slots_of, study_utilization, utilization
from explorer.study._flight import InFlight, next_to_start
from explorer.study_file import load_study
from explorer.trial_config import TrialConfig
from tests.builders import peak_held

BATCHES = [8 * k for k in range(1, 31)]


def _table(path: Path) -> Path:
    """Every (batch, 1 or 8 GPUs) is measured; 1-GPU batch 232 and up ran out of memory."""
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(
            ["model_name", "number_gpus", "batch_size", "distributed_backend"]
            + ["dataset_tokens_per_second_per_gpu", "is_valid"]
        )
        for bs in BATCHES:
            writer.writerow(["tiny-llama", 1, bs, "NONE", 1000.0 + bs, int(bs < 232)])
            writer.writerow(["tiny-llama", 8, bs, "DDP", 900.0 + bs, 1])
    return path


def _pool_study(write_study, tmp_path: Path, name: str = "study.yaml", **patch) -> Path:
    """A study of 1- and 8-GPU trials on an 8-GPU pool, replayed with simulated durations."""
    table = _table(tmp_path / "table.csv")
    base = {
        "storage": f"sqlite:///{tmp_path}/pool.db",
        "sampler": {"kind": "random", "seed": 0},
        "n_trials": 31,
        "parallel_trials": 8,
        "infer_oom": False,
        "resources": {"gpus_per_node": 8},
        "launcher": {
            "kind": "replay",
            "table": str(table),
            "durations": {"ok_s": 100.0, "oom_s": 20.0, "jitter": 0.5, "seed": 3},
        },
        "search_space": {
            "parameters": {
                "batch_size": {"values": BATCHES},
                "number_gpus": {"values": [1, 8]},
                "distributed_backend": "DDP",
                "gradient_checkpointing": False,
            }
        },
    }
    return write_study(base | patch, name=name)


def _enqueue(path: Path, configs: list[tuple[int, int]]) -> None:
    """Enqueue (number_gpus, batch_size) configurations, asked in this order."""
    loaded = load_study(path)
    study = open_study(loaded, create=True)
    for gpus, bs in configs:
        config = TrialConfig(
            batch_size=bs,
            number_gpus=gpus,
            distributed_backend="DDP" if gpus > 1 else "NONE",
            gradient_checkpointing=False,
            model_max_length=64,
        )
        study.enqueue_trial(loaded.space.params_for(config))


def _stored_slots(path: Path) -> dict[int, GpuSlot]:
    """Trial number -> slot, read back from storage only."""
    study = open_study(load_study(path), create=False)
    return {
        t.number: GpuSlot.from_attr(t.user_attrs[SLOT_ATTR])
        for t in study.get_trials()
        if SLOT_ATTR in t.user_attrs
    }


def test_virtual_clock_durations_and_the_pool_is_never_oversubscribed(write_study, tmp_path):
    path = _pool_study(write_study, tmp_path)
    lines: list[str] = []
    result = optimize(load_study(path), printer=lines.append)
    assert result.counted == 31
    study = open_study(load_study(path), create=False)
    trials = [t for t in study.get_trials() if SLOT_ATTR in t.user_attrs]
    assert len(trials) == 31  # every counted trial ran (a reused answer holds no GPUs, has no slot)
    for t in trials:
        slot = GpuSlot.from_attr(t.user_attrs[SLOT_ATTR])
        base = 100.0 if t.user_attrs["status"] == "ok" else 20.0
        u = random.Random(f"3:{t.number}").uniform(-1.0, 1.0)
        assert slot.end - slot.start == pytest.approx(base * (1 + 0.5 * u))
        assert t.user_attrs["wall_seconds"] == pytest.approx(slot.end - slot.start, abs=1e-3)
        assert slot.gpus == config_of(t).number_gpus and slot.pool == 8 and slot.clock == "virtual"
    assert {t.user_attrs["status"] for t in trials} == {"ok", "oom"}
    slots = [GpuSlot.from_attr(t.user_attrs[SLOT_ATTR]) for t in trials]
    assert peak_held(slots, lambda s: s.gpus) <= 8
    assert max(sum(s.start <= x.start < s.end for s in slots) for x in slots) > 1  # trials overlapped
    assert min(s.start for s in slots) == 0.0


def test_a_small_trial_starts_while_a_big_one_waits_and_the_big_one_is_not_starved(write_study, tmp_path):
    """Asked in order: A (1 GPU), B (8 GPUs), then 29 one-GPU trials. B waits for A; younger 1-GPU
    trials start beside A, but at most ``max_passed_over`` of them before B."""
    one_gpu = [(1, bs) for bs in BATCHES]
    order = [one_gpu[0], (8, 8), *one_gpu[1:]]
    started_before_b = {}
    for k in (2, 100):
        folder = tmp_path / f"k{k}"
        folder.mkdir()
        path = _pool_study(
            write_study,
            folder,
            name=f"k{k}.yaml",
            max_passed_over=k,
            storage=f"sqlite:///{folder}/pool.db",
            output_dir=str(folder / "runs"),  # the two study files sit side by side: a run folder each
        )
        _enqueue(path, order)
        optimize(load_study(path), printer=lambda _: None)
        slots = _stored_slots(path)
        assert len(slots) == 31 and slots[1].gpus == 8
        younger = [n for n in slots if n > 1 and slots[n].start < slots[1].start]
        assert younger, "a 1-GPU trial asked after the 8-GPU one started while it waited"
        assert all(slots[n].gpus == 1 for n in younger)
        assert peak_held(slots.values(), lambda s: s.gpus) <= 8
        started_before_b[k] = len(younger)
    assert started_before_b[2] == 2  # then it was reserved for: the pool drained for it
    assert started_before_b[100] == 29  # without the rule it waits for every small trial


def test_lookahead_one_starts_trials_in_the_order_asked(write_study, tmp_path):
    path = _pool_study(write_study, tmp_path, lookahead=1)
    _enqueue(path, [(1, 8), (8, 8), (1, 16), (1, 24)])
    optimize(load_study(path), printer=lambda _: None)
    slots = _stored_slots(path)
    starts = [slots[n].start for n in sorted(slots)]
    assert starts == sorted(starts)
    assert slots[2].start >= slots[1].end  # the 1-GPU trial after the 8-GPU one waited for it


def _flight(gpus: int, passed_over: int = 0) -> InFlight:
    config = TrialConfig(
        batch_size=8,
        number_gpus=gpus,
        distributed_backend="DDP" if gpus > 1 else "NONE",
        gradient_checkpointing=False,
        model_max_length=64,
    )
    return InFlight(trial=None, config=config, attempt=0, passed_over=passed_over)  # type: ignore[arg-type]


def test_first_fit_oldest_first_then_reserve():
    free = 3
    pending = [_flight(8), _flight(4), _flight(2), _flight(1)]
    picked = next_to_start(pending, lambda n, nodes: n <= free, max_passed_over=2)
    assert picked is not None and picked.config.number_gpus == 2  # the oldest that fits
    assert [f.config.number_gpus for f in pending] == [8, 4, 1] and pending[0].passed_over == 1
    picked = next_to_start(pending, lambda n, nodes: n <= free, max_passed_over=2)
    assert picked is not None and picked.config.number_gpus == 1 and pending[0].passed_over == 2
    pending.append(_flight(1))
    assert next_to_start(pending, lambda n, nodes: n <= free, max_passed_over=2) is None  # reserved for the 8
    picked = next_to_start(pending, lambda n, nodes: n <= 8, max_passed_over=2)
    assert picked is not None and picked.config.number_gpus == 8


def test_utilization_is_gpu_seconds_over_the_pools():
    run = dict(clock="virtual", pool=4)
    slots = [
        GpuSlot(run="a", gpus=2, start=0.0, end=10.0, **run),
        GpuSlot(run="a", gpus=2, start=0.0, end=5.0, **run),
        GpuSlot(run="b", gpus=4, start=0.0, end=10.0, **run),  # a resumed run: its clock starts at 0 again
    ]
    one = utilization(slots[:2])
    assert one is not None and one.fraction == pytest.approx(30 / 40) and one.makespan_s == 10.0
    both = utilization(slots)
    assert both is not None and both.fraction == pytest.approx((30 + 40) / (40 + 40)) and both.runs == 2
    assert utilization([]) is None
    assert utilization([GpuSlot(run="c", gpus=1, start=5.0, end=5.0, **run)]).fraction is None


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {"run": "a", "clock": "virtual", "pool": 4, "gpus": 5, "start": 0, "end": 1},
        {"run": "a", "clock": "virtual", "pool": 4, "gpus": 1, "start": 2, "end": 1},
        {"run": "a", "clock": "sundial", "pool": 4, "gpus": 1, "start": 0, "end": 1},
        {"run": "a", "pool": 4, "gpus": 1, "start": 0, "end": 1},
    ],
)
def test_a_stored_slot_that_does_not_parse_is_refused(bad):
    with pytest.raises(ValueError):
        GpuSlot.from_attr(bad)


@pytest.mark.parametrize(
    ("launcher", "field", "problem"),
    [
        ({"kind": "ray", "durations": {"ok_s": 10.0}}, "launcher", "durations is only for kind: replay"),
        (
            {"kind": "replay", "table": "t.csv", "durations": {"jitter": 1.0}},
            "launcher.durations.jitter",
            "less than 1",
        ),
        (
            {"kind": "replay", "table": "t.csv", "durations": {"ok_s": 0.0}},
            "launcher.durations.ok_s",
            "greater than 0",
        ),
        (
            {"kind": "replay", "table": "t.csv", "durations": {"ok": 5.0}},
            "launcher.durations.ok",
            "unknown key",
        ),
    ],
)
def test_durations_are_validated(write_study, tmp_path, launcher, field, problem):
    (tmp_path / "t.csv").write_text("number_gpus,dataset_tokens_per_second_per_gpu\n1,1.0\n")
    with pytest.raises(SpecError) as err:
        load_study(write_study({"launcher": launcher}))
    assert err.value.field == field and problem in err.value.problem


def test_cli_prints_the_stored_utilization(write_study, tmp_path, capsys):
    from explorer.cli import main

    path = _pool_study(write_study, tmp_path, n_trials=6)
    optimize(load_study(path), printer=lambda _: None)
    used = study_utilization(open_study(load_study(path), create=False))
    assert used is not None and used.fraction is not None
    assert main(["utilization", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{100 * used.fraction:.1f}%" in out and "virtual clock" in out
    busy = sum(s.gpu_seconds for s in slots_of(open_study(load_study(path), create=False).get_trials()))
    assert used.busy_gpu_seconds == pytest.approx(busy)


def test_a_configuration_proposed_while_it_runs_waits_for_that_answer(write_study, tmp_path):
    """Two proposals of one configuration in flight at once: it runs once, the other is answered
    from it when it ends (not run twice)."""
    path = _pool_study(write_study, tmp_path, n_trials=3)
    _enqueue(path, [(1, 8), (1, 8), (1, 16), (1, 8)])
    lines: list[str] = []
    optimize(load_study(path), printer=lines.append)
    study = open_study(load_study(path), create=False)
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    slots = _stored_slots(path)
    ran = [config_of(trials[n]).key() for n in slots]
    assert len(ran) == len(set(ran))  # nothing ran twice
    assert 0 in slots and 1 not in slots
    assert trials[1].user_attrs["reused_from"] == 0 and trials[1].value == trials[0].value
    assert any("trial 1 waits for trial 0" in line for line in lines)


def test_a_paced_replay_holds_its_gpus_in_real_time(write_study, tmp_path):
    """``time_scale`` 0.01: 100-s trials hold their GPUs for about 1 s of real time each."""
    import time

    path = _pool_study(
        write_study,
        tmp_path,
        n_trials=4,
        parallel_trials=1,
        launcher={
            "kind": "replay",
            "table": str(tmp_path / "table.csv"),
            "durations": {"ok_s": 100.0, "oom_s": 100.0, "time_scale": 0.01},
        },
    )
    started = time.monotonic()
    result = optimize(load_study(path), printer=lambda _: None)
    wall = time.monotonic() - started
    assert result.counted == 4
    slots = sorted(_stored_slots(path).values(), key=lambda s: s.start)
    assert len(slots) == 4
    for before, after in zip(slots, slots[1:], strict=False):  # one at a time, back to back
        assert after.start >= before.end - 1e-6
    assert wall >= 4.0, wall  # 4 x 100 virtual s x 0.01; nothing runs ahead of real time
    # the virtual clock follows real time: the last end is 400 s plus whatever the loop took
    # between trials (more on a loaded machine), never more than the real time elapsed
    assert 400.0 - 1e-6 <= slots[-1].end <= wall / 0.01 + 1.0
