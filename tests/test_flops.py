"""Model FLOPs per token, cross-checked against torch.utils.flop_counter on the tiny model."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from explorer.flops import FlopModel, peak_flops_for
from explorer.spec import MethodSpec, ModelSpec
from explorer.trial_config import TrialConfig
from explorer.worker._model import build_model, load_config
from explorer.worker._train import _flop_model

from .conftest import TINY_ARCH

SEQ = 64


def _counted_flops_per_token(model, batch: int = 2) -> float:
    ids = torch.randint(1, 4000, (batch, SEQ))
    with FlopCounterMode(display=False) as counter:
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
    return counter.get_total_flops() / (batch * SEQ)


@pytest.mark.parametrize("lora_r", [None, 8])
def test_formula_matches_flop_counter(lora_r):
    spec = ModelSpec(name="tiny", architecture=TINY_ARCH)
    config = load_config(spec, None)
    model = build_model(
        spec, None, config, lora_r=lora_r, method=MethodSpec(kind="lora" if lora_r else "full")
    )
    trial = TrialConfig(
        batch_size=2,
        number_gpus=1,
        distributed_backend="NONE",
        gradient_checkpointing=False,
        model_max_length=SEQ,
        lora_r=lora_r,
    )
    flops = _flop_model(model, config, trial)
    # The CPU's fused SDPA kernel is invisible to FlopCounterMode: count attention as matmuls.
    model.set_attn_implementation("eager")
    counted = _counted_flops_per_token(model)
    # The formula counts matmuls only (no softmax, norms, loss). For LoRA it is an upper bound:
    # autograd skips the input gradients of layer 0's projections (nothing before them trains).
    assert flops.model_flops_per_token == pytest.approx(counted, rel=0.02)
    assert flops.attention / flops.model_flops_per_token > 0.04  # the attention term is checked too
    if lora_r:
        assert flops.n_trainable_linear < flops.n_linear / 10


def test_checkpointing_costs_hardware_flops_not_model_flops():
    base = dict(n_linear=1000, n_trainable_linear=1000, layers=2, hidden=8, seq_len=16, lora=False)
    plain = FlopModel(checkpointing=False, **base)
    ckpt = FlopModel(checkpointing=True, **base)
    assert plain.model_flops_per_token == ckpt.model_flops_per_token == 6000 + 12 * 2 * 8 * 16
    assert ckpt.hardware_flops_per_token == pytest.approx(plain.model_flops_per_token * 4 / 3)
    assert plain.mfu(tokens_per_second_per_device=1e3, peak_flops=1e9) == pytest.approx(
        plain.model_flops_per_token * 1e3 / 1e9
    )


def test_peak_table():
    assert peak_flops_for("NVIDIA-H100-80GB-HBM3") == 989e12
    assert peak_flops_for("NVIDIA H100 PCIe") == 756e12
    assert peak_flops_for("NVIDIA H100 NVL") == 835e12  # not the SXM part's 989
    assert peak_flops_for("NVIDIA H200 NVL") == 835e12
    assert peak_flops_for("NVIDIA H200") == 989e12
    assert peak_flops_for("NVIDIA-A100-SXM4-80GB") == 312e12
    assert peak_flops_for("NVIDIA L40S") == 362e12
    assert peak_flops_for("CPU-logical") is None
