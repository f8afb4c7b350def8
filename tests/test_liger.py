"""Liger's patches, by name, on a granite and a llama model (issue 27, item 4).

Liger's granite patch cannot fuse the linear layer with the cross entropy (granite scales its
logits; ``fused_linear_cross_entropy`` raises NotImplementedError there), so it replaces torch's
cross entropy instead and the logits are still built; on llama the forward itself is replaced.
The trial's report must tell the two apart, and name the RoPE patch.

Patching only (no kernel runs): it needs liger_kernel to import (it imports triton), not a GPU.
Liger patches module globals (torch's cross entropy, the modeling modules' classes); each test
puts them back.
"""

from __future__ import annotations

import importlib
import importlib.util

import pytest
import torch

from explorer.trial_config import TrialConfig
from explorer.worker._apply import apply_liger

LIGER = importlib.util.find_spec("liger_kernel")
needs_liger = pytest.mark.skipif(
    LIGER is None, reason="liger_kernel is not installed (it needs triton): the patch report is untested here"
)

SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
)


@pytest.fixture
def restore_globals():
    """Put back what Liger replaces in this process (a trial's worker is its own process)."""
    modules = [importlib.import_module(f"transformers.models.{t}.modeling_{t}") for t in ("llama", "granite")]
    saved = [(m, dict(vars(m))) for m in modules]
    cross_entropy = torch.nn.functional.cross_entropy
    yield
    torch.nn.functional.cross_entropy = cross_entropy
    for module, attrs in saved:
        for name, value in attrs.items():
            setattr(module, name, value)


def _model(model_type: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **SMALL))


def _config() -> TrialConfig:
    return TrialConfig(
        batch_size=1, number_gpus=1, gradient_checkpointing=False, model_max_length=64, liger_kernel=True
    )


@needs_liger
def test_llama_fuses_the_loss(restore_globals):
    cross_entropy = torch.nn.functional.cross_entropy
    report = apply_liger(_model("llama"), _config())["liger"]
    assert torch.nn.functional.cross_entropy is cross_entropy
    assert report["model_type"] == "llama"
    assert report["loss"] == "fused_linear_cross_entropy"
    assert report["rope"] is True
    # 2 layers x 2 norms + the final norm; one MLP per layer
    assert report["modules"] == {"LlamaMLP": 2, "LlamaRMSNorm": 5}
    assert report["patched"] == 7


@needs_liger
def test_granite_keeps_building_the_logits_and_says_so(restore_globals):
    cross_entropy = torch.nn.functional.cross_entropy
    report = apply_liger(_model("granite"), _config())["liger"]
    assert report["model_type"] == "granite"
    assert report["loss"] == "cross_entropy"  # not fused: the logits are built
    assert torch.nn.functional.cross_entropy is not cross_entropy
    assert report["rope"] is True
    assert report["modules"] == {"GraniteMLP": 2, "GraniteRMSNorm": 5}


def test_off_is_off():
    assert apply_liger(_model("llama"), _config().replace(liger_kernel=False)) == {"liger": "off"}
