"""A warm zygote's children start from a state that holds nothing of an earlier run: one request's
output (its reply, its log tail) cannot be found in the memory of the next request's child."""

from __future__ import annotations

import os

import pytest

from ait.sandbox import SandboxPolicy, run_untrusted
from ait.sandbox.zygote import Zygote, read_request_line

# Joined at run time in the scanner (a constant "a" + "b" is folded at compile time) so that
# nothing of its own holds the secret whole.
SECRET = "PREVIOUS-RUN-" + "7f3a91c2"
SCAN = ("import gc; t = '-'.join(['PREVIOUS', 'RUN', '7f3a91c2']); "
        "hits = [o for o in gc.get_objects() if isinstance(o, (dict, list, tuple)) and any("
        "isinstance(v, (str, bytes)) and t in (v if isinstance(v, str) else v.decode('latin-1')) "
        "for v in (o.values() if isinstance(o, dict) else o))]; "
        "print('FOUND' if hits else 'CLEAN', len(hits))")


@pytest.fixture
def zygote(tmp_path):
    z = Zygote([], env={"HOME": str(tmp_path), "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    yield z
    z.close()


def run(zygote, tmp_path, stmt: str, name: str):
    work = tmp_path / name
    work.mkdir()
    return run_untrusted(["-m", "timeit", "-n", "1", "-r", "1", stmt], cwd=work, timeout_s=60,
                         log_path=tmp_path / f"{name}.log", policy=SandboxPolicy(write=[str(work)]), zygote=zygote)


def test_the_next_child_cannot_find_the_previous_runs_output(zygote, tmp_path):
    first = run(zygote, tmp_path, f"print({SECRET!r})", "first")
    assert first.returncode == 0 and SECRET in first.log_tail
    pid = zygote.proc.pid
    second = run(zygote, tmp_path, SCAN, "second")
    assert zygote.proc.pid == pid  # the same warm zygote served both
    assert second.returncode == 0 and "CLEAN 0" in second.log_tail, second.log_tail


def test_a_request_line_is_read_without_taking_the_next_one():
    read, write = os.pipe()
    os.write(write, b'{"a": 1}\n{"b": 2}\n')
    os.close(write)
    assert read_request_line(read) == b'{"a": 1}'
    assert read_request_line(read) == b'{"b": 2}'
    assert read_request_line(read) is None
    os.close(read)
