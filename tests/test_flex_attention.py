"""``attn_implementation: flex_attention`` (torch's FlexAttention: compiled block-sparse masks) for
padding-free packed rows without flash_attn.

On the CPU (torch 2.13) FlexAttention runs forward, compiled by inductor (about a minute on a
loaded 2-core machine, hence ``slow``), and has no backward: the logits test runs here, and the
missing backward is asserted, since it is the reason the knob declares the value CUDA-only (the
doctor and the space say so). The CUDA half (``-m gpu``) trains a packed trial with it and checks
the logits on the GPU.
"""

from __future__ import annotations

import pytest
import torch

from tests.builders import CUDA_ONE_GPU
from tests.conftest import TINY_ARCH


def _packed_and_alone(device: str) -> tuple[torch.Tensor, torch.Tensor, torch.nn.Module, dict]:
    from transformers import AutoModelForCausalLM, LlamaConfig

    from explorer.worker._data import collator_for, pad_item

    arch = {k: v for k, v in TINY_ARCH.items() if k != "model_type"}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**arch), attn_implementation="flex_attention")
    model = model.to(device).eval()
    # 25 tokens in all: torch 2.13's compiled CPU FlexAttention kernel returns garbage or NaN, varying
    # from run to run, for a 24-token causal sequence (compared with SDPA: 16-23, 25-65 and 96 tokens
    # come out right). explorer never runs flex on a CPU: validation refuses it.
    entries = [torch.arange(5, 12), torch.arange(40, 44), torch.arange(90, 104)]
    batch = {k: v.to(device) for k, v in collator_for("packed")([pad_item(e, 16) for e in entries]).items()}
    with torch.no_grad():
        packed = model(
            input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False
        ).logits[0]
        alone = torch.cat([model(input_ids=e[None].to(device), use_cache=False).logits[0] for e in entries])
    return packed, alone, model, batch


@pytest.mark.slow
def test_flex_packed_rows_give_each_entry_alone_its_logits_on_the_cpu():
    packed, alone, model, batch = _packed_and_alone("cpu")
    assert model.config._attn_implementation == "flex_attention"
    assert torch.allclose(packed, alone, atol=1e-4), (packed - alone).abs().max()
    model.train()
    with pytest.raises(NotImplementedError, match="FlexAttention does not support backward on CPU"):
        model(**batch, use_cache=False).loss.backward()


def test_flex_attention_is_refused_on_a_cpu_study_with_the_reason(write_study):
    from explorer.errors import SpecError
    from explorer.study_file import load_study

    space = {"parameters": {"batch_size": 4, "number_gpus": 1, "gradient_checkpointing": False}}
    space["parameters"]["attn_implementation"] = {"choices": ["sdpa", "flex_attention"]}
    with pytest.raises(
        SpecError, match=r"'flex_attention' needs a CUDA device \(torch's FlexAttention has no backward"
    ):
        load_study(write_study({"search_space": space}))


@pytest.mark.gpu
def test_flex_packed_logits_and_a_packed_trial_on_cuda(make_job, tmp_path):
    """On CUDA: the logits test, then a packed trial with flex attention trains and says so."""
    from explorer.launch import run_trial
    from explorer.measurement import Outcome

    assert torch.cuda.is_available(), "pytest -m gpu needs a CUDA device"
    packed, alone, _, _ = _packed_and_alone("cuda")
    assert torch.allclose(packed, alone, atol=1e-3), (packed - alone).abs().max()
    job = make_job(
        CUDA_ONE_GPU, batch_size=4, number_gpus=1, attn_implementation="flex_attention", padding="packed"
    )
    m = run_trial(job, work_dir=tmp_path / "flex", timeout_s=600)
    assert m.outcome is Outcome.OK, m.error or m.log_tail[-2000:]
    assert m.extra["attention_in_model"] == "flex_attention"
