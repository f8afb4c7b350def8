"""A Ray address that does not answer is one line after the probe's timeout, at load time, not a hang."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from explorer.errors import SpecError
from explorer.spec._ray_address import PROBE_TIMEOUT_S, check_ray_address, ray_endpoint
from explorer.study_file import load_study
from tests.builders import run_cli

REPO = Path(__file__).resolve().parents[1]


HANG_GUARD_S = 60
"""A validate that waits on the address longer than this fails the test (``TimeoutExpired``).

It guards against a hang (``ray.init`` retries for minutes), not against a slow machine: the
probe's own timeout is shown by its message ("no answer within"), not by a stopwatch."""


def _validate(path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return run_cli("validate", str(path), timeout=HANG_GUARD_S, env=env)


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    [line] = proc.stderr.splitlines()
    return line


@pytest.mark.parametrize(
    ("address", "endpoint"),
    [
        ("10.0.0.5:6379", ("10.0.0.5", 6379)),
        ("head-svc.ray:6379", ("head-svc.ray", 6379)),
        ("ray://10.0.0.5:10002", ("10.0.0.5", 10002)),
        ("ray://head", ("head", 10001)),
        ("[::1]:6379", ("::1", 6379)),
        ("local", None),
    ],
)
def test_the_endpoint_of_each_address_form(address, endpoint):
    assert ray_endpoint(address) == endpoint


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("head", "needs host:port"),
        ("head:0", "not a number in 1..65535"),
        ("head:http", "not a number"),
        (":6379", "needs a host"),
        ("https://head:8265", "unsupported scheme 'https'"),
    ],
)
def test_malformed_addresses_are_refused(address, problem):
    with pytest.raises(SpecError) as err:
        check_ray_address(address, file="s.yaml")
    assert err.value.field == "launcher.address" and problem in err.value.problem


def test_auto_without_a_running_cluster_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(SpecError, match="no Ray cluster is running on this machine"):
        check_ray_address("auto", file="s.yaml")
    (tmp_path / "ray_current_cluster").write_text("127.0.0.1:1\n")  # a cluster that has gone away
    with pytest.raises(SpecError, match="cannot reach Ray at 127.0.0.1:1: connection refused"):
        check_ray_address("auto", file="s.yaml")


def test_a_real_ray_cluster_passes(ray_local, write_study):
    """The probe's gRPC health check is answered by a real Ray GCS (not only refused elsewhere)."""
    gcs = ray_local.get_runtime_context().gcs_address
    check_ray_address(gcs, file="s.yaml")
    loaded = load_study(write_study({"launcher": {"kind": "ray", "address": gcs}}))
    assert loaded.spec.launcher.address == gcs


def test_a_server_that_accepts_but_never_answers_is_one_line_within_seconds(write_study):
    """The case a TCP connect cannot catch: something accepts the connection and says nothing."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.extend(listener.accept()[0] for _ in range(4)), daemon=True).start()
    port = listener.getsockname()[1]
    path = write_study({"launcher": {"kind": "ray", "address": f"127.0.0.1:{port}"}})
    try:
        proc = _validate(path)
    finally:
        listener.close()
    line = _one_line(proc)
    assert (
        f": launcher.address: '127.0.0.1:{port}': cannot reach Ray at 127.0.0.1:{port}: no answer within"
        in line
    )
    assert f"no answer within {PROBE_TIMEOUT_S:g} s" in line, line


def test_ray_address_from_the_environment_is_probed_and_named(write_study, tmp_path):
    path = write_study({"storage": f"sqlite:///{tmp_path}/s.db"})
    line = _one_line(_validate(path, RAY_ADDRESS="127.0.0.1:1"))
    assert f"{path}: launcher.address: RAY_ADDRESS=127.0.0.1:1: cannot reach Ray" in line, line
    assert not (tmp_path / "s.db").exists()
    # commands that only read a stored study do not need the cluster: status says what it says
    # about the storage, not about Ray
    status = run_cli("status", str(path), timeout=60, env={"RAY_ADDRESS": "127.0.0.1:1"})
    assert status.returncode == 2 and "no study" in status.stderr and "Ray" not in status.stderr


def test_validate_offline_checks_a_cluster_study_without_its_cluster():
    """``address: auto`` with no cluster here: validate refuses it in one line; ``--offline``
    checks everything else and says that the address was not probed."""
    repo = Path(__file__).resolve().parents[1]
    study = "studies/granite-3.1-2b-full-2x8xh100.yaml"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    plain = subprocess.run(
        [sys.executable, "-m", "explorer", "validate", study],
        cwd=repo,
        capture_output=True,
        text=True,
        env=env,
    )
    assert plain.returncode == 2 and "launcher.address" in plain.stderr and "Traceback" not in plain.stderr
    offline = subprocess.run(
        [sys.executable, "-m", "explorer", "validate", "--offline", study],
        cwd=repo,
        capture_output=True,
        text=True,
        env=env,
    )
    assert offline.returncode == 0, offline.stderr
    assert "ok: study 'granite-3.1-2b-full-2x8xh100'" in offline.stdout and "not probed" in offline.stdout
