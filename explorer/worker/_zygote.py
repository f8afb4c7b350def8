"""A warm process that has imported torch and transformers, and forks the ranks of trials.

Starting a rank from a fresh interpreter costs about 4-5 s of imports on a CPU (torch,
transformers, accelerate, the Trainer) before the first step; an out-of-memory configuration
then costs a large part of a feasible trial. The zygote pays the imports once per node and
forks each rank from there, so a rank reaches its first full-size step in well under a second.

Protocol (one Unix-socket connection per rank, JSON lines):

* the client sends ``{"argv": [...], "env": {...}, "cwd": DIR, "log": FILE}``;
* the zygote forks; the child starts a session of its own, takes exactly ``env`` as its
  environment, appends stdout and stderr to ``log`` and runs ``explorer.worker`` with ``argv``;
* the zygote answers ``{"pid": PID}`` at once and ``{"rc": CODE}`` when the child ends
  (``-N``: killed by signal N);
* when the client's connection closes first (the Ray actor died), the child's process group
  is killed.

The zygote never touches CUDA, so each child initialises CUDA itself with its own
``CUDA_VISIBLE_DEVICES``. It exits when its owner process is gone, or after ``idle_exit_s``
without a rank.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import selectors
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["COLD_LINE", "READY_LINE", "preload", "serve"]

READY_LINE = "explorer-zygote ready"
COLD_LINE = "explorer-zygote cold:"
"""The zygote's first line when it cannot fork CUDA ranks (an import initialised CUDA): the rest
says which import; the client then starts its ranks cold."""
_WAKEUP = object()  # selector key data of the signal wakeup pipe


def _preloaded() -> list[str]:
    """The modules the zygote imports, in order."""
    import importlib.util

    modules = ["torch.distributed", "accelerate", "transformers", "explorer.worker._train"]
    # peft imports bitsandbytes where it is installed, and bitsandbytes reads the device at import;
    # a LoRA rank imports peft itself then
    if importlib.util.find_spec("peft") is not None and importlib.util.find_spec("bitsandbytes") is None:
        modules.append("peft")
    return modules


def preload(upto: int | None = None) -> str | None:
    """Import what every rank needs (the first ``upto`` of :func:`_preloaded`), without running any
    torch op (no thread pools, no CUDA); the import after which CUDA was initialised, if one was
    (a forked child could not use it: "Cannot re-initialize CUDA in forked subprocess"), else
    ``None``."""
    import importlib

    import torch

    for name in _preloaded()[:upto]:
        importlib.import_module(name)
        if name == "transformers":
            from transformers import AutoModelForCausalLM, Trainer, TrainingArguments  # noqa: F401
        if _poisons_fork(torch):
            return name
    return None


def _poisons_fork(torch: Any) -> bool:
    """Whether a child forked now would find CUDA unusable: torch marks that in the parent once
    CUDA or its device count was asked for (``is_initialized`` alone misses the count)."""
    if torch.cuda.is_initialized():
        return True
    pid = os.fork()
    if pid == 0:
        os._exit(1 if torch.cuda._is_in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) != 0


def _run_child(request: dict, listener: socket.socket, conn: socket.socket, wakeup: tuple[int, int]) -> None:
    """In the forked child: become the rank described by ``request``; never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in wakeup:
            os.close(fd)
        listener.close()
        conn.close()
        os.setsid()
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        import torch

        threads = int(request["env"].get("OMP_NUM_THREADS", "0") or 0)
        if threads > 0:  # OpenMP read OMP_NUM_THREADS when the zygote loaded it, not now
            torch.set_num_threads(threads)
        from explorer.worker._train import main

        sys.argv = ["python -m explorer.worker", *request["argv"]]
        code = main(list(request["argv"]))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _owner_alive(owner: int | None) -> bool:
    if owner is None:
        return True
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_request(conn: socket.socket) -> dict:
    conn.settimeout(10.0)
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            raise ValueError("connection closed before a full request")
        data += chunk
    conn.settimeout(None)
    request = json.loads(data)
    if not isinstance(request, dict):
        raise ValueError("request is not an object")
    return request


def _send(conn: socket.socket, message: dict) -> None:
    with contextlib.suppress(OSError):
        conn.sendall((json.dumps(message) + "\n").encode())


def _stand_aside(culprit: str, upto: int | None) -> None:
    """After importing ``culprit`` left CUDA unusable in a fork: exec afresh with the imports before
    it (never returns), or, where it was the first or the imports were already cut, say so in the
    zygote's first line (:data:`COLD_LINE`)."""
    before = _preloaded().index(culprit)
    if upto is None and before > 0:
        print(
            f"explorer-zygote: importing {culprit} initialised CUDA; ranks import it themselves",
            file=sys.stderr,
        )
        sys.stderr.flush()
        os.execv(
            sys.executable,
            [sys.executable, "-m", "explorer.worker.zygote", *sys.argv[1:], "--upto", str(before)],
        )
    print(f"{COLD_LINE} importing {culprit} initialised CUDA, so a forked rank could not use it", flush=True)


