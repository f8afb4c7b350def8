"""``explorer report``'s "time and cost" figure on the two replayed CPU studies of ``explorer plan``.

The plotted hours of the measured points are recomputed by hand from the table's raw window
measurements (dataset tokens and seconds of each trial's measured window); the page embeds the
figure for a study file with a ``budget``, and says in one line how to get it without one.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from explorer.cli import main
from explorer.plan import PlanJob, PlanRow, candidates, cost_series, draw_time_and_cost, plan_job, study_rows
from explorer.plan._figure import FILE, HINT
from explorer.report._canvas import HEIGHT_PX, WIDTH_PX
from explorer.study import open_existing_study
from explorer.study_file import load_study
from tests.builders import PLAN_TABLE, best_rates_by_hand, replayed_plan_studies

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The two replay studies, run to the end in a copy of their folders; the first reported."""
    files = replayed_plan_studies(tmp_path_factory.mktemp("cost"))
    assert main(["report", str(files[0])]) == 0
    return files


def _by_hand() -> dict[tuple[str, int], float]:
    """Each (GPU model, GPU count)'s best dataset tokens/s per GPU from the raw window measurements."""
    return {k: v[0] for k, v in best_rates_by_hand(ROOT / PLAN_TABLE).items()}


def _rows(file: Path) -> tuple[list[PlanRow], PlanJob]:
    loaded = load_study(file, check_model=False)
    job = plan_job([loaded.spec], file=str(file))
    return candidates(study_rows(loaded, open_existing_study(loaded)), job), job


def test_the_plotted_hours_and_costs_follow_the_raw_measurements(
    replayed: list[Path], tmp_path: Path
) -> None:
    hand = _by_hand()
    every = []
    for file in replayed:
        spec = yaml.safe_load(file.read_text())
        budget, prices = spec["budget"], spec["prices"]
        tokens, epochs = float(budget["tokens"]), float(budget["epochs"])
        rows, job = _rows(file)
        every += rows
        path, series = draw_time_and_cost(rows, job, tmp_path / f"{file.stem}.png")
        assert path.is_file()
        (line,) = series  # one study, one GPU model
        model = spec["resources"]["gpu_model"]
        assert line.gpu_model == model and line.unit == "USD"
        measured = {p.number_gpus: p for p in line.points if not p.extrapolated}
        assert set(measured) == {n for m, n in hand if m == model}
        for n, point in measured.items():
            hours = tokens * epochs / (hand[(model, n)] * n) / 3600
            assert point.hours == pytest.approx(hours, rel=1e-3), (model, n)
            assert point.cost == pytest.approx(hours * n * prices[model], rel=1e-3), (model, n)
            assert point.hours_band is None and point.trial is not None
        beyond = [p for p in line.points if p.extrapolated]
        # budget.max_gpus 8 on 2 GPUs per node: 4 and 8 GPUs come from the fit, with its band
        assert [p.number_gpus for p in beyond] == [4, 8]
        for p in beyond:
            assert p.hours_band is not None and p.cost_band is not None
            assert p.hours_band[0] <= p.hours <= p.hours_band[1]
            assert p.cost_band[0] <= p.cost <= p.cost_band[1]
        # without a price the cost is in GPU-hours
        (unpriced,) = cost_series(rows, PlanJob(tokens=tokens, epochs=epochs))
        assert unpriced.unit == "GPU-hours"
        assert [p.cost for p in unpriced.points] == pytest.approx(
            [p.hours * p.number_gpus for p in line.points]
        )
    # a study that searched both models: one line each
    _, both = draw_time_and_cost(every, job, tmp_path / "both.png")
    assert [s.gpu_model for s in both] == ["CPU-large", "CPU-small"]


def test_the_report_page_embeds_the_figure_with_its_sources(replayed: list[Path]) -> None:
    folder = replayed[0].parent / "explorer-runs" / "plan-replay-cpu-small" / "report"
    png = (folder / FILE).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert (int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")) == (WIDTH_PX, HEIGHT_PX)
    page = (folder / "index.html").read_text()
    figure = re.search(r'<figure id="time_cost">(.*?)</figure>', page, re.S)
    assert figure, "the time and cost figure is on the page"
    text = figure.group(1)
    assert f'<img src="{FILE}"' in text and "Optuna artifact <code>" in text
    for said in ("200,000,000 dataset tokens x 2 epochs", "CPU-small $1.00", "docs/scaling.md", "12 h"):
        assert said in text, said
    assert HINT not in page
    assert page.index('id="memory"') < page.index('id="time_cost"') < page.index('id="history"')


def test_a_study_file_without_a_budget_gets_the_hint(replayed: list[Path], tmp_path: Path) -> None:
    spec = yaml.safe_load(replayed[0].read_text())
    del spec["budget"]
    bare = replayed[0].with_name("no-budget.yaml")  # same name, storage and folder: the same study
    bare.write_text(yaml.safe_dump(spec, sort_keys=False))
    assert main(["report", str(bare), "--out", str(tmp_path / "r")]) == 0
    page = (tmp_path / "r" / "index.html").read_text()
    assert page.count(HINT) == 1
    assert not (tmp_path / "r" / FILE).exists() and 'id="time_cost"' not in page


def test_a_budget_whose_global_batch_was_never_measured_gets_a_line_not_a_figure(
    replayed: list[Path], tmp_path: Path
) -> None:
    spec = yaml.safe_load(replayed[0].read_text())
    spec["budget"]["global_batch"] = 24  # measured: 8, 16, 32, 64
    odd = replayed[0].with_name("odd-batch.yaml")  # same name, storage and folder: the same study
    odd.write_text(yaml.safe_dump(spec, sort_keys=False))
    assert main(["report", str(odd), "--out", str(tmp_path / "r")]) == 0
    page = (tmp_path / "r" / "index.html").read_text()
    assert (
        "No time and cost figure: no feasible configuration with budget.global_batch 24 was measured." in page
    )
    assert not (tmp_path / "r" / FILE).exists() and 'id="time_cost"' not in page
