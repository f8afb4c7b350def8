"""Where explorer may write: never a run folder at the filesystem root or in a system folder, and
never over a file of the user's in a folder given with ``--out``."""

from __future__ import annotations

from pathlib import Path

import pytest

from explorer.cli import main
from explorer.errors import SpecError
from explorer.paths import OUT_MANIFEST, check_run_folder, claim_out


@pytest.mark.parametrize("folder", ["/", "/etc", "/etc/explorer", "/usr/local/runs", "/tmp", "~"])
def test_optimize_refuses_a_run_folder_at_the_root_or_a_system_folder(
    write_study, tmp_path: Path, capsys: pytest.CaptureFixture[str], folder: str
) -> None:
    before = {p.name for p in Path("/etc").iterdir()}
    path = write_study(
        {"storage": f"sqlite:///{tmp_path}/s.db", "output_dir": str(Path(folder).expanduser())}
    )
    assert main(["optimize", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "output_dir" in err[0] and str(path) in err[0], err
    assert {p.name for p in Path("/etc").iterdir()} == before  # no .explorer-study, trial-*, best
    assert not (tmp_path / "s.db").exists()  # nothing written, the storage included


def test_a_folder_of_ones_own_inside_a_shared_top_folder_is_fine(tmp_path: Path) -> None:
    check_run_folder(tmp_path / "runs", file="study.yaml")  # /tmp/pytest-.../runs
    with pytest.raises(SpecError, match="system folder /etc"):
        check_run_folder(Path("/etc/../etc/ssh"), file="study.yaml")


def test_out_never_overwrites_a_file_explorer_did_not_write(tmp_path: Path) -> None:
    out = tmp_path / "site"
    out.mkdir()
    (out / "index.html").write_text("the user's page")
    with pytest.raises(SpecError, match=r"index.html exists and was not written by explorer"):
        claim_out(out, ["index.html", "data.csv"], field="--out")
    assert (out / "index.html").read_text() == "the user's page"
    assert not (out / OUT_MANIFEST).exists()  # nothing written
    # a new folder, then a second run into it: explorer's own files may be replaced
    fresh = tmp_path / "fresh"
    claim_out(fresh, ["index.html", "data.csv"], field="--out")
    (fresh / "index.html").write_text("explorer's page")
    claim_out(fresh, ["index.html", "history.png"], field="--out")
    assert (fresh / OUT_MANIFEST).read_text().split() == ["data.csv", "history.png", "index.html"]
    # a file the user adds later, under a name explorer did not write before, is theirs
    (fresh / "notes.md").write_text("mine")
    with pytest.raises(SpecError, match="notes.md exists"):
        claim_out(fresh, ["notes.md"], field="--out")


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.builders import replayed_plan_studies

    return replayed_plan_studies(tmp_path_factory.mktemp("outs"))[0]


@pytest.mark.parametrize(
    ("verb", "theirs", "args"),
    [
        ("report", "index.html", ["--out", "{d}"]),
        ("export", "data.csv", ["--out", "{d}/data.csv"]),
        ("best", "launch.sh", ["--out", "{d}"]),
        ("plan", "launch.sh", ["--tokens", "1e8", "--out", "{d}"]),
    ],
)
def test_each_verb_keeps_the_users_file_and_replaces_its_own(
    replayed: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    verb: str,
    theirs: str,
    args: list[str],
) -> None:
    users = tmp_path / "users"
    users.mkdir()
    (users / theirs).write_text("the user's own")
    argv = [verb, str(replayed), *(a.format(d=users) for a in args)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{users / theirs} exists and was not written by explorer" in err[0], err
    assert (users / theirs).read_text() == "the user's own" and sorted(p.name for p in users.iterdir()) == [
        theirs
    ]
    # a folder of explorer's own: written, then written again over its own files
    ours = tmp_path / "ours"
    argv = [verb, str(replayed), *(a.format(d=ours) for a in args)]
    assert main(argv) == 0
    assert main(argv) == 0 and (ours / theirs).is_file()
    assert theirs in (ours / OUT_MANIFEST).read_text().split()
