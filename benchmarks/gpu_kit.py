"""The GPU evidence kit: what a lent GPU machine runs, in two device calls, most telling first, resumable.

    python3 benchmarks/gpu_kit.py --plan                  # each call's steps and minutes, and the
                                                          # exact device-tool call (docs/gpu.md)
    python3 benchmarks/gpu_kit.py --device cuda --call 1  # on the lent machine
    python3 benchmarks/gpu_kit.py --dry-run               # here on the CPU: every step, a tiny granite

A session's device time is 15 minutes in all, the machine's start (1-2 minutes) included, at most
10 minutes a command, and no machine starts with under 4 minutes left. So call 1 (at most 8
minutes) holds the most telling evidence, in this order: ``doctor-node`` (``explorer doctor
--node-only --json``: the node's measured figures, recorded on the study), ``study-short``
(``explorer optimize`` on short entries), ``measure`` (``explorer measure`` of the default
configuration and of the best), ``estimate`` (``explorer estimate``'s prediction of both, physics
alone and calibrated to the study's trials, against what was measured) and ``pytest-knobs``
(``pytest -m gpu tests/test_gpu_knobs.py``). Call 2, on the same warm machine at once, runs the
rest: ``sdpa-shapes`` (``benchmarks/sdpa_shapes.py``: what a new row length costs sdpa),
``activation-bytes`` (``benchmarks/activation_bytes.py``: a layer's saved bytes, counted), ``env``
(nvidia-smi), ``doctor`` (a smoke run per knob value), ``trl`` (SFTTrainer, padded and packed)
and ``pytest-gpu`` (the other GPU tests). Each call starts with ``carries`` (the ``.gpu`` carries
of ``scripts/gpu_pack.sh`` unpacked once a machine) and ends with ``summary``.

Each step's planned minutes are its hard time limit on the GPU (SIGINT, then SIGKILL), so a slow
step cannot eat the next ones; a step that would not end within the call's minutes waits for the
next call. Every step's status goes into ``kit.json``; a call skips what is done and runs again
what timed out or waited. The kit writes under /tmp (on the GPU it stays on the warm machine
between calls); ``--bundle FILE`` packs the run's folder, after each step, into one ``.tar.gz``
whose paths start at the repository root, for ``benchmarks/results/gpu/<run id>/`` (the dry run:
``benchmarks/results/gpu-dry-run/<run id>/``). The run id is the newest unfinished run, committed
or on the machine, else today's UTC date.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
PACK = REPO / "scripts" / "gpu_pack.sh"


@dataclass(frozen=True)
class Step:
    """One step of the kit: the call it belongs to, its planned minutes on the GPU (its time limit
    there), its time limit in the CPU dry run (a cap for a stuck step on a busy CPU, not a plan),
    and what it does."""

    name: str
    call: int
    minutes: float
    cpu_s: float
    what: str


PLAN = (
    Step("carries", 1, 0.25, 120, "unpack the .gpu carries into /tmp/site (once a machine)"),
    Step("doctor-node", 1, 0.75, 300, "explorer doctor --node-only --json: the node's figures, no smoke run"),
    Step("study-short", 1, 2.0, 600, "explorer optimize, entries of 100-800 tokens (resumes)"),
    Step("measure", 1, 1.75, 600, "explorer measure: the default configuration, the best"),
    Step("estimate", 1, 0.25, 300, "explorer estimate of both against what was measured"),
    Step("pytest-knobs", 1, 2.65, 120, "pytest -m gpu tests/test_gpu_knobs.py"),
    Step("summary", 1, 0.1, 60, "summary.json, summary.md"),
    Step("carries", 2, 0.25, 120, "the same (nothing to do on the warm machine)"),
    Step("sdpa-shapes", 2, 0.5, 120, "benchmarks/sdpa_shapes.py: sdpa's price for a new row length"),
    Step(
        "activation-bytes", 2, 0.5, 300, "benchmarks/activation_bytes.py: a layer's saved bytes, Liger's too"
    ),
    Step("env", 2, 0.25, 120, "nvidia-smi and the probe's facts"),
    Step("doctor", 2, 0.75, 600, "explorer doctor --json: the node measured, a smoke run per knob value"),
    Step("trl", 2, 1.25, 600, "explorer measure under TRL's SFTTrainer, max_length and packed"),
    Step("pytest-gpu", 2, 0.5, 120, "pytest -m gpu: test_gpu, test_flex_attention, test_doctor_gpu"),
    Step("summary", 2, 0.1, 60, "summary.json, summary.md"),
)
"""Each step's minutes as measured on an H200 (the kit's run of 2026-11-28): the machine's start
and carries 5 s; the first granite-3.1-2b trial 31 s (cold), an OOM trial 11 s; ``measure`` of the
default and the best 99 s; ``estimate`` 3 s; two knob tests 94 s; ``env`` 9 s; the doctor's first
smoke run (13 values) 25 s. Not all of it fits one session: call 2's steps go on where a later
session resumes the run."""
CALLS = sorted({s.call for s in PLAN})
ALWAYS = ("carries", "summary")
"""Steps that run in every call (each is cheap, and does nothing that is done already)."""
SESSION_MIN = 15.0
"""Device time a session has, all calls and the machine's start together."""
START_MIN = 2.0
"""The machine's start, at most."""
FIRST_CALL_MAX_MIN = 8.0
"""Call 1 at most: what is left after it and the start must hold call 2."""
CALL_SLACK_MIN = 0.25
"""Per call, beyond its steps: Python's start, the bundle, the kit's own bookkeeping."""
BUNDLE = "$OUT/gpu-kit.tar.gz"
RESULTS = {
    "cuda": REPO / "benchmarks" / "results" / "gpu",
    "cpu": REPO / "benchmarks" / "results" / "gpu-dry-run",
}
"""Where a run's files are committed, one folder per run id."""
LIVE = {"cuda": Path("/tmp/explorer-gpu-kit/results"), "cpu": Path("/tmp/explorer-gpu-kit-dry-run/results")}
"""Where the kit writes: under /tmp, which stays on the warm machine between calls (the checkout
there is copied again for each call), and which keeps the dry run out of the checkout here; a run
committed and not yet there is copied there first, so a fresh machine resumes it too."""
SITE = Path("/tmp/site")
PENDING = ("timed out", "waits")
"""Statuses of a step that runs again at the next call."""
GRACE_S = 20.0
"""At most this long before a step's limit, SIGINT (explorer marks its trials interrupted)."""
TRL_STUDY = REPO / "studies" / "local-jsonl-trl.yaml"
TRL_RUN = {
    "cuda": (("batch_size=16", "number_gpus=1", "model_max_length=512"), 2, 10),
    "cpu": (("batch_size=4", "number_gpus=1", "model_max_length=512"), 1, 3),
}
"""The configuration ``trl`` measures, its warmup and measured steps, by device; on the CPU a small
one (the dry run checks that the step runs)."""
STUDY = {
    "cuda": REPO / "studies" / "granite-3.1-2b-full-1xh100-throughput.yaml",
    "cpu": REPO / "benchmarks" / "gpu_kit_cpu.yaml",
}
KNOB_TESTS = ("tests/test_gpu_knobs.py",)
OTHER_GPU_TESTS = ("tests/test_gpu.py", "tests/test_flex_attention.py", "tests/test_doctor_gpu.py")
TARGET_MFU = 0.40
TARGET_SHORT_DTPS = 3 * 2700.0
"""Dataset tokens/s of granite-3.1-2b on short entries on one H100: 3x the 2.7k measured before
the real-data knobs."""


