"""The wheel is whole: `pip install` it into a fresh virtual environment, away from the source
tree, and `explorer best` still renders its accelerate config (the templates of launchers/ ship
inside it as explorer/launchers)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_the_listed_packages_are_every_package():
    # (a regex, not tomllib: that arrived in Python 3.11, and explorer supports 3.10)
    block = re.search(r"^packages = \[(.*?)\]", (ROOT / "pyproject.toml").read_text(), re.S | re.M)
    assert block is not None
    listed = set(re.findall(r'"([\w.]+)"', block.group(1)))
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "explorer").rglob("__init__.py")}
    data = {  # folders of data alone ship as packages too, as setuptools asks
        "explorer.launchers." + ".".join(p.relative_to(ROOT / "launchers").parts)
        for p in (ROOT / "launchers").rglob("*")
        if p.is_dir()
    } | {"explorer.report.templates"}
    assert listed == found | {"explorer.launchers"} | data


def test_building_the_wheel_prints_no_setuptools_warning(tmp_path):
    """``pip install .`` builds this wheel; its backend's deprecation and packaging warnings
    (a license as a TOML table, data folders missing from ``packages``) are what users saw."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-v",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = [
        line
        for line in (proc.stdout + proc.stderr).splitlines()
        if re.search(r"Warning|deprecat", line) and "byte-compiling is disabled" not in line
    ]
    assert said == []


def _run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"{args}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    return proc.stdout


@pytest.mark.slow  # builds and installs a wheel, runs a study: in `make test-slow`
def test_a_wheel_in_a_fresh_venv_runs_best_outside_the_source_tree(tmp_path):
    """The fresh venv gets the wheel alone (--no-deps); its dependencies come from this
    environment's site-packages through a .pth file, which Python reads for paths only (so the
    editable install of this checkout is not seen there)."""
    _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        tmp_path / "dist",
        ROOT,
        cwd=tmp_path,
    )
    (wheel,) = (tmp_path / "dist").glob("explorer-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
    assert {"explorer/report/templates/index.html.j2", "explorer/launchers/accelerate/fsdp2.yaml"} <= names
    assert {"explorer/launchers/slurm/explorer.sbatch", "explorer/launchers/slurm/README.md"} <= names
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    site = Path(
        _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path).strip()
    )
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # --ignore-installed: this checkout's editable install is visible through the .pth
    _run(
        python, "-m", "pip", "install", "--no-deps", "--ignore-installed", "-q", wheel, cwd=tmp_path, env=env
    )

    work = tmp_path / "work"
    work.mkdir()
    study = yaml.safe_load((ROOT / "studies" / "cpu-table.yaml").read_text())
    study.update(
        name="wheel",
        sampler={"kind": "tpe", "seed": 0},
        n_trials=4,
        infer_oom=True,
        launcher={"kind": "replay", "table": str(ROOT / "benchmarks/results/tables/cpu-quickstart.csv")},
        search_space=str(ROOT / "search_spaces" / "cpu-table.yaml"),
    )
    (work / "study.yaml").write_text(yaml.safe_dump(study))
    explorer = venv / "bin" / "explorer"
    where = _run(python, "-c", "import explorer; print(explorer.__file__)", cwd=work, env=env)
    assert where.startswith(str(site)), where
    assert _run(explorer, "--version", cwd=work, env=env).startswith("explorer ")
    _run(explorer, "optimize", "study.yaml", cwd=work, env=env)
    out = _run(explorer, "best", "study.yaml", "--out", work / "best", cwd=work, env=env)
    assert "accelerate launch" in out
    rendered = yaml.safe_load((work / "best" / "accelerate.yaml").read_text())
    assert rendered["compute_environment"] == "LOCAL_MACHINE"
