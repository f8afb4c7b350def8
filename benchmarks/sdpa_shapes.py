"""Does a new sequence length cost scaled_dot_product_attention a fixed host-side price on this GPU?

The GPU knob suite measured a packed batch six times slower than the same entries padded on an
H200 (188 ms a step against 32 ms, the GPU 2.6% busy), and TRL's padding-free SFTTrainer the same
on an H100 (154 ms against 32 ms). A packed batch is one row whose length changes every step.
Public reports say cuDNN's attention builds an execution plan for each new shape (55-70 ms a
build in flashinfer's measurements; a torchtune issue on SDPA's host overhead on H100), and torch
picks cuDNN's attention on Hopper. This script tests that on the device: forward and backward of
``torch.nn.functional.scaled_dot_product_attention`` with the block-diagonal causal mask that
transformers builds for a packed row under sdpa (one row, bf16, GQA as the knob suite's model:
16 query heads over 4 key-value heads, head size 64), for ``--lengths`` distinct row lengths
against the same length repeated, under each backend that accepts it (torch's own choice, then
each of cuDNN, memory-efficient, flash and math forced). Each call is timed alone
(synchronised), the first call of each length apart.

    python3 benchmarks/sdpa_shapes.py --json OUT.json           # CUDA; on a CPU: a small check

One JSON object: per backend, ``new_ms`` (median of calls each at a length not seen before) and
``same_ms`` (median of calls at the longest of those lengths, seen before), or the first line of
its error: ``new_ms`` well over ``same_ms`` is a price paid for each new length.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

HEADS, KV_HEADS, HEAD_DIM = 16, 4, 64
"""The knob suite's model (hidden 1024, 16 heads over 4 key-value heads)."""


def packed_mask(torch: Any, lengths: list[int], device: Any) -> Any:
    """The block-diagonal causal boolean mask of one packed row of entries of ``lengths``: a token
    sees the tokens of its own entry up to itself (transformers' mask for sdpa on a packed row)."""
    ids = torch.repeat_interleave(
        torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device)
    )
    n = ids.numel()
    causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    return (causal & (ids[:, None] == ids[None, :]))[None, None]


def _entries(total: int) -> list[int]:
    """Entry lengths of 100-800 tokens (the suite's data) that add up to ``total``."""
    out, left, step = [], total, 0
    while left > 0:
        n = min(left, 100 + (step * 263) % 701)
        out.append(n)
        left, step = left - n, step + 1
    return out


def _call(torch: Any, length: int, device: Any, dtype: Any) -> float:
    """Seconds of one synchronised forward and backward at one row of ``length`` tokens."""
    q = torch.randn(1, HEADS, length, HEAD_DIM, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(1, KV_HEADS, length, HEAD_DIM, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(1, KV_HEADS, length, HEAD_DIM, device=device, dtype=dtype, requires_grad=True)
    mask = packed_mask(torch, _entries(length), device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    out.sum().backward()
    sync()
    return time.perf_counter() - start


def measure(backend: str | None, lengths: list[int], repeats: int, device: Any, dtype: Any) -> dict[str, Any]:
    """``new_ms`` and ``same_ms`` under ``backend`` (``None``: torch's choice): the same work or
    less at a new length than at the longest length, seen before."""
    import contextlib

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    scope = contextlib.nullcontext() if backend is None else sdpa_kernel(getattr(SDPBackend, backend))
    try:
        with scope:
            new = [_call(torch, n, device, dtype) for n in lengths]
            same = [_call(torch, lengths[-1], device, dtype) for _ in range(repeats)]
    except Exception as exc:  # a backend that refuses the mask or the dtype: its first line, kept
        return {
            "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        }
    return {
        "new_ms": round(statistics.median(new[1:]) * 1e3, 3),  # the very first call also warms up
        "same_ms": round(statistics.median(same) * 1e3, 3),
        "new_calls_ms": [round(s * 1e3, 3) for s in new],
    }


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the result here too")
    parser.add_argument("--lengths", type=int, default=8, help="distinct row lengths")
    ns = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    base = 3000 if cuda else 300
    lengths = [base + 37 * i for i in range(ns.lengths)]
    backends = (
        [None, "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "FLASH_ATTENTION", "MATH"]
        if cuda
        else [None, "MATH"]
    )
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "lengths": lengths,
        "backends": {str(b or "default"): measure(b, lengths, ns.lengths, device, dtype) for b in backends},
    }
    text = json.dumps(result, indent=1)
    print(text)
    if ns.json:
        with open(ns.json, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
