"""Keep the arc's newest bundle between sessions, in git history but out of the working tree.

    python bench/arc_keep.py save       # after bench/arc_collect.py: commit ARC/bundle and ARC/step0, then take them out
    python bench/arc_keep.py restore    # on a fresh checkout: bring them back from history into ARC/
    python bench/arc_keep.py show       # which steps history holds, and in which commits

Why both: every tracked file travels with every device call, whose limit is 64 MiB, so a bundle that
stays in the tree would leave no room to stage the models. But the git-ignored `.arc/` is lost with the
checkout: on 2026-12-07 a new checkout came without it, and the arc's step-8 bundle with it (the arc
restarted from its warm start). So `save` commits the pieces in one commit and removes them from the
index in the next: history holds them, the tree does not carry them. `restore` finds the newest commit
that added each folder's record (bundle.json), writes its files back and checks every piece against
that record's sha256. It only ever commits ARC's folders, whatever else is staged.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

FOLDERS = ("bundle", "step0")  # the newest step's bundle; the warm start's (the transfer at the arc's end)


def git(*args: str, cwd: Path, binary: bool = False) -> str | bytes:
    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=False)
    if out.returncode != 0:
        said = (out.stderr or out.stdout).decode(errors="replace").strip()
        raise SystemExit(f"git {' '.join(args[:2])}: {said}")
    return out.stdout if binary else out.stdout.decode()


def record(folder: Path) -> dict | None:
    path = folder / "bundle.json"
    return json.loads(path.read_text()) if path.is_file() else None


def check(folder: Path, rec: dict) -> list[str]:
    """What in `folder` does not match its record (missing pieces, other sizes or sha256)."""
    bad = []
    for piece in rec.get("pieces", []):
        p = folder / piece["name"]
        if not p.is_file():
            bad.append(f"{piece['name']}: missing")
        elif p.stat().st_size != piece["bytes"] or hashlib.sha256(p.read_bytes()).hexdigest() != piece["sha256"]:
            bad.append(f"{piece['name']}: size or sha256 differs from the record")
    return bad


def newest_commit(root: Path, rel: str) -> str | None:
    """The newest commit that added REL/bundle.json (each save adds it; the next commit removes it)."""
    sha = git("log", "-1", "--format=%H", "--diff-filter=A", "--", f"{rel}/bundle.json", cwd=root).strip()
    return sha or None


def keep_in_history(root: Path, files: list[str], keep_msg: str, out_msg: str) -> str:
    """Two commits on HEAD: its tree plus `files`, then its tree again. Built beside the index (a
    throwaway one), so whatever else is staged stays staged and the tree after is HEAD's before."""
    head = git("rev-parse", "HEAD", cwd=root).strip()
    index = (root / git("rev-parse", "--git-path", "arc_keep.index", cwd=root).strip()).resolve()
    env_git = lambda *a: subprocess.run(["git", *a], cwd=root, capture_output=True, text=True, check=True,  # noqa: E731
                                        env={**os.environ, "GIT_INDEX_FILE": str(index)}).stdout.strip()
    try:
        env_git("read-tree", head)
        env_git("add", "-f", "--", *files)
        tree = env_git("write-tree")
    finally:
        index.unlink(missing_ok=True)
    kept = git("commit-tree", tree, "-p", head, "-m", keep_msg, cwd=root).strip()
    out = git("commit-tree", f"{head}^{{tree}}", "-p", kept, "-m", f"{out_msg} (in {kept[:12]})", cwd=root).strip()
    git("update-ref", "-m", "arc_keep", "HEAD", out, head, cwd=root)
    return kept


def save(root: Path, arc: Path) -> int:
    rel_arc = arc.resolve().relative_to(root)
    saved = 0
    for name in FOLDERS:
        folder, rel = arc / name, f"{rel_arc}/{name}"
        rec = record(folder)
        if rec is None:
            continue
        if bad := check(folder, rec):
            raise SystemExit(f"{folder}: does not match its record ({'; '.join(bad)}): run bench/arc_collect.py again")
        last = newest_commit(root, rel)
        if last and json.loads(git("show", f"{last}:{rel}/bundle.json", cwd=root)) == rec:
            print(f"{rel}: step {rec['step']} is already in {last[:12]}")
            continue
        files = [f"{rel}/bundle.json", *(f"{rel}/{p['name']}" for p in rec["pieces"])]
        kept = keep_in_history(root, files, f"Arc state: {name} step {rec['step']} from {rec.get('machine', '?')}, kept "
                               "in history (the next commit takes it out of the tree; bench/arc_keep.py restore brings it back)",
                               f"Arc state: {name} step {rec['step']} out of the tree again")
        print(f"{rel}: step {rec['step']} kept in {kept[:12]} ({sum(p['bytes'] for p in rec['pieces']) / 2**20:.1f} MiB)")
        saved += 1
    return saved


def restore(root: Path, arc: Path) -> int:
    rel_arc = arc.resolve().relative_to(root)
    restored = 0
    for name in FOLDERS:
        folder, rel = arc / name, f"{rel_arc}/{name}"
        sha = newest_commit(root, rel)
        if sha is None:
            print(f"{rel}: history holds none")
            continue
        rec = json.loads(git("show", f"{sha}:{rel}/bundle.json", cwd=root))
        if record(folder) == rec and not check(folder, rec):
            print(f"{rel}: step {rec['step']} already here")
            continue
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            old.unlink()
        (folder / "bundle.json").write_text(json.dumps(rec, indent=1) + "\n")
        for piece in rec["pieces"]:
            (folder / piece["name"]).write_bytes(git("show", f"{sha}:{rel}/{piece['name']}", cwd=root, binary=True))
        if bad := check(folder, rec):
            raise SystemExit(f"{rel} from {sha[:12]}: {'; '.join(bad)}")
        print(f"{rel}: step {rec['step']} restored from {sha[:12]}")
        restored += 1
    return restored


def show(root: Path, arc: Path) -> None:
    rel_arc = arc.resolve().relative_to(root)
    for name in FOLDERS:
        rel = f"{rel_arc}/{name}"
        for line in git("log", "--format=%H %cs", "--diff-filter=A", "--", f"{rel}/bundle.json", cwd=root).splitlines():
            sha, day = line.split()
            rec = json.loads(git("show", f"{sha}:{rel}/bundle.json", cwd=root))
            print(f"{rel}: step {rec['step']} from {rec.get('machine', '?')} in {sha[:12]} ({day})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=("save", "restore", "show"))
    ap.add_argument("--arc", type=Path, default=Path(".arc"), help="the git-ignored folder bench/arc_collect.py fills")
    a = ap.parse_args(argv)
    root = Path(git("rev-parse", "--show-toplevel", cwd=Path.cwd()).strip())
    arc = a.arc if a.arc.is_absolute() else Path.cwd() / a.arc
    try:
        arc.resolve().relative_to(root)
    except ValueError:
        ap.error(f"--arc {a.arc}: must be inside the repository ({root})")
    if a.action == "save":
        save(root, arc)
    elif a.action == "restore":
        restore(root, arc)
    else:
        show(root, arc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
