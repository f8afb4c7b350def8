"""GPU integration suite for the knobs of issue 15: each value that matters on CUDA really reaches
the run, and the ones that save memory save it. Each assertion reads what really ran (the
optimizer's class and state bytes, Liger's patches by name, the FSDP wrapper and its process
group, the NVML device by UUID: issue 27), so a knob that did nothing fails it. Never run in this project's CI (no GPU): see the
README for what has run on a GPU.

A model big enough for the memory effects to show (a Llama of 4 layers, hidden 1024, a 32k
vocabulary: the logits of one step are about 1 GB) trains a few steps per case on one GPU.

A value whose package is missing on the machine (flash_attn, liger_kernel, bitsandbytes) must
fail its trial with the line that names the package: both outcomes are asserted, nothing is
skipped. Run with ``pytest -m gpu``.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from explorer.launch import run_trial
from explorer.measurement import Outcome
from tests.builders import CUDA_ONE_GPU

pytestmark = pytest.mark.gpu

MEDIUM_ARCH = {
    "model_type": "llama",
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
}
CUDA_STUDY = {
    "workload": {
        "model": {"name": "medium-llama", "architecture": MEDIUM_ARCH},
        "dataset": {"kind": "synthetic", "entries": 512, "min_tokens": 100, "max_tokens": 800, "seed": 0},
        "model_max_length": 1024,
        "torch_dtype": "bfloat16",
    },
    "measurement": {"warmup_steps": 2, "measured_steps": 4, "trial_timeout_s": 600},
    **CUDA_ONE_GPU,
}


@pytest.fixture(autouse=True)
def _needs_cuda():
    assert torch.cuda.is_available(), "pytest -m gpu needs a CUDA device"


def _trial(make_job, tmp_path, name: str, **config):
    job = make_job(CUDA_STUDY, batch_size=8, number_gpus=1, **config)
    return run_trial(job, work_dir=tmp_path / name, timeout_s=600)


def _ok(m):
    assert m.outcome is Outcome.OK, m.error or m.log_tail[-2000:]
    assert m.properties is not None and m.properties.device == "cuda"
    return m.properties


def _needs_package(module: str, m) -> bool:
    """Whether the package is here; if not, the trial must have failed saying so."""
    if importlib.util.find_spec(module) is not None:
        return True
    assert m.outcome is Outcome.FAILED and f"needs the Python package '{module}'" in (m.error or ""), m.error
    return False


def test_pure_bf16_halves_the_model_states(make_job, tmp_path):
    mixed = _ok(_trial(make_job, tmp_path, "mixed"))
    m = _trial(make_job, tmp_path, "bf16", precision="pure_bf16")
    pure = _ok(m)
    assert m.extra["weights_dtype"] == "bfloat16"
    # Weights 4 -> 2 bytes a parameter and AdamW's two moments 8 -> 4 (the gradients, freed after
    # each step, may not be live at the peak): at least 6 bytes a parameter saved, less a margin.
    # Not a ratio of the peaks: this model's logits and activations outweigh its states (on an
    # H200, 5.18 GiB against 6.30, 0.82x, a saving of 1.11 GiB for 86M parameters).
    saved = mixed.peak_memory_allocated_gib - pure.peak_memory_allocated_gib
    assert saved > 0.75 * 6 * m.extra["trainable_parameters"] / 2**30


def test_packing_raises_dataset_tokens_per_second(make_job, tmp_path):
    """Entries of 100-800 tokens padded to 1024 against the same entries packed."""
    padded = _ok(_trial(make_job, tmp_path, "padded"))
    packed = _ok(_trial(make_job, tmp_path, "packed", padding="packed"))
    assert packed.dataset_tokens_per_second > 1.3 * padded.dataset_tokens_per_second


def test_attention_kernel_reaches_the_model(make_job, tmp_path):
    """eager builds each layer's 8 x 16 x 1024 x 1024 score matrix; sdpa and flash attention do
    not: a kernel that never reached the model would leave the peaks equal."""
    peaks = {}
    for kernel in ("eager", "sdpa", "flash_attention_2"):
        m = _trial(make_job, tmp_path, kernel, attn_implementation=kernel)
        if kernel == "flash_attention_2" and not _needs_package("flash_attn", m):
            continue
        peaks[kernel] = _ok(m).peak_memory_allocated_gib
        assert m.extra["attention_in_model"] == kernel
    assert peaks["sdpa"] < peaks["eager"]
    if "flash_attention_2" in peaks:
        assert peaks["flash_attention_2"] < peaks["eager"]


def test_liger_patches_the_model_and_lowers_peak_memory(make_job, tmp_path):
    plain = _ok(_trial(make_job, tmp_path, "plain"))
    m = _trial(make_job, tmp_path, "liger", liger_kernel=True)
    if not _needs_package("liger_kernel", m):
        return
    liger = _ok(m)
    report = m.extra["liger"]
    assert report["loss"] == "fused_linear_cross_entropy" and report["rope"] is True
    assert report["modules"] == {"LlamaMLP": 4, "LlamaRMSNorm": 9}
    # the fused linear cross entropy never materialises the 8 x 1024 x 32k logits (1 GB in bf16)
    assert liger.peak_memory_allocated_gib < plain.peak_memory_allocated_gib - 0.25


def test_liger_on_granite_keeps_the_logits_and_says_so(make_job, tmp_path):
    """Liger's granite patch replaces the cross entropy, not the lm_head's matmul with it."""
    granite = {**MEDIUM_ARCH, "model_type": "granite"}
    study = {
        **CUDA_STUDY,
        "workload": {**CUDA_STUDY["workload"], "model": {"name": "medium-granite", "architecture": granite}},
    }
    job = make_job(study, batch_size=8, number_gpus=1, liger_kernel=True)
    m = run_trial(job, work_dir=tmp_path / "granite", timeout_s=600)
    if not _needs_package("liger_kernel", m):
        return
    _ok(m)
    assert m.extra["liger"]["loss"] == "cross_entropy" and m.extra["liger"]["rope"] is True


OPTIMIZERS = {
    # the class the Trainer really built, whether fused, and the state it holds against Adam's
    "adamw_torch_fused": ("torch.optim.adamw.AdamW", True, (0.99, 1.01)),
    "adafactor": ("transformers.optimization.Adafactor", False, (0.0, 0.1)),
    "adamw_bnb_8bit": ("bitsandbytes.optim.adamw.AdamW", False, (0.2, 0.3)),  # 2 bytes a weight of 8
}


def test_optimizer_is_the_one_asked_for_and_its_states_shrink(make_job, tmp_path):
    """Adam's two float32 states per weight (about 0.9 GB for this model) against 8-bit states
    and Adafactor's factored ones: measured in the optimizer's own state tensors."""
    m = _trial(make_job, tmp_path, "adamw_torch")
    _ok(m)
    adam = m.extra["optimizer"]
    assert (adam["class"], adam["fused"]) == ("torch.optim.adamw.AdamW", False)
    for optim, (cls, fused, (low, high)) in OPTIMIZERS.items():
        m = _trial(make_job, tmp_path, optim, optim=optim)
        if optim == "adamw_bnb_8bit" and not _needs_package("bitsandbytes", m):
            continue
        _ok(m)
        built = m.extra["optimizer"]
        assert (built["class"], built["fused"]) == (cls, fused), built
        assert low <= built["state_bytes"] / adam["state_bytes"] <= high, (optim, built, adam)


def test_selective_checkpointing_sits_between_none_and_all(make_job, tmp_path):
    peaks = {}
    for name, config in {
        "none": dict(gradient_checkpointing=False),
        "half": dict(gradient_checkpointing=True, checkpoint_fraction=0.5),
        "all": dict(gradient_checkpointing=True),
    }.items():
        m = _trial(make_job, tmp_path, name, **config)
        peaks[name] = _ok(m).peak_memory_allocated_gib
        if name == "half":
            assert m.extra["checkpointed_layers"] == [2, 4]
    assert peaks["all"] < peaks["half"] < peaks["none"]


def test_fsdp_cpu_offload_moves_the_states_off_the_gpu(make_job, tmp_path):
    """FSDP2 in a process group of one (the knob needs FSDP; one GPU is what a lent machine has):
    really wrapped, the offload's group with a CPU backend, and the states off the GPU."""
    fsdp = dict(distributed_backend="FSDP", fsdp_version=2, fsdp_sharding_strategy="FULL_SHARD")
    k = _trial(make_job, tmp_path, "kept", **fsdp)
    o = _trial(make_job, tmp_path, "offloaded", fsdp_cpu_offload=True, **fsdp)
    kept, offloaded = _ok(k), _ok(o)
    for m in (k, o):
        assert m.extra["fsdp_wrapped"] is True and m.extra["wrapper"].startswith("FSDPModule")
        assert m.extra["process_group"]["world_size"] == 1
        assert m.extra["gradient_reduce_dtype"] == "bfloat16"  # FSDP's mixed precision policy
    assert k.extra["process_group"]["backends"] == "cuda:nccl"
    assert sorted(o.extra["process_group"]["backends"].split(",")) == ["cpu:gloo", "cuda:nccl"]
    # parameters, gradients and Adam's states (about 1.8 GB in float32) leave the GPU
    assert offloaded.peak_memory_allocated_gib < kept.peak_memory_allocated_gib - 0.5


def test_nvml_reads_the_trials_gpu_by_uuid(make_job, tmp_path):
    m = _trial(make_job, tmp_path, "nvml")
    _ok(m)
    if importlib.util.find_spec("pynvml") is None:
        assert "nvml" not in m.extra  # no NVML, no GPU readings: the record says nothing
        return
    uuid = "GPU-" + str(torch.cuda.get_device_properties(0).uuid)
    assert m.extra["nvml"]["devices"] == [uuid]
    assert m.extra["nvml"]["memory_counts"] in ("trial processes", "whole device (other processes included)")
    assert m.properties.system["gpu_memory_utilization_peak"] > 0.0
