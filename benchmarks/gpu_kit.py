"""The GPU evidence kit: everything a lent GPU machine must run, from one command, resumable.

    python3 benchmarks/gpu_kit.py --device cuda      # on the lent machine (docs/gpu.md)
    python3 benchmarks/gpu_kit.py --device cpu       # the dry run: a tiny granite, same steps

Steps, in order; each writes its files under ``--out`` (default ``benchmarks/results/gpu/``,
``benchmarks/results/gpu-dry-run/`` on the CPU) and its status into ``kit.json``:

* ``env``: the machine (nvidia-smi, torch, the packages the knobs need);
* ``doctor``: ``explorer doctor`` on the throughput study (``doctor.json``, ``doctor.txt``);
* ``pytest-gpu``: ``pytest -m gpu`` (``pytest-gpu.log``; not on the CPU);
* ``study-short`` / ``study-long``: ``explorer optimize`` on the throughput study with short
  (instruction-length) entries and with long ones (every entry fills model_max_length); resumable,
  a step cut by its time limit is interrupted cleanly and continues when the kit runs again;
* ``measure``: ``explorer measure`` of the default configuration (every real-data knob at its
  default, the best's batch and checkpointing) and of the short study's best, on short entries;
* ``trl``: ``explorer measure`` under TRL's SFTTrainer (``studies/local-jsonl-trl.yaml``: the
  local tokenizer and JSONL entries, nothing downloaded; on the GPU its device set to CUDA),
  padded to max_length and packed (``trl-max_length.jsonl``, ``trl-packed.jsonl``);
* ``summary``: ``summary.json`` and ``summary.md``: MFU and dataset tokens/s of each, against the
  targets (40% MFU; 3x the 2.7k dataset tokens/s of short entries), recomputed from the files.

A step that fails or runs out of time is recorded and the kit goes on; running the kit again
skips the steps that are done (``--redo STEP`` runs one again). ``--budget-s``: stop starting
steps once less than a step's time limit is left (one device call runs at most 10 minutes: call
the kit again on the same warm machine).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
STEPS = ("env", "doctor", "pytest-gpu", "study-short", "study-long", "measure", "trl", "summary")
LIMITS = {  # seconds each step may take: 24 minutes in all on the GPU (more than one call: --budget-s)
    "cuda": {
        "env": 60,
        "doctor": 270,
        "pytest-gpu": 240,
        "study-short": 330,
        "study-long": 180,
        "measure": 180,
        "trl": 150,
        "summary": 30,
    },
    "cpu": {
        "env": 60,
        "doctor": 300,
        "pytest-gpu": 30,
        "study-short": 240,
        "study-long": 150,
        "measure": 180,
        "trl": 240,
        "summary": 30,
    },
}
TRL_STUDY = REPO / "studies" / "local-jsonl-trl.yaml"
TRL_SETS = ("batch_size=16", "number_gpus=1", "model_max_length=512")
STUDY = {
    "cuda": REPO / "studies" / "granite-3.1-2b-full-1xh100-throughput.yaml",
    "cpu": REPO / "benchmarks" / "gpu_kit_cpu.yaml",
}
PENDING = ("timed out", "waits")
"""Statuses of a step that runs again at the next call."""
TARGET_MFU = 0.40
TARGET_SHORT_DTPS = 3 * 2700.0
"""Dataset tokens/s of granite-3.1-2b on short entries on one H100: 3x the 2.7k measured before
the real-data knobs (issue 15)."""


def _explorer(*args: str) -> list[str]:
    return [sys.executable, "-m", "explorer", *args]


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in [str(REPO), os.environ.get("PYTHONPATH", "")] if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def run_logged(cmd: list[str], log: Path, limit_s: float) -> tuple[int | None, float]:
    """Run ``cmd`` with its output in ``log``; at ``limit_s`` send SIGINT (explorer marks its
    trials interrupted), then SIGKILL. Returns (exit status, ``None`` when cut; seconds)."""
    t0 = time.monotonic()
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=_env(), stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            return proc.wait(timeout=limit_s), time.monotonic() - t0
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            return None, time.monotonic() - t0


class Kit:
    """The kit's state: where it writes, what is done."""

    def __init__(self, *, device: str, out: Path, work: Path) -> None:
        self.device, self.out, self.work = device, out, work
        out.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        self.state_path = out / "kit.json"
        self.state: dict[str, Any] = (
            json.loads(self.state_path.read_text()) if self.state_path.is_file() else {}
        )
        self.state.setdefault("device", device)
        self.state.setdefault("steps", {})

    def save(self) -> None:
        self.state_path.write_text(json.dumps(self.state, indent=1))

    def record(self, step: str, status: str, seconds: float, **more: Any) -> None:
        self.state["steps"][step] = {"status": status, "seconds": round(seconds, 1), **more}
        self.save()
        print(f"gpu-kit: {step}: {status} ({seconds:.0f} s)", flush=True)

    def study(self, entries: str) -> Path:
        """The throughput study with its storage and run folder here, ``short`` or ``long`` entries."""
        data = yaml.safe_load(STUDY[self.device].read_text())
        if entries == "long":
            length = data["workload"]["model_max_length"]
            data["name"] += "-long"
            data["workload"]["dataset"] = {
                "kind": "synthetic",
                "entries": 4096,
                "min_tokens": length,
                "max_tokens": 2 * length,
                "seed": 0,
            }
            data["n_trials"] = min(int(data["n_trials"]), 12)
        data["storage"] = f"sqlite:///{self.out / 'kit.db'}"
        data["output_dir"] = str(self.work / f"runs-{entries}")  # one run folder per storage
        path = self.work / f"{data['name']}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path


