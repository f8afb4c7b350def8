"""Security guarantees of issue 6: what trial processes see, what the package never does with
study content, and what servers and sockets are open to."""

from __future__ import annotations

import ast
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from explorer.launch import run_trial
from explorer.launch._command import free_port, trial_environment, zygote_environment
from explorer.measurement import Outcome
from tests.builders import run_cli, start_dashboard

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "explorer"
SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "aws-s3cret-key",
    "PGPASSWORD": "pg-s3cret",
    "EXPLORER_STORAGE_PASSWORD": "explorer-s3cret",
    "EXPLORER_STORAGE": "postgresql://explorer:url-s3cret@db.example:5432/optuna",
    "DATABASE_URL": "postgresql://app:db-s3cret@db.example/app",
    "GITHUB_TOKEN": "ghp_s3cret",
}


# -- the environment of trial processes -------------------------------------------------------


def test_the_allow_list_keeps_secrets_out_and_hf_token_in(make_job):
    base = {**SECRETS, "PATH": "/usr/bin", "HF_TOKEN": "hf_needed_for_gated_models", "NCCL_DEBUG": "INFO"}
    job = make_job(batch_size=4, number_gpus=2, distributed_backend="DDP")
    for env in (trial_environment(job, cpu_count=4, base=base), zygote_environment(cpu_count=2, base=base)):
        assert not set(SECRETS) & set(env), sorted(env)
        assert env["HF_TOKEN"] == "hf_needed_for_gated_models"  # documented: gated downloads need it
        assert env["NCCL_DEBUG"] == "INFO" and env["PATH"] == "/usr/bin"


def test_secrets_of_the_driver_do_not_reach_a_real_trials_processes(make_job, tmp_path, monkeypatch):
    """A real 2-process DDP trial (torchrun and its two ranks, fresh interpreters) started with
    secrets in the driver's environment: the environment of every process of the trial, read from
    /proc while it runs, holds none of them, and neither do their command lines."""
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    job = make_job(batch_size=4, number_gpus=2, distributed_backend="DDP")
    seen: dict[int, tuple[dict[str, str], list[str]]] = {}
    done = threading.Event()

    def sample() -> None:
        me = psutil.Process()
        while not done.is_set():
            for p in me.children(recursive=True):
                try:
                    env = p.environ()
                    if "EXPLORER_TRIAL_TOKEN" in env:  # a process of this trial
                        seen[p.pid] = (env, p.cmdline())
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue  # it ended between the listing and the read
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        m = run_trial(job, work_dir=tmp_path / "trial", timeout_s=240, warm_start=False)
    finally:
        done.set()
        sampler.join(timeout=10)
    assert m.outcome is Outcome.OK, m.error or m.log_tail[-2000:]
    assert len(seen) >= 3, seen.keys()  # torchrun and both ranks were read
    ranks = [env for env, _ in seen.values() if "RANK" in env]
    assert {env["RANK"] for env in ranks} == {"0", "1"}
    for env, cmdline in seen.values():
        assert not set(SECRETS) & set(env), sorted(env)
        text = "\n".join([*env.values(), *cmdline])
        for value in SECRETS.values():
            assert value not in text
        # explorer's variables there are only the two the launcher sets for the trial
        assert {k for k in env if k.startswith("EXPLORER_")} == {"EXPLORER_OWNER_PID", "EXPLORER_TRIAL_TOKEN"}


# -- no eval, exec, unsafe YAML, pickle or shell ----------------------------------------------


