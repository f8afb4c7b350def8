"""Issue 13: a storage password is never printed or written, wherever it sits (the URL's
user-info, with an unencoded ``@`` or percent-encoded; its query string; ``PGPASSWORD``); every
command explorer prints runs as printed, with the options the user passed; and optuna-dashboard
started the moment ``explorer optimize`` prints its dashboard line finds the study.

Real parts: the ``explorer`` and ``optuna-dashboard`` console scripts as subprocesses (through
bash where a command names an environment variable), sqlite files and the session's PostgreSQL
server (``tests/_postgres.py``) with a role whose password is :data:`PASSWORD`.
"""

from __future__ import annotations

import json
import os
import queue
import shlex
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pytest

from explorer.commands import MASKED_NOTE, command, hint_lines, shown_url
from explorer.launch._command import free_port
from explorer.secrets import has_secret, mask_url, redact, secrets_of
from explorer.study import open_storage
from tests.builders import run_cli
from tests.conftest import merge

PASSWORD = "Zq9-s3cret@x"
"""Distinctive, with an ``@`` in it: neither it nor :data:`ENCODED` may appear anywhere."""
ENCODED = quote(PASSWORD, safe="")  # Zq9-s3cret%40x
STEM = "Zq9-s3cret"  # what both forms, and the piece before the @, share
BIN = Path(sys.executable).parent  # the console scripts: explorer, optuna-dashboard
REPO = Path(__file__).resolve().parents[1]
WAIT_S = 120.0  # a generous bound on anything a test waits for (a line, a server)


def _leaks(*texts: str) -> list[str]:
    return [t for t in texts if STEM in t or ENCODED in t or PASSWORD in t]


def _files_with_secret(root: Path) -> list[Path]:
    return [
        f
        for f in root.rglob("*")
        if f.is_file() and any(s.encode() in f.read_bytes() for s in (STEM, ENCODED))
    ]


def _table(path: Path) -> Path:
    """A replay table: batch 4..32 on 1 or 2 GPUs, checkpointing or not; all fit."""
    rows = ["model_name,gpu_model,model_max_length,number_gpus,batch_size,distributed_backend,"
            "gradient_checkpointing,dataset_tokens_per_second_per_gpu,is_valid"]  # fmt: skip
    for bs in (4, 8, 16, 32):
        for gpus in (1, 2):
            for ckpt in (False, True):
                backend = "DDP" if gpus > 1 else "NONE"
                rows.append(
                    f"tiny-llama,CPU-logical,64,{gpus},{bs},{backend},{ckpt},{1000 + bs - 100 * gpus},1"
                )
    path.write_text("\n".join(rows) + "\n")
    return path


def _replay_study(write_study, tmp_path: Path, **patch) -> Path:
    """A study answered by the replay launcher (no Ray); its file names no storage."""
    base = {
        "name": "secrets",
        "n_trials": 3,
        "launcher": {"kind": "replay", "table": str(_table(tmp_path / "table.csv"))},
        "search_space": {
            "parameters": {
                "batch_size": {"values": [4, 8, 16, 32]},
                "number_gpus": {"values": [1, 2]},
                "distributed_backend": "DDP",
                "gradient_checkpointing": {"choices": [False, True]},
            }
        },
    }
    return write_study(merge(base, patch), name="secrets.yaml")


def _shell(cmd: str, env: dict[str, str] | None = None, **popen) -> subprocess.Popen[str]:
    """``cmd`` as a user would paste it into a shell (``explorer`` and ``optuna-dashboard`` on
    PATH, from the repository root), started; output captured unless ``popen`` says otherwise."""
    full = {**os.environ, **(env or {}), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    popen = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **popen}
    return subprocess.Popen(["bash", "-c", cmd], cwd=REPO, env=full, text=True, **popen)