def step_env(kit: Kit, limit: float) -> tuple[str, dict[str, Any]]:
    code = (
        "import json, torch, importlib.metadata as md\n"
        "from explorer.doctor import probe, optional_modules\n"
        "print(json.dumps(probe(optional_modules()), indent=1))\n"
    )
    rc, _ = run_logged([sys.executable, "-c", code], kit.out / "env.txt", limit)
    if kit.device == "cuda":
        run_logged(["nvidia-smi"], kit.out / "env.txt", 30)
    return ("done" if rc == 0 else f"failed (exit {rc})"), {}


def step_doctor(kit: Kit, limit: float) -> tuple[str, dict[str, Any]]:
    study = kit.study("short")
    rc, _ = run_logged(_explorer("doctor", str(study), "--json"), kit.work / "doctor.log", limit)
    folder = kit.work / "runs-short" / "doctor"
    from explorer.doctor import DoctorReport, Row, render_table

    if (folder / "doctor.json").is_file():
        data = json.loads((folder / "doctor.json").read_text())
        (kit.out / "doctor.json").write_text(json.dumps(data, indent=1))
        rows = [Row(**r) for r in data["rows"]]
        fields = {k: data[k] for k in ("study", "gpu_model", "node", "device", "seconds")}
        (kit.out / "doctor.txt").write_text(render_table(DoctorReport(rows=rows, **fields)))
    elif (folder / "rows.jsonl").is_file():  # cut short: the rows it found
        (kit.out / "doctor-rows.jsonl").write_text((folder / "rows.jsonl").read_text())
    status = (
        {0: "done", 1: "done (some values failed: doctor.txt)"}.get(rc, f"failed (exit {rc})")
        if rc is not None
        else "timed out"
    )
    return status, {}


def step_pytest(kit: Kit, limit: float) -> tuple[str, dict[str, Any]]:
    if kit.device != "cuda":
        return "not run (no CUDA: the dry run skips it)", {}
    files = [
        "tests/test_gpu.py",
        "tests/test_gpu_knobs.py",
        "tests/test_flex_attention.py",
        "tests/test_doctor_gpu.py",
    ]
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "gpu",
        "-q",
        "-p",
        "no:cacheprovider",
        *[f for f in files if (REPO / f).is_file()],
    ]
    rc, _ = run_logged(cmd, kit.out / "pytest-gpu.log", limit)
    return ("timed out" if rc is None else "done" if rc == 0 else f"done, failures (exit {rc})"), {}