# ---------------------------------------------------------------- the plan


def carries() -> list[str]:
    """The carries ``scripts/gpu_pack.sh`` packs (``pack NAME ...`` lines), as ``carry`` paths."""
    return [f".gpu/{name}" for name in re.findall(r"^pack (\w+) ", PACK.read_text(), re.M)]


def limits_for(device: str, overrides: dict[str, float]) -> dict[str, float]:
    """Each step's time limit in seconds on ``device``, ``overrides`` (``--limit``) applied."""
    base = {s.name: (s.minutes * 60 if device == "cuda" else s.cpu_s) for s in PLAN}
    return {**base, **overrides}


def call_steps(call: str) -> list[Step]:
    """The steps of one call (``all``: every call's, each step once)."""
    if call == "all":
        seen: dict[str, Step] = {}
        for s in PLAN:
            seen.setdefault(s.name, s)
        return [s for s in seen.values() if s.name != "summary"] + [seen["summary"]]
    return [s for s in PLAN if s.call == int(call)]


def call_timeout_s(call: int, limits: dict[str, float]) -> int:
    """The ``timeout_s`` of a call: its steps' limits and the slack, in whole seconds."""
    return math.ceil(sum(limits[s.name] for s in call_steps(str(call))) + CALL_SLACK_MIN * 60)


def device_call(call: int, limits: dict[str, float]) -> dict[str, Any]:
    """What a session gives the device tool's ``run`` for ``call``."""
    command = f"python3 benchmarks/gpu_kit.py --device cuda --call {call} --bundle {BUNDLE}"
    return {"command": command, "carry": carries(), "timeout_s": call_timeout_s(call, limits)}


def plan_problems(limits: dict[str, float]) -> list[str]:
    """Why the GPU plan does not fit a session (empty: it fits)."""
    problems = []
    first = call_timeout_s(1, limits) / 60
    if first > FIRST_CALL_MAX_MIN:
        problems.append(
            f"call 1 takes {first:.2f} min with its {CALL_SLACK_MIN} min of slack, over the "
            f"{FIRST_CALL_MAX_MIN:.0f} min a first call may take"
        )
    total = START_MIN + sum(call_timeout_s(c, limits) for c in CALLS) / 60
    if total > SESSION_MIN:
        problems.append(
            f"the start and the calls take {total:.2f} min, over a session's {SESSION_MIN:.0f} min"
        )
    for c in CALLS:
        if len(device_call(c, limits)["command"]) > 2000:
            problems.append(f"call {c}'s command is over the device tool's 2000 characters")
    return problems


def print_plan(device: str, limits: dict[str, float]) -> int:
    """Print each call's steps with their minutes, the totals and the device tool's calls; exit 2
    (one line on stderr) when the GPU plan does not fit a session."""
    unit = "GPU" if device == "cuda" else "CPU dry run"
    print(f"GPU evidence kit plan ({unit}: each step's minutes are its time limit)")
    for c in CALLS:
        steps = call_steps(str(c))
        print(f"call {c}: {sum(limits[s.name] for s in steps) / 60:.2f} min of steps")
        for i, s in enumerate(steps, 1):
            print(f"  {i}. {s.name:<17}{limits[s.name] / 60:5.2f} min  {s.what}")
        if device == "cuda":
            run = device_call(c, limits)
            print(
                f"  timeout_s {run['timeout_s']} ({run['timeout_s'] / 60:.2f} min: the steps + {CALL_SLACK_MIN} min)"
            )
            print(f"  device run: {json.dumps(run)}")
    if device != "cuda":
        return 0
    parts = " + ".join(f"call {c} {call_timeout_s(c, limits) / 60:.2f}" for c in CALLS)
    total = START_MIN + sum(call_timeout_s(c, limits) for c in CALLS) / 60
    print(f"session: start {START_MIN:.2f} + {parts} = {total:.2f} min of {SESSION_MIN:.0f}")
    problems = plan_problems(limits)
    if problems:
        print("gpu_kit.py: plan refused: " + "; ".join(problems), file=sys.stderr)
        return 2
    print(f"plan: ok (call 1 within {FIRST_CALL_MAX_MIN:.0f} min; call 2 at once on the warm machine)")
    return 0


