"""The priors that order local search's neighbours: the throughput prior's dominance and ceilings,
the memory model fitted to measured peaks, and what each changes in a proposal."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from explorer.search._memory_model import MemoryModel
from explorer.search._neighbours import LocalSearch
from explorer.search._throughput_prior import Ceilings, throughput_dominates
from explorer.study_file import load_study
from explorer.trial_config import TrialConfig
from tests.builders import GRANITE_FSDP2, config

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "benchmarks" / "search_studies" / "granite-3.1-2b.yaml"
TABLE = ROOT / "benchmarks" / "results" / "tables" / "model-granite-3.1-2b.csv"


def _config(**kw) -> TrialConfig:
    return config(GRANITE_FSDP2, **kw)


def _single(batch_size: int, **kw) -> TrialConfig:
    return TrialConfig(
        batch_size=batch_size,
        number_gpus=1,
        distributed_backend="NONE",
        gradient_checkpointing=kw.pop("gradient_checkpointing", True),
        model_max_length=2048,
        **kw,
    )


def test_throughput_dominance_follows_fewer_gpus_less_sharding_no_checkpointing():
    c = _config()  # 4 GPUs, per-device batch 8, FSDP2 SHARD_GRAD_OP, checkpointing on
    ddp = _config(distributed_backend="DDP", fsdp_version=None, fsdp_sharding_strategy=None)
    assert throughput_dominates(c, c)
    assert throughput_dominates(_config(gradient_checkpointing=False), c)
    assert not throughput_dominates(c, _config(gradient_checkpointing=False))
    assert throughput_dominates(c, _config(fsdp_sharding_strategy="FULL_SHARD"))
    assert not throughput_dominates(_config(fsdp_sharding_strategy="FULL_SHARD"), c)
    # fewer GPUs at the same per-device batch (8), not at the same global batch
    assert throughput_dominates(_config(number_gpus=2, batch_size=16), c)
    assert not throughput_dominates(_config(number_gpus=2), c)
    assert not throughput_dominates(c, _config(number_gpus=2, batch_size=16))
    # one GPU beats every backend at its per-device batch
    assert throughput_dominates(_single(8), c) and throughput_dominates(_single(8), ddp)
    assert not throughput_dominates(_single(16), c)
    # not across FSDP versions, backends or sequence lengths; HYBRID_SHARD only with itself
    assert not throughput_dominates(_config(fsdp_version=1), c)
    assert not throughput_dominates(ddp, c) and not throughput_dominates(c, ddp)
    assert not throughput_dominates(_config(model_max_length=1024), c)
    hybrid = _config(fsdp_sharding_strategy="HYBRID_SHARD")
    assert throughput_dominates(hybrid, hybrid)
    assert not throughput_dominates(_config(fsdp_sharding_strategy="NO_SHARD"), hybrid)


def test_a_ceiling_is_the_lowest_measured_value_that_dominates():
    c = _config(fsdp_sharding_strategy="FULL_SHARD", number_gpus=8, batch_size=64)  # per-device 8
    no_ckpt = c.replace(gradient_checkpointing=False)
    ceilings = Ceilings.of(
        [
            (_config(), 50.0),  # 4 GPUs, SHARD_GRAD_OP: dominates c
            (_single(8), 80.0),  # one GPU: dominates c
            (_config(batch_size=64), 10.0),  # per-device 16: not comparable
            (no_ckpt, 5.0),  # checkpointing off, else the same: dominates c
        ]
    )
    assert ceilings.ceiling(c) == 5.0
    assert ceilings.ceiling(_config(fsdp_version=1)) == 80.0  # only the one GPU dominates it
    assert ceilings.ceiling(_config(batch_size=16)) is None  # per-device 4: none measured
    assert Ceilings.of([]).ceiling(c) is None


def test_the_memory_model_learns_the_modelled_table_from_a_quarter_of_it():
    from benchmarks.memory_prior import _table_rows

    rows = _table_rows(TABLE)
    ok = [(c, m) for c, fits, m in rows if fits and m]
    ooms = [c for c, fits, _ in rows if not fits]
    assert MemoryModel.fit(ok[:4], ooms) is None  # too few peaks
    model = MemoryModel.fit(ok[::4], ooms[::4])
    assert model is not None
    # the modelled table's memory is linear in the model's features: exact to its rounding
    assert max(abs(model.predict(c) - m) for c, m in ok) < 0.05
    assert all(model.fits(c) is not False for c, _ in ok)
    assert sum(model.fits(c) is False for c in ooms) > len(ooms) // 2
    assert not math.isinf(model.ooms_above) and model.fits_below < model.ooms_above


@pytest.fixture(scope="module")
def loaded():
    return load_study(STUDY, replay_table=TABLE)


def test_neighbours_predicted_to_run_out_of_memory_come_last(loaded):
    """The neighbours of the best configuration come in two runs: those the memory model lets
    fit, then those it predicts OOM (proposed still, not skipped). Without the prior they mix."""
    from benchmarks.memory_prior import _table_rows

    rows = _table_rows(TABLE)
    fitting = sorted((c for c, fits, _ in rows if fits), key=repr)[:12]
    peak = {c: m for c, _, m in rows}
    best = _config(number_gpus=2, batch_size=16)
    feasible = [(c, 1.0 + i) for i, c in enumerate(fitting)] + [(best, 100.0)]
    peaks = [(c, peak[c]) for c, _ in feasible]
    ooms = list(enumerate(sorted((c for c, fits, _ in rows if not fits), key=repr)[:6]))
    model = MemoryModel.fit(peaks, [c for _, c in ooms])
    assert model is not None

    def order(local: LocalSearch) -> list[bool]:
        answered = {c.key() for c, _ in feasible} | {c.key() for _, c in ooms}
        out = []
        while (p := local.propose(feasible=feasible, answered=answered, ooms=ooms, peaks=peaks)) is not None:
            if p[1] == best:
                out.append(model.fits(p[0]) is False)
            answered.add(p[0].key())
        return out

    on = order(LocalSearch(space=loaded.space, resources=loaded.spec.resources))
    assert True in on and False in on and on == sorted(on)
    off = order(LocalSearch(space=loaded.space, resources=loaded.spec.resources, memory_prior=False))
    assert sorted(off) == on and off != on
