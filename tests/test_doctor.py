"""``explorer doctor``: which configuration checks each knob value, what the table says, what
``optimize`` then does with it, and a package made unimportable in the trials' environment.

The quick tests plan the cases of ``studies/cpu-every-knob.yaml`` for a CPU node (no run); the
slow ones run the real doctor (probe, smoke runs through ``run_trial``) and real trials."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from explorer.doctor import (
    FAILED,
    NOT_APPLICABLE,
    RAN,
    DoctorReport,
    Node,
    Row,
    group_cases,
    plan_cases,
    record_findings,
    render_table,
    run_doctor,
)
from explorer.knobs import Needs, knob, knobs
from explorer.knobs._registry import KNOBS
from explorer.validity import DOCTOR_ATTR, doctor_reason, invalid_reason
from tests.builders import run_cli
from tests.conftest import REPO

EVERY_KNOB = REPO / "studies" / "cpu-every-knob.yaml"
CUDA_ONLY = {
    ("optim", "adamw_bnb_8bit"),
    ("attn_implementation", "flash_attention_2"),
    ("attn_implementation", "flex_attention"),
    ("liger_kernel", True),
    ("fsdp_cpu_offload", True),
}
"""The values of the every-knob study that need CUDA (their knobs' ``needs``)."""
CPU_NODE = Node(device="cpu", gpus=2, model_type="llama")


def _every_knob(tmp_path: Path, **patch: object) -> Path:
    """The every-knob study with its storage and run folder in ``tmp_path`` (and ``patch``)."""
    data = yaml.safe_load(EVERY_KNOB.read_text())
    data.update(storage=f"sqlite:///{tmp_path / 's.db'}", output_dir=str(tmp_path / "runs"), **patch)
    path = tmp_path / "every-knob.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_the_every_knob_study_searches_every_knob():
    from explorer.study_file import load_study

    loaded = load_study(EVERY_KNOB, check_launcher=False)
    assert set(loaded.space.domains) == {k.name for k in knobs()}
    assert {(k.name, v) for k in knobs() for v in k.needs} <= CUDA_ONLY | {
        (k.name, v) for k in knobs() for v in k.needs if v not in loaded.space.domains[k.name].values
    }


def test_each_value_gets_a_valid_configuration_or_the_reason(tmp_path):
    """On a CPU node of 2 logical GPUs: every CUDA-only value is not applicable and blocks (its
    need is the reason); the other values each get a valid configuration holding that value,
    except those outside one node or the smallest batch; the runs cover every case, fewer."""
    from explorer.study_file import load_study

    loaded = load_study(_every_knob(tmp_path), check_launcher=False)
    resources = loaded.spec.resources
    cases = plan_cases(loaded.space, resources, CPU_NODE)
    assert {(c.knob, c.value) for c in cases} == {
        (name, v) for name, d in loaded.space.domains.items() for v in d.values
    }
    for case in cases:
        if (case.knob, case.value) in CUDA_ONLY:
            assert case.config is None and case.blocks and "needs a CUDA device" in (case.reason or "")
        elif (case.knob, case.value) in {("batch_size", 8), ("number_nodes", 2)}:
            assert case.config is None and not case.blocks, case
        else:
            assert case.config is not None, case
            assert getattr(case.config, case.knob) == case.value
            assert invalid_reason(case.config, resources) is None
            assert case.config.batch_size == 4 and case.config.number_nodes == 1
    runs = group_cases(cases, loaded.space, resources, CPU_NODE)
    assert sorted(id(c) for r in runs for c in r.cases) == sorted(id(c) for c in cases if c.config)
    assert len(runs) < len([c for c in cases if c.config]) / 3
    for run in runs:
        assert invalid_reason(run.config, resources) is None
        assert all(getattr(run.config, c.knob) == c.value for c in run.cases)
        assert not (len(run.cases) > 1 and any(c.knob == "torch_compile" and c.value for c in run.cases))


def test_a_missing_package_blocks_its_value_only():
    from explorer.doctor import unmet_here

    node = dataclasses.replace(
        CPU_NODE, device="cuda", missing={"flash_attn": "ImportError: libcudart.so.12"}
    )
    attn = knob("attn_implementation")
    assert unmet_here(attn, "flash_attention_2", node) == (
        "'flash_attention_2' needs the Python package 'flash_attn', which does not import here: "
        "ImportError: libcudart.so.12"
    )
    assert unmet_here(attn, "flex_attention", node) is None
    assert "FlexAttention has no backward on the CPU" in (unmet_here(attn, "flex_attention", CPU_NODE) or "")


def test_the_recorded_findings_make_a_configuration_invalid():
    from explorer.spec import ResourcesSpec
    from tests.builders import config

    resources = ResourcesSpec(gpu_model="H100", gpus_per_node=8)
    base = dict(batch_size=8, number_gpus=1, gradient_checkpointing=False, model_max_length=64)
    recorded = {"invalid": {"H100": {"optim": {json.dumps("adamw_bnb_8bit"): "no kernel for sm_90"}}}}
    assert doctor_reason(config(base), recorded, resources) is None
    assert doctor_reason(config(base, optim="adamw_bnb_8bit"), None, resources) is None
    assert doctor_reason(config(base, optim="adamw_bnb_8bit"), recorded, resources) == (
        "explorer doctor found optim=adamw_bnb_8bit failing on H100: no kernel for sm_90"
    )
    other = ResourcesSpec(gpu_model="A100", gpus_per_node=8)  # another node type: not its findings
    assert doctor_reason(config(base, optim="adamw_bnb_8bit"), recorded, other) is None


def test_the_table_and_json_say_the_same():
    rows = [
        Row(knob="optim", value="adamw_torch", status=RAN, config="k1", seconds=1.5),
        Row(
            knob="optim",
            value="adafactor",
            status=FAILED,
            detail="RuntimeError: boom",
            blocks=True,
            config="k2",
        ),
        Row(
            knob="liger_kernel",
            value=True,
            status=NOT_APPLICABLE,
            detail="True needs a CUDA device",
            blocks=True,
        ),
    ]
    node = {"host": "h", "torch": "2.13", "packages": {"liger_kernel": {"version": None, "error": "E: x"}}}
    report = DoctorReport(study="s", gpu_model="H100", node=node, device="cpu", rows=rows, seconds=3.0)
    data = json.loads(report.to_json())
    assert data["invalid"] == {
        "optim": {'"adafactor"': "RuntimeError: boom"},
        "liger_kernel": {"true": "True needs a CUDA device"},
    }
    text = render_table(report)
    assert "1 ran, 1 failed, 1 not applicable" in text and "liger_kernel: does not import: E: x" in text
    assert "RuntimeError: boom" in text and text.count("invalid in optimize") == 2


def _blocked_env(tmp_path: Path) -> dict[str, str]:
    """A real package ``doctor_probe_pkg`` on the path, and a ``sitecustomize`` that makes it
    unimportable in every process started with this environment (the narrowest boundary: the
    import itself)."""
    pkgs, block = tmp_path / "pkgs", tmp_path / "block"
    (pkgs / "doctor_probe_pkg").mkdir(parents=True)
    (pkgs / "doctor_probe_pkg" / "__init__.py").write_text('__version__ = "1.0"\n')
    block.mkdir()
    (block / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'doctor_probe_pkg':\n"
        "            raise ImportError(f'{name} is blocked by the test')\n"
        "sys.meta_path.insert(0, _Block())\n"
    )
    path = os.pathsep.join([str(block), str(pkgs), str(REPO), os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path.rstrip(os.pathsep)}


@pytest.fixture
def adafactor_needs_a_package(monkeypatch):
    """A plugin's declaration, for this test only: ``optim: adafactor`` needs ``doctor_probe_pkg``
    (the real knob, its value and the worker unchanged; only what the doctor checks grows)."""
    optim = knob("optim")
    patched = dataclasses.replace(optim, needs={**optim.needs, "adafactor": Needs(module="doctor_probe_pkg")})
    monkeypatch.setitem(KNOBS, "optim", patched)


def test_the_probe_reports_a_package_that_the_trials_cannot_import(tmp_path, adafactor_needs_a_package):
    from explorer.doctor import probe_in_child
    from explorer.launch import zygote_environment

    env = _blocked_env(tmp_path)
    free = {**os.environ, "PYTHONPATH": env["PYTHONPATH"].split(os.pathsep, 1)[1]}
    assert probe_in_child(zygote_environment(cpu_count=1, base=free))["packages"]["doctor_probe_pkg"] == {
        "version": "1.0",
        "error": None,
    }
    blocked = probe_in_child(zygote_environment(cpu_count=1, base={**os.environ, **env}))
    assert blocked["packages"]["doctor_probe_pkg"] == {
        "version": None,
        "error": "ImportError: doctor_probe_pkg is blocked by the test",
    }
    assert blocked["cuda_available"] is False and blocked["torch"].startswith("2.")


@pytest.mark.slow
def test_an_unimportable_package_is_never_launched_by_optimize(
    tmp_path, monkeypatch, adafactor_needs_a_package
):
    """The doctor (in this process, where the plugin's declaration holds) reports adafactor not
    applicable and records it; ``explorer optimize`` (a real process, real Ray, a grid over both
    optimizers) then runs adamw_torch and records adafactor invalid with the doctor's reason."""
    from explorer.study import open_existing_study
    from explorer.study_file import load_study

    env = _blocked_env(tmp_path)
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    space = {
        "parameters": {
            "batch_size": 4,
            "number_gpus": 1,
            "gradient_checkpointing": False,
            "optim": {"choices": ["adamw_torch", "adafactor"]},
        }
    }
    study = _every_knob(tmp_path, name="blocked", search_space=space, sampler={"kind": "grid"}, n_trials=2)
    loaded = load_study(study, check_launcher=False)
    report = run_doctor(loaded)
    by_value = {r.value: r for r in report.rows if r.knob == "optim"}
    assert by_value["adamw_torch"].status == RAN
    assert by_value["adafactor"].status == NOT_APPLICABLE and by_value["adafactor"].blocks
    assert (
        "doctor_probe_pkg" in by_value["adafactor"].detail
        and "blocked by the test" in by_value["adafactor"].detail
    )
    record_findings(loaded, report)

    proc = run_cli("optimize", str(study), timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = open_existing_study(loaded).get_trials(deepcopy=False)
    assert len(trials) == 2, [t.user_attrs for t in trials]
    invalid = [t for t in trials if t.user_attrs.get("status") == "invalid"]
    assert len(invalid) == 1, [t.user_attrs for t in trials]
    assert "explorer doctor found optim=adafactor failing on CPU-logical" in invalid[0].user_attrs["error"]
    assert "blocked by the test" in invalid[0].user_attrs["error"]
    assert [t.user_attrs.get("status") for t in trials if t not in invalid] == ["ok"]
    stored = open_existing_study(loaded).user_attrs[DOCTOR_ATTR]
    assert "blocked by the test" in stored["invalid"]["CPU-logical"]["optim"]['"adafactor"']
    assert not list((tmp_path / "runs").glob("**/trial-*adafactor*"))


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_doctor_table_agrees_with_what_the_trials_then_do(tmp_path):
    """``explorer doctor`` on the every-knob study (one node: number_nodes fixed to 1), then
    ``explorer optimize`` on it: a proposal holding a value the doctor found not applicable is
    recorded invalid with the doctor's reason and never launched (the search reads the findings,
    so it proposes few or none); every launched trial is measured (ok or oom), as the table said
    its values run."""
    from explorer.record import StudyRecord
    from explorer.study import config_of, open_existing_study
    from explorer.study._confirm import CONFIRM_JOB_BASE
    from explorer.study_file import load_study

    data = yaml.safe_load(EVERY_KNOB.read_text())
    params = data["search_space"]["parameters"]
    params["number_nodes"] = 1
    params["torch_compile"] = False  # a compiled trial takes minutes here (the doctor runs one)
    resources = {**data["resources"], "nodes": 1, "gpu_models": {"CPU-logical": 2}}
    study = _every_knob(tmp_path, search_space=data["search_space"], resources=resources, n_trials=6)
    proc = run_cli("doctor", str(study), "--json", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = json.loads(proc.stdout)
    rows = {(r["knob"], json.dumps(r["value"])): r for r in table["rows"]}
    for (name, value), row in rows.items():
        if (name, json.loads(value)) in CUDA_ONLY:
            assert (
                row["status"] == NOT_APPLICABLE and row["blocks"] and "needs a CUDA device" in row["detail"]
            )
        elif (name, json.loads(value)) != ("batch_size", 8):
            assert row["status"] == RAN, row
    print(f"doctor: {table['seconds']} s", file=sys.stderr)
    runs = {r["config"] for r in table["rows"] if r["status"] == RAN}  # the configuration that checked each
    assert len(runs) == len(list((tmp_path / "runs" / "doctor").glob("run-*")))
    assert len(runs) < sum(r["status"] == RAN for r in table["rows"]) / 3

    proc = run_cli("optimize", str(study), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = load_study(study, check_launcher=False)
    trials = open_existing_study(loaded).get_trials(deepcopy=False)
    seen = {"invalid": 0, "measured": 0}
    for t in trials:
        config = config_of(t).to_dict()
        blocked = [f"{k}={v}" for k, v in config.items() if rows.get((k, json.dumps(v)), {}).get("blocks")]
        if blocked:
            assert t.user_attrs["status"] == "invalid", (config, t.user_attrs)
            assert t.user_attrs["error"].startswith(f"explorer doctor found {blocked[0]} failing"), (
                t.user_attrs["error"]
            )
            seen["invalid"] += 1
        else:
            assert t.user_attrs["status"] in ("ok", "oom"), (config, t.user_attrs.get("error"))
            seen["measured"] += 1
    assert seen["measured"] >= 3, seen  # (the search, reading the findings, proposes few or none blocked)
    # every measured trial has its folder; so has each confirmation job (numbered above
    # CONFIRM_JOB_BASE, never a trial), which runs only when rivals are within noise of the best
    folders = {int(p.name.removeprefix("trial-")) for p in (tmp_path / "runs").glob("trial-*")}
    launched = {n for n in folders if n <= CONFIRM_JOB_BASE}
    assert launched == {t.number for t in trials}, (sorted(folders), seen)
    confirmation = StudyRecord.of(open_existing_study(loaded)).confirmation or {}
    jobs = {m["job"] for m in confirmation.get("measurements", [])}
    assert folders - launched == jobs, (sorted(folders), confirmation)


def test_a_replay_study_is_refused_with_one_line(capsys, tmp_path):
    """A replay study reads its trials from a table: nothing would run on a node (exit 2, one
    line naming the file and field, nothing written)."""
    from explorer.cli import main

    study = REPO / "benchmarks" / "search_studies" / "faults-granite-3.1-2b.yaml"
    assert "kind: replay" in study.read_text()
    code = main(["doctor", str(study), "--storage", f"sqlite:///{tmp_path / 's.db'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].endswith(
        f"{study}: launcher.kind: replay reads trials from a table: nothing runs on a node"
    )
    assert not (tmp_path / "s.db").exists()


def test_attached_findings_reach_every_validity_check_and_no_trial():
    """``optimize`` attaches the recorded findings to the study's resources: ``invalid_reason``
    (the loop's, the local search's, the proposals') then refuses the value; the resources a
    trial receives (JSON) and their equality are unchanged."""
    from explorer.spec import ResourcesSpec
    from explorer.validity import attach_findings
    from tests.builders import config

    resources = ResourcesSpec(gpu_model="H100", gpus_per_node=8)
    base = dict(batch_size=8, number_gpus=1, gradient_checkpointing=False, model_max_length=64)
    blocked = config(base, liger_kernel=True)
    assert invalid_reason(blocked, resources) is None
    attach_findings(resources, {"invalid": {"H100": {"liger_kernel": {"true": "no triton"}}}})
    assert (
        invalid_reason(blocked, resources)
        == "explorer doctor found liger_kernel=True failing on H100: no triton"
    )
    assert invalid_reason(config(base), resources) is None
    assert invalid_reason(blocked, resources.model_copy()) is not None  # a capped copy keeps them
    assert resources == ResourcesSpec(gpu_model="H100", gpus_per_node=8)
    assert "doctor" not in json.dumps(resources.model_dump(mode="json"))
    attach_findings(resources, None)
    assert invalid_reason(blocked, resources) is None


def test_a_one_gpu_cuda_node_checks_cpu_offload_on_one_gpu(tmp_path):
    """On a CUDA node of one GPU, fsdp_cpu_offload and FSDP each get a one-GPU configuration (FSDP
    with offload, issue 23) instead of "a trial of 2 GPUs"."""
    from explorer.study_file import load_study

    loaded = load_study(_every_knob(tmp_path), check_launcher=False)
    node = Node(device="cuda", gpus=1, model_type="llama")
    cases = {(c.knob, c.value): c for c in plan_cases(loaded.space, loaded.spec.resources, node)}
    for want in (("fsdp_cpu_offload", True), ("distributed_backend", "FSDP")):
        config = cases[want].config
        assert config is not None, cases[want]
        assert (config.number_gpus, config.distributed_backend, config.fsdp_cpu_offload) == (1, "FSDP", True)
        assert invalid_reason(config, loaded.spec.resources) is None


def test_where_no_smoke_run_ran_no_failure_blames_its_value():
    """A node where every smoke run fails (the H100 whose forked ranks could not use CUDA) has a
    set-up fault, not 23 invalid values: its failures block nothing in optimize. Where one run ran,
    each failure still blocks its value; a value not applicable (a package missing) always does."""
    from explorer.doctor._run import _unblamed

    failed = Row(knob="optim", value="adamw_torch", status=FAILED, detail="rank 0: RuntimeError", blocks=True)
    missing = Row(knob="attn_implementation", value="flash_attention_2", status=NOT_APPLICABLE, blocks=True)
    ran = Row(knob="optim", value="adamw_torch_fused", status=RAN)
    assert [r.blocks for r in _unblamed([failed, missing])] == [False, True]
    assert [r.blocks for r in _unblamed([failed, missing, ran])] == [True, True, False]


def test_optimize_refuses_a_space_the_doctors_findings_leave_empty(capsys, tmp_path):
    """Every value of one knob recorded failing (the H100's forked ranks): optimize says which knob
    and how to clear it in one line (exit 2) and runs nothing, instead of a search with nothing
    to propose (it crashed in the joint models)."""
    from explorer.cli import main
    from explorer.record import StudyRecord, write_study
    from explorer.study import open_study
    from explorer.study_file import load_study
    from tests.test_confirmation import _quickstart

    study_file = _quickstart(tmp_path)
    loaded = load_study(str(study_file))
    findings = {"false": "rank 0: RuntimeError: Cannot re-initialize CUDA", "true": "rank 0: RuntimeError"}
    model = loaded.spec.resources.model
    write_study(
        open_study(loaded, create=True),
        DOCTOR_ATTR,
        {"invalid": {model: {"gradient_checkpointing": findings}}},
    )
    assert main(["optimize", str(study_file)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert (
        f"{study_file}: search_space: no configuration can run on {model}: explorer doctor found every value"
        in err
    )
    assert "of gradient_checkpointing (rank 0: RuntimeError: Cannot re-initialize CUDA) failing" in err
    assert "run explorer doctor again" in err
    study = open_study(loaded, create=False)
    assert study.get_trials() == [] and StudyRecord.of(study).doctor is not None
