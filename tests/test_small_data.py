"""A batch larger than the dataset: every step still trains on the full batch (the entries read
round and round), and the trial records the samples it trained on."""

from __future__ import annotations

import pytest

from explorer.launch import run_trial
from explorer.measurement import Outcome
from explorer.worker._data import Repeated, SyntheticTokens, filled


@pytest.mark.slow  # a real trial: about 10 to 30 s on two busy cores
def test_a_batch_of_16_on_8_entries_trains_16_samples_a_step(make_job, tmp_path):
    """Batch 16 on a dataset of 8 entries, 1 warm-up and 3 measured steps (the real worker on one
    CPU process): 48 measured samples, and the dataset tokens are those of the 8 entries twice
    over per step."""
    job = make_job(
        {"workload": {"dataset": {"entries": 8}}, "measurement": {"warmup_steps": 1, "measured_steps": 3}},
        batch_size=16,
        number_gpus=1,
        distributed_backend="NONE",
    )
    m = run_trial(job, work_dir=tmp_path / "trial", timeout_s=240)
    assert m.outcome is Outcome.OK, m.error or m.log_tail[-2000:]
    p = m.properties
    assert p is not None and p.measured_steps == 3
    assert p.measured_samples == 3 * 16
    data = SyntheticTokens(job.workload.dataset, vocab_size=4096, max_length=job.config.model_max_length)
    per_pass = sum(int(data[i]["attention_mask"].sum()) for i in range(8))
    assert p.measured_dataset_tokens == 3 * 2 * per_pass


def test_a_dataset_as_large_as_a_step_is_not_repeated(make_job):
    job = make_job({"workload": {"dataset": {"entries": 8}}}, batch_size=8, number_gpus=1)
    data = SyntheticTokens(job.workload.dataset, vocab_size=4096, max_length=64)
    assert filled(data, 8) is data
    repeated = filled(data, 20)
    assert isinstance(repeated, Repeated) and len(repeated) == 20
    assert all(repeated[i + 8]["input_ids"].equal(data[i]["input_ids"]) for i in range(8))
