"""A real, throwaway PostgreSQL server for the tests: initdb in a temporary folder, loopback only.

The server is started once per test session (see ``postgres_server`` in ``tests/conftest.py``)
with password authentication for the user ``explorer``, so every URL the tests use carries
credentials (``postgresql+psycopg://explorer:PASSWORD@127.0.0.1:PORT/DB``); each test gets a
database of its own. PostgreSQL refuses to run as root: as root, ``initdb`` and ``pg_ctl`` run as
the ``postgres`` system user (created by Debian's ``postgresql`` package) through ``runuser``.

The binaries come from ``scripts/postgres.sh install`` (``make test`` runs it); without them the
tests that need the server fail with a message saying so (they are never skipped).
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["PASSWORD", "USER", "PostgresServer", "find_bindir"]

USER = "explorer"
PASSWORD = "pg-s3cret-7f3a9c"
"""Recognizable on purpose: the credential tests assert it appears in no output and no file."""
SYSTEM_USER = "postgres"


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", path))


def find_bindir() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``: the newest ``/usr/lib/postgresql/*/bin``,
    else ``pg_config --bindir``, else ``PATH``; ``None`` when there is none."""
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True):
        if os.access(os.path.join(d, "initdb"), os.X_OK) and os.access(os.path.join(d, "pg_ctl"), os.X_OK):
            return Path(d)
    if shutil.which("pg_config"):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=False)
        d = out.stdout.strip()
        if d and os.access(os.path.join(d, "initdb"), os.X_OK):
            return Path(d)
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(initdb).parent
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One PostgreSQL server on 127.0.0.1, in a temporary folder removed by :meth:`stop`."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="explorer-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = 0
        self._as_user: list[str] = []
        self._databases = itertools.count()
        if os.geteuid() == 0:  # postgres refuses root: run its tools as the postgres system user
            try:
                entry = pwd.getpwnam(SYSTEM_USER)
            except KeyError:
                raise RuntimeError(
                    f"running as root, but there is no {SYSTEM_USER!r} system user to run PostgreSQL as "
                    "(scripts/postgres.sh install creates it with Debian's postgresql package)"
                ) from None
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
            self._as_user = ["runuser", "-u", SYSTEM_USER, "--"]

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = [*self._as_user, *args]
        return subprocess.run(cmd, cwd=self.root, capture_output=True, text=True, timeout=120, check=False)

    def start(self) -> None:
        """initdb (user ``explorer`` with ``PASSWORD``, scram over TCP), then start on a free port.

        Raises:
            RuntimeError: initdb or the server failed; the message holds their output.
        """
        pwfile = self.root / "pwfile"
        pwfile.write_text(PASSWORD + "\n")
        if self._as_user:
            entry = pwd.getpwnam(SYSTEM_USER)
            os.chown(pwfile, entry.pw_uid, entry.pw_gid)
        pwfile.chmod(0o600)
        init = self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            USER,
            f"--pwfile={pwfile}",
            "--auth-host=scram-sha-256",
            "--auth-local=scram-sha-256",
            "-E",
            "UTF8",
            "--no-sync",
        )
        pwfile.unlink()
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed ({init.returncode}): {init.stdout}{init.stderr}")
        for attempt in range(3):
            self.port = _free_port()
            options = (
                f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
            )
            ctl = self._run(
                str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options, "-w",
                "-t", "60", "start",
            )  # fmt: skip
            if ctl.returncode == 0:
                return
            if attempt == 2:
                log = self.log.read_text() if self.log.exists() else ""
                raise RuntimeError(f"pg_ctl start failed ({ctl.returncode}): {ctl.stdout}{ctl.stderr}{log}")
            time.sleep(0.5)  # the port was taken between the probe and the bind: try another

    def url(self, database: str = "postgres", *, password: bool = True) -> str:
        """The SQLAlchemy URL of ``database`` (psycopg 3), with the password unless told not to."""
        auth = f"{USER}:{PASSWORD}" if password else USER
        return f"postgresql+psycopg://{auth}@127.0.0.1:{self.port}/{database}"

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user=USER, password=PASSWORD, dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(sql)  # type: ignore[arg-type]

    def create_database(self) -> str:
        """A new, empty database; returns its name."""
        name = f"t{os.getpid()}_{next(self._databases)}"
        self._admin(f'CREATE DATABASE "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        """Drop ``name``, closing whatever connections still use it."""
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def pid(self) -> int | None:
        """The postmaster's pid while it runs."""
        pidfile = self.data / "postmaster.pid"
        try:
            return int(pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def stop(self) -> None:
        """Stop the server (fast shutdown), wait until its process is gone, remove the folder.

        Raises:
            RuntimeError: the server process is still there after the stop.
        """
        pid = self.pid()
        if pid is not None:
            self._run(
                str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop"
            )
            deadline = time.monotonic() + 30
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                raise RuntimeError(f"PostgreSQL (pid {pid}) did not stop; see {self.log}")
        shutil.rmtree(self.root, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