# ---------------------------------------------------------------- running steps


class Clock:
    """A step's deadline."""

    def __init__(self, limit_s: float) -> None:
        self.end = time.monotonic() + limit_s

    def left(self) -> float:
        return max(self.end - time.monotonic(), 1.0)


def _explorer(*args: str) -> list[str]:
    return [sys.executable, "-m", "explorer", *args]


def _env() -> dict[str, str]:
    site = [str(SITE)] if (SITE / ".unpacked").is_file() else []
    path = os.pathsep.join(p for p in [str(REPO), *site, os.environ.get("PYTHONPATH", "")] if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def run_logged(cmd: list[str], log: Path, limit_s: float, stdout: Path | None = None) -> int | None:
    """Run ``cmd`` with its output appended to ``log`` (its stdout to ``stdout`` where given),
    within ``limit_s`` in all: SIGINT a little before (explorer marks its trials interrupted),
    SIGKILL at it. Returns the exit status, ``None`` when cut."""
    grace = min(GRACE_S, 0.2 * limit_s)
    with log.open("a") as fh, (stdout or log).open("a") as out:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=out, stderr=fh, start_new_session=True)
        try:
            return proc.wait(timeout=limit_s - grace)
        except subprocess.TimeoutExpired:
            tree = _descendants(proc.pid)  # ranks run in sessions of their own: the group misses them
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for child in tree:  # whatever outlived it (a rank holding the GPU's memory)
            with contextlib.suppress(psutil.Error):
                child.kill()
        psutil.wait_procs(tree, timeout=10)
        fh.write(f"gpu-kit: cut at its limit of {limit_s:.0f} s\n")
        return None


def _descendants(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).children(recursive=True)
    return []


def _child_json(code: str, args: list[str], log: Path, clock: Clock) -> Any:
    """Run ``code`` in a child Python within the step's time (its stderr into ``log``); the JSON
    of the last line it printed (``None``: it failed or printed nothing)."""
    out = log.with_suffix(".stdout")
    out.unlink(missing_ok=True)
    rc = run_logged([sys.executable, "-c", code, *args], log, clock.left(), stdout=out)
    lines = out.read_text().strip().splitlines() if out.is_file() else []
    out.unlink(missing_ok=True)
    return json.loads(lines[-1]) if rc == 0 and lines else None


def _ended(rc: int | None, ok: str = "done") -> str:
    return "timed out" if rc is None else ok if rc == 0 else f"failed (exit {rc})"


class Kit:
    """The kit's state: where it writes, what is done."""

    def __init__(self, *, device: str, out: Path, work: Path, bundle: tuple[Path, str] | None) -> None:
        self.device, self.out, self.work, self.bundle = device, out, work, bundle
        out.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        self.state_path = out / "kit.json"
        self.state: dict[str, Any] = (
            json.loads(self.state_path.read_text()) if self.state_path.is_file() else {}
        )
        self.state.setdefault("device", device)
        self.state.setdefault("steps", {})
        self.state.setdefault("calls", [])

    def save(self) -> None:
        self.state_path.write_text(json.dumps(self.state, indent=1))
        if self.bundle is not None:  # the results folder, its paths from the repository's root
            path, arc = self.bundle
            path.parent.mkdir(parents=True, exist_ok=True)
            with tarfile.open(path, "w:gz") as tar:
                tar.add(self.out, arcname=arc)

    def record(self, step: str, status: str, seconds: float, **more: Any) -> None:
        self.state["steps"][step] = {"status": status, "seconds": round(seconds, 1), **more}
        self.save()
        print(f"gpu-kit: {step}: {status} ({seconds:.0f} s)", flush=True)

    def settled(self, step: str) -> bool:
        status = self.state["steps"].get(step, {}).get("status", "")
        return bool(status) and not status.startswith(PENDING)

    def study(self) -> Path:
        """The throughput study (its 100-800-token entries: ``short``) with its storage and run
        folder here."""
        data = yaml.safe_load(STUDY[self.device].read_text())
        if self.device == "cuda":
            _on_this_gpu(data)
        data["storage"] = f"sqlite:///{self.out / 'kit.db'}"
        data["output_dir"] = str(self.work / "runs-short")
        path = self.work / f"{data['name']}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path


def _on_this_gpu(data: dict[str, Any]) -> None:
    """The throughput study with its GPU model read from the device (the study names an H100; a
    lent H200 would refuse it). The values whose package the machine lacks (``flash_attention_2``:
    flash-attn has no wheel to carry) are left to ``doctor-node``, which records them invalid."""
    data["resources"].pop("gpu_model", None)


