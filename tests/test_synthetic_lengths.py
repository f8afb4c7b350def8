"""Synthetic entry lengths (``dataset.lengths``) and the named presets: every length within
``[min_tokens, max_tokens]``, a function of the seed and the index only, and a lognormal's median
and quartiles where declared; a study that names none of the new fields dumps (and so keys its
stored measurements) as before."""

from __future__ import annotations

import math
import statistics
import subprocess
import sys

import pytest

from explorer.job import TrialJob
from explorer.spec import SYNTHETIC_PRESETS, DatasetSpec, MeasurementSpec, ResourcesSpec, WorkloadSpec
from explorer.trial_config import TrialConfig
from explorer.worker._data import SyntheticTokens, entry_length

N = 4000
"""Entries drawn per check: the sample median of a lognormal with sigma 0.6 is then within about
1.2% of the true one (one standard error), so a 4% tolerance is over three standard errors."""
UNIFORM = DatasetSpec(min_tokens=32, max_tokens=160, seed=0)
LOGNORMAL = DatasetSpec(min_tokens=100, max_tokens=800, lengths="lognormal", median_tokens=250, sigma=0.6)
SPECS = {
    "uniform": UNIFORM,
    "lognormal": LOGNORMAL,
    "instruction-short": DatasetSpec(preset="instruction-short"),
    "instruction-long": DatasetSpec(preset="instruction-long"),
}


def _lengths(spec: DatasetSpec, n: int = N) -> list[int]:
    return [entry_length(spec, i) for i in range(n)]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_lengths_stay_in_bounds_and_reach_both(name):
    spec = SPECS[name]
    lengths = _lengths(spec)
    assert min(lengths) == spec.resolved_min_tokens and max(lengths) == spec.resolved_max_tokens


@pytest.mark.parametrize("name", sorted(SPECS))
def test_lengths_depend_on_seed_and_index_only(name):
    spec = SPECS[name]
    forward = _lengths(spec, 200)
    backward = [entry_length(spec, i) for i in reversed(range(200))][::-1]
    assert forward == backward == _lengths(spec.model_copy(), 200)
    other_seed = DatasetSpec.model_validate(spec.model_dump() | {"seed": spec.seed + 1})
    assert _lengths(other_seed, 200) != forward


def test_lengths_are_pinned():
    """The lengths are part of what a stored measurement means: a change to the drawing (or to
    torch's generator) must be deliberate."""
    assert _lengths(SPECS["instruction-short"], 8) == [630, 372, 316, 405, 100, 187, 100, 229]
    assert _lengths(UNIFORM, 8) == [88, 150, 143, 129, 33, 124, 103, 119]


@pytest.mark.parametrize("name", ["lognormal", "instruction-short", "instruction-long"])
def test_lognormal_median_and_quartiles_are_as_declared(name):
    spec = SPECS[name]
    assert spec.median_tokens is not None and spec.sigma is not None
    q1, median, q3 = statistics.quantiles(_lengths(spec), n=4)
    spread = math.exp(0.6745 * spec.sigma)  # quartiles of a lognormal: median / spread, median * spread
    assert median == pytest.approx(spec.median_tokens, rel=0.04)
    assert q1 == pytest.approx(spec.median_tokens / spread, rel=0.05)
    assert q3 == pytest.approx(spec.median_tokens * spread, rel=0.05)


def test_uniform_median_is_the_middle():
    assert statistics.median(_lengths(UNIFORM)) == pytest.approx((32 + 160) / 2, rel=0.04)


def test_presets():
    short = SPECS["instruction-short"]
    assert (short.entries, short.min_tokens, short.max_tokens) == (4096, 100, 800)
    assert (short.lengths, short.median_tokens, short.sigma) == ("lognormal", 250, 0.6)
    ado = DatasetSpec(preset="news-tokens-16384plus-entries-4096")  # ado's id: every entry 16384 tokens
    assert (ado.resolved_entries, ado.resolved_min_tokens, ado.resolved_max_tokens) == (4096, 16384, 16384)
    assert set(_lengths(ado, 50)) == {16384}
    assert DatasetSpec(preset="instruction-short", seed=7, entries=4096).seed == 7  # agreeing fields are fine
    assert set(SYNTHETIC_PRESETS) >= {
        "news-tokens-16384plus-entries-4096",
        "instruction-short",
        "instruction-long",
    }


def test_items_hold_the_drawn_lengths_truncated():
    data = SyntheticTokens(SPECS["instruction-short"], vocab_size=4096, max_length=256)
    for i in range(64):
        assert int(data[i]["attention_mask"].sum()) == min(entry_length(data.spec, i), 256)


def test_dump_leaves_default_lengths_out():
    """A study that names no length distribution dumps exactly as before the field existed, so its
    store key (:func:`explorer.store.workload_key`) is unchanged; one that does dumps it."""
    assert UNIFORM.model_dump() == {
        "kind": "synthetic",
        "preset": None,
        "entries": 4096,
        "min_tokens": 32,
        "max_tokens": 160,
        "seed": 0,
        "path": None,
        "text_field": "output",
    }
    dumped = LOGNORMAL.model_dump(mode="json")
    assert (dumped["lengths"], dumped["median_tokens"], dumped["sigma"]) == ("lognormal", 250, 0.6)


def test_lengths_reach_the_worker():
    """The job's JSON (what the worker processes read) carries the distribution."""
    workload = WorkloadSpec.model_validate(
        {
            "model": {"name": "m", "architecture": {"model_type": "llama"}},
            "dataset": {"preset": "instruction-short"},
        }
    )
    config = TrialConfig(batch_size=4, number_gpus=1, gradient_checkpointing=False, model_max_length=512)
    job = TrialJob(
        trial_number=0,
        config=config,
        workload=workload,
        measurement=MeasurementSpec(),
        resources=ResourcesSpec(),
    )
    assert TrialJob.from_json(job.to_json()).workload.dataset == workload.dataset


def test_spec_does_not_import_torch():
    """``explorer validate`` reads the dataset spec without torch."""
    code = (
        "import sys; from explorer.spec import DatasetSpec; "
        "DatasetSpec(preset='instruction-short'); assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
