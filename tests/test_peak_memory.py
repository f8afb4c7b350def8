"""The CPU peak is this process's own: a trial started by a large parent (a long pytest run, a driver
holding a study) must not report the parent's resident set as its peak.

CI found this: ``ru_maxrss`` survives fork and exec on Linux, so three 0.5 GiB-capped trials started
from a pytest process of ~1 GiB measured a "peak" of 0.517 GiB and were wrongly OOM.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from explorer.worker._memory import MemoryCap, peak_memory_bytes, peak_rss_bytes, reset_peak_rss

_CHILD = textwrap.dedent(
    """
    import json, torch
    from explorer.worker._memory import MemoryCap, peak_memory_bytes
    cap = MemoryCap(None, torch.device("cpu"))
    cap.mark_baseline()
    block = torch.ones(16 * 2**20 // 4)  # 16 MiB, touched
    print(json.dumps({"peak": peak_memory_bytes(torch.device("cpu"), baseline_rss=cap.baseline_rss)[0]}))
    """
)

_PARENT = textwrap.dedent(
    """
    import subprocess, sys
    big = bytearray(768 * 2**20)
    for i in range(0, len(big), 4096):
        big[i] = 1
    sys.exit(subprocess.run([sys.executable, "-c", sys.argv[1]]).returncode)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the inherited ru_maxrss is Linux's")
def test_a_child_of_a_large_parent_reports_its_own_peak():
    out = subprocess.run(
        [sys.executable, "-c", _PARENT, _CHILD], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    peak = json.loads(out.strip().splitlines()[-1])["peak"]
    assert 12 * 2**20 <= peak <= 256 * 2**20, f"peak {peak / 2**20:.0f} MiB for a 16 MiB tensor"


def test_the_peak_follows_a_reset():
    """After a reset the high-water mark is the current resident set, not an earlier, larger one."""
    block = torch.ones(64 * 2**20 // 4)
    high = peak_rss_bytes()
    del block
    cap = MemoryCap(None, torch.device("cpu"))
    cap.mark_baseline()
    if not reset_peak_rss():
        pytest.skip("this kernel has no /proc/self/clear_refs: the peak cannot be reset")
    after = peak_memory_bytes(torch.device("cpu"), baseline_rss=cap.baseline_rss)[0]
    assert peak_rss_bytes() <= high
    assert after < 32 * 2**20
