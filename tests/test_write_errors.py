"""`export`, `report`, `best` and `plan` writing into a read-only or a full folder: one line that
names the file and the reason, exit status 1, no traceback. Both filesystems are real: a tmpfs
mounted read-only, and a small tmpfs filled to the last byte (root, as here and in CI)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.builders import replayed_plan_studies
from tests.test_failures import fill, small_disk


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return replayed_plan_studies(tmp_path_factory.mktemp("writes"))[0]


def _verbs(study: Path, out: Path) -> dict[str, list[str]]:
    return {
        "export": ["export", str(study), "--out", str(out / "data.csv")],
        "report": ["report", str(study), "--out", str(out / "report")],
        "best": ["best", str(study), "--out", str(out / "best")],
        "plan": ["plan", str(study), "--tokens", "1e8", "--out", str(out / "plan")],
    }


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "explorer", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(  # one verb in the default suite, every verb with the slow one
    "verb", [pytest.param(v, marks=pytest.mark.slow) for v in ("export", "report", "plan")] + ["best"]
)
def test_a_read_only_folder_is_one_line(replayed: Path, tmp_path: Path, verb: str) -> None:
    with small_disk(tmp_path / "ro") as disk:
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        done = _run(_verbs(replayed, disk)[verb])
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("explorer: error: cannot write ") and "Read-only file system" in lines[0]
    assert str(disk) in lines[0]


@pytest.mark.slow  # the same path as the read-only folder's, on a second real filesystem
@pytest.mark.parametrize("verb", ["export", "report", "best", "plan"])
def test_a_full_disk_is_one_line(replayed: Path, tmp_path: Path, verb: str) -> None:
    with small_disk(tmp_path / "full", size_kib=64) as disk:
        (disk / "out").mkdir()
        fill(disk)
        done = _run(_verbs(replayed, disk / "out")[verb])
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("explorer: error: cannot write ") and "No space left on device" in lines[0]
