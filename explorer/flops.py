"""Model FLOPs per token and MFU. Pure arithmetic: no torch import.

Assumptions (PaLM appendix B conventions):

* Only matrix multiplications count. ``n_linear`` is the number of weights in linear layers, the
  LM head included and the embedding lookup excluded.
* Full fine-tuning: ``6 * n_linear`` per token (2 forward, 2 for input gradients, 2 for weight
  gradients) plus ``12 * layers * hidden * seq_len`` for the attention score and value matmuls,
  forward and backward, counted without the causal-mask saving.
* LoRA: frozen weights need no weight gradient: ``4 * n_frozen + 6 * n_trainable``, plus the same
  attention term (activation gradients still flow through attention).
* Activation checkpointing recomputes the forward: that work is *not* model FLOPs, so it lowers
  MFU. It is counted in ``hardware_flops_per_token`` (HFU): ``+ 2 * n_linear + 4 * layers * hidden
  * seq_len``.
* MFU uses the tokens the model computes on (padding included: ``train_tokens_per_second``).
"""

from __future__ import annotations

from dataclasses import dataclass

from explorer.gpus import GPUS, lookup

__all__ = ["PEAK_BF16_TFLOPS", "FlopModel", "peak_flops_for"]

PEAK_BF16_TFLOPS: dict[str, float] = {g.label: g.bf16_tflops or g.fp16_tflops or 0.0 for g in GPUS}
"""Dense bf16 tensor-core peaks, TFLOP/s, by GPU model (fp16 for the T4 and V100, which have no
bf16): :mod:`explorer.gpus`' table, where each comes with its source."""


def peak_flops_for(gpu_name: str) -> float | None:
    """The peak (FLOP/s) of a GPU name such as ``NVIDIA-H100-80GB-HBM3``
    (:func:`explorer.gpus.lookup`), or ``None``: not a GPU the table knows."""
    gpu = lookup(gpu_name)
    return gpu.peak_flops if gpu is not None else None


@dataclass(frozen=True, kw_only=True)
class FlopModel:
    """FLOPs per trained token of one configuration."""

    n_linear: int
    """Weights in linear layers (frozen and trainable), the LM head included."""
    n_trainable_linear: int
    """Of those, the trainable ones (all of them for full fine-tuning; the adapters for LoRA)."""
    layers: int
    hidden: int
    seq_len: int
    lora: bool
    checkpointing: float
    """The fraction of decoder layers whose forward is recomputed (``True``: all, ``False``: none)."""

    @property
    def attention(self) -> float:
        return 12.0 * self.layers * self.hidden * self.seq_len

    @property
    def model_flops_per_token(self) -> float:
        if self.lora:
            frozen = self.n_linear - self.n_trainable_linear
            return 4.0 * frozen + 6.0 * self.n_trainable_linear + self.attention
        return 6.0 * self.n_linear + self.attention

    @property
    def hardware_flops_per_token(self) -> float:
        extra = (2.0 * self.n_linear + self.attention / 3.0) * float(self.checkpointing)
        return self.model_flops_per_token + extra

    def mfu(self, *, tokens_per_second_per_device: float, peak_flops: float) -> float:
        """Model FLOPs utilisation of one device."""
        return self.model_flops_per_token * tokens_per_second_per_device / peak_flops