def step_carries(kit: Kit, clock: Clock) -> str:
    """Unpack the carries into ``/tmp/site`` once a machine (on the CPU: into the work folder,
    off the path, to check them; this environment has the packages)."""
    tars = sorted(REPO.glob(".gpu/*/*.tar.xz"))
    if not tars:
        return (
            "nothing to unpack (no .gpu carries here)" if kit.device == "cpu" else "failed: no .gpu carries"
        )
    site = SITE if kit.device == "cuda" else kit.work / "site"
    marker = site / ".unpacked"
    names = "\n".join(str(t.relative_to(REPO)) for t in tars)
    if marker.is_file() and marker.read_text() == names:
        return "done (unpacked before on this machine)"
    site.mkdir(parents=True, exist_ok=True)
    for t in tars:
        rc = run_logged(["tar", "-xJf", str(t), "-C", str(site)], kit.out / "carries.log", clock.left())
        if rc != 0:
            return f"{_ended(rc)}: {t.relative_to(REPO)}"
    marker.write_text(names)
    return f"done ({len(tars)} carries into {site})"


def step_env(kit: Kit, clock: Clock) -> str:
    code = (
        "import json\n"
        "from explorer.doctor import probe, optional_modules\n"
        "print(json.dumps(probe(optional_modules()), indent=1))\n"
    )
    rc = run_logged([sys.executable, "-c", code], kit.out / "env.txt", clock.left())
    if kit.device == "cuda":
        run_logged(["nvidia-smi"], kit.out / "env.txt", min(clock.left(), 30))
    return _ended(rc)


def step_doctor(kit: Kit, clock: Clock) -> str:
    """``explorer doctor --resume --json`` on the short study: it smoke-runs each knob value that
    no earlier call found (its rows, ``doctor-rows.jsonl``, go on from call to call and from
    session to session), with the node's figures ``doctor-node`` recorded; its findings are
    recorded on the study (``optimize`` never launches a value the node cannot run). Every file
    it left in its folder is copied here (cut short: ``rows.jsonl``, the rows it found)."""
    study = kit.study()
    folder = kit.work / "runs-short" / "doctor"
    (folder / "doctor.json").unlink(missing_ok=True)  # an earlier run's, not this one's
    found = kit.out / "doctor-rows.jsonl"  # what an earlier call found (a fresh machine lacks it)
    if found.is_file() and not (folder / "rows.jsonl").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "rows.jsonl").write_text(found.read_text())
    cmd = _explorer("doctor", str(study), "--resume", "--json")
    rc = run_logged(cmd, kit.out / "doctor.log", clock.left())
    for path in sorted(folder.glob("*.json*")):
        name = path.name if path.name == "doctor.json" else f"doctor-{path.name}"
        (kit.out / name).write_text(path.read_text())
    return "done (some values failed: doctor.json)" if rc == 1 else _ended(rc)


def _pytest(kit: Kit, clock: Clock, files: tuple[str, ...], log: str) -> str:
    """``pytest -m gpu`` on ``files`` (on the CPU: collected only, to check the command)."""
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-v", "-p", "no:cacheprovider"]
    cmd += [f for f in files if (REPO / f).is_file()]
    if kit.device != "cuda":
        rc = run_logged([*cmd, "--collect-only", "-q"], kit.out / log, clock.left())
        found = re.findall(r"(\d+)(?:/\d+)? tests? collected", (kit.out / log).read_text())
        return f"collected only (no CUDA): {found[-1] if found else '?'} tests" if rc == 0 else _ended(rc)
    ran = _pytest_outcomes(kit.out / log)  # an earlier call's tests, cut or not: not run again
    cmd += [a for test in ran for a in ("--deselect", test)]
    rc = run_logged(cmd, kit.out / log, clock.left())
    outcomes = _pytest_outcomes(kit.out / log)
    counts = ", ".join(f"{n} {o.lower()}" for o, n in sorted(Counter(outcomes.values()).items()))
    if rc is None:
        return f"timed out ({counts or 'no test ended'}; the rest runs at the next call)"
    failed = any(o != "PASSED" for o in outcomes.values())
    return f"done ({counts})" if rc in (0, 5) and not failed else f"done, failures (exit {rc}; {counts})"


def _pytest_outcomes(log: Path) -> dict[str, str]:
    """Each test's outcome in a ``pytest -v`` log (every call's output appended there)."""
    text = log.read_text() if log.is_file() else ""
    return dict(re.findall(r"^(tests/\S+::\S+) (PASSED|FAILED|ERROR)", text, re.M))


def step_sdpa_shapes(kit: Kit, clock: Clock) -> str:
    """``benchmarks/sdpa_shapes.py``: whether each new row length (a packed batch's every step)
    costs sdpa a fixed host-side price on this GPU, per backend (``sdpa-shapes.json``)."""
    script = REPO / "benchmarks" / "sdpa_shapes.py"
    out = kit.out / "sdpa-shapes.json"
    rc = run_logged(
        [sys.executable, str(script), "--json", str(out)], kit.out / "sdpa-shapes.log", clock.left()
    )
    return _ended(rc)


def step_activation_bytes(kit: Kit, clock: Clock) -> str:
    """``benchmarks/activation_bytes.py`` on the throughput study's model (two of its layers):
    the bytes a decoder layer saves for the backward, counted, in mixed precision and pure bf16,
    with and without Liger's kernels where they run, against the physics (``activation-bytes.json``)."""
    script = REPO / "benchmarks" / "activation_bytes.py"
    out = kit.out / "activation-bytes.json"
    seq = "1000" if kit.device == "cuda" else "100"
    cmd = [sys.executable, str(script), "--study", str(STUDY[kit.device]), "--seq", seq, "--json", str(out)]
    return _ended(run_logged(cmd, kit.out / "activation-bytes.log", clock.left()))


