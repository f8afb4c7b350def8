"""The GPU evidence kit (``benchmarks/gpu_kit.py``, ``scripts/gpu_pack.sh``; docs/gpu.md): its plan
fits a session's device time (call 1 at most 8 minutes, the most telling steps first) and is the one
docs/gpu.md gives, its carries fit one device call, a step is cut at its own limit, a run resumes,
and its CPU dry run goes through every step of both calls and recomputes its figures from its files."""

from __future__ import annotations

import datetime
import functools
import importlib.util
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO

CARRY = REPO / "benchmarks" / "results" / "gpu" / "carry.json"
PACK = REPO / "scripts" / "gpu_pack.sh"
KIT = REPO / "benchmarks" / "gpu_kit.py"
DOC = REPO / "docs" / "gpu.md"
LIMIT = 64 * 2**20
CALL_1 = ["carries", "doctor-node", "study-short", "measure", "estimate", "pytest-knobs", "summary"]


def _tree_bytes() -> int:
    """The bytes of the tracked working tree (what travels with every device call), with 1 KiB a
    file for what the device tool counts beyond the files' bytes (as scripts/gpu_pack.sh counts:
    the tool refused a call of 66.8 MB of files and carries, under 64 MiB by bytes alone)."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    files = [REPO / n for n in names.decode().split("\0") if n and (REPO / n).is_file()]
    return sum(f.stat().st_size + 1024 for f in files)


def _pinned(variable: str) -> list[str]:
    match = re.search(rf'^{variable}="([^"]+)"', PACK.read_text(), re.M)
    assert match, variable
    return match.group(1).split()


@functools.cache
def _module():
    """``benchmarks/gpu_kit.py``, imported once (registered first: its dataclass looks it up)."""
    spec = importlib.util.spec_from_file_location("gpu_kit", KIT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_kit"] = module
    spec.loader.exec_module(module)
    return module


def test_the_carries_fit_one_device_call_together_with_the_tree():
    """The three carries the pack script made travel in each call of the kit: all three with
    today's tracked tree stay under the 64 MiB one call sends; the record names exactly the
    packages the script pins, liger-kernel, bitsandbytes and trl among them."""
    record = json.loads(CARRY.read_text())
    assert record["limit_bytes"] == LIMIT
    carries = record["carries"]
    assert list(carries) == _module().carries() == [".gpu/site", ".gpu/kernels", ".gpu/trl"]
    assert carries[".gpu/site"]["packages"] == _pinned("SITE_PACKAGES")
    assert carries[".gpu/kernels"]["packages"] == _pinned("KERNEL_PACKAGES")
    assert carries[".gpu/trl"]["packages"] == _pinned("TRL_PACKAGES")
    assert {p.split("==")[0] for p in carries[".gpu/kernels"]["packages"]} == {"liger-kernel", "bitsandbytes"}
    assert "trl" in {p.split("==")[0] for p in carries[".gpu/trl"]["packages"]}
    tree = _tree_bytes()
    assert sum(c["bytes"] for c in carries.values()) + tree < LIMIT, (carries, tree)


def _plan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(KIT), "--plan", *args], cwd=REPO, capture_output=True, text=True
    )


def _calls(text: str) -> dict[int, dict]:
    """Each call's steps and minutes as the plan prints them, and its device run."""
    calls: dict[int, dict] = {}
    for line in text.splitlines():
        if m := re.match(r"call (\d+): ([\d.]+) min of steps$", line):
            call = calls[int(m[1])] = {"minutes": float(m[2]), "steps": []}
        elif m := re.match(r"  \d+\. (\S+) +([\d.]+) min  ", line):
            call["steps"].append((m[1], float(m[2])))
        elif line.startswith("  device run: "):
            call["run"] = json.loads(line.removeprefix("  device run: "))
    return calls