def serve(sock_path: Path, *, owner: int | None, idle_exit_s: float, upto: int | None = None) -> int:
    """Accept rank requests on ``sock_path`` until the owner is gone or the zygote sits idle.

    Where an import leaves CUDA unusable in a fork, the zygote starts afresh (the same process,
    ``exec``) with only the imports before it, and the ranks import the rest themselves; where
    the first one does, it says so (:data:`COLD_LINE`) and exits, and the ranks start cold."""
    culprit = preload(upto)
    if culprit is not None:
        _stand_aside(culprit, upto)
        return 0
    # A rank's end must wake select() at once. A Python signal handler alone does not: select() is
    # retried after EINTR (PEP 475), so ranks were reaped only at the next 0.5 s timeout, and
    # every trial took up to 0.5 s longer than its ranks. The wakeup fd makes SIGCHLD readable.
    wakeup = os.pipe()
    for fd in wakeup:
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wakeup[1])
    signal.signal(signal.SIGCHLD, lambda *_: None)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = sock_path.with_suffix(f".{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    listener.bind(str(tmp))
    os.chmod(tmp, 0o600)  # only this user may ask for a rank (its folder is 0700 too), whatever the umask
    listener.listen(64)
    os.replace(tmp, sock_path)  # clients connect only once the zygote is ready
    inode = os.stat(sock_path).st_ino
    print(READY_LINE, flush=True)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    selector.register(wakeup[0], selectors.EVENT_READ, _WAKEUP)
    children: dict[int, socket.socket] = {}
    idle_since = time.monotonic()
    try:
        while _owner_alive(owner) and (children or time.monotonic() - idle_since < idle_exit_s):
            for key, _ in selector.select(timeout=0.5):
                if key.data is _WAKEUP:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(wakeup[0], 4096):
                            pass
                elif key.data is None:
                    conn, _ = listener.accept()
                    try:
                        request = _read_request(conn)
                    except (OSError, ValueError):
                        conn.close()
                        continue
                    pid = os.fork()
                    if pid == 0:
                        _run_child(request, listener, conn, wakeup)
                    children[pid] = conn
                    _send(conn, {"pid": pid})
                    selector.register(conn, selectors.EVENT_READ, pid)
                else:  # the client hung up (or sent something): its rank must not outlive it
                    pid = key.data
                    with contextlib.suppress(OSError):
                        if key.fileobj.recv(1) == b"":  # type: ignore[union-attr]
                            with contextlib.suppress(ProcessLookupError, PermissionError):
                                os.killpg(pid, signal.SIGKILL)
            _reap(children, selector)
            if children:
                idle_since = time.monotonic()
    finally:
        for pid in list(children):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            if os.stat(sock_path).st_ino == inode:  # not a successor's socket
                sock_path.unlink()
        remove_files(sock_path)
    return 0


def remove_files(sock_path: Path) -> bool:
    """Remove the files of the zygote at ``sock_path`` (``zygote-<key>.sock``, ``.lock``, an
    empty ``.log``, a killed start's ``.<pid>.tmp``) unless a starter holds its lock or a zygote
    answers on it; whether they were removed.

    A starter locks ``.lock`` and then checks that the path still names the file it locked
    (:func:`explorer.launch._warm.ensure_zygote`), so removing it under the lock is safe."""
    lock_path = sock_path.with_suffix(".lock")
    try:
        fh = lock_path.open("a")
    except OSError:
        return False
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            same = os.fstat(fh.fileno()).st_ino == os.stat(lock_path).st_ino
        except OSError:  # held by a starter, or removed meanwhile
            return False
        if not same or answers(sock_path):
            return False
        log = sock_path.with_suffix(".log")
        with contextlib.suppress(OSError):
            if log.stat().st_size == 0:
                log.unlink()
        for stale in [sock_path, *sock_path.parent.glob(f"{sock_path.stem}.*.tmp"), lock_path]:
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
    return True


def answers(sock_path: Path) -> bool:
    """Whether a zygote accepts connections on ``sock_path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(sock_path))
        except OSError:
            return False
    return True


def _reap(children: dict[int, socket.socket], selector: selectors.BaseSelector) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        _send(conn, {"rc": code})
        selector.unregister(conn)
        conn.close()


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m explorer.worker.zygote")
    parser.add_argument("--socket", required=True, type=Path)
    parser.add_argument("--owner", type=int, default=None, help="exit when this pid is gone")
    parser.add_argument("--idle-exit", type=float, default=300.0, help="seconds without a rank")
    parser.add_argument("--upto", type=int, default=None, help="preload only this many modules")
    ns = parser.parse_args(argv)
    return serve(ns.socket, owner=ns.owner, idle_exit_s=ns.idle_exit, upto=ns.upto)