def step_doctor_node(kit: Kit, clock: Clock) -> str:
    """``explorer doctor --node-only --json`` on the short study: the node's measured figures
    alone, no smoke run (on the H200 the 2-layer smoke run of an earlier kit did not end within
    its minute), into ``doctor-node.json``, and recorded on the study (``estimate`` prices with
    them; the full doctor later keeps them or measures them again)."""
    study = kit.study()
    found = kit.work / "runs-short" / "doctor" / "doctor.json"
    found.unlink(missing_ok=True)  # an earlier run's, not this one's
    cmd = _explorer("doctor", str(study), "--node-only", "--json")
    rc = run_logged(cmd, kit.out / "doctor-node.log", clock.left())
    if not found.is_file():
        return _ended(rc)
    (kit.out / "doctor-node.json").write_text(found.read_text())
    measured = json.loads(found.read_text()).get("measured")
    said = "measured" if measured and not measured.get("error") else f"not measured: {measured}"
    return f"done (node {said}; recorded on the short study)" if rc == 0 else _ended(rc)


def step_study(kit: Kit, clock: Clock) -> tuple[str, dict[str, Any]]:
    """``explorer optimize`` of the throughput study (resumes from its storage), and its best."""
    study = kit.study()
    log = kit.out / "study-short.log"
    rc = run_logged(_explorer("optimize", str(study)), log, max(clock.left() - 10, 1))
    best = _best(kit, study, clock)
    if best is not None:
        (kit.out / "best-short.yaml").write_text(yaml.safe_dump(best, sort_keys=False))
    if rc is None:
        return "timed out (resumes when the kit runs again)", {"best": best}
    return _ended(rc), {"best": best}


BEST = (
    "import json, sys\n"
    "from explorer.study_file import load_study\n"
    "from explorer.study import open_existing_study, config_of\n"
    "from explorer.knobs import knob\n"
    "s = open_existing_study(load_study(sys.argv[1], check_model=False))\n"
    "ok = [t for t in s.get_trials(deepcopy=False) if t.user_attrs.get('status') == 'ok']\n"
    "key = 'dataset_tokens_per_second_per_gpu'\n"
    "b = max(ok, key=lambda t: t.user_attrs[key]) if ok else None\n"
    "c = None if b is None else config_of(b).to_dict()\n"
    "applies = None if c is None else {k: v for k, v in c.items()"
    " if v is not None and not (knob(k).when is not None and v == knob(k).inactive)}\n"
    "print(json.dumps(None if b is None else {'trial': b.number, 'trials_ok': len(ok), 'config': c,"
    " 'measure_config': applies, key: b.user_attrs[key], 'mfu': b.user_attrs.get('mfu')}))\n"
)
"""The best measured trial: its configuration, the part ``measure --config`` takes (the knobs
that apply: not NONE, the backend of one GPU) and its figures; ``null`` when none is measured."""


def _best(kit: Kit, study: Path, clock: Clock) -> dict[str, Any] | None:
    return _child_json(BEST, [str(study)], kit.out / "best.log", clock)  # type: ignore[no-any-return]


def step_measure(kit: Kit, clock: Clock) -> str:
    """``explorer measure`` of the default configuration (every real-data knob at its default, the
    best's batch and checkpointing) and of the short study's best, each in half the time left."""
    best = _best(kit, kit.study(), clock)
    if best is None:
        return "waits for a measured trial of the short study"
    config = best["measure_config"]
    default = [
        f"batch_size={config['batch_size']}",
        f"gradient_checkpointing={str(config['gradient_checkpointing']).lower()}",
    ]
    if config.get("gradient_checkpointing"):
        default.append(f"checkpoint_fraction={config.get('checkpoint_fraction', 1.0)}")
    (kit.out / "measure-configs.json").write_text(json.dumps({"default": default, "best": config}, indent=1))
    (kit.work / "best-config.yaml").write_text(yaml.safe_dump(config))
    runs = {
        "default": [a for s in default for a in ("--set", s)],
        "best": ["--config", str(kit.work / "best-config.yaml")],
    }
    return _measure_each(kit, clock, kit.study(), runs, "measure")


def _measure_each(kit: Kit, clock: Clock, study: Path, runs: dict[str, list[str]], prefix: str) -> str:
    """One ``explorer measure`` per entry of ``runs`` (its arguments), each in an equal share of
    the time left, into ``<prefix>-<name>.jsonl``."""
    statuses = []
    for i, (name, args) in enumerate(runs.items()):
        jsonl = kit.out / f"{prefix}-{name}.jsonl"
        jsonl.unlink(missing_ok=True)
        cmd = _explorer("measure", str(study), *args, "--json", str(jsonl))
        rc = run_logged(cmd, kit.out / f"{prefix}.log", clock.left() / (len(runs) - i))
        statuses.append(f"{name}: " + ("timed out" if rc is None else "ok" if rc == 0 else f"exit {rc}"))
    cut = any(s.endswith("timed out") for s in statuses)
    return ("timed out" if cut else "done") + " (" + ", ".join(statuses) + ")"


