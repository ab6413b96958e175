"""bench/arc_keep.py: the arc's newest bundle kept in git history, out of the tree, and brought back."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("arc_keep", ROOT / "bench" / "arc_keep.py")
keep = importlib.util.module_from_spec(spec)
spec.loader.exec_module(keep)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(tmp_path, monkeypatch):
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    git(r, "config", "user.email", "t@example.invalid")
    git(r, "config", "user.name", "t")
    (r / ".gitignore").write_text("/.arc/\n")
    (r / "README").write_text("x\n")
    git(r, "add", ".")
    git(r, "commit", "-q", "-m", "init")
    monkeypatch.chdir(r)
    return r


def put(folder: Path, step: int, payload: bytes) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    pieces = []
    for i in range(0, len(payload), 1000):
        p = folder / f"bundle.tar.part-{i // 1000:02d}"
        p.write_bytes(payload[i:i + 1000])
        pieces.append({"name": p.name, "bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()})
    rec = {"step": step, "pieces": pieces}
    (folder / "bundle.json").write_text(json.dumps(rec))
    return rec


def test_save_keeps_the_pieces_in_history_but_not_in_the_tree_and_restore_brings_the_newest_back(repo):
    put(repo / ".arc" / "bundle", 3, bytes(range(256)) * 9)
    put(repo / ".arc" / "step0", 0, b"warm" * 700)
    (repo / "other.txt").write_text("staged, not the arc's\n")
    git(repo, "add", "other.txt")
    assert keep.main(["save"]) == 0
    assert git(repo, "ls-files", ".arc") == ""                       # out of the tree: device calls do not carry it
    assert "other.txt" in git(repo, "diff", "--cached", "--name-only")  # someone else's staged change left alone
    newest = put(repo / ".arc" / "bundle", 4, b"\x07newer" * 500)
    keep.main(["save"])
    assert keep.main(["save"]) == 0                                    # nothing new: no commit
    log = git(repo, "log", "--format=%s")
    assert log.count("kept in history") == 3 and log.count("out of the tree again") == 3

    subprocess.run(["rm", "-rf", str(repo / ".arc")], check=True)      # the checkout is new: .arc/ is gone
    keep.main(["restore"])
    assert json.loads((repo / ".arc" / "bundle" / "bundle.json").read_text()) == newest
    assert b"".join((repo / ".arc" / "bundle" / p["name"]).read_bytes() for p in newest["pieces"]) == b"\x07newer" * 500
    assert (repo / ".arc" / "step0" / "bundle.tar.part-00").read_bytes() == (b"warm" * 700)[:1000]
    assert not keep.check(repo / ".arc" / "step0", json.loads((repo / ".arc" / "step0" / "bundle.json").read_text()))


def test_save_refuses_pieces_that_do_not_match_their_record(repo):
    put(repo / ".arc" / "bundle", 2, b"a" * 2500)
    (repo / ".arc" / "bundle" / "bundle.tar.part-01").write_bytes(b"b" * 1000)
    with pytest.raises(SystemExit, match="part-01: size or sha256 differs"):
        keep.main(["save"])
    assert "kept in history" not in git(repo, "log", "--format=%s")


def test_restore_with_nothing_kept_changes_nothing(repo, capsys):
    keep.main(["restore"])
    assert not (repo / ".arc").exists()
    assert "history holds none" in capsys.readouterr().out
