"""The local Ray's health: whether a process the Ray this driver started cannot do without (its
GCS, its raylet) has died, the end of the run that this is (:class:`RayLost`), and the sweep of
what such a Ray leaves behind.

A dead raylet or GCS is no trial's failure: every trial asked for after it would fail in no time
("the Ray cluster cannot place ..."), and Ray's core ends a driver whose GCS stays gone for a minute
with its own line. The launcher asks :func:`dead_process` before each step, and a death ends the
run: the loop marks its trials in flight interrupted (run again on resume) and says it in one line.
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any

__all__ = ["ESSENTIAL", "RayLost", "dead_process", "kill_leftovers", "leftovers"]

ESSENTIAL = {"gcs_server": "GCS", "raylet": "raylet"}
"""The local Ray's processes a run cannot go on without (Ray's process type: what we call it)."""


class RayLost(RuntimeError):
    """The local Ray this driver started is gone (its GCS or raylet died): the run ends, its trials
    in flight are marked interrupted and run again on resume; no trial is failed for it."""


def _how(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def _local_node() -> Any:
    """The node this process started (``None``: no Ray, or one joined at an address)."""
    import ray

    node = getattr(ray._private.worker, "_global_node", None)
    return node if node is not None and getattr(node, "head", False) else None


def dead_process() -> str | None:
    """What of the local Ray this process started has died, in a few words (``None``: nothing, or
    no such Ray)."""
    node = _local_node()
    if node is None:
        return None
    for kind, name in ESSENTIAL.items():
        for info in node.all_processes.get(kind, []):
            returncode = info.process.poll()
            if returncode is not None:
                return f"the local Ray's {name} (pid {info.process.pid}) {_how(returncode)}"
    return None


def leftovers() -> list[Any]:
    """The processes of the local Ray this process started, wherever they now hang (a dead
    raylet's workers belong to no parent of ours): our descendants that are Ray's, and every
    process that names its session folder or carries its raylet's pid."""
    import psutil
    import ray

    node = _local_node()
    if node is None:
        return []
    session = str(node.get_session_dir_path())
    raylets = {str(info.process.pid) for info in node.all_processes.get("raylet", [])}
    home = os.path.dirname(ray.__file__)
    found: dict[int, Any] = {}
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        with contextlib.suppress(psutil.Error):
            cmd = proc.cmdline()
            if any(session in arg for arg in cmd) or proc.environ().get("RAY_RAYLET_PID") in raylets:
                found[proc.pid] = proc
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmd = child.cmdline()
            if cmd and (cmd[0].startswith("ray::") or any(home in arg for arg in cmd)):
                found[child.pid] = child
    return list(found.values())


def kill_leftovers(procs: list[Any], *, timeout_s: float = 10.0) -> None:
    """SIGKILL ``procs`` (and what they started) and wait for them to go."""
    import psutil

    victims: dict[int, Any] = {}
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            victims.update({c.pid: c for c in proc.children(recursive=True)})
            victims[proc.pid] = proc
    for proc in victims.values():
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(list(victims.values()), timeout=timeout_s)
