"""bench/gpu.sh, the one GPU runner: its header documents exactly the stages it runs, and it parses.

CI has no GPU; the stages themselves run on the GPU machine (docs/gpu.md). What can break here is the
runner's shape: a stage added to the case statement but not to the header (nobody finds it), or one
the header promises that the script no longer runs.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

RUNNER = Path(__file__).resolve().parents[1] / "bench" / "gpu.sh"


def header_stages(text: str) -> set[str]:
    block = text.split("# Stages", 1)[1].split("\nset -uo", 1)[0]
    return set(re.findall(r"^#   ([a-z][a-z0-9-]*)\s{2,}", block, re.MULTILINE))


def case_stages(text: str) -> set[str]:
    body = text.split("run_stage() {", 1)[1].split("\n}\n", 1)[0]
    return set(re.findall(r"^    ([a-z][a-z0-9-]*)\)", body, re.MULTILINE))


def test_header_lists_exactly_the_stages_the_runner_runs():
    text = RUNNER.read_text()
    documented, run = header_stages(text), case_stages(text)
    assert {"surface", "arc", "packing", "inner-job", "agent-eval", "convert"} <= run
    assert documented == run, f"documented only: {documented - run}; run only: {run - documented}"


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_runner_parses_and_prints_its_stages_without_arguments(tmp_path):
    assert subprocess.run(["bash", "-n", str(RUNNER)]).returncode == 0
    # Without a stage it prints its header and exits 2, before it copies or starts anything.
    out = subprocess.run(["bash", str(RUNNER)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin",
                         "RESULTS": str(tmp_path / "r")})
    assert out.returncode == 2
    assert "surface" in out.stdout and "agent-eval" in out.stdout
    assert not (tmp_path / "r").exists()
