"""The worst-case step: a trial's peak memory covers the longest batch the real run can meet.

A synthetic dataset whose lengths are lognormal (median 16 tokens) has rare entries at the full
``model_max_length`` (256): the few batches a trial trains on never hold one, the real run does.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from explorer.job import TrialJob
from explorer.measurement import Outcome
from explorer.trial_config import TrialConfig
from explorer.worker._data import collator_for, entry_length
from explorer.worker._worst_case import full_length_batch, varies_shape

LENGTH = 256
RARE_LONG = {
    "workload": {
        "dataset": {
            "kind": "synthetic",
            "entries": 4096,
            "lengths": "lognormal",
            "median_tokens": 16,
            "sigma": 1.0,
            "min_tokens": 4,
            "max_tokens": LENGTH,
            "seed": 0,
        },
        "model_max_length": LENGTH,
    },
    "measurement": {"warmup_steps": 1, "measured_steps": 2},
    "resources": {"device_memory_gib": None},
}


@pytest.mark.parametrize("padding", ["longest", "packed"])
def test_the_full_length_batch_is_what_the_collator_makes_of_full_entries(padding):
    config = TrialConfig(
        batch_size=6, number_gpus=2, gradient_checkpointing=False, model_max_length=32, padding=padding
    )
    batch = full_length_batch(config, vocab_size=100, collator=collator_for(padding))
    per_device = config.per_device_batch_size
    assert batch["input_ids"].numel() == per_device * 32  # every token a dataset token
    assert int(batch["input_ids"].min()) >= 1 and int(batch["input_ids"].max()) < 100
    if padding == "packed":  # one row, each entry's positions from 0
        assert batch["input_ids"].shape == (1, per_device * 32)
        assert int(batch["position_ids"].eq(0).sum()) == per_device
    else:
        assert (
            batch["input_ids"].shape == (per_device, 32)
            and int(batch["attention_mask"].sum()) == per_device * 32
        )


def test_only_shapes_that_vary_need_the_step():
    assert varies_shape(
        TrialConfig(
            batch_size=4, number_gpus=1, gradient_checkpointing=False, model_max_length=8, padding="longest"
        )
    )
    assert varies_shape(
        TrialConfig(
            batch_size=4, number_gpus=1, gradient_checkpointing=False, model_max_length=8, padding="packed"
        )
    )
    assert not varies_shape(
        TrialConfig(
            batch_size=4,
            number_gpus=1,
            gradient_checkpointing=False,
            model_max_length=8,
            padding="max_length",
        )
    )


def _run(job: TrialJob, tmp_path: Path, name: str, *, cap: float | None = None, worst_case: bool = True):
    from explorer.launch._run import run_trial

    resources = job.resources.model_copy(update={"device_memory_gib": cap})
    job = dataclasses.replace(job, resources=resources, worst_case_step=worst_case)
    return run_trial(job, work_dir=tmp_path / name, timeout_s=240)


@pytest.mark.slow  # three real trials of a tiny model (about 15 s each on 2 busy cores)
def test_a_trial_that_fits_its_few_batches_but_not_the_longest_one_is_oom(make_job, tmp_path):
    job = make_job(RARE_LONG, batch_size=16, number_gpus=1, padding="longest")
    seen = 16 * (1 + 2)  # the entries of the trial's steps (sequential sampling)
    longest_seen = max(entry_length(job.workload.dataset, i) for i in range(seen))
    long_entries = sum(entry_length(job.workload.dataset, i) >= LENGTH for i in range(4096))
    assert longest_seen < LENGTH // 2 and 0 < long_entries < 4096 // 100  # rare, and never seen

    free = _run(job, tmp_path, "uncapped")
    assert free.outcome is Outcome.OK, free.error
    step = free.extra["worst_case_step"]
    assert step["ran"] and step["tokens"] == 16 * LENGTH
    assert free.properties is not None
    # the trial's peak is the full-length step's, far above that of the batches it measured
    assert free.properties.peak_memory_gib == pytest.approx(step["peak_after_gib"], rel=1e-6)
    assert step["peak_after_gib"] > 1.5 * step["peak_before_gib"]
    cap = (step["peak_before_gib"] + step["peak_after_gib"]) / 2

    without = _run(job, tmp_path, "capped-without-step", cap=cap, worst_case=False)
    assert without.outcome is Outcome.OK, without.error  # its own batches fit under the cap
    assert without.extra["worst_case_step"] == {"ran": False, "why": "off for this job"}
    assert without.properties is not None and without.properties.peak_memory_gib < cap
    p = without.properties
    assert p.memory_limit_gib == pytest.approx(cap) and p.memory_headroom is not None
    assert p.memory_headroom == pytest.approx(1 - p.peak_memory_gib / cap, abs=1e-9)

    certified = _run(job, tmp_path, "capped", cap=cap)
    assert certified.outcome is Outcome.OOM  # the real run's longest batch does not
    assert certified.error is not None and "worst-case step (16 entries of 256 tokens" in certified.error