COPY_DOCTOR = (
    "import sys\n"
    "from explorer.study_file import load_study\n"
    "from explorer.study import open_existing_study, open_study\n"
    "from explorer.validity import DOCTOR_ATTR\n"
    "found = open_existing_study(load_study(sys.argv[1], check_model=False)).user_attrs.get(DOCTOR_ATTR)\n"
    "if found: open_study(load_study(sys.argv[2], check_model=False), create=True).set_user_attr(DOCTOR_ATTR, found)\n"
)
"""The doctor's findings on the short study, recorded on the long one too (one node, one model)."""


def _study_step(kit: Kit, limit: float, entries: str) -> tuple[str, dict[str, Any]]:
    study = kit.study(entries)
    if entries == "long":
        copy = [sys.executable, "-c", COPY_DOCTOR, str(kit.study("short")), str(study)]
        run_logged(copy, kit.out / f"study-{entries}.log", 120)
    rc, _ = run_logged(_explorer("optimize", str(study)), kit.out / f"study-{entries}.log", limit)
    best = _best(kit, study)
    if best is not None:
        (kit.out / f"best-{entries}.yaml").write_text(yaml.safe_dump(best, sort_keys=False))
    if rc is None:
        return "timed out (resumes when the kit runs again)", {"best": best}
    return ("done" if rc == 0 else f"failed (exit {rc})"), {"best": best}