def test_the_plan_puts_the_most_telling_steps_in_a_first_call_of_8_minutes():
    """--plan prints each call's steps with their minutes and totals: call 1 is the doctor's node
    measurement, one short study, measure, estimate and the knob tests, in that order, at most 8
    minutes with its slack; call 2 holds the rest (the sdpa benchmark, the doctor's smoke runs and
    trl among it); the start and both calls fit the 15 minutes."""
    plan = _plan()
    assert plan.returncode == 0, plan.stderr
    calls = _calls(plan.stdout)
    assert [s for s, _ in calls[1]["steps"]] == CALL_1
    assert {"sdpa-shapes", "activation-bytes", "doctor", "trl", "pytest-gpu", "env"} <= {
        s for s, _ in calls[2]["steps"]
    }
    for call in calls.values():
        assert call["minutes"] == pytest.approx(sum(m for _, m in call["steps"]), abs=0.01)
        assert all(m > 0 for _, m in call["steps"])
        assert call["run"]["timeout_s"] == pytest.approx(
            (call["minutes"] + _module().CALL_SLACK_MIN) * 60, abs=1
        )
        assert len(call["run"]["command"]) <= 2000 and call["run"]["timeout_s"] <= 600
        assert call["run"]["carry"] == list(json.loads(CARRY.read_text())["carries"])
    assert calls[1]["run"]["timeout_s"] <= 8 * 60
    assert 2 + sum(c["run"]["timeout_s"] for c in calls.values()) / 60 <= 15
    assert "plan: ok" in plan.stdout


def test_docs_give_the_plans_device_calls_and_minutes():
    """docs/gpu.md gives each call's device run exactly as the plan prints it, and each step's
    minutes."""
    doc = DOC.read_text()
    calls = _calls(_plan().stdout)
    for call in calls.values():
        assert json.dumps(call["run"]) in doc
        for step, minutes in call["steps"]:
            assert re.search(rf"`{re.escape(step)}`[^|\n]*\| *{minutes:.2f} *\|", doc), (step, minutes)


