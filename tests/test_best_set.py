"""``explorer best`` writes its files as one set. A real SIGKILL before each step of the write
(every flush to disk, rename, removal: the kill points of the writing process, counted) leaves the
folder holding one whole set, the old one or the new one, never a mix; the next write clears what
the kill left beside it and keeps the check run's ``run/`` output. A folder that holds a file of
the user's, or the current folder, is refused in one line with nothing written.

The writer runs in a forked child process of this one (the study loaded once); the child counts
its calls of the ``os`` functions that change files and, at the chosen one, waits to be killed
(:func:`_kill_before`). That pause is the test's only hook: the write itself is the real one.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from explorer.best import write_config
from explorer.errors import SpecError
from explorer.paths import OUT_MANIFEST
from explorer.spec import LoadedStudy
from explorer.study_file import load_study
from explorer.trial_config import TrialConfig
from tests.conftest import BASE_STUDY

BASE = dict(gradient_checkpointing=False, model_max_length=64)
GENERATIONS = {  # two configurations whose files differ (the title heads two of them as well)
    "old": TrialConfig(**BASE, batch_size=4, number_gpus=2, distributed_backend="DDP"),
    "new": TrialConfig(**BASE, batch_size=2, number_gpus=1, distributed_backend="NONE"),
}
COUNTED = ("mkdir", "fsync", "rename", "replace", "unlink", "rmdir", "chmod")
"""The ``os`` functions the child counts as kill points (every change a write makes on disk)."""
RESULT = '{"outcome": "ok"}\n'


def _write(loaded: LoadedStudy, out: Path, generation: str) -> None:
    write_config(
        loaded,
        GENERATIONS[generation],
        out,
        steps=3 if generation == "old" else 5,
        trial_number=0 if generation == "old" else 1,
        device_type="cpu",
        title=f"generation {generation}",
        claim=True,
    )


def _child(kill_at: int, progress: int, write: Callable[[], None]) -> None:
    """Run ``write`` with each counted ``os`` call reported on ``progress`` (a byte); the
    ``kill_at``-th waits to be killed, before it runs."""
    calls = 0

    def counted(real: Callable[..., object]) -> Callable[..., object]:
        def call(*args: object, **kwargs: object) -> object:
            nonlocal calls
            calls += 1
            os.write(progress, b".")
            if calls == kill_at:
                time.sleep(120)  # SIGKILLed here
            return real(*args, **kwargs)

        return call

    for name in COUNTED:
        setattr(os, name, counted(getattr(os, name)))
    write()


def _kill_before(kill_at: int, write: Callable[[], None]) -> tuple[int, bool]:
    """Fork a child that runs ``write`` and SIGKILL it before its ``kill_at``-th counted call
    (never for 0, or past its last call). Returns (the calls it reported, whether it was killed)."""
    read, progress = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        code = 1
        try:
            os.close(read)
            _child(kill_at, progress, write)
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(progress)
    seen, killed = 0, False
    try:
        while not killed:
            ready, _, _ = select.select([read], [], [], 120)
            assert ready, f"the child stalled after {seen} calls"
            chunk = os.read(read, 4096)
            if not chunk:
                break
            seen += len(chunk)
            if seen >= kill_at > 0:
                os.kill(pid, signal.SIGKILL)
                killed = True
    finally:
        os.close(read)
        _, status = os.waitpid(pid, 0)
    assert killed or os.waitstatus_to_exitcode(status) == 0, f"the child failed: status {status}"
    return seen, killed


def _files(folder: Path) -> dict[str, bytes]:
    if not folder.is_dir():
        return {}
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != OUT_MANIFEST}


def _leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoadedStudy]:
    folder = tmp_path_factory.mktemp("set")
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump({**BASE_STUDY, "storage": f"sqlite:///{folder}/s.db"}, sort_keys=False))
    yield load_study(path)


def _reference(loaded: LoadedStudy, out: Path) -> dict[str, dict[str, bytes]]:
    """Each generation's files, written whole into ``out`` (their own paths inside them); ``out``
    is left holding the old one, and the check run's ``run/result.json``."""
    sets = {}
    for generation in ("new", "old"):
        _write(loaded, out, generation)
        sets[generation] = _files(out)
    (out / "run").mkdir()
    (out / "run" / "result.json").write_text(RESULT)
    differing = [n for n in sets["old"] if sets["old"][n] != sets["new"].get(n)]
    assert set(sets["old"]) == set(sets["new"]) and len(differing) >= 5, differing
    return sets