def _best(kit: Kit, study: Path) -> dict[str, Any] | None:
    """The best measured trial's configuration and figures (``None``: none measured yet)."""
    code = (
        "import json, sys\n"
        "from explorer.study_file import load_study\n"
        "from explorer.study import open_existing_study, config_of\n"
        "s = open_existing_study(load_study(sys.argv[1], check_model=False))\n"
        "ok = [t for t in s.get_trials(deepcopy=False) if t.user_attrs.get('status') == 'ok']\n"
        "key = 'dataset_tokens_per_second_per_gpu'\n"
        "b = max(ok, key=lambda t: t.user_attrs[key]) if ok else None\n"
        "print(json.dumps(None if b is None else {'trial': b.number, 'trials_ok': len(ok), 'config': config_of(b).to_dict(),"
        " key: b.user_attrs[key], 'mfu': b.user_attrs.get('mfu')}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(study)],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-1]) if proc.returncode == 0 and lines else None


def step_measure(kit: Kit, limit: float) -> tuple[str, dict[str, Any]]:
    study = kit.study("short")
    best = _best(kit, study)
    if best is None:
        return "waits for a measured trial of the short study", {}
    from explorer.knobs import knob

    # what `measure --config` takes: the knobs that apply (not NONE, the backend of one GPU)
    config = {
        k: v
        for k, v in best["config"].items()
        if v is not None and not (knob(k).when is not None and v == knob(k).inactive)
    }
    (kit.work / "best-config.yaml").write_text(yaml.safe_dump(config))
    default = [
        f"batch_size={config['batch_size']}",
        f"gradient_checkpointing={str(config['gradient_checkpointing']).lower()}",
    ]
    if config.get("gradient_checkpointing"):
        default.append(f"checkpoint_fraction={config.get('checkpoint_fraction', 1.0)}")
    t0, statuses = time.monotonic(), []
    for name, args in (
        ("default", [a for s in default for a in ("--set", s)]),
        ("best", ["--config", str(kit.work / "best-config.yaml")]),
    ):
        jsonl = kit.out / f"measure-{name}.jsonl"
        jsonl.unlink(missing_ok=True)
        left = limit - (time.monotonic() - t0)
        rc, _ = run_logged(
            _explorer("measure", str(study), *args, "--json", str(jsonl)),
            kit.out / "measure.log",
            max(left, 1),
        )
        statuses.append(f"{name}: " + ("timed out" if rc is None else "ok" if rc == 0 else f"exit {rc}"))
    return "done (" + ", ".join(statuses) + ")", {}


def trl_study(kit: Kit) -> Path:
    """The shipped ``trl`` study, its paths absolute, with its storage and run folder here; on the
    GPU its resources one CUDA device (the model read through NVML)."""
    data = yaml.safe_load(TRL_STUDY.read_text())
    base = TRL_STUDY.parent
    data["workload"]["model"]["path"] = str((base / data["workload"]["model"]["path"]).resolve())
    data["workload"]["dataset"]["path"] = str((base / data["workload"]["dataset"]["path"]).resolve())
    space = yaml.safe_load((base / data["search_space"]).read_text())
    space["parameters"]["number_gpus"] = 1  # one process: what the kit measures
    space["parameters"].pop("distributed_backend", None)
    data["search_space"] = space
    data["storage"] = f"sqlite:///{kit.out / 'kit-trl.db'}"
    data["output_dir"] = str(kit.work / "runs-trl")
    data["measurement"] = {"warmup_steps": 2, "measured_steps": 10, "stop": "steps", "trial_timeout_s": 240}
    if kit.device == "cuda":
        data["resources"] = {"gpus_per_node": 1, "device": "cuda"}
    path = kit.work / "local-jsonl-trl.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def step_trl(kit: Kit, limit: float) -> tuple[str, dict[str, Any]]:
    """One ``trl`` configuration, padded to max_length and packed, measured under SFTTrainer."""
    study = trl_study(kit)
    t0, statuses = time.monotonic(), []
    for padding in ("max_length", "packed"):
        jsonl = kit.out / f"trl-{padding}.jsonl"
        jsonl.unlink(missing_ok=True)
        sets = [a for s in (*TRL_SETS, f"padding={padding}") for a in ("--set", s)]
        left = limit - (time.monotonic() - t0)
        rc, _ = run_logged(
            _explorer("measure", str(study), *sets, "--json", str(jsonl)), kit.out / "trl.log", max(left, 1)
        )
        statuses.append(f"{padding}: " + ("timed out" if rc is None else "ok" if rc == 0 else f"exit {rc}"))
    return "done (" + ", ".join(statuses) + ")", {}


def _measured(path: Path) -> dict[str, Any] | None:
    """MFU and dataset tokens/s of the first measured line of a ``measure --json`` file."""
    for line in path.read_text().splitlines() if path.is_file() else []:
        m = json.loads(line)
        p = m.get("properties")
        if m.get("outcome") == "ok" and p:
            return {
                k: p[k]
                for k in (
                    "mfu",
                    "dataset_tokens_per_second",
                    "dataset_tokens_per_second_per_gpu",
                    "peak_memory_gib",
                )
            }
    return None


def summarize(out: Path) -> dict[str, Any]:
    """The kit's figures, recomputed from its files (``measure-*.jsonl``, ``best-*.yaml``)."""
    default, best = _measured(out / "measure-default.jsonl"), _measured(out / "measure-best.jsonl")
    studies = {
        e: yaml.safe_load((out / f"best-{e}.yaml").read_text())
        for e in ("short", "long")
        if (out / f"best-{e}.yaml").is_file()
    }
    summary: dict[str, Any] = {"default": default, "best": best, "studies": studies}
    trl = {p: _measured(out / f"trl-{p}.jsonl") for p in ("max_length", "packed")}
    summary["trl"] = trl
    if trl["max_length"] and trl["packed"]:
        summary["trl_packed_over_max_length"] = (
            trl["packed"]["dataset_tokens_per_second"] / trl["max_length"]["dataset_tokens_per_second"]
        )
    if default and best:
        summary["gain_over_default"] = (
            best["dataset_tokens_per_second"] / default["dataset_tokens_per_second"]
        )
    if best:
        summary["targets"] = {
            "mfu_at_least_0.40": best["mfu"] >= TARGET_MFU,
            "short_dataset_tokens_per_second_at_least_8100": best["dataset_tokens_per_second"]
            >= TARGET_SHORT_DTPS,
        }
    return summary


def step_summary(kit: Kit, limit: float) -> tuple[str, dict[str, Any]]:
    summary = summarize(kit.out)
    summary["steps"] = kit.state["steps"]
    (kit.out / "summary.json").write_text(json.dumps(summary, indent=1))
    lines = [f"# GPU evidence kit ({kit.device})", "", "| step | status | seconds |", "| --- | --- | --- |"]
    lines += [f"| {s} | {v['status']} | {v['seconds']} |" for s, v in kit.state["steps"].items()]
    for name in ("default", "best"):
        m = summary[name]
        lines.append(
            f"\n{name}: "
            + (
                "not measured"
                if m is None
                else f"MFU {m['mfu']:.3f}, {m['dataset_tokens_per_second']:.0f} dataset tokens/s"
            )
        )
    if "trl_packed_over_max_length" in summary:
        trl = summary["trl"]
        lines.append(
            f"\ntrl (SFTTrainer): {trl['max_length']['dataset_tokens_per_second']:.0f} dataset tokens/s "
            f"max_length, {trl['packed']['dataset_tokens_per_second']:.0f} packed: "
            f"{summary['trl_packed_over_max_length']:.2f}x"
        )
    if "gain_over_default" in summary:
        lines.append(
            f"\nbest / default on short entries: {summary['gain_over_default']:.2f}x; targets: {summary.get('targets')}"
        )
    (kit.out / "summary.md").write_text("\n".join(lines) + "\n")
    return "done", {}


RUNNERS = {
    "env": step_env,
    "doctor": step_doctor,
    "pytest-gpu": step_pytest,
    "study-short": lambda kit, limit: _study_step(kit, limit, "short"),
    "study-long": lambda kit, limit: _study_step(kit, limit, "long"),
    "measure": step_measure,
    "trl": step_trl,
    "summary": step_summary,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/gpu_kit.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", type=Path, help="results folder (default benchmarks/results/gpu[-dry-run])")
    parser.add_argument(
        "--work", type=Path, help="run folders and studies (default /tmp/explorer-gpu-kit-DEVICE)"
    )
    parser.add_argument(
        "--budget-s", type=float, default=570.0, help="start no step that may not end within this"
    )
    parser.add_argument("--redo", action="append", default=[], choices=STEPS, help="run a done step again")
    parser.add_argument(
        "--limit", action="append", default=[], metavar="STEP=SECONDS", help="another time limit"
    )
    ns = parser.parse_args(argv)
    out = ns.out or REPO / "benchmarks" / "results" / ("gpu" if ns.device == "cuda" else "gpu-dry-run")
    kit = Kit(device=ns.device, out=out, work=ns.work or Path(f"/tmp/explorer-gpu-kit-{ns.device}"))
    limits = {**LIMITS[ns.device], **{s: float(v) for s, _, v in (x.partition("=") for x in ns.limit)}}
    started = time.monotonic()
    for step in STEPS:
        done = kit.state["steps"].get(step, {}).get("status", "")
        if step not in ns.redo and step != "summary" and done and not done.startswith(PENDING):
            continue
        if time.monotonic() - started + limits[step] > ns.budget_s and step != "summary":
            print(f"gpu-kit: {step} and later steps wait for the next call (budget {ns.budget_s:.0f} s)")
            break
        t0 = time.monotonic()
        try:
            status, more = RUNNERS[step](kit, limits[step])
        except Exception as exc:  # recorded; the kit goes on with the next step
            status, more = f"failed: {type(exc).__name__}: {exc}", {}
        kit.record(step, status, time.monotonic() - t0, **more)
    left = [s for s in STEPS if kit.state["steps"].get(s, {}).get("status", "-").startswith(("-", *PENDING))]
    print(
        f"gpu-kit: {out}: "
        + ("every step ran" if not left else f"still to run: {', '.join(left)} (run the kit again)")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
