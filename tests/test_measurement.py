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


@pytest.mark.parametrize(
    ("padding", "gpus", "backend"), [("longest", 1, "NONE"), ("packed", 1, "NONE"), ("packed", 2, "DDP")]
)
def test_dataset_tokens_recount_in_every_padding_mode(padding, gpus, backend, make_job, tmp_path):
    """Whatever the padding, the dataset tokens are those of the consumed entries (truncated at
    model_max_length), and so are the samples; only the trained tokens (padding included) differ:
    fewer than max_length's with ``longest``, exactly the dataset tokens with ``packed``."""
    job = make_job(batch_size=4, number_gpus=gpus, distributed_backend=backend, padding=padding)
    m = run_trial(job, work_dir=tmp_path / "trial", timeout_s=240)
    assert m.outcome is Outcome.OK, m.error or m.log_tail[-2000:]
    p = m.properties
    assert p is not None
    per_step = job.config.batch_size
    warm, steps = job.measurement.warmup_steps, job.measurement.measured_steps
    expected = _recount(
        job.workload.dataset,
        first=warm * per_step,
        count=per_step * steps,
        max_length=job.config.model_max_length,
    )
    assert p.measured_samples == per_step * steps
    assert p.measured_dataset_tokens == expected
    padded = per_step * steps * job.config.model_max_length
    if padding == "packed":
        assert p.measured_train_tokens == expected
    else:
        assert expected <= p.measured_train_tokens <= padded  # (these entries mostly reach 64)


def test_a_packed_batch_keeps_its_entries_apart():
    """The packed collator concatenates the entries, restarts the position ids at each, and masks
    the first label of each (no entry learns to predict across a boundary); no attention mask."""
    import torch

    from explorer.worker._data import collator_for, pad_item

    items = [pad_item(torch.arange(1, n + 1), 8) for n in (3, 5, 2)]
    batch = collator_for("packed")(items)
    assert "attention_mask" not in batch
    assert batch["input_ids"].tolist() == [[1, 2, 3, 1, 2, 3, 4, 5, 1, 2]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 4, 0, 1]]
    assert batch["labels"].tolist() == [[-100, 2, 3, -100, 2, 3, 4, 5, -100, 2]]
    longest = collator_for("longest")(items)
    assert longest["input_ids"].shape == (3, 5) and longest["attention_mask"].sum() == 10
    assert collator_for("max_length") is None


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_no_attention_crosses_a_packed_entry(attn):
    """The tiny model's logits for a packed row equal those of each entry alone (transformers
    builds the attention mask from the restarting position ids, without a KV cache: the worker
    trains with ``use_cache`` off), so packing changes no result."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from explorer.worker._data import collator_for, pad_item
    from tests.conftest import TINY_ARCH

    arch = {k: v for k, v in TINY_ARCH.items() if k != "model_type"}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**arch), attn_implementation=attn).eval()
    entries = [torch.arange(5, 12), torch.arange(40, 44)]
    batch = collator_for("packed")([pad_item(e, 16) for e in entries])
    with torch.no_grad():
        packed = model(
            input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False
        ).logits[0]
        alone = torch.cat([model(input_ids=e[None], use_cache=False).logits[0] for e in entries])
    assert torch.allclose(packed, alone, atol=1e-4), (packed - alone).abs().max()
