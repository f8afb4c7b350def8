"""The GPU evidence kit (``benchmarks/gpu_kit.py``, ``scripts/gpu_pack.sh``; docs/gpu.md): what
it carries fits one device call, and its CPU dry run goes through every step, records them,
keeps going past a step cut by its time limit, resumes, and recomputes its figures from its files."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

CARRY = REPO / "benchmarks" / "results" / "gpu" / "carry.json"
PACK = REPO / "scripts" / "gpu_pack.sh"
LIMIT = 64 * 2**20


def _tree_bytes() -> int:
    """The bytes of the tracked working tree (what travels with every device call)."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return sum((REPO / n).stat().st_size for n in names.decode().split("\0") if n and (REPO / n).is_file())


def _pinned(variable: str) -> list[str]:
    match = re.search(rf'^{variable}="([^"]+)"', PACK.read_text(), re.M)
    assert match, variable
    return match.group(1).split()


def test_each_carry_fits_one_device_call_with_the_tree():
    """Each carry the pack script made, with today's tracked tree, stays under the 64 MiB one call
    sends; the record names exactly the packages the script pins, liger-kernel and bitsandbytes
    among them."""
    record = json.loads(CARRY.read_text())
    assert record["limit_bytes"] == LIMIT
    carries = record["carries"]
    assert carries[".gpu/site"]["packages"] == _pinned("SITE_PACKAGES")
    assert carries[".gpu/kernels"]["packages"] == _pinned("KERNEL_PACKAGES")
    assert {p.split("==")[0] for p in carries[".gpu/kernels"]["packages"]} == {"liger-kernel", "bitsandbytes"}
    tree = _tree_bytes()
    for path, carry in carries.items():
        assert carry["bytes"] + tree < LIMIT, (path, carry["bytes"], tree)


def _kit(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(REPO / "benchmarks" / "gpu_kit.py"), "--device", "cpu"]
    cmd += ["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1500)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_kit_dry_run_on_the_cpu(tmp_path):
    """First call: the short study is cut at 5 s (recorded, the kit goes on: long study, measure
    with nothing best yet, summary). Second call: only what is left runs; the short study resumes,
    measure compares default and best, and the summary's figures are the measured lines'."""
    first = _kit(tmp_path, "--limit", "study-short=5")
    assert first.returncode == 0, first.stderr[-3000:]
    state = json.loads((tmp_path / "out" / "kit.json").read_text())["steps"]
    assert state["study-short"]["status"].startswith("timed out"), state
    assert state["doctor"]["status"].startswith("done") and state["env"]["status"] == "done", state
    assert state["pytest-gpu"]["status"].startswith("not run")
    assert state["measure"]["status"].startswith("waits") and state["summary"]["status"] == "done"
    doctor = json.loads((tmp_path / "out" / "doctor.json").read_text())
    status = {(r["knob"], json.dumps(r["value"])): r["status"] for r in doctor["rows"]}
    assert status[("padding", '"packed"')] == status[("precision", '"pure_bf16"')] == "ran"
    assert status[("batch_size", "8")] == "not applicable"
    assert {s for k, s in status.items() if k != ("batch_size", "8")} == {"ran"}

    second = _kit(tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "gpu-kit: doctor:" not in second.stdout  # done before: not run again
    state = json.loads((tmp_path / "out" / "kit.json").read_text())["steps"]
    assert state["study-short"]["status"] == "done" and state["measure"]["status"].startswith("done")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    lines = {
        name: [json.loads(x) for x in (tmp_path / "out" / f"measure-{name}.jsonl").read_text().splitlines()]
        for name in ("default", "best")
    }
    for name, measured in lines.items():
        p = measured[0]["properties"]
        assert summary[name]["mfu"] == pytest.approx(p["mfu"])
        assert summary[name]["dataset_tokens_per_second"] == pytest.approx(p["dataset_tokens_per_second"])
        assert 0 < p["mfu"] < 1
    assert summary["gain_over_default"] == pytest.approx(
        summary["best"]["dataset_tokens_per_second"] / summary["default"]["dataset_tokens_per_second"]
    )
    assert "best / default on short entries" in (tmp_path / "out" / "summary.md").read_text()