ESTIMATE = (
    "import json, sys\n"
    "from explorer.study_file import load_study\n"
    "from explorer.measure import config_from_cli\n"
    "from explorer.estimate import describe, estimate_study, stored_measurements\n"
    "loaded = load_study(sys.argv[1], check_model=False, check_launcher=False, check_hub=False)\n"
    "chosen = json.loads(open(sys.argv[2]).read())\n"
    "configs = {'default': config_from_cli(loaded, sets=chosen['default'], config_file=None),\n"
    "           'best': config_from_cli(loaded, sets=[], config_file=sys.argv[3])}\n"
    "measured = stored_measurements(loaded) or []\n"
    "import explorer.estimate as e\n"
    "node = e.recorded_node(loaded) if hasattr(e, 'recorded_node') else None\n"
    "found = {'trials': len(measured), 'node_measured': node is not None}\n"
    "for basis, m in (('physics', []), ('calibrated', measured)):\n"
    "    rows = estimate_study(loaded, sets={}, measured=m)\n"
    "    print('\\n'.join(describe(loaded, rows, top=5, measured=len(m))), file=sys.stderr)\n"
    "    for name, c in configs.items():\n"
    "        row = next((r for r in rows if r.key == c.key()), None) or next((r for r in rows\n"
    "            if all(getattr(c, k, None) == v for k, v in r.config.items())), None)\n"
    "        found.setdefault(name, {})[basis] = None if row is None else row.as_json()\n"
    "print(json.dumps(found))\n"
)
"""``explorer estimate``'s rows for the measured default and best: the physics alone, and
calibrated to the short study's trials (its top 5 of each into the log)."""


def step_estimate(kit: Kit, clock: Clock) -> str:
    """The estimates of the default and the best beside what ``measure`` measured of them."""
    chosen = kit.out / "measure-configs.json"
    measured = {n: _measured(kit.out / f"measure-{n}.jsonl") for n in ("default", "best")}
    if not chosen.is_file() or not any(measured.values()):
        return "waits for measure"
    best_file = kit.work / "best-config.yaml"
    best_file.write_text(yaml.safe_dump(json.loads(chosen.read_text())["best"]))
    args = [str(kit.study()), str(chosen), str(best_file)]
    found = _child_json(ESTIMATE, args, kit.out / "estimate.log", clock)
    if found is None:
        return "failed (estimate.log)"
    (kit.out / "estimate.json").write_text(json.dumps(compare(found, measured), indent=1))
    return "done"


