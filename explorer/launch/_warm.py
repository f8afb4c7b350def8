"""Client side of the warm start: find or start this node's zygote, fork ranks from it, wait.

See :mod:`explorer.worker._zygote` for the protocol. One zygote serves one driver (``owner``)
on one node; a second driver, or a driver on another host, gets a zygote of its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import selectors
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["WarmRank", "ensure_zygote", "kill_ranks", "spawn_rank", "sweep", "wait_ranks"]

START_TIMEOUT_S = 180.0
IDLE_EXIT_S = 300.0
PEER_GRACE_S = 5.0
"""After one rank fails, the others get this long to report their own error before they are killed
(they would otherwise wait forever in a collective, as under torchrun)."""


def _zygote_dir() -> Path:
    """``$TMPDIR/explorer-<uid>``: a folder only this user can enter (the zygote's socket forks a
    process with any environment it is sent, so nobody else may reach it).

    Raises:
        RuntimeError: the path is a symlink or not a folder, or another user owns it (someone may
            have made it first, in a shared /tmp, to reach the socket).
    """
    path = Path(tempfile.gettempdir()) / f"explorer-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise RuntimeError(f"{path} is a symlink or not a folder; refusing to put the zygote's socket there")
    if st.st_uid != os.getuid():
        raise RuntimeError(f"{path} is owned by uid {st.st_uid}, not {os.getuid()}; refusing to use it")
    if stat.S_IMODE(st.st_mode) != 0o700:
        path.chmod(0o700)  # ours, but loosened (or made under an odd umask): tighten it
    return path


def _connectable(sock: Path) -> bool:
    from explorer.worker._zygote import answers

    return sock.exists() and answers(sock)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path``, a file that still has that name once locked (a zygote
    that ends removes its lock file under the lock: :func:`explorer.worker._zygote.remove_files`)."""
    while True:
        with path.open("a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                same = os.fstat(fh.fileno()).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                yield
                return


def sweep(folder: Path, *, keep: Path | None = None) -> int:
    """Remove the files of every zygote in ``folder`` that no longer answers and that nobody is
    starting (killed zygotes, ended runs), ``keep`` aside; how many zygotes' files went."""
    from explorer.worker._zygote import remove_files

    socks = {p.with_suffix(".sock") for p in folder.glob("zygote-*.lock")} - {keep}
    return sum(remove_files(s) for s in sorted(socks))


_COLD: dict[str, str] = {}
"""Why a zygote key's ranks start cold (its zygote said so), so that no trial starts it again."""


def cold_reason(owner_pid: int | None) -> str | None:
    """Why the zygote of ``owner_pid`` on this node cannot fork ranks, once it said so."""
    return _COLD.get(_key(owner_pid))


def _key(owner_pid: int | None) -> str:
    from explorer import __version__

    return hashlib.sha1(
        f"{socket.gethostname()}|{owner_pid}|{sys.executable}|{__version__}".encode()
    ).hexdigest()[:16]


def ensure_zygote(*, owner_pid: int | None, env: dict[str, str]) -> Path | None:
    """The socket of the zygote serving ``owner_pid`` on this node, started if need be; ``None``
    when the zygote cannot fork ranks (:data:`~explorer.worker._zygote.COLD_LINE`: an import
    initialised CUDA), and the ranks must start cold (why goes to stderr, the first time).

    ``env`` is the zygote's own environment (allocator and thread settings are read at start);
    each rank still gets exactly the environment its request carries.
    """
    from explorer.worker._zygote import COLD_LINE

    key = _key(owner_pid)
    if key in _COLD:
        return None
    folder = _zygote_dir()
    sock = folder / f"zygote-{key}.sock"
    sweep(folder, keep=sock)
    with _locked(folder / f"zygote-{key}.lock"):  # one starter per key, even with parallel trials
        if _connectable(sock):
            return sock
        sock.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "explorer.worker.zygote", "--socket", str(sock)]
        cmd += ["--idle-exit", str(IDLE_EXIT_S)]
        if owner_pid is not None:
            cmd += ["--owner", str(owner_pid)]
        with (folder / f"zygote-{key}.log").open("ab") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        assert proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            line = proc.stdout.readline().decode().strip() if sel.select(timeout=START_TIMEOUT_S) else ""
            if not line:
                proc.kill()
                raise RuntimeError(f"the warm-start zygote did not start; see {folder / f'zygote-{key}.log'}")
        proc.stdout.close()
        if line.startswith(COLD_LINE):
            proc.wait()
            _COLD[key] = line.removeprefix(COLD_LINE).strip()
            print(f"explorer: ranks start cold: {_COLD[key]}", file=sys.stderr, flush=True)
            return None
        return sock


@dataclass
class WarmRank:
    """One rank forked by the zygote, and the connection that reports its end."""

    pid: int
    conn: socket.socket
    returncode: int | None = None
    _buffer: bytes = field(default=b"", repr=False)


def spawn_rank(sock: Path, *, argv: list[str], env: dict[str, str], cwd: Path, log: Path) -> WarmRank:
    """Ask the zygote for one rank; returns once the rank's process exists."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(str(sock))
    request = {"argv": argv, "env": env, "cwd": str(cwd), "log": str(log)}
    conn.sendall((json.dumps(request) + "\n").encode())
    rank = WarmRank(pid=-1, conn=conn)
    conn.settimeout(30.0)
    message = _read_message(rank)
    conn.settimeout(None)
    if message is None or "pid" not in message:
        conn.close()
        raise RuntimeError("the warm-start zygote closed the connection without starting the rank")
    rank.pid = int(message["pid"])
    return rank


def _read_message(rank: WarmRank) -> dict | None:
    while b"\n" not in rank._buffer:
        chunk = rank.conn.recv(4096)
        if not chunk:
            return None
        rank._buffer += chunk
    line, rank._buffer = rank._buffer.split(b"\n", 1)
    message = json.loads(line)
    return message if isinstance(message, dict) else None


def wait_ranks(ranks: list[WarmRank], *, timeout_s: float) -> tuple[int, bool]:
    """Wait for every rank; returns (the first non-zero exit status or 0, whether it timed out).

    Once a rank fails, its peers get :data:`PEER_GRACE_S` and are then killed.
    """
    deadline = time.monotonic() + timeout_s
    failed_at: float | None = None
    first_failure = 0
    with selectors.DefaultSelector() as sel:
        for rank in ranks:
            sel.register(rank.conn, selectors.EVENT_READ, rank)
        while any(r.returncode is None for r in ranks):
            now = time.monotonic()
            if now >= deadline:
                return first_failure, True
            if failed_at is not None and now - failed_at >= PEER_GRACE_S:
                break
            for key, _ in sel.select(timeout=min(1.0, deadline - now)):
                rank = key.data
                message = _read_message(rank)
                rank.returncode = int(message["rc"]) if message and "rc" in message else -signal.SIGKILL
                sel.unregister(rank.conn)
                if rank.returncode != 0 and failed_at is None:
                    failed_at, first_failure = time.monotonic(), rank.returncode
    return first_failure, False


def kill_ranks(ranks: list[WarmRank]) -> None:
    """SIGKILL every rank's session (its process group) and anything it started; close connections."""
    import psutil

    victims: list[psutil.Process] = []
    for rank in ranks:
        with contextlib.suppress(psutil.NoSuchProcess):
            victims += psutil.Process(rank.pid).children(recursive=True)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(rank.pid, signal.SIGKILL)
    for p in victims:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    for rank in ranks:
        rank.conn.close()  # the zygote also kills a rank whose client hung up
