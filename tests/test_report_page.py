"""``explorer report`` on a real study (the CPU quickstart's measured table, replayed: no training):
the page opens with the best configuration and the command that writes it out, then the top ten
with why each lost, and every figure is a PNG of the report's size."""

from __future__ import annotations

import re
from pathlib import Path

import optuna
import pytest
import yaml

from explorer.cli import main
from explorer.report._canvas import HEIGHT_PX, WIDTH_PX
from explorer.report._memory import memory_front
from explorer.report._points import Kind, measured_feasible, points_of
from explorer.report._ranking import RankedTrial, behind_best, differences
from explorer.study import OBJECTIVE, open_study, optimize
from explorer.study_file import load_study
from explorer.trial_config import TrialConfig

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ["throughput", "frontier", "gpus", "memory", "history", "feasibility", "importances"]


@pytest.fixture(scope="module")
def cpu_study(tmp_path_factory) -> tuple[Path, optuna.Study]:
    """studies/cpu-table.yaml answered from benchmarks/results/tables/cpu-quickstart.csv: 40
    random proposals over both sequence lengths and GPU counts, some running out of memory."""
    tmp = tmp_path_factory.mktemp("cpu-report")
    spec = yaml.safe_load((ROOT / "studies" / "cpu-table.yaml").read_text())
    spec |= {
        "search_space": str(ROOT / "search_spaces" / "cpu-table.yaml"),
        "launcher": {
            "kind": "replay",
            "table": str(ROOT / "benchmarks" / "results" / "tables" / "cpu-quickstart.csv"),
            "max_retries": 0,
        },
        "storage": f"sqlite:///{tmp}/s.db",
        "output_dir": str(tmp / "out"),
        "n_trials": 40,
        "sampler": {"kind": "random", "seed": 3},
    }
    path = tmp / "study.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    loaded = load_study(path)
    optimize(loaded, printer=lambda _: None)
    assert main(["report", str(path)]) == 0
    return path, open_study(loaded, create=False)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000, path
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _ranking(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Recomputed here: trials that measured a throughput of their own, fastest per GPU first."""
    ran = [
        t
        for t in study.get_trials()
        if t.user_attrs.get("status") == "ok" and "reused_from" not in t.user_attrs
    ]
    return sorted(ran, key=lambda t: -t.user_attrs[OBJECTIVE])


def _section(page: str, element_id: str) -> str:
    start = page.index(f'id="{element_id}"')
    return page[start : page.index("</table>", start)]


def test_the_page_opens_with_the_best_configuration_and_its_command(cpu_study):
    path, study = cpu_study
    statuses = {t.user_attrs.get("status") for t in study.get_trials()}
    assert {"ok", "oom"} <= statuses, statuses
    page = (path.parent / "out" / "report" / "index.html").read_text()
    best = _ranking(study)[0]
    head = page[: page.index('id="top"')]
    assert f"Best configuration: trial {best.number}</h2>" in head
    assert f"<code>explorer best {path}</code>" in head
    assert f"{best.user_attrs[OBJECTIVE]:,.0f} dataset tokens/s per GPU" in head
    params = _section(page, "best-parameters")
    assert f"<th>batch_size</th><td>{best.user_attrs['batch_size']}</td>" in params  # not its log2
    assert f"<th>number_gpus</th><td>{best.user_attrs['number_gpus']}</td>" in params
    assert "log2" not in params
    assert f"peak memory {best.user_attrs['peak_memory_gib']:.3f} GiB" in head
    assert f"MFU {100 * best.user_attrs['mfu']:.2f}%" in head
    assert f"± {100 * best.user_attrs['step_time_rel_ci']:.1f}%" in head


def test_the_top_ten_table_is_ordered_and_says_why_each_lost(cpu_study):
    path, study = cpu_study
    page = (path.parent / "out" / "report" / "index.html").read_text()
    table = _section(page, "top-configurations")
    expected = _ranking(study)[:10]
    assert len(expected) == 10
    rows = re.findall(r'<tr data-trial="(\d+)"(.*?)</tr>', table, flags=re.S)
    assert [int(n) for n, _ in rows] == [t.number for t in expected]
    best = expected[0]
    assert "<td>best</td>" in rows[0][1]
    for (_, row), trial in zip(rows[1:], expected[1:], strict=True):
        reason = re.findall(r"<td>([^<]*)</td>\s*$", row.strip())[0]
        gap = 100 * (1 - trial.user_attrs[OBJECTIVE] / best.user_attrs[OBJECTIVE])
        slower = re.search(r"([\d.]+)% slower per GPU", reason)
        if slower:
            assert abs(float(slower.group(1)) - gap) < 0.6, (reason, gap)
        else:
            assert "same throughput within noise" in reason and gap < 100 * 0.35, reason
        if trial.user_attrs["number_gpus"] != best.user_attrs["number_gpus"]:
            assert f"uses {trial.user_attrs['number_gpus']} GPUs" in reason
        assert "differs: " in reason and f"{trial.user_attrs[OBJECTIVE]:,.0f}" in row


def test_every_figure_is_a_png_of_the_report_size(cpu_study):
    path, _ = cpu_study
    folder = path.parent / "out" / "report"
    page = (folder / "index.html").read_text()
    for name in FIGURES:
        assert _png_size(folder / f"{name}.png") == (WIDTH_PX, HEIGHT_PX), name
        assert f'<img src="{name}.png"' in page


def test_figures_draw_only_measured_feasible_throughputs_and_the_true_memory_front(cpu_study):
    """An OOM or failed trial has no throughput: it is never among the points drawn as one; the
    frontier's front is exactly the trials no other beats on throughput without more memory."""
    _, study = cpu_study
    points = points_of(study)
    assert any(p.kind is Kind.OOM for p in points)
    measured = measured_feasible(points)
    assert measured and all(p.kind is Kind.FEASIBLE and p.objective > 0 for p, _ in measured)
    front = {p.number for p, _ in memory_front(measured)}

    def dominated(p):
        return any(
            q.objective >= p.objective
            and q.peak_memory_gib <= p.peak_memory_gib
            and (q.objective > p.objective or q.peak_memory_gib < p.peak_memory_gib)
            for q, _ in measured
        )

    assert front == {p.number for p, _ in measured if not dominated(p)}


def _row(number: int, per_gpu: float, memory: float, **config) -> RankedTrial:
    base = dict(batch_size=64, number_gpus=1, distributed_backend="NONE", gradient_checkpointing=False)
    return RankedTrial(
        number=number,
        config=TrialConfig(model_max_length=64, **(base | config)),
        per_gpu=per_gpu,
        total=per_gpu * (base | config)["number_gpus"],
        mfu=0.3,
        peak_memory_gib=memory,
        step_time_s=0.1,
        step_time_rel_ci=0.01,
    )


def test_why_a_configuration_lost_is_computed_from_both():
    best = _row(1, 1000.0, 0.30)
    fsdp = _row(
        2,
        880.0,
        0.20,
        batch_size=16,
        number_gpus=2,
        distributed_backend="FSDP",
        fsdp_version=1,
        fsdp_sharding_strategy="FULL_SHARD",
    )
    reason = behind_best(fsdp, best, tolerance=0.02)
    assert reason.startswith("12% slower per GPU; uses 2 GPUs (best: 1); less memory (0.2 vs 0.3 GiB)")
    assert "bs=16" in reason and "gpus=2" in reason and "FSDP1/FULL_SHARD" in reason
    assert differences(fsdp.config, best.config).count("FSDP1/FULL_SHARD") == 1  # one label, 3 fields

    twin = _row(3, 990.0, 0.45, gradient_checkpointing=True)
    assert behind_best(twin, best, tolerance=0.02) == (
        "same throughput within noise (1.0% below; noise 2.0%); more memory (0.45 vs 0.3 GiB); "
        "differs: ckpt=on"
    )
    assert "same configuration" in behind_best(_row(4, 999.0, 0.30), best, tolerance=0.02)


def test_a_study_without_a_feasible_trial_says_so_and_draws_no_throughput(write_study, tmp_path):
    """Every trial ran out of memory: no best, no table, and the throughput figures say why they
    are empty instead of drawing the OOMs at 0."""
    db = f"sqlite:///{tmp_path}/oom.db"
    path = write_study({"name": "oom", "storage": db})
    study = optuna.create_study(study_name="oom", storage=db, direction="maximize")
    dist = {"log2_batch_size": optuna.distributions.IntDistribution(2, 6)}
    for e in range(2, 5):
        attrs = dict(status="oom", batch_size=2**e, number_gpus=1, distributed_backend="NONE")
        study.add_trial(
            optuna.trial.create_trial(
                params={"log2_batch_size": e},
                distributions=dist,
                value=0.0,
                user_attrs={**attrs, "gradient_checkpointing": False, "model_max_length": 64},
                system_attrs={"constraints": [1.0]},
            )
        )
    assert main(["report", str(path), "--out", str(tmp_path / "r")]) == 0
    page = (tmp_path / "r" / "index.html").read_text()
    assert "No feasible configuration yet" in page and 'id="top-configurations"' not in page
    assert not measured_feasible(points_of(study))
    for name in FIGURES:
        assert _png_size(tmp_path / "r" / f"{name}.png") == (WIDTH_PX, HEIGHT_PX), name