def compare(found: dict[str, Any], measured: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    """Each configuration's predictions (physics alone, calibrated) beside its measured dataset
    tokens/s per GPU: measured over predicted, and whether the band holds it."""
    out: dict[str, Any] = {"trials": found["trials"], "node_measured": found.get("node_measured")}
    for name, m in measured.items():
        got = None if m is None else m["dataset_tokens_per_second_per_gpu"]
        rows: dict[str, Any] = {"measured": got}
        for basis, row in found.get(name, {}).items():
            if row is None or got is None:
                rows[basis] = row
                continue
            predicted, band = row["dataset_tokens_per_second_per_gpu"], row["band"]
            rows[basis] = {
                **row,
                "measured_over_predicted": got / predicted if predicted else None,
                "in_band": band["low"] <= got <= band["high"],
            }
        out[name] = rows
    return out


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
    _, warmup, measured = TRL_RUN[kit.device]
    data["measurement"] = {
        "warmup_steps": warmup,
        "measured_steps": measured,
        "stop": "steps",
        "trial_timeout_s": 240,
    }
    if kit.device == "cuda":
        data["resources"] = {"gpus_per_node": 1, "device": "cuda"}
    else:  # the kit measures SFTTrainer's two paddings, not the study's cap (packed rows of 16 x
        # 512 tokens peaked at 1.06 GiB on one 2-core VM, over the study's 1 GiB)
        data["resources"]["device_memory_gib"] = 2.0
    path = kit.work / "local-jsonl-trl.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def step_trl(kit: Kit, clock: Clock) -> str:
    """One ``trl`` configuration, padded to max_length and packed, measured under SFTTrainer."""
    runs = {
        padding: [a for s in (*TRL_RUN[kit.device][0], f"padding={padding}") for a in ("--set", s)]
        for padding in ("max_length", "packed")
    }
    return _measure_each(kit, clock, trl_study(kit), runs, "trl")


# ---------------------------------------------------------------- the summary


def _outcome(path: Path) -> str | None:
    """The outcome of the first line of a ``measure --json`` file (``oom``, ...); ``None``: none."""
    lines = path.read_text().splitlines() if path.is_file() else []
    return json.loads(lines[0]).get("outcome") if lines else None


def _measured(path: Path) -> dict[str, Any] | None:
    """MFU and dataset tokens/s of the first measured line of a ``measure --json`` file."""
    for line in path.read_text().splitlines() if path.is_file() else []:
        m = json.loads(line)
        p = m.get("properties")
        if m.get("outcome") == "ok" and p:
            keys = (
                "mfu",
                "dataset_tokens_per_second",
                "dataset_tokens_per_second_per_gpu",
                "peak_memory_gib",
            )
            return {k: p[k] for k in keys}
    return None


def _doctor(out: Path) -> dict[str, Any] | None:
    """The doctor's rows counted by status, and its failures (``doctor.json``, else the rows of
    a doctor cut short)."""
    if (out / "doctor.json").is_file():
        rows, whole = json.loads((out / "doctor.json").read_text())["rows"], True
    elif (out / "doctor-rows.jsonl").is_file():
        rows, whole = [json.loads(x) for x in (out / "doctor-rows.jsonl").read_text().splitlines()], False
    else:
        return None
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    failed = [
        f"{r['knob']}={json.dumps(r['value'])}: {r.get('detail', '')}"
        for r in rows
        if r["status"] == "failed"
    ]
    return {"complete": whole, "counts": counts, "failed": failed}


def _node(out: Path) -> dict[str, Any]:
    """The node's figures each doctor measured (``doctor-node.json``, ``doctor.json``; ``None``
    where that doctor did not end)."""
    found = {}
    for name in ("doctor-node", "doctor"):
        path = out / f"{name}.json"
        found[name] = json.loads(path.read_text()).get("measured") if path.is_file() else None
    return found


def summarize(out: Path) -> dict[str, Any]:
    """The kit's figures, recomputed from its files."""
    default, best = _measured(out / "measure-default.jsonl"), _measured(out / "measure-best.jsonl")
    short = out / "best-short.yaml"
    studies = {"short": yaml.safe_load(short.read_text())} if short.is_file() else {}
    summary: dict[str, Any] = {"node": _node(out), "doctor": _doctor(out), "default": default, "best": best}
    summary["outcomes"] = {name: _outcome(out / f"measure-{name}.jsonl") for name in ("default", "best")}
    summary["studies"] = studies
    if (out / "estimate.json").is_file():
        summary["estimate"] = json.loads((out / "estimate.json").read_text())
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


def _estimate_lines(estimate: dict[str, Any]) -> list[str]:
    lines = []
    figures = "the node's measured figures" if estimate.get("node_measured") else "the GPU table's figures"
    bases = {"physics": "physics alone", "calibrated": f"calibrated to {estimate.get('trials')} trials"}
    for name in ("default", "best"):
        for basis, said in bases.items():
            row = estimate.get(name, {}).get(basis)
            if row and row.get("measured_over_predicted") is not None:
                lines.append(
                    f"estimate ({said}, {figures}) of {name}: "
                    f"{row['dataset_tokens_per_second_per_gpu']:.0f} tokens/s/GPU predicted "
                    f"(band {row['band']['low']:.0f}-{row['band']['high']:.0f}), measured "
                    f"{row['measured_over_predicted']:.2f}x that, {'in' if row['in_band'] else 'outside'} the band"
                )
    return lines


def _node_line(measured: dict[str, Any] | None) -> str:
    """A doctor's measured figures in one line (``None``: it did not end)."""
    if not measured:
        return "none (not run, or cut before its end, when its figures are written)"
    units = {
        "matmul_tflops": "TFLOP/s matmul",
        "memory_bandwidth_tbs": "TB/s copy",
        "allocatable_gib": "GiB allocatable",
        "allreduce_busbw_gbs": "GB/s all-reduce busbw",
    }
    known = [f"{measured[k]:.4g} {u}" for k, u in units.items() if isinstance(measured.get(k), (int, float))]
    return ", ".join(known) if known else json.dumps(measured)


def summary_lines(kit: Kit, summary: dict[str, Any]) -> list[str]:
    """``summary.md``: the steps, then the figures, the most telling first."""
    lines = [f"# GPU evidence kit ({kit.device})", "", "| step | status | seconds |", "| --- | --- | --- |"]
    lines += [f"| {s} | {v['status']} | {v['seconds']} |" for s, v in kit.state["steps"].items()]
    lines.append("")
    for name, measured in summary["node"].items():
        lines.append(f"node measured by {name}: " + _node_line(measured))
    doctor = summary["doctor"]
    if doctor:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(doctor["counts"].items()))
        lines.append(f"doctor{'' if doctor['complete'] else ' (cut short)'}: {counts}")
        lines += [f"  failed: {f}" for f in doctor["failed"]]
    for name in ("default", "best"):
        m = summary[name]
        outcome = summary.get("outcomes", {}).get(name)
        got = (
            "not measured" + (f" ({outcome})" if outcome else "")
            if m is None
            else f"MFU {m['mfu']:.3f}, {m['dataset_tokens_per_second']:.0f} dataset tokens/s"
        )
        lines.append(f"{name}: {got}")
    if "gain_over_default" in summary:
        lines.append(
            f"best / default on short entries: {summary['gain_over_default']:.2f}x; targets: {summary.get('targets')}"
        )
    lines += _estimate_lines(summary.get("estimate", {}))
    if "trl_packed_over_max_length" in summary:
        trl = summary["trl"]
        lines.append(
            f"trl (SFTTrainer): {trl['max_length']['dataset_tokens_per_second']:.0f} dataset tokens/s "
            f"max_length, {trl['packed']['dataset_tokens_per_second']:.0f} packed: "
            f"{summary['trl_packed_over_max_length']:.2f}x"
        )
    return lines


def step_summary(kit: Kit, clock: Clock) -> str:
    summary = summarize(kit.out)
    summary["steps"] = kit.state["steps"]
    (kit.out / "summary.json").write_text(json.dumps(summary, indent=1))
    (kit.out / "summary.md").write_text("\n".join(summary_lines(kit, summary)) + "\n")
    return "done"


RUNNERS: dict[str, Any] = {
    "carries": step_carries,
    "env": step_env,
    "doctor-node": step_doctor_node,
    "doctor": step_doctor,
    "pytest-knobs": lambda kit, clock: _pytest(kit, clock, KNOB_TESTS, "pytest-knobs.log"),
    "pytest-gpu": lambda kit, clock: _pytest(kit, clock, OTHER_GPU_TESTS, "pytest-gpu.log"),
    "study-short": step_study,
    "sdpa-shapes": step_sdpa_shapes,
    "activation-bytes": step_activation_bytes,
    "measure": step_measure,
    "estimate": step_estimate,
    "trl": step_trl,
    "summary": step_summary,
}


# ---------------------------------------------------------------- the command line


