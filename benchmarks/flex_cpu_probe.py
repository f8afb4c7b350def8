"""torch's compiled FlexAttention on the CPU against SDPA, by sequence length (causal, GQA).

Why ``tests/test_flex_attention.py`` packs 25 tokens, not 24: with torch 2.13 the compiled CPU
kernel returns garbage or NaN for a 24-token causal sequence, varying from run to run, while
lengths around it match SDPA. Each length runs in a process of its own (the kernel is compiled
per shape)::

    .venv/bin/python benchmarks/flex_cpu_probe.py 16 20 24 25 32 64 128
"""

from __future__ import annotations

import subprocess
import sys

ONE = """
import sys, torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
torch.manual_seed(0)
n = int(sys.argv[1])
q = torch.randn(1, 4, n, 16)
k, v = torch.randn(1, 2, n, 16), torch.randn(1, 2, n, 16)
mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, n, n, device="cpu")
out = torch.compile(flex_attention)(q, k, v, block_mask=mask, enable_gqa=True)
ref = torch.nn.functional.scaled_dot_product_attention(
    q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True
)
print(n, bool(torch.isnan(out).any()), float((out - ref).abs().max()))
"""


def main(lengths: list[int]) -> None:
    print(f"torch {__import__('torch').__version__}: tokens, NaN, max |flex - sdpa|")
    for n in lengths:
        done = subprocess.run([sys.executable, "-c", ONE, str(n)], capture_output=True, text=True, check=True)
        print(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [16, 20, 23, 24, 25, 32, 64, 128])
