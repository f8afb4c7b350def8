"""``explorer doctor --resume`` goes on where an earlier doctor of the study stopped: the values it
wrote to ``rows.jsonl`` as it found them are kept as found and not run again, and the node's
figures recorded on the study are reused, not measured again. A lent GPU gives the doctor a
minute a session; without this, every session ran the same first values again."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from explorer.doctor import FAILED, RAN, DoctorReport, Row, record_findings, run_doctor
from explorer.doctor._cases import plan_cases
from explorer.doctor._run import node_of

ROOT = Path(__file__).resolve().parents[1]
FACTS = {"cuda_available": False, "visible_gpus": 0, "packages": {}, "host": "h"}
"""The probe's facts of a CPU node with every optional package (the probe itself is not run)."""
MEASURED = {"device": "cpu", "matmul_tflops": 123.0, "backend": "gloo", "allreduce_busbw_gbs": 4.5}
"""Figures no real measurement gives: seen again, they were reused."""


def _loaded(tmp_path: Path):
    """The quickstart study with a small space, its storage and run folder in ``tmp_path``."""
    from explorer.study_file import load_study

    raw = yaml.safe_load((ROOT / "studies" / "quickstart.yaml").read_text())
    raw["search_space"] = {
        "parameters": {
            "batch_size": {"values": [4, 8]},
            "number_gpus": 1,
            "gradient_checkpointing": {"choices": [False, True]},
        }
    }
    raw.update(storage=f"sqlite:///{tmp_path}/study.db", output_dir=str(tmp_path / "runs"))
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_study(path, check_model=False, check_launcher=False, check_hub=False)


def _earlier(loaded) -> list[Row]:
    """Rows an earlier doctor wrote for every value (one failed, with a detail no run gives)."""
    cases = plan_cases(loaded.space, loaded.spec.resources, node_of(loaded, FACTS))
    rows = [Row(knob=c.knob, value=c.value, status=RAN, config="earlier", seconds=1.5) for c in cases]
    rows[1] = Row(
        knob=rows[1].knob, value=rows[1].value, status=FAILED, detail="rank 0: from before", blocks=True
    )
    folder = loaded.output_dir / "doctor"
    folder.mkdir(parents=True)
    (folder / "rows.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows))
    return rows


def test_resume_keeps_every_value_found_before_and_runs_none_again(tmp_path):
    loaded = _loaded(tmp_path)
    rows = _earlier(loaded)
    report = run_doctor(loaded, facts=FACTS, measured=MEASURED, resume=True)
    assert report.rows == rows
    assert not list((loaded.output_dir / "doctor").glob("run-*"))  # no smoke run
    assert json.loads((loaded.output_dir / "doctor" / "doctor.json").read_text())["rows"] == [
        asdict(r) for r in rows
    ]


@pytest.mark.timeout(600)
def test_resume_runs_only_the_values_not_found_before(tmp_path):
    """One value left out of the earlier rows: exactly one smoke run (real, on the CPU) finds it."""
    loaded = _loaded(tmp_path)
    rows = _earlier(loaded)
    left = rows[-1]
    kept = rows[:-1]
    (loaded.output_dir / "doctor" / "rows.jsonl").write_text(
        "".join(json.dumps(asdict(r)) + "\n" for r in kept)
    )
    report = run_doctor(loaded, facts=FACTS, measured=MEASURED, resume=True)
    assert report.rows[:-1] == kept
    new = report.rows[-1]
    assert (new.knob, new.value) == (left.knob, left.value) and new.status == RAN and new.config != "earlier"
    assert len(list((loaded.output_dir / "doctor").glob("run-*"))) == 1


def test_the_cli_reuses_the_node_figures_recorded_on_the_study(tmp_path):
    """``explorer doctor --resume --json``: the figures an earlier doctor recorded are the report's,
    not measured again, and the rows found before are the report's."""
    from tests.builders import run_cli

    loaded = _loaded(tmp_path)
    rows = _earlier(loaded)
    record_findings(
        loaded,
        DoctorReport(
            study="quickstart", gpu_model="CPU-logical", node=FACTS, device="cpu", measured=MEASURED
        ),
    )
    proc = run_cli("doctor", str(loaded.file), "--resume", "--json", timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]  # the failed row from before still counts
    data = json.loads(proc.stdout)
    assert data["measured"] == MEASURED
    assert data["rows"] == [asdict(r) for r in rows]
