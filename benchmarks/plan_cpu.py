"""Record the two-GPU-model CPU table that ``explorer plan``'s worked example and tests replay.

Runs the real CPU studies ``benchmarks/plan_studies/cpu-small.yaml`` and ``cpu-large.yaml`` (every
configuration of ``search_spaces/plan-cpu.yaml`` on logical GPUs of two declared models that
differ in threads and memory per process), exports each with ``explorer export``, and writes
their rows into one table, ``benchmarks/results/tables/cpu-two-models.csv`` (the ``gpu_model``
column tells them apart). Takes about 10 minutes on 2 cores.

    .venv/bin/python benchmarks/plan_cpu.py
"""

from __future__ import annotations

import csv
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STUDIES = [ROOT / "benchmarks/plan_studies/cpu-small.yaml", ROOT / "benchmarks/plan_studies/cpu-large.yaml"]
TABLE = ROOT / "benchmarks/results/tables/cpu-two-models.csv"


def _explorer(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "explorer.cli", *args], check=True, cwd=ROOT)


def main() -> None:
    rows: list[dict[str, str]] = []
    columns: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, study in enumerate(STUDIES):
            storage = f"sqlite:///{tmp}/plan-{i}.db"
            _explorer("optimize", str(study), "--storage", storage)
            out = Path(tmp) / f"{study.stem}.csv"
            _explorer("export", str(study), "--storage", storage, "--out", str(out))
            with out.open(newline="") as fh:
                reader = csv.DictReader(fh)
                columns += [c for c in reader.fieldnames or [] if c not in columns]
                rows += list(reader)
    with TABLE.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    print(f"{TABLE}: {len(rows)} rows")


if __name__ == "__main__":
    main()