def _calls(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    """Every call as its dotted name (``yaml.load``, ``eval``) and node."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            parts = []
            f = node.func
            while isinstance(f, ast.Attribute):
                parts.append(f.attr)
                f = f.value
            if isinstance(f, ast.Name):
                parts.append(f.id)
            out.append((".".join(reversed(parts)), node))
    return out


FORBIDDEN = {
    "eval",
    "exec",
    "builtins.eval",
    "builtins.exec",
    "compile",
    "__import__",
    "yaml.load",
    "yaml.unsafe_load",
    "yaml.full_load",
    "yaml.load_all",
    "yaml.unsafe_load_all",
    "pickle.load",
    "pickle.loads",
    "marshal.loads",
    "os.system",
    "os.popen",
}


def test_the_package_never_evals_unpickles_or_loads_yaml_unsafely():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 50
    found = []
    shell = []
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        for name, node in _calls(tree):
            if name in FORBIDDEN or (name == "load" and _imports_yaml_load(tree)):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {name}")
            for kw in node.keywords:
                if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                    shell.append(f"{path.relative_to(REPO)}:{node.lineno}: {name}(shell=...)")
    assert not found, found
    assert not shell, shell
    # files are read by read_yaml only (safe_load after a size limit and a bomb pre-scan); the
    # other safe_load calls parse a --set value and the accelerate config explorer just rendered
    loads = [
        f"{p.relative_to(REPO)}"
        for p in files
        for name, _ in _calls(ast.parse(p.read_text()))
        if name in ("yaml.safe_load", "yaml.parse")
    ]
    assert set(loads) == {"explorer/spec/_load.py", "explorer/measure.py", "explorer/settings/_accelerate.py"}


def _imports_yaml_load(tree: ast.AST) -> bool:
    return any(
        isinstance(n, ast.ImportFrom) and n.module == "yaml" and any(a.name == "load" for a in n.names)
        for n in ast.walk(tree)
    )


def test_the_scan_would_catch_each_forbidden_call():
    """The scanner itself: every forbidden form is found in a snippet that has it."""
    snippet = "import yaml, pickle, os, subprocess\n" + "\n".join(
        [
            "eval(x)",
            "exec(x)",
            "yaml.load(t)",
            "yaml.unsafe_load(t)",
            "pickle.loads(b)",
            "os.system(c)",
        ]
    )
    names = {name for name, _ in _calls(ast.parse(snippet))}
    assert {"eval", "exec", "yaml.load", "yaml.unsafe_load", "pickle.loads", "os.system"} <= names & FORBIDDEN
    shell_call = ast.parse("subprocess.run(c, shell=True)").body[0].value  # type: ignore[attr-defined]
    assert any(kw.arg == "shell" and kw.value.value is True for kw in shell_call.keywords)


def test_a_python_tag_in_a_study_file_is_refused_without_running_it(tmp_path):
    """``!!python/object/apply:os.system`` would run a command under yaml.load; safe_load refuses
    the tag (the corpus case yaml_unknown_tag.yaml checks the one-line error too)."""
    marker = tmp_path / "pwned"
    study = tmp_path / "evil.yaml"
    study.write_text(f"name: !!python/object/apply:os.system ['touch {marker}']\n")
    proc = run_cli("validate", str(study), timeout=60)
    assert proc.returncode == 2 and "python/object" in proc.stderr and proc.stderr.count("\n") == 1
    assert not marker.exists()
    corpus = (REPO / "tests" / "bad_inputs" / "yaml_unknown_tag.yaml").read_text()
    assert "!!python/object" in corpus


# -- servers and sockets ----------------------------------------------------------------------


def test_explorer_dashboard_listens_on_loopback_only_by_default(write_study, tmp_path):
    import optuna

    path = write_study({"storage": f"sqlite:///{tmp_path}/s.db"})
    optuna.create_study(study_name="test", storage=f"sqlite:///{tmp_path}/s.db")
    port = free_port()
    server = start_dashboard(path, port)
    try:
        assert server.stdout is not None
        assert server.stdout.readline().startswith(f"dashboard: http://127.0.0.1:{port}/")
        deadline = time.monotonic() + 60
        listening: list = []
        while not listening:
            assert server.poll() is None and time.monotonic() < deadline, "dashboard did not listen"
            listening = [
                c
                for c in psutil.Process(server.pid).net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN
            ]
            time.sleep(0.2)
        assert [(c.laddr.ip, c.laddr.port) for c in listening] == [("127.0.0.1", port)]
        # and from the machine's own non-loopback address, nothing answers on that port
        others = [
            a.address
            for addrs in psutil.net_if_addrs().values()
            for a in addrs
            if a.family == socket.AF_INET and not a.address.startswith("127.")
        ]
        for ip in others:
            with socket.socket() as s, pytest.raises(ConnectionRefusedError):
                s.settimeout(3)
                s.connect((ip, port))
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_ray_is_started_without_its_dashboard():
    """The local Ray explorer starts serves no dashboard (an HTTP server on every interface)."""
    source = (PACKAGE / "launch" / "_ray.py").read_text()
    tree = ast.parse(source)
    inits = [node for name, node in _calls(tree) if name == "ray.init"]
    assert inits
    common = [
        n
        for n in ast.walk(tree)
        if isinstance(n, (ast.Assign, ast.AnnAssign))
        and any(
            isinstance(t, ast.Name) and t.id == "common"
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
        )
    ]
    assert len(common) == 1 and "include_dashboard=False" in ast.unparse(common[0])
    for node in inits:
        assert any(kw.arg is None and ast.unparse(kw.value) == "common" for kw in node.keywords)


def test_the_zygote_folder_is_private_and_checked(tmp_path, monkeypatch):
    """The warm-start zygote's socket lives in ``$TMPDIR/explorer-<uid>``: mode 0700, owned by us.
    A folder someone loosened is tightened; one that is a symlink, or someone else's, is refused."""
    import tempfile

    from explorer.launch._warm import _zygote_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = _zygote_dir()
    assert folder == tmp_path / f"explorer-{os.getuid()}"
    st = folder.lstat()
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
    folder.chmod(0o777)
    assert stat.S_IMODE(_zygote_dir().lstat().st_mode) == 0o700
    folder.rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    folder.symlink_to(elsewhere)
    with pytest.raises(RuntimeError, match="symlink"):
        _zygote_dir()
    folder.unlink()
    if os.getuid() == 0:  # as root, make it someone else's
        folder.mkdir(mode=0o700)
        os.chown(folder, 65534, 65534)
        with pytest.raises(RuntimeError, match="owned by uid 65534"):
            _zygote_dir()


def test_the_zygote_socket_is_owner_only(tmp_path):
    """A real zygote's socket file is 0600 (in its 0700 folder), whatever the umask."""
    sock = tmp_path / "z.sock"
    env = zygote_environment(cpu_count=1)
    old = os.umask(0)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "explorer.worker.zygote", "--socket", str(sock), "--idle-exit", "30"],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
    finally:
        os.umask(old)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "explorer-zygote ready"
        assert stat.S_ISSOCK(sock.lstat().st_mode)
        assert stat.S_IMODE(sock.lstat().st_mode) == 0o600
    finally:
        proc.kill()
        proc.wait(timeout=10)
