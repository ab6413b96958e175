"""The agent's file tools, confined to one workspace directory.

The agent names files by relative path. Every call is checked twice: lexically (no
absolute paths, no `..`, no NUL) and by resolving the path on disk (symlinks followed,
parents included) and comparing it with the resolved root. Writes go further and refuse
any symlink on the way, and open the final component with O_NOFOLLOW, so a link the
agent's own code planted in the workspace cannot redirect a harness write.

Every mistake is a ToolError whose message is shown to the agent verbatim, so each one
says what was wrong and what to do instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

BINARY_SNIFF_BYTES = 8192  # NUL bytes in this prefix mark a file as binary
MISSING_FILE_HINT = 20  # how many existing files to name when a read misses


class ToolError(Exception):
    """A tool call the agent got wrong; str(e) is shown to the agent verbatim,
    so it must say what was wrong and what to do."""


class WorkspaceTools:
    def __init__(
        self,
        root: str | Path,
        read_only: Iterable[str] = ("INSTRUCTIONS.md", "task.json"),
        max_file_bytes: int = 256_000,
        max_files: int = 200,
    ) -> None:
        # Resolve once: every later containment check compares against the real root.
        self.root = Path(os.path.realpath(root))
        if not self.root.is_dir():
            raise ValueError(f"workspace root {root} is not a directory")
        self.read_only = frozenset(os.path.normpath(p) for p in read_only)
        self.max_file_bytes = max_file_bytes
        self.max_files = max_files

    # ---- the tools ----------------------------------------------------------------

    def list_files(self) -> str:
        lines = []
        for rel, full in self._walk():
            if os.path.islink(full):
                lines.append((rel, self._describe_link(rel, full)))
            elif not os.path.isdir(full):
                lines.append((rel, f"{rel} ({os.lstat(full).st_size} bytes)"))
        return "\n".join(line for _, line in sorted(lines)) or "(empty)"

    def read_file(self, path: str) -> str:
        return self._read_bytes(self._clean(path)).decode("utf-8", errors="replace")

    def write_file(self, path: str, content: str) -> str:
        if not isinstance(content, str):
            raise ToolError(f"write_file content must be a string, got {type(content).__name__}")
        if "\0" in content:
            raise ToolError("write_file takes text; the content contains NUL bytes")
        data = content.encode("utf-8")
        if len(data) > self.max_file_bytes:
            raise ToolError(
                f"content is {len(data)} bytes, over the limit of {self.max_file_bytes} bytes; "
                "make it smaller or split it across files"
            )
        rel = self._writable(path)
        if not os.path.lexists(self.root / rel) and self._count_files() >= self.max_files:
            raise ToolError(
                f"the workspace already holds {self.max_files} files, the limit; "
                f"overwrite an existing file instead of creating {rel}"
            )
        self._write(rel, data)
        return f"wrote {rel} ({len(data)} bytes)"

    def edit_file(self, path: str, old: str, new: str) -> str:
        if not isinstance(old, str) or not isinstance(new, str):
            raise ToolError("edit_file takes text: old and new must both be strings")
        if not old:
            raise ToolError("edit_file needs non-empty old text to find; use write_file to replace a whole file")
        rel = self._writable(path)
        try:
            # Strict here: round-tripping through errors='replace' would corrupt non-UTF-8 bytes.
            text = self._read_bytes(rel).decode("utf-8")
        except UnicodeDecodeError:
            raise ToolError(f"{rel} is not valid UTF-8; rewrite it whole with write_file") from None
        count = text.count(old)
        if count != 1:
            where = "was not found" if count == 0 else f"occurs {count} times"
            raise ToolError(
                f"old text {where} in {rel}; edit_file needs exactly one match: "
                + ("copy it exactly from read_file, whitespace included" if count == 0
                   else "include more surrounding lines so it matches once")
            )
        updated = text.replace(old, new, 1)
        return self.write_file(rel, updated).replace("wrote", "edited", 1)

    # ---- path checks ----------------------------------------------------------------

    def _read_bytes(self, rel: str) -> bytes:
        real = self._resolve_inside(rel)
        if not os.path.exists(real):
            raise ToolError(f"no such file: {rel}. {self._existing_hint()}")
        if os.path.isdir(real):
            raise ToolError(f"{rel} is a directory; read_file takes a file (use list_files to see what is inside)")
        if not os.path.isfile(real):
            # FIFOs and devices could block the harness; only regular files are readable.
            raise ToolError(f"{rel} is not a regular file and cannot be read")
        size = os.path.getsize(real)
        if size > self.max_file_bytes:
            raise ToolError(f"{rel} is {size} bytes, over the read limit of {self.max_file_bytes} bytes")
        with open(real, "rb") as f:
            data = f.read(self.max_file_bytes + 1)
        if b"\0" in data[:BINARY_SNIFF_BYTES]:
            raise ToolError(f"{rel} looks binary (it contains NUL bytes); read_file only shows text files")
        return data

    def _clean(self, path: object) -> str:
        """Lexical checks; returns the normalised relative path (with '/' separators)."""
        if not isinstance(path, str):
            raise ToolError(f"path must be a string, got {type(path).__name__}")
        if not path.strip():
            raise ToolError("path is empty; give a path relative to the workspace, e.g. env.py")
        if "\0" in path:
            raise ToolError("path contains a NUL byte; give a plain relative path, e.g. env.py")
        if os.path.isabs(path):
            raise ToolError(f"{path} is an absolute path; give a path relative to the workspace, e.g. env.py")
        # Refuse any `..`, even a harmless one: there is never a reason to climb.
        if ".." in path.replace("\\", "/").split("/"):
            raise ToolError(f"{path} uses '..'; paths must stay inside the workspace, e.g. data/rows.json")
        rel = os.path.normpath(path)
        if rel == ".":
            raise ToolError(f"{path} names the workspace itself; give a file path, e.g. env.py")
        return rel

    def _resolve_inside(self, rel: str) -> str:
        """Follow every symlink (parents included) and insist the result is under the root."""
        real = os.path.realpath(self.root / rel)
        if not self._inside(real):
            raise ToolError(f"{rel} resolves outside the workspace (through a symlink) and cannot be used")
        return real

    def _inside(self, real: str) -> bool:
        return os.path.commonpath([self.root, real]) == str(self.root)

    def _writable(self, path: object) -> str:
        rel = self._clean(path)
        target = self.root / rel
        if rel in self.read_only or self._same_as_read_only(target):
            raise ToolError(f"{rel} is read-only: it is part of the task; put your work in other files, e.g. env.py")
        # No symlink anywhere on the way, even one pointing inside: the harness never
        # writes through a link the agent (or its code) planted.
        cur = self.root
        for part in Path(rel).parts:
            cur = cur / part
            if cur.is_symlink():
                link = cur.relative_to(self.root)
                raise ToolError(f"{link} is a symlink; files are never written through links, use a real path")
            if not cur.exists():
                break
            if cur != target and not cur.is_dir():
                raise ToolError(f"{cur.relative_to(self.root)} is a file, so {rel} cannot be created under it")
        self._resolve_inside(rel)  # second guard, independent of the walk above
        if target.is_dir():
            raise ToolError(f"{rel} is a directory; give a file path inside it, e.g. {rel}/notes.txt")
        return rel

    def _same_as_read_only(self, target: Path) -> bool:
        # Catches another spelling of the same file (case-insensitive filesystems, hard links).
        if not target.exists():
            return False
        return any(
            (self.root / ro).exists() and os.path.samefile(target, self.root / ro) for ro in self.read_only
        )

    def _write(self, rel: str, data: bytes) -> None:
        target = self.root / rel
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            # O_NOFOLLOW: if a symlink appeared after the checks, the open fails instead of following it.
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            raise ToolError(f"cannot write {rel}: {e.strerror}") from None
        with os.fdopen(fd, "wb") as f:
            f.write(data)

    # ---- listing helpers ------------------------------------------------------------

    def _walk(self) -> Iterable[tuple[str, str]]:
        """Every entry under the root as (relative path, full path); symlinked dirs are not entered."""
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=False):
            for name in dirnames + filenames:
                full = os.path.join(dirpath, name)
                yield os.path.relpath(full, self.root), full

    def _describe_link(self, rel: str, full: str) -> str:
        real = os.path.realpath(full)
        if not self._inside(real):
            return f"{rel} -> (outside the workspace, ignored)"
        target = os.path.relpath(real, self.root)
        if os.path.isdir(real):
            return f"{rel} -> {target}/ (link to a directory)"
        if not os.path.exists(real):
            return f"{rel} -> {target} (broken link)"
        return f"{rel} -> {target} ({os.path.getsize(real)} bytes)"

    def _files(self) -> list[str]:
        """Files the agent can use: not directories, not links that lead outside."""
        return sorted(
            rel
            for rel, full in self._walk()
            if self._inside(os.path.realpath(full)) and not os.path.isdir(os.path.realpath(full))
        )

    def _count_files(self) -> int:
        # Count every non-directory entry, links that lead outside included: the limit is on entries.
        return sum(1 for _, full in self._walk() if os.path.islink(full) or not os.path.isdir(full))

    def _existing_hint(self) -> str:
        files = self._files()
        if not files:
            return "The workspace is empty."
        more = f" (and {len(files) - MISSING_FILE_HINT} more)" if len(files) > MISSING_FILE_HINT else ""
        return "Files that exist: " + ", ".join(files[:MISSING_FILE_HINT]) + more
