"""Every command explorer prints or writes into a file is quoted for the shell: a path with
``$(...)``, spaces or quotes in it, copied from accelerate.yaml's header comment, names that path
and runs nothing."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from explorer.cli import main
from tests.builders import replayed_plan_studies


def test_the_accelerate_config_header_quotes_its_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (study,) = replayed_plan_studies(tmp_path / "studies")[:1]
    out = tmp_path / "best $(touch PWNED) it's"
    assert main(["best", str(study), "--out", str(out)]) == 0
    capsys.readouterr()
    header = [
        line
        for line in (out / "accelerate.yaml").read_text().splitlines()
        if "run: accelerate launch" in line
    ]
    assert header, "the header names the command"
    command = header[0].split("run: ", 1)[1].removesuffix(" ...")
    words = shlex.split(command)
    assert words[:3] == ["accelerate", "launch", "--config_file"]
    assert words[3] == str(out / "accelerate.yaml")  # one word: the path itself, nothing run
