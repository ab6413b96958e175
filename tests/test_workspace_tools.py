"""Workspace file tools: round trips, confinement (paths and symlinks), read-only files, limits."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ait.harness.workspace_tools import ToolError, WorkspaceTools


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "INSTRUCTIONS.md").write_text("do the thing\n")
    (root / "task.json").write_text("{}")
    return root


@pytest.fixture
def tools(ws: Path) -> WorkspaceTools:
    return WorkspaceTools(ws, max_file_bytes=1000, max_files=5)


def outside_snapshot(tmp_path: Path) -> set[str]:
    """Everything under the tmp dir except the workspace, to prove nothing leaked out."""
    return {str(p) for p in tmp_path.rglob("*") if "ws" not in p.relative_to(tmp_path).parts[:1]}


def test_round_trip(tools: WorkspaceTools, ws: Path) -> None:
    assert tools.write_file("env.py", "x = 1\n") == "wrote env.py (6 bytes)"
    assert tools.read_file("env.py") == "x = 1\n"
    assert tools.write_file("data/deep/rows.txt", "é") == "wrote data/deep/rows.txt (2 bytes)"
    assert (ws / "data" / "deep" / "rows.txt").read_text(encoding="utf-8") == "é"
    assert tools.edit_file("env.py", "x = 1", "x = 2").startswith("edited env.py")
    assert tools.read_file("./env.py") == "x = 2\n"


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "a/../../x", "sub/../../x", "", "  ", "a\0b", ".", "x/.."])
def test_bad_paths_refused(tools: WorkspaceTools, ws: Path, tmp_path: Path, bad: str) -> None:
    (ws / "sub").mkdir()
    before = outside_snapshot(tmp_path)
    with pytest.raises(ToolError):
        tools.read_file(bad)
    with pytest.raises(ToolError):
        tools.write_file(bad, "pwned")
    with pytest.raises(ToolError):
        tools.edit_file(bad, "a", "b")
    assert outside_snapshot(tmp_path) == before
    assert not (tmp_path / "x").exists()


def test_symlink_to_outside_file(tools: WorkspaceTools, ws: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("hidden eval")
    (ws / "link.txt").symlink_to(secret)
    for call in (
        lambda: tools.read_file("link.txt"),
        lambda: tools.write_file("link.txt", "pwned"),
        lambda: tools.edit_file("link.txt", "hidden", "pwned"),
    ):
        with pytest.raises(ToolError):
            call()
    assert secret.read_text() == "hidden eval"
    assert "link.txt -> (outside the workspace, ignored)" in tools.list_files()
    with pytest.raises(ToolError) as e:
        tools.read_file("nope.txt")
    assert "link.txt" not in str(e.value)  # the hint names only usable files


def test_symlinked_dir_to_outside(tools: WorkspaceTools, ws: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f.txt").write_text("orig")
    (ws / "out").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ToolError, match="symlink"):
        tools.write_file("out/new.txt", "pwned")
    with pytest.raises(ToolError):
        tools.write_file("out/f.txt", "pwned")
    with pytest.raises(ToolError, match="outside"):
        tools.read_file("out/f.txt")
    assert sorted(p.name for p in outside.iterdir()) == ["f.txt"]
    assert (outside / "f.txt").read_text() == "orig"


def test_no_write_through_inside_symlink(tools: WorkspaceTools, ws: Path) -> None:
    (ws / "real.txt").write_text("real")
    (ws / "alias.txt").symlink_to(ws / "real.txt")
    (ws / "alias_ro").symlink_to(ws / "INSTRUCTIONS.md")
    assert tools.read_file("alias.txt") == "real"  # reading through an inside link is fine
    with pytest.raises(ToolError, match="symlink"):
        tools.write_file("alias.txt", "changed")
    with pytest.raises(ToolError):
        tools.write_file("alias_ro", "changed")
    assert (ws / "real.txt").read_text() == "real"
    assert (ws / "INSTRUCTIONS.md").read_text() == "do the thing\n"


def test_read_only_files(tools: WorkspaceTools, ws: Path) -> None:
    for path in ("INSTRUCTIONS.md", "./INSTRUCTIONS.md", "task.json"):
        with pytest.raises(ToolError, match="is read-only"):
            tools.write_file(path, "x")
        with pytest.raises(ToolError, match="is read-only"):
            tools.edit_file(path, "{}", "x")
    assert tools.read_file("INSTRUCTIONS.md") == "do the thing\n"
    assert (ws / "task.json").read_text() == "{}"


def test_read_only_hard_link_refused(tools: WorkspaceTools, ws: Path) -> None:
    os.link(ws / "task.json", ws / "copy.json")
    with pytest.raises(ToolError, match="read-only"):
        tools.write_file("copy.json", "x")
    assert (ws / "task.json").read_text() == "{}"


def test_content_checks(tools: WorkspaceTools, ws: Path) -> None:
    with pytest.raises(ToolError, match="contains NUL bytes"):
        tools.write_file("a.txt", "a\0b")
    with pytest.raises(ToolError, match="got bytes"):
        tools.write_file("a.txt", b"abc")  # type: ignore[arg-type]
    with pytest.raises(ToolError, match="1001 bytes.*1000"):
        tools.write_file("a.txt", "x" * 1001)
    with pytest.raises(ToolError, match="1002 bytes"):
        tools.write_file("a.txt", "é" * 501)  # limit is on UTF-8 bytes, not characters
    assert not (ws / "a.txt").exists()


def test_read_errors(tools: WorkspaceTools, ws: Path) -> None:
    (ws / "big.txt").write_text("x" * 2000)
    (ws / "blob.bin").write_bytes(b"\x7fELF\0\0")
    (ws / "d").mkdir()
    with pytest.raises(ToolError, match="2000 bytes.*1000"):
        tools.read_file("big.txt")
    with pytest.raises(ToolError, match="binary"):
        tools.read_file("blob.bin")
    with pytest.raises(ToolError, match="directory"):
        tools.read_file("d")
    with pytest.raises(ToolError, match="no such file: nope.py.*INSTRUCTIONS.md"):
        tools.read_file("nope.py")


def test_write_onto_directory_or_under_file(tools: WorkspaceTools, ws: Path) -> None:
    (ws / "d").mkdir()
    with pytest.raises(ToolError, match="directory"):
        tools.write_file("d", "x")
    tools.write_file("f.txt", "x")
    with pytest.raises(ToolError, match="is a file"):
        tools.write_file("f.txt/g.txt", "x")


def test_edit_match_counts(tools: WorkspaceTools, ws: Path) -> None:
    tools.write_file("env.py", "a = 1\na = 1\n")
    with pytest.raises(ToolError, match="not found"):
        tools.edit_file("env.py", "b = 1", "b = 2")
    with pytest.raises(ToolError, match="occurs 2 times.*more surrounding"):
        tools.edit_file("env.py", "a = 1", "a = 2")
    assert (ws / "env.py").read_text() == "a = 1\na = 1\n"
    (ws / "latin.txt").write_bytes(b"caf\xe9 a")
    with pytest.raises(ToolError, match="UTF-8"):
        tools.edit_file("latin.txt", "a", "b")  # would corrupt the \xe9 byte
    assert (ws / "latin.txt").read_bytes() == b"caf\xe9 a"


def test_max_files(tools: WorkspaceTools, ws: Path) -> None:
    for i in range(3):  # 2 seeded + 3 = the limit of 5
        tools.write_file(f"f{i}.txt", "x")
    with pytest.raises(ToolError, match="holds 5 files"):
        tools.write_file("sub/one_more.txt", "x")
    assert not (ws / "sub").exists()
    assert tools.write_file("f0.txt", "overwrite is fine") == "wrote f0.txt (17 bytes)"


def test_list_files(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    tools = WorkspaceTools(root)
    assert tools.list_files() == "(empty)"
    tools.write_file("z.txt", "abc")
    tools.write_file("data/b.json", "{}")
    (root / "empty_dir").mkdir()
    (root / "ln").symlink_to("/etc/hostname")
    assert tools.list_files().splitlines() == [
        "data/b.json (2 bytes)",
        "ln -> (outside the workspace, ignored)",
        "z.txt (3 bytes)",
    ]


def test_o_nofollow_second_guard(
    tools: WorkspaceTools, ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Simulate a link planted after the checks ran (a race): the open itself must refuse it.
    secret = tmp_path / "secret.txt"
    secret.write_text("orig")
    (ws / "late.txt").symlink_to(secret)
    monkeypatch.setattr(WorkspaceTools, "_writable", lambda self, path: self._clean(path))
    with pytest.raises(ToolError, match="cannot write late.txt"):
        tools.write_file("late.txt", "pwned")
    assert secret.read_text() == "orig"