def run_id(roots: list[Path]) -> str:
    """The newest run under ``roots`` with a step still to run and not ``closed`` (its
    ``kit.json`` says why it must not be resumed), else today's UTC date (``-2``, ``-3``, ...
    after a finished run of the same day)."""
    steps = {s.name for s in PLAN} - set(ALWAYS)
    unfinished = set()
    for path in (p for root in roots for p in root.glob("*/kit.json")):
        state = json.loads(path.read_text())
        done = state.get("steps", {})
        if state.get("closed"):
            continue
        if any(not done.get(s, {}).get("status") or done[s]["status"].startswith(PENDING) for s in steps):
            unfinished.add(path.parent.name)
    if unfinished:
        return max(unfinished)
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    n = 1
    while any((root / (today if n == 1 else f"{today}-{n}")).exists() for root in roots):
        n += 1
    return today if n == 1 else f"{today}-{n}"


def seed(out: Path, committed: Path) -> None:
    """A run committed here and not yet under ``out`` (a fresh machine): copied there."""
    if not (out / "kit.json").is_file() and (committed / "kit.json").is_file() and out != committed:
        shutil.copytree(committed, out, dirs_exist_ok=True)


def run_call(kit: Kit, call: str, limits: dict[str, float], budget_s: float, redo: list[str]) -> None:
    """Run one call's steps in order: each within its limit, none started that could not end
    within the call's budget; done steps skipped."""
    started = time.monotonic()
    kit.state["calls"].append(
        {"call": call, "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    )
    for s in call_steps(call):
        if s.name not in ALWAYS and s.name not in redo and kit.settled(s.name):
            print(f"gpu-kit: {s.name}: done before ({kit.state['steps'][s.name]['status']})")
            continue
        if time.monotonic() - started + limits[s.name] > budget_s and s.name != "summary":
            print(f"gpu-kit: {s.name}: waits for the next call (its {limits[s.name]:.0f} s do not fit)")
            continue
        t0 = time.monotonic()
        try:
            result = RUNNERS[s.name](kit, Clock(limits[s.name]))
        except Exception as exc:  # recorded; the kit goes on with the next step
            result = f"failed: {type(exc).__name__}: {exc}"
        status, more = result if isinstance(result, tuple) else (result, {})
        kit.record(s.name, status, time.monotonic() - t0, **more)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="benchmarks/gpu_kit.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", action="store_true", help="print the calls, steps and minutes; run nothing")
    parser.add_argument("--dry-run", action="store_true", help="--device cpu --call all: every step here")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--call", choices=[*map(str, CALLS), "all"], help="which call's steps to run")
    parser.add_argument("--run-id", help="results folder under benchmarks/results/gpu[-dry-run]/")
    parser.add_argument("--out", type=Path, help="results folder (instead of the run id's)")
    parser.add_argument(
        "--work", type=Path, help="run folders and studies (default /tmp/explorer-gpu-kit-...)"
    )
    parser.add_argument(
        "--bundle", type=Path, help="pack the results folder into this .tar.gz after each step"
    )
    parser.add_argument("--budget-s", type=float, help="start no step that may not end within this")
    parser.add_argument(
        "--redo", action="append", default=[], choices=sorted(RUNNERS), help="run a done step again"
    )
    parser.add_argument(
        "--limit", action="append", default=[], metavar="STEP=SECONDS", help="another time limit"
    )
    ns = parser.parse_args(argv)
    if ns.dry_run:
        ns.device, ns.call = "cpu", ns.call or "all"
    return ns


def _limits(ns: argparse.Namespace) -> dict[str, float] | str:
    """The limits with ``--limit`` applied, or the one line that says what is wrong."""
    overrides = {}
    for item in ns.limit:
        name, eq, value = item.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not eq or name not in RUNNERS or seconds <= 0:
            return f"--limit: {item}: expected STEP=SECONDS with STEP one of {', '.join(sorted(RUNNERS))}"
        overrides[name] = seconds
    return limits_for(ns.device, overrides)


def main(argv: list[str] | None = None) -> int:
    ns = _parse(argv)
    limits = _limits(ns)
    if isinstance(limits, str):
        print(f"gpu_kit.py: {limits}", file=sys.stderr)
        return 2
    if ns.plan:
        return print_plan(ns.device, limits)
    if ns.call is None:
        print("gpu_kit.py: --call: say which call to run (1, 2 or all; --plan shows them)", file=sys.stderr)
        return 2
    if ns.device == "cuda" and plan_problems(limits):
        print("gpu_kit.py: plan refused: " + "; ".join(plan_problems(limits)), file=sys.stderr)
        return 2
    rid = ns.run_id or (ns.out.name if ns.out else run_id([RESULTS[ns.device], LIVE[ns.device]]))
    out = ns.out or LIVE[ns.device] / rid
    seed(out, RESULTS[ns.device] / rid)
    work = ns.work or Path(f"/tmp/explorer-gpu-kit-{ns.device}-{rid}")
    arc = f"{RESULTS[ns.device].relative_to(REPO)}/{rid}"
    kit = Kit(device=ns.device, out=out, work=work, bundle=(ns.bundle, arc) if ns.bundle else None)
    budget = ns.budget_s or sum(limits[s.name] for s in call_steps(ns.call))
    run_call(kit, ns.call, limits, budget, ns.redo)
    left = [s.name for s in call_steps("all") if s.name not in ALWAYS and not kit.settled(s.name)]
    print(f"gpu-kit: {out}: " + ("every step ran" if not left else f"still to run: {', '.join(left)}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
