"""The reported throughput is recomputable: an independent token recount from the dataset itself."""

from __future__ import annotations

import pytest

from explorer.launch import run_trial
from explorer.measurement import Outcome
from explorer.spec import DatasetSpec
from explorer.worker._data import entry_length


def _recount(spec: DatasetSpec, *, first: int, count: int, max_length: int) -> int:
    """Dataset tokens of entries [first, first+count): min(len(tokens), model_max_length) each."""
    return sum(min(entry_length(spec, i), max_length) for i in range(first, first + count))


@pytest.mark.parametrize(
    ("gpus", "backend", "accumulation", "checkpointing"),
    [(1, "NONE", 2, False), (2, "DDP", 2, True), (2, "DDP", 1, False)],
)
def test_dataset_tokens_recount(gpus, backend, accumulation, checkpointing, make_job, tmp_path):
    job = make_job(
        batch_size=4,
        number_gpus=gpus,
        distributed_backend=backend,
        gradient_accumulation_steps=accumulation,
        gradient_checkpointing=checkpointing,
    )
    m = run_trial(job, work_dir=tmp_path / "trial", timeout_s=240)
    assert m.outcome is Outcome.OK, m.error or m.log_tail[-2000:]
    p = m.properties
    assert p is not None
    per_step = job.config.batch_size * accumulation  # entries per optimizer step, all ranks together
    warm, steps = job.measurement.warmup_steps, job.measurement.measured_steps
    assert p.measured_samples == per_step * steps
    expected = _recount(
        job.workload.dataset,
        first=warm * per_step,
        count=per_step * steps,
        max_length=job.config.model_max_length,
    )
    assert p.measured_dataset_tokens == expected
    # the synthetic entries are 16..96 tokens and cut at 64: some padding, some truncation
    assert expected < p.measured_train_tokens == per_step * steps * job.config.model_max_length
    assert p.dataset_tokens_per_second == pytest.approx(expected / p.measured_seconds, rel=0.005)
    assert p.dataset_tokens_per_second_per_gpu == pytest.approx(
        expected / p.measured_seconds / gpus, rel=0.005
    )
    assert p.train_steps_per_second == pytest.approx(steps / p.measured_seconds, rel=0.005)
