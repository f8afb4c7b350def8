"""A Ray cluster with token authentication that the driver has no token for (or the wrong one):
``validate`` and ``optimize`` refuse it with one line, exit 2, before anything is written (the
gRPC health check answers without a token, so the probe makes a call the token guards)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from explorer.launch._command import free_port
from tests.builders import run_cli
from tests.test_multinode import RAY, _ports, _stop


@pytest.mark.slow  # a real Ray head: 10 to 40 s to start
def test_a_token_cluster_without_the_token_is_refused_in_one_line(write_study, tmp_path):
    temp_dir = Path(tempfile.mkdtemp(prefix="rtk-", dir="/tmp"))  # short: Ray's socket paths
    token = secrets.token_hex(16)
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    port = free_port()
    head = [RAY, "start", "--head", "--port", str(port), "--num-cpus", "1", "--node-ip-address", "127.0.0.1"]
    head += ["--disable-usage-stats", "--temp-dir", str(temp_dir), "--include-dashboard=false"]
    head += ["--dashboard-port", str(free_port()), "--ray-client-server-port", str(free_port()), *_ports()]
    try:
        started = subprocess.run(head, env=env, capture_output=True, text=True, timeout=120)
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
        path = write_study(
            {
                "storage": f"sqlite:///{tmp_path}/s.db",
                "launcher": {"kind": "ray", "address": f"127.0.0.1:{port}"},
            }
        )
        no_home = {"HOME": str(tmp_path), "RAY_AUTH_TOKEN_PATH": str(tmp_path / "none")}
        for given, words in (("", "has no token"), ("not-" + token, "has a token that is not the cluster's")):
            for verb in ("validate", "optimize"):
                proc = run_cli(verb, str(path), timeout=60, env={**no_home, "RAY_AUTH_TOKEN": given})
                lines = [line for line in proc.stderr.splitlines() if line.strip()]
                assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
                assert "launcher.address" in lines[0] and words in lines[0], lines[0]
                assert token not in proc.stdout + proc.stderr
        assert not (tmp_path / "s.db").exists()
        accepted = run_cli("validate", str(path), timeout=60, env={**no_home, "RAY_AUTH_TOKEN": token})
        assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    finally:
        _stop([temp_dir])
        shutil.rmtree(temp_dir, ignore_errors=True)