@pytest.mark.parametrize(  # the fallback's kill points in the slow suite
    "exchange", ["renameat2", pytest.param("two renames", marks=pytest.mark.slow)]
)
def test_a_kill_at_any_point_leaves_one_whole_set(
    loaded: LoadedStudy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: str
) -> None:
    if exchange == "two renames":  # what a filesystem without RENAME_EXCHANGE takes (as if here)
        monkeypatch.setattr("explorer.paths._exchange", lambda a, b: False)
    out = tmp_path / "best"
    sets = _reference(loaded, out)
    calls, killed = _kill_before(0, lambda: _write(loaded, out, "new"))  # every kill point, counted
    assert not killed and calls >= 8 and _files(out) == sets["new"]
    _write(loaded, out, "old")
    outcomes: dict[int, str] = {}
    after: dict[int, str] = {}
    for kill_at in range(1, calls + 1):
        _kill_before(kill_at, lambda: _write(loaded, out, "new"))
        outcomes[kill_at] = _state(_files(out), sets)
        if not out.exists() and exchange == "two renames":  # killed between the two renames
            aside = [n for n in _leftovers(out) if ".old-" in n]
            outcomes[kill_at] = f"none; the old folder aside: {_state(_files(out.parent / aside[0]), sets)}"
        left = _leftovers(out)
        _write(loaded, out, "old")  # the next write clears what the kill left, and keeps run/
        kept = (out / "run" / "result.json").read_text() if (out / "run").is_dir() else None
        stray = sorted(set(os.listdir(out)) - {*sets["old"], OUT_MANIFEST, "run"}) + _leftovers(out)
        if len(left) > 2 or _state(_files(out), sets) != "old" or kept != RESULT or stray:
            after[kill_at] = f"left {left}; then {_state(_files(out), sets)}, run/ {kept!r}, stray {stray}"
    mixed = {k: v for k, v in outcomes.items() if v not in ("old", "new", "none; the old folder aside: old")}
    assert not mixed, f"{len(mixed)} of {len(outcomes)} kills left a mixed set: {mixed}"
    assert not after, f"the next write after {len(after)} of {len(outcomes)} kills: {after}"
    assert {"old", "new"} <= set(outcomes.values()), outcomes  # the kills spanned the swap


def _state(found: dict[str, bytes], sets: dict[str, dict[str, bytes]]) -> str:
    """The generation whose every file ``found`` holds, or which file is whose."""
    whose = {n: {g for g, files in sets.items() if found.get(n) == files[n]} for n in sorted(sets["old"])}
    whole = set.intersection(*whose.values())
    if whole:
        return whole.pop()
    return "a mix: " + ", ".join(f"{n} {'/'.join(sorted(g)) or 'neither'}" for n, g in whose.items())


def test_a_kill_while_a_new_folder_is_written_leaves_none_or_the_whole_set(
    loaded: LoadedStudy, tmp_path: Path
) -> None:
    out = tmp_path / "fresh" / "best"
    calls, _ = _kill_before(0, lambda: _write(loaded, out, "new"))
    whole = _files(out)
    partial = {}
    for kill_at in range(1, calls + 1):
        if out.parent.exists():  # the kill may come before the first folder is made
            shutil.rmtree(out.parent)
        _kill_before(kill_at, lambda: _write(loaded, out, "new"))
        if _files(out) not in ({}, whole):
            partial[kill_at] = sorted(_files(out))
    assert not partial, f"{len(partial)} of {calls} kills left a part of the set: {partial}"
    _write(loaded, out, "new")
    assert _files(out) == whole and _leftovers(out) == []


def test_a_folder_holding_a_users_file_is_refused_nothing_written(
    loaded: LoadedStudy, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    _write(loaded, out, "old")
    before = _files(out)
    (out / "notes.md").write_text("mine")
    with pytest.raises(SpecError, match=r"notes.md exists and was not written by explorer.*nothing written"):
        _write(loaded, out, "new")
    assert _files(out) == {**before, "notes.md": b"mine"} and _leftovers(out) == []
    (out / "notes.md").unlink()
    os.chmod(out, 0o750)
    _write(loaded, out, "new")  # the folder keeps its mode
    assert (os.stat(out).st_mode & 0o777) == 0o750 and os.access(out / "launch.sh", os.X_OK)
    assert sorted((out / OUT_MANIFEST).read_text().split()) == sorted(_files(out))


def test_the_current_folder_is_refused(
    loaded: LoadedStudy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "here"
    _write(loaded, out, "old")
    before = _files(out)
    monkeypatch.chdir(out)
    with pytest.raises(SpecError, match="holds the current folder"):
        _write(loaded, Path("."), "new")
    assert _files(out) == before
