"""Every test runs against a private AIT_HOME (model cache, baselines, hidden secret)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

# Set before any test module imports ait, so nothing ever touches the user's ~/.ait.
_HOME = tempfile.mkdtemp(prefix="ait-test-home-")
_HOME_OWNER = os.getpid()
os.environ["AIT_HOME"] = _HOME
os.environ.pop("AIT_HIDDEN_SEED", None)
os.environ.pop("AIT_BASELINES", None)
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
# Ray reads these when it is first imported (any test may import it first): a private Ray
# binds and advertises loopback only, and reports no usage.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session")
def ait_home() -> str:
    return _HOME


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the private AIT_HOME (converted models, baselines, hidden sets; 276 runs had left theirs
    in /tmp). Only the process that made it removes it, never a forked child, and
    AIT_KEEP_TEST_HOME=1 keeps it for a look after a failure."""
    if os.getpid() == _HOME_OWNER and not os.environ.get("AIT_KEEP_TEST_HOME"):
        shutil.rmtree(_HOME, ignore_errors=True)
