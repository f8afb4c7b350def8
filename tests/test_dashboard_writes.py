"""`explorer dashboard` cannot change the study unless the user asks: optuna-dashboard's API
accepts ``DELETE /api/studies/1`` and would drop the study for any local user who reaches the
port; explorer's server refuses every writing request (403) unless ``--allow-writes``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import optuna
import pytest

from explorer.launch._command import free_port


def _serve(study_file: Path, port: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "explorer", "dashboard", str(study_file), "--port", str(port), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def _request(method: str, url: str, body: bytes | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, method=method, data=body)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _study_id(base: str, server: subprocess.Popen[str]) -> int:
    deadline = time.monotonic() + 60
    while True:
        try:
            status, body = _request("GET", f"{base}/api/studies")
            break
        except OSError:
            assert server.poll() is None and time.monotonic() < deadline, "dashboard did not start"
            time.sleep(0.5)
    assert status == 200
    [summary] = json.loads(body)["study_summaries"]
    return int(summary["study_id"])


def _stored(url: str) -> list[str]:
    return [s.study_name for s in optuna.get_all_study_summaries(storage=url)]


@pytest.mark.parametrize(
    "allow", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["read-only", "allow-writes"]
)
def test_a_real_delete_is_refused_unless_writes_are_allowed(write_study, tmp_path: Path, allow: bool) -> None:
    from explorer.study import open_study
    from explorer.study_file import load_study

    url = f"sqlite:///{tmp_path}/s.db"
    path = write_study({"storage": url, "output_dir": str(tmp_path / "runs")})
    study = open_study(load_study(path), create=True)
    study.enqueue_trial({})
    port = free_port()
    server = _serve(path, port, *(["--allow-writes"] if allow else []))
    try:
        base = f"http://127.0.0.1:{port}"
        study_id = _study_id(base, server)
        assert server.stdout is not None
        said = [server.stdout.readline() for _ in range(3)]
        status, body = _request("DELETE", f"{base}/api/studies/{study_id}")
        renamed, _ = _request("POST", f"{base}/api/studies/{study_id}/rename", b'{"study_name": "x"}')
        if allow:
            assert status == 204 and _stored(url) == []
            assert any("--allow-writes" in line for line in said)
        else:
            assert status == 403 and "--allow-writes" in json.loads(body)["reason"]
            assert renamed == 403
            assert _stored(url) == ["test"]  # the study is still there, untouched
            assert any(line.startswith("read-only") for line in said)
            # reads still work: the page and the API
            assert _request("GET", f"{base}/api/studies/{study_id}?after=0")[0] == 200
            assert _request("GET", f"{base}/dashboard/")[0] == 200
    finally:
        server.terminate()
        server.wait(timeout=10)