def test_a_first_call_over_8_minutes_is_refused(tmp_path):
    """A limit that takes call 1 past 8 minutes: the plan is printed, then refused with one line
    and exit 2; the kit refuses to run it on the GPU, writing nothing."""
    plan = _plan("--limit", "measure=135")
    assert plan.returncode == 2
    assert plan.stderr.strip().count("\n") == 0 and "call 1 takes 8.50 min" in plan.stderr
    run = subprocess.run(
        [sys.executable, str(KIT), "--device", "cuda", "--call", "1", "--limit", "measure=135"]
        + ["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and "plan refused" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "out").exists()


def test_a_step_is_cut_at_its_own_limit(tmp_path):
    """A step's command that would run on is cut at its limit (None), and so is what it started
    in a session of its own that ignores SIGINT (as a rank holding the GPU would)."""
    kit = _module()
    log, pid_file = tmp_path / "step.log", tmp_path / "rank.pid"
    rank = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(600)"
    code = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', {rank!r}], start_new_session=True)\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(600)\n"
    )
    rc = kit.run_logged([sys.executable, "-c", code], log, 6.0)
    assert rc is None and "cut at its limit of 6 s" in log.read_text()
    pid = int(pid_file.read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert kit.run_logged([sys.executable, "-c", "raise SystemExit(3)"], log, 60.0) == 3


def test_the_run_id_resumes_an_unfinished_run(tmp_path):
    """The newest run with a step still to run (timed out, waiting or never run) is resumed;
    with every step settled a new run of today starts."""
    kit = _module()
    steps = {s.name for s in kit.PLAN}
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    (tmp_path / "2020-01-01").mkdir()
    (tmp_path / "2020-01-01" / "kit.json").write_text(json.dumps({"steps": {"doctor": {"status": "done"}}}))
    assert kit.run_id([tmp_path]) == "2020-01-01"
    every = {s: {"status": "done"} for s in steps}
    (tmp_path / "2020-01-01" / "kit.json").write_text(json.dumps({"steps": every}))
    assert kit.run_id([tmp_path]) == today
    (tmp_path / today).mkdir()
    (tmp_path / today / "kit.json").write_text(json.dumps({"steps": every}))
    assert kit.run_id([tmp_path]) == f"{today}-2"
    every["study-short"] = {"status": "timed out (resumes when the kit runs again)"}
    (tmp_path / today / "kit.json").write_text(json.dumps({"steps": every}))
    assert kit.run_id([tmp_path]) == today
    closed = {"steps": every, "closed": "its study's storage holds a broken doctor's findings"}
    (tmp_path / today / "kit.json").write_text(json.dumps(closed))
    assert kit.run_id([tmp_path]) == f"{today}-2"


def test_no_committed_run_is_left_to_resume_by_mistake():
    """Every committed run with a step still to run says why it is closed, or is the one to resume."""
    kit = _module()
    root = REPO / "benchmarks" / "results" / "gpu"
    assert kit.run_id([root]) not in {p.parent.name for p in root.glob("*/kit.json")}


def test_estimate_compared_with_what_was_measured():
    """Measured over predicted and whether the band holds it, per configuration and basis."""
    row = {"dataset_tokens_per_second_per_gpu": 1000.0, "band": {"low": 500.0, "high": 2000.0}}
    found = {
        "trials": 3,
        "default": {"physics": row, "calibrated": {**row, "band": {"low": 900.0, "high": 1100.0}}},
    }
    got = _module().compare(found, {"default": {"dataset_tokens_per_second_per_gpu": 1500.0}, "best": None})
    assert got["default"]["physics"]["measured_over_predicted"] == pytest.approx(1.5)
    assert got["default"]["physics"]["in_band"] is True and got["default"]["calibrated"]["in_band"] is False
    assert got["best"] == {"measured": None} and got["trials"] == 3


def _kit(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(KIT), "--device", "cpu", "--out", str(tmp_path / "out")]
    cmd += ["--work", str(tmp_path / "work"), "--bundle", str(tmp_path / "kit.tar.gz"), *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=2700)


def _steps(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "out" / "kit.json").read_text())["steps"]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_kit_dry_run_on_the_cpu(tmp_path):
    """Call 1 with the short study cut at 5 s: recorded, the kit goes on (measure and estimate
    wait). Call 1 again: only what is left runs, the study resumes, measure compares default and
    best, estimate sets both beside what was measured. Call 2: the rest. The summary's figures are
    the measured lines', and the bundle holds the run under benchmarks/results/gpu-dry-run/."""
    first = _kit(tmp_path, "--call", "1", "--limit", "study-short=5")
    assert first.returncode == 0, first.stderr[-3000:]
    state = _steps(tmp_path)
    assert state["study-short"]["status"].startswith("timed out"), state
    assert state["doctor-node"]["status"] == "done (node measured; recorded on the short study)", state
    assert state["carries"]["status"].startswith(("done", "nothing"))
    assert state["pytest-knobs"]["status"].startswith("collected only (no CUDA): 9 tests"), state
    assert state["measure"]["status"].startswith("waits") and state["estimate"]["status"].startswith("waits")
    assert state["summary"]["status"] == "done" and "trl" not in state and "doctor" not in state

    again = _kit(tmp_path, "--call", "1")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "gpu-kit: doctor-node: done before" in again.stdout  # not run again
    state = _steps(tmp_path)
    assert state["study-short"]["status"] == "done" and state["measure"]["status"].startswith("done")
    assert state["estimate"]["status"] == "done", state
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    for name in ("default", "best"):
        p = json.loads((tmp_path / "out" / f"measure-{name}.jsonl").read_text().splitlines()[0])["properties"]
        assert summary[name]["mfu"] == pytest.approx(p["mfu"])
        assert summary[name]["dataset_tokens_per_second"] == pytest.approx(p["dataset_tokens_per_second"])
        assert 0 < p["mfu"] < 1
        for basis in ("physics", "calibrated"):
            row = summary["estimate"][name][basis]
            assert row["measured_over_predicted"] == pytest.approx(
                p["dataset_tokens_per_second_per_gpu"] / row["dataset_tokens_per_second_per_gpu"]
            )
    assert summary["estimate"]["trials"] >= 1 and summary["estimate"]["node_measured"] is True
    node = json.loads((tmp_path / "out" / "doctor-node.json").read_text())["measured"]
    assert summary["node"]["doctor-node"] == node and node["device"] == "cpu" and node["matmul_tflops"] > 0
    assert summary["gain_over_default"] == pytest.approx(
        summary["best"]["dataset_tokens_per_second"] / summary["default"]["dataset_tokens_per_second"]
    )
    assert "best / default on short entries" in (tmp_path / "out" / "summary.md").read_text()

    second = _kit(tmp_path, "--call", "2")
    assert second.returncode == 0, second.stderr[-3000:]
    state = _steps(tmp_path)
    assert state["env"]["status"] == "done" and state["sdpa-shapes"]["status"] == "done", state
    assert state["trl"]["status"] == "done (max_length: ok, packed: ok)", state
    assert state["pytest-gpu"]["status"].startswith("collected only (no CUDA)"), state
    assert "every step ran" in second.stdout
    assert state["doctor"]["status"].startswith("done"), state
    doctor = json.loads((tmp_path / "out" / "doctor.json").read_text())
    status = {(r["knob"], json.dumps(r["value"])): r["status"] for r in doctor["rows"]}
    assert status[("padding", '"packed"')] == status[("precision", '"pure_bf16"')] == "ran"
    assert status[("batch_size", "8")] == "not applicable"
    assert {s for k, s in status.items() if k != ("batch_size", "8")} == {"ran"}
    shapes = json.loads((tmp_path / "out" / "sdpa-shapes.json").read_text())
    assert shapes["device"] == "cpu" and shapes["backends"]["default"]["new_ms"] > 0
    assert state["activation-bytes"]["status"] == "done", state
    counted = json.loads((tmp_path / "out" / "activation-bytes.json").read_text())["variants"]
    assert set(counted) == {"mixed", "pure_bf16"}  # no Liger without CUDA
    assert all(v["layer_bytes_per_token"] > 0 for v in counted.values())
    with tarfile.open(tmp_path / "kit.tar.gz") as tar:
        names = set(tar.getnames())
    assert {
        "benchmarks/results/gpu-dry-run/out/kit.json",
        "benchmarks/results/gpu-dry-run/out/summary.md",
    } <= names


def _gpu_suite_studies() -> dict[str, dict]:
    from tests.builders import CUDA_ONE_GPU, TINY_GRANITE
    from tests.test_doctor_gpu import SPACE
    from tests.test_gpu_knobs import CUDA_STUDY

    return {
        "test_gpu": CUDA_ONE_GPU,
        "test_gpu compiled": CUDA_ONE_GPU
        | {"workload": {"model": {"name": "g", "architecture": TINY_GRANITE}}},
        "test_gpu_knobs": CUDA_STUDY,
        "test_doctor_gpu": {**CUDA_STUDY, "search_space": SPACE},
    }


@pytest.mark.parametrize("suite", ["test_gpu", "test_gpu compiled", "test_gpu_knobs", "test_doctor_gpu"])
def test_the_gpu_suites_studies_load_on_a_one_gpu_node(suite, write_study):
    """``pytest -m gpu``'s studies load on the lent machine, where NVML sizes the resources to its
    one GPU: a study refused there fails every test, at the cost of device time, so each is loaded
    here first, with the lent machine's model and GPU count declared (there is no NVML here)."""
    from explorer.study_file import load_study
    from tests.conftest import merge

    one_gpu = {"gpu_model": "NVIDIA-H100-80GB-HBM3", "gpus_per_node": 1}
    loaded = load_study(
        write_study(merge(_gpu_suite_studies()[suite], {"resources": one_gpu})), check_launcher=False
    )
    assert loaded.spec.resources.gpus_per_node == 1
    assert set(loaded.space.domains) >= {"batch_size", "number_gpus", "gradient_checkpointing"}


def test_the_h100_figures_in_the_docs_are_the_recorded_ones():
    """The README's and docs/gpu.md's H100 figures, recomputed from the kit's committed results."""
    gpu = REPO / "benchmarks" / "results" / "gpu"
    measured = json.loads((gpu / "2026-11-27-fork" / "doctor.json").read_text())["measured"]
    trl = {
        p: json.loads((gpu / "2026-11-27-3" / f"trl-{p}.jsonl").read_text().splitlines()[0])["properties"]
        for p in ("max_length", "packed")
    }
    padded, packed = (trl[p]["dataset_tokens_per_second"] for p in ("max_length", "packed"))
    readme = (REPO / "README.md").read_text()
    page = " ".join((REPO / "docs" / "gpu.md").read_text().split())
    node = (
        f"{measured['matmul_tflops']:.1f} TFLOP/s bf16",
        f"{measured['memory_bandwidth_tbs']:.2f} TB/s",
        f"{measured['allocatable_gib']:.2f} GiB allocatable",
    )
    for text in (" ".join(readme.split()), page):
        assert all(figure in text for figure in node), node
    assert f"{padded:,.0f} dataset tokens/s padded to max_length" in page
    assert f"{trl['max_length']['train_tokens_per_second']:,.0f} train tokens/s" in page
    assert f"{packed:,.0f} packed ({packed / padded:.2f}x)" in page
    steps = {p: 1000 * trl[p]["step_time_mean"] for p in trl}
    assert (
        f"{trl['packed']['measured_dataset_tokens']:,} dataset tokens in {trl['packed']['measured_steps']} steps"
        in page
    )
    assert trl["packed"]["measured_dataset_tokens"] == trl["max_length"]["measured_dataset_tokens"]
    assert f"{steps['max_length']:.1f} ms a step padded and {steps['packed']:.1f} ms packed" in page


def test_the_h200_figures_in_the_docs_are_the_recorded_ones():
    """The README's and docs/gpu.md's H200 figures, recomputed from the kit's committed run."""
    run = REPO / "benchmarks" / "results" / "gpu" / "2026-11-28"
    best = json.loads((run / "measure-best.jsonl").read_text().splitlines()[0])["properties"]
    physics = json.loads((run / "estimate.json").read_text())["best"]["physics"]
    default = json.loads((run / "measure-default.jsonl").read_text().splitlines()[0])
    readme = " ".join((REPO / "README.md").read_text().split())
    page = " ".join((REPO / "docs" / "gpu.md").read_text().split())
    shared = (
        f"{best['dataset_tokens_per_second']:,.0f} dataset tokens/s",
        f"MFU {best['mfu']:.3f}",
        f"{best['peak_memory_allocated_gib']:.1f} GiB allocated",
        f"{physics['dataset_tokens_per_second_per_gpu']:,.0f}",
        f"{physics['peak_memory_gib']:.1f} GiB",
    )
    for text in (readme, page):
        assert all(figure in text for figure in shared), shared
    assert physics["fits"] is False and "OutOfMemoryError" in default["error"]
    assert f"{best['train_tokens_per_second']:,.0f} train tokens/s" in page
    assert f"{best['peak_memory_gib']:.1f} GiB reserved" in page
    assert f"measured {physics['measured_over_predicted']:.2f}x" in page
    log = (run / "pytest-knobs.log").read_text()
    pure, mixed = (float(x) for x in re.search(r"assert ([\d.]+) < \(0\.8 \* ([\d.]+)\)", log).groups())
    assert f"pure bf16 saving {mixed - pure:.2f} GiB ({pure / mixed:.2f}x the peak)" in readme
    assert f"allocated {pure:.2f} GiB against mixed precision's {mixed:.2f} ({pure / mixed:.2f}x" in page
    packed, padded = (float(x) for x in re.search(r"assert ([\d.]+) > \(1\.3 \* ([\d.]+)\)", log).groups())
    assert (
        f"packing ran at {packed:,.0f} dataset tokens/s against {padded:,.0f} padded ({packed / padded:.2f}x)"
        in page
    )
    # the packed and padded trials' step times and the packed one's GPU use, from the same assertion
    packing = log.split("def test_packing_raises")[1]  # its failure's report
    steps = [float(x) for x in re.findall(r"step_time_mean=([\d.]+)", packing)][:2]
    busy = float(re.findall(r"'gpu_compute_utilization_avg': ([\d.]+)", packing)[0])
    assert (
        f"{1000 * steps[0]:.0f} ms a step against {1000 * steps[1]:.0f} ms with the GPU {busy:.1f}% busy"
        in page
    )
    assert f"the GPU {busy:.1f}% busy" in readme
    assert f"a step of {best['step_time_mean']:.3f} s (cv {best['step_time_cv']:.3f})" in page
    extra = json.loads((run / "measure-best.jsonl").read_text().splitlines()[0])["extra"]
    assert f"states were {extra['optimizer']['state_bytes'] / 1e9:.2f} GB" in page
    assert extra["start"] == "warm" and "ranks forked warm" in readme
    in_use = float(re.search(r"this process has ([\d.]+) GiB memory in use", default["error"]).group(1))
    assert f"ran out of memory at {in_use:.1f} GiB" in page
    rows = [json.loads(line) for line in (run / "doctor-rows.jsonl").read_text().splitlines()]
    assert f"first smoke run ({len(rows)} values at once) ran in {rows[0]['seconds']:.1f} s" in page


def test_the_knob_tests_go_on_where_an_earlier_call_stopped(tmp_path):
    """``pytest-knobs`` on the GPU runs only the tests whose outcome no earlier call logged (the
    log holds every call's output): with eight of the nine logged, the ninth alone runs (here,
    without CUDA, it fails at the suite's CUDA check), and the status counts all nine."""
    kit_module = _module()
    kit = kit_module.Kit(device="cuda", out=tmp_path / "out", work=tmp_path / "work", bundle=None)
    names = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q", "tests/test_gpu_knobs.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout.split()
    tests = [n for n in names if n.startswith("tests/test_gpu_knobs.py::")]
    assert len(tests) == 9
    log = tmp_path / "out" / "pytest-knobs.log"
    log.write_text(
        "".join(f"{t} PASSED [ 11%]\n" for t in tests[:8]) + "gpu-kit: cut at its limit of 159 s\n"
    )
    status = kit_module._pytest(kit, kit_module.Clock(300), kit_module.KNOB_TESTS, "pytest-knobs.log")
    outcomes = kit_module._pytest_outcomes(log)
    assert outcomes[tests[8]] in ("FAILED", "ERROR") and len(outcomes) == 9
    assert log.read_text().count(f"{tests[0]} PASSED") == 1  # not run again
    assert status.startswith("done, failures (exit 1; ") and "8 passed" in status, status