def _finish(proc: subprocess.Popen[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Wait for ``proc`` (started by :func:`_shell`) and take its output."""
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _bash(cmd: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return _finish(_shell(cmd, env))


def _printed(stdout: str, label: str) -> list[str]:
    """The commands printed after ``label:`` (``dashboard``, ``next``), one a line."""
    return [line.split(": ", 1)[1] for line in stdout.splitlines() if line.startswith(f"{label}: ")]


# -- the one place: mask_url and redact -----------------------------------------------------------


@pytest.mark.parametrize(
    "url, shown",
    [
        ("postgresql+psycopg://u:Zq9-s3cret%40x@db:5432/o", "postgresql+psycopg://u:***@db:5432/o"),
        ("postgresql+psycopg://u:Zq9-s3cret@x@db:5432/o", "postgresql+psycopg://u:***@db:5432/o"),
        ("postgresql+psycopg://u:Zq9/s3cret@x@db/o", "postgresql+psycopg://u:***@db/o"),
        ("postgresql+psycopg://u@db/o?user=u&password=Zq9-s3cret%40x", "postgresql+psycopg://u@db/o?user=u&password=***"),
        ("postgresql+psycopg://u@db/o?sslpassword=Zq9-s3cret@x&sslmode=require", "postgresql+psycopg://u@db/o?sslpassword=***&sslmode=require"),
        ("postgresql+psycopg://u@db/o?passwd=Zq9-s3cret&pwd=Zq9-s3cret&token=Zq9-s3cret&api_key=Zq9-s3cret", "postgresql+psycopg://u@db/o?passwd=***&pwd=***&token=***&api_key=***"),
        ("postgresql+psycopg://u@db/o?password=Zq9-s3cret&x&sslkey=/k.pem", "postgresql+psycopg://u@db/o?password=***&sslkey=/k.pem"),
        ("postgresql+psycopg://me@corp.example:Zq9-s3cret@db/o", "postgresql+psycopg://me@corp.example:***@db/o"),
        ("sqlite:////runs/a@b/s.db", "sqlite:////runs/a@b/s.db"),
        ("postgresql+psycopg://u@db:notaport/o?password=Zq9-s3cret%40x", "postgresql+psycopg://u@db:notaport/o?password=***"),
        ("postgresql+psycopg//u:Zq9-s3cret@x@db/o", "postgresql+psycopg//u:***@db/o"),
        ("host=db user=u password=Zq9-s3cret@x dbname=o", "host=db user=u password=*** dbname=o"),
    ],
)  # fmt: skip
def test_mask_url_hides_the_password_wherever_it_sits(url, shown):
    assert mask_url(url) == shown
    assert has_secret(url) == (shown != url)
    assert STEM not in mask_url(url)


def test_redact_masks_every_form_a_driver_could_echo(monkeypatch):
    """A driver's message may hold the URL, the password decoded or encoded, the piece
    SQLAlchemy took for the host (``u:p@ss@host`` is password ``p`` on host ``ss@host``), or a
    DSN's ``password=...``; and PGPASSWORD's value. None of them survives :func:`redact`."""
    url = f"postgresql+psycopg://u:{PASSWORD}@db:5432/o?password={ENCODED}"
    assert {PASSWORD, ENCODED, STEM, "x"} <= secrets_of(url)
    message = (
        f'failed for {url}: could not translate host name "x@db" to address; dsn: host=db user=u '
        f"password={PASSWORD} dbname=o; {{'password': '{STEM}'}}; as given {ENCODED}; at 0x7f"
    )
    out = redact(message, url)
    assert not _leaks(out), out
    assert '"***@db"' in out and "at 0x7f" in out  # a one-letter piece only where it stands alone
    monkeypatch.setenv("PGPASSWORD", "pg-env-" + STEM)
    assert redact(f"libpq said pg-env-{STEM}", None) == "libpq said ***"


def test_an_unparsable_url_is_refused_without_its_password(write_study, tmp_path):
    path = _replay_study(write_study, tmp_path)
    url = f"postgresql+psycopg://u@db:notaport/o?password={ENCODED}"
    refused = run_cli("status", str(path), "--storage", url, timeout=120)
    assert refused.returncode == 2 and "not an SQLAlchemy URL" in refused.stderr, refused.stderr
    assert not _leaks(refused.stdout, refused.stderr), refused.stderr


# -- PostgreSQL: a role with a password, the password in the query string and with an @ ---------


def _role_url(postgres_server, postgres_url: str) -> tuple[str, str]:
    """A role ``zq`` whose password is PASSWORD, owning the test's database: its URL (password in
    the query string, percent-encoded) and the database's name."""
    from sqlalchemy.engine import make_url

    database = make_url(postgres_url).database
    postgres_server._admin(
        f"DO $$ BEGIN CREATE ROLE zq LOGIN PASSWORD '{PASSWORD}'; "
        "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
    )
    postgres_server._admin(f'ALTER DATABASE "{database}" OWNER TO zq')
    port = postgres_server.port
    return f"postgresql+psycopg://zq@127.0.0.1:{port}/{database}?password={ENCODED}", str(database)


def test_postgresql_password_in_the_query_string_or_with_an_at_is_never_printed(
    write_study, tmp_path, postgres_server, postgres_url
):
    """The whole path on a real server, the URL passed as ``--storage "$VAR"`` through bash:
    optimize, then each command it printed run as printed (the variable in it), status, export,
    dashboard; then error lines (a closed port, a wrong password, an unencoded ``@`` in the
    user-info). The password, encoded or not, is in no output and no file explorer wrote."""
    url, database = _role_url(postgres_server, postgres_url)
    path = _replay_study(write_study, tmp_path)
    env = {"EXPLORER_TEST_STORAGE": url}
    outputs: list[str] = []

    run = _bash(f'explorer optimize {path} --storage "$EXPLORER_TEST_STORAGE"', env)
    outputs.append(run.stdout + run.stderr)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3/3 trials done" in run.stdout
    assert f"study 'secrets' in {mask_url(url)}" in run.stdout and "password=***" in run.stdout
    nexts = _printed(run.stdout, "next")
    assert nexts == [
        f'explorer {verb} {path} --storage "$EXPLORER_TEST_STORAGE"' for verb in ("report", "best")
    ]
    dashboards = _printed(run.stdout, "dashboard")
    assert dashboards[:2] == dashboards[2:]  # at the start (the study created) and in the summary
    [explorer_dash, optuna_dash] = dashboards[:2]
    assert optuna_dash == 'optuna-dashboard "$EXPLORER_TEST_STORAGE"'

    # at once: each printed command as printed (the shell expands the variable), an export,
    # explorer dashboard as printed on a free port, and three storages that fail
    port = free_port()
    server = _shell(f"exec {explorer_dash} --port {port}", env)
    runs = [_shell(cmd, env) for cmd in nexts]
    runs.append(_shell(f'explorer export {path} --storage "$EXPLORER_TEST_STORAGE" --format json', env))
    closed = url.replace(f":{postgres_server.port}/", f":{free_port()}/")
    wrong = url.replace(ENCODED, "wrong-" + ENCODED)
    at_in_userinfo = f"postgresql+psycopg://zq:{PASSWORD}@127.0.0.1:{postgres_server.port}/{database}"
    bad = [(closed, "refused"), (wrong, "password authentication failed"), (at_in_userinfo, "resolve host")]
    failing = [
        _shell(f"explorer status {path} --storage {shlex.quote(u)}", {"PGPASSWORD": PASSWORD}) for u, _ in bad
    ]
    try:
        assert server.stdout is not None
        head = [server.stdout.readline(), server.stdout.readline()]
        assert head[0].startswith(f"dashboard: http://127.0.0.1:{port}/"), head
        studies = _api(f"http://127.0.0.1:{port}", server)
        assert [s["study_name"] for s in studies] == ["secrets"]
        outputs += head
    finally:
        server.terminate()
        dash = _finish(server)
    outputs.append(dash.stderr)
    assert "Traceback" not in dash.stderr, dash.stderr
    for done in map(_finish, runs):
        outputs.append(done.stdout + done.stderr)
        assert done.returncode == 0, done.stdout + done.stderr
    for (_, words), failed in zip(bad, map(_finish, failing), strict=True):
        # one line each, exit status 2, no password
        outputs.append(failed.stdout + failed.stderr)
        assert failed.returncode == 2 and failed.stderr.count("\n") == 1, failed.stderr
        assert "cannot read" in failed.stderr and words in failed.stderr and "Traceback" not in failed.stderr

    assert not _leaks(*outputs), _leaks(*outputs)
    assert not _files_with_secret(tmp_path)  # trial folders, write-ahead files, report, best, export
    assert any((tmp_path / "explorer-runs").rglob("index.html")) and any(
        (tmp_path / "explorer-runs").rglob("job.json")
    )


def _api(base: str, server: subprocess.Popen[str]) -> list[dict]:
    """The study summaries the dashboard at ``base`` serves, once it answers (HTTP 200)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            with urllib.request.urlopen(f"{base}/api/studies", timeout=10) as r:
                assert r.status == 200
                return list(json.loads(r.read())["study_summaries"])
        except OSError:
            assert server.poll() is None, "the dashboard exited"
            assert time.monotonic() < deadline, "the dashboard did not answer"
            time.sleep(0.3)


def test_a_printed_command_with_a_password_masks_it_and_says_so_once(write_study, tmp_path, monkeypatch):
    """No environment variable holds the URL: the printed commands carry ``***`` for the
    password, and one note says so. The options the command line gave are all there, quoted."""
    from explorer.study_file import load_study

    path = _replay_study(write_study, tmp_path)
    url = f"postgresql+psycopg://zq:{PASSWORD}@db.example:5432/o?sslmode=require&password={ENCODED}"
    for name in [k for k, v in os.environ.items() if v == url]:
        monkeypatch.delenv(name)
    loaded = load_study(path, storage=url, n_trials=5, check_model=False)
    lines = hint_lines(loaded, then=("report", "best"))
    assert not _leaks(*lines), lines
    assert lines.count(MASKED_NOTE) == 1 and lines[-1] == MASKED_NOTE
    masked = shlex.quote(mask_url(url))
    assert lines[0] == f"dashboard: explorer dashboard {path} --storage {masked}"
    assert lines[1] == f"dashboard: optuna-dashboard {masked}"
    assert shlex.split(lines[0].split(": ", 1)[1])[-1] == mask_url(url)  # one shell word
    optimize, hidden = command("optimize", loaded, n_trials=True)
    assert hidden and optimize == f"explorer optimize {path} --storage {masked} --n-trials 5"
    monkeypatch.setenv("DB_URL", url)  # now a variable holds it: the command names the variable
    assert shown_url(url).text == '"$DB_URL"' and MASKED_NOTE not in hint_lines(loaded)
    # the study file's own storage and n_trials are not repeated
    own = load_study(path, check_model=False)
    assert command("best", own) == (f"explorer best {path}", False)


# -- the dashboard the moment a study starts; printed commands run as printed -------------------


def test_dashboards_started_at_the_printed_line_serve_the_study_and_printed_commands_run(
    write_study, tmp_path
):
    """``explorer optimize --storage sqlite:///other.db --n-trials 3`` (a replay paced in real
    time): the moment it prints its dashboard lines (read through a pipe), both printed
    dashboards are started as printed (``optuna-dashboard URL`` and ``explorer dashboard``, each
    on a free loopback port). Each answers ``/api/studies`` with the study, with no traceback.
    When the study is done, every command it printed runs as printed (``shlex.split``)."""
    path = _replay_study(
        write_study,
        tmp_path,
        n_trials=50,  # the file says 50; the command line 3
        launcher={"durations": {"ok_s": 100.0, "oom_s": 100.0, "time_scale": 0.01}},  # 1 s a trial
    )
    other = tmp_path / "other.db"
    lines: queue.Queue[str | None] = queue.Queue()
    driver = subprocess.Popen(
        [str(BIN / "explorer"), "optimize", str(path), "--storage", "sqlite:///other.db", "--n-trials", "3"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: list[str] = []

    def read() -> None:
        assert driver.stdout is not None
        for line in driver.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    servers: list[tuple[subprocess.Popen[str], Path]] = []
    try:
        deadline = time.monotonic() + WAIT_S
        while len(_printed("\n".join(seen), "dashboard")) < 2:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            assert line is not None, "\n".join(seen)
            seen.append(line)
        printed = _printed("\n".join(seen), "dashboard")
        assert printed == [
            f"explorer dashboard {path} --storage sqlite:///{other}",
            f"optuna-dashboard sqlite:///{other}",
        ]
        ports = []
        for cmd in reversed(printed):  # at once: optuna-dashboard first, the file just created
            ports.append(free_port())
            argv = [str(BIN / shlex.split(cmd)[0]), *shlex.split(cmd)[1:], "--port", str(ports[-1])]
            if argv[0].endswith("optuna-dashboard"):
                argv += ["--host", "127.0.0.1"]
            err = tmp_path / f"{Path(argv[0]).name}.err"
            with err.open("w") as fh:
                servers.append((subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=fh), err))
        for port, (server, _) in zip(ports, servers, strict=True):
            studies = _api(f"http://127.0.0.1:{port}", server)
            assert [s["study_name"] for s in studies] == ["secrets"]
        while (line := lines.get(timeout=WAIT_S)) is not None:
            seen.append(line)
        assert driver.wait(timeout=WAIT_S) == 0, "\n".join(seen)
        for server, _ in servers:
            assert server.poll() is None  # still serving
    finally:
        for server, _ in servers:
            server.terminate()
            server.wait(timeout=30)
        if driver.poll() is None:
            driver.kill()
            driver.wait(timeout=30)
    for _, err in servers:
        assert "Traceback" not in err.read_text(), err.read_text()
    out = "\n".join(seen)
    assert "3/3 trials done" in out
    nexts = _printed(out, "next")
    assert nexts == [f"explorer {verb} {path} --storage sqlite:///{other}" for verb in ("report", "best")]
    assert _printed(out, "dashboard")[-2:] == printed  # the summary says the same
    for done in [_finish(p) for p in [_shell(shlex.join(shlex.split(cmd))) for cmd in nexts]]:
        assert done.returncode == 0, done.stdout + done.stderr
    assert any(tmp_path.rglob("index.html")) and any(tmp_path.rglob("launch.sh"))


# -- the schema at once; explorer dashboard at any moment -----------------------------------------


def test_optunas_schema_appears_in_one_transaction(tmp_path):
    """A reader polling a fresh sqlite file while ``open_storage`` creates it sees no table, or
    every table with the version row and the alembic revision: never half a schema (which made
    ``optuna-dashboard`` fail with ``no such table: version_info``, or write the version row)."""
    db = tmp_path / "fresh.db"
    url = f"sqlite:///{db}"
    seen: list[tuple[int, ...]] = []
    done = threading.Event()
    failures: list[BaseException] = []

    def create() -> None:
        try:
            open_storage(url)
        except BaseException as exc:  # reported below
            failures.append(exc)
        finally:
            done.set()

    threading.Thread(target=create, daemon=True).start()
    deadline = time.monotonic() + WAIT_S
    while not done.is_set() or not seen or seen[-1][0] == 0:
        assert time.monotonic() < deadline and not failures, (failures, seen[-3:])
        if db.exists():
            con = sqlite3.connect(db, timeout=10)  # reads only, as optuna-dashboard does
            try:
                tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                rows = [
                    con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] if t in tables else -1
                    for t in ("version_info", "alembic_version")
                ]
                seen.append((len(tables), *rows) if tables else (0, 0, 0))
            finally:
                con.close()
        time.sleep(0.001)
    assert not failures, failures
    full = max(n for n, _, _ in seen)
    assert full >= 12 and all(s in ((0, 0, 0), (full, 1, 1)) for s in seen), sorted(set(seen))


def test_explorer_dashboard_before_the_study_exists_is_one_line_and_creates_nothing(write_study, tmp_path):
    """At every moment before the study exists (no file; an empty file, as a reader's open
    leaves it; the schema without the study) ``explorer dashboard`` is one line, exit status 2,
    no traceback, and the file stays as it was."""
    db = tmp_path / "early.db"
    path = write_study({"storage": f"sqlite:///{db}", "name": "early"})
    for stage in ("no file", "empty file", "schema, no study"):
        if stage == "empty file":
            db.touch()
        if stage == "schema, no study":
            db.unlink()
            open_storage(f"sqlite:///{db}").engine.dispose()
        before = db.read_bytes() if db.exists() else None
        failed = run_cli("dashboard", str(path), "--port", str(free_port()))
        assert failed.returncode == 2 and failed.stdout == "", (stage, failed.stdout)
        assert failed.stderr.count("\n") == 1 and "no study" in failed.stderr, (stage, failed.stderr)
        assert (db.read_bytes() if db.exists() else None) == before, stage


# -- a storage that fails mid-run ----------------------------------------------------------------


def test_a_storage_lost_mid_run_is_one_line_without_the_password_and_keeps_its_trials(
    write_study, tmp_path, postgres_server, postgres_url
):
    """A real server stops taking the study's role while ``explorer optimize`` runs (its login
    refused, its connections ended): one line, exit status 1, no traceback, no password. The
    trials stored before are all there, and the same command resumes the study once the role
    may log in again."""
    import psycopg
    from sqlalchemy.engine import make_url

    database = str(make_url(postgres_url).database)
    role = f"gone{os.getpid()}"
    postgres_server._admin(f"CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD}'")
    postgres_server._admin(f'ALTER DATABASE "{database}" OWNER TO {role}')
    url = f"postgresql+psycopg://{role}:{ENCODED}@127.0.0.1:{postgres_server.port}/{database}"
    durations = {"ok_s": 100.0, "oom_s": 100.0, "time_scale": 0.02}  # 2 s a trial
    path = _replay_study(write_study, tmp_path, n_trials=8, launcher={"durations": durations})
    env = {"EXPLORER_TEST_STORAGE": url}

    def complete() -> int:
        with psycopg.connect(postgres_server.url(database).replace("+psycopg", "")) as conn:
            found = conn.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_name = 'trials'"
            ).fetchone()
            if not found or not found[0]:
                return 0
            row = conn.execute("SELECT count(*) FROM trials WHERE state = 'COMPLETE'").fetchone()
            return int(row[0]) if row else 0

    run = _shell(f'exec explorer optimize {path} --storage "$EXPLORER_TEST_STORAGE"', env)
    try:
        deadline = time.monotonic() + WAIT_S
        while complete() < 2:
            assert run.poll() is None and time.monotonic() < deadline, "no trial finished"
            time.sleep(0.2)
        postgres_server._admin(f"ALTER ROLE {role} NOLOGIN")
        postgres_server._admin(
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'"
        )
        failed = _finish(run)
    finally:
        postgres_server._admin(f"ALTER ROLE {role} LOGIN")
    kept = complete()
    assert failed.returncode == 1, failed.stdout[-2000:] + failed.stderr[-2000:]
    # the error, last; before it, perhaps what the driver logged as the connection died (one
    # line each, from library_log_lines)
    *logged, line = failed.stderr.strip().splitlines()
    assert line.startswith("explorer: error: the storage failed: ") and "run the command again" in line
    assert all(
        log.startswith(("explorer: optuna", "explorer: sqlalchemy", "explorer: psycopg")) for log in logged
    ), failed.stderr
    assert 2 <= kept < 8
    resumed = _bash(f'explorer optimize {path} --storage "$EXPLORER_TEST_STORAGE"', env)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert complete() == 8
    outputs = [failed.stdout, failed.stderr, resumed.stdout, resumed.stderr]
    assert not _leaks(*outputs), _leaks(*outputs)
    assert "Traceback" not in failed.stderr + resumed.stderr


def test_a_crash_prints_its_traceback_with_the_opened_storages_secrets_masked(monkeypatch):
    """A bug (any exception nothing handles) keeps its traceback for the report, masked; a
    storage's own error (SQLAlchemy's, here as the cause of Optuna's wrapper) is one line."""
    import optuna
    import sqlalchemy

    from explorer.errors import crash_text
    from explorer.secrets import remember_opened

    url = f"postgresql+psycopg://zq:{ENCODED}@db.example/o"
    remember_opened(url)
    monkeypatch.setenv("PGPASSWORD", "pg-env-s3cret")
    try:
        raise ValueError(f"cannot use {url} (or {PASSWORD}, or pg-env-s3cret)")
    except ValueError as exc:
        bug = crash_text(exc)
    assert bug.startswith("Traceback") and "ValueError: cannot use postgresql+psycopg://zq:***@" in bug
    assert not _leaks(bug) and "pg-env-s3cret" not in bug
    try:
        try:
            raise sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception(f"server at {url} closed\nmore"))
        except sqlalchemy.exc.OperationalError as exc:
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit") from exc
    except optuna.exceptions.StorageInternalError as exc:
        lost = crash_text(exc)
    assert lost.count("\n") == 1 and lost.startswith("explorer: error: the storage failed: (")
    assert "server at postgresql+psycopg://zq:***@db.example/o closed" in lost and not _leaks(lost)


def test_what_the_storage_drivers_log_is_one_masked_line_each(capsys):
    """SQLAlchemy's pool logs a traceback when a connection it hands back has died: the CLI's
    handler prints it as one masked line (the message and the error's first line)."""
    import logging

    from explorer.errors import library_log_lines
    from explorer.secrets import remember_opened

    url = f"postgresql+psycopg://zq:{ENCODED}@db.example/o"
    remember_opened(url)
    library_log_lines()
    library_log_lines()  # twice: still one handler
    try:
        raise ConnectionError(f"server at {url} went away\ndetails")
    except ConnectionError:
        logging.getLogger("sqlalchemy.pool.impl.QueuePool").error(
            "Exception during reset or similar", exc_info=True
        )
    err = capsys.readouterr().err
    assert err == (
        "explorer: sqlalchemy.pool.impl.QueuePool: Exception during reset or similar: "
        "server at postgresql+psycopg://zq:***@db.example/o went away\n"
    )
