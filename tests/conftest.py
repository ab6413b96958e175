"""Every test runs against a private AIT_HOME (model cache, baselines, hidden secret)."""

from __future__ import annotations

import os
import tempfile

import pytest

# Set before any test module imports ait, so nothing ever touches the user's ~/.ait.
_HOME = tempfile.mkdtemp(prefix="ait-test-home-")
os.environ["AIT_HOME"] = _HOME
os.environ.pop("AIT_HIDDEN_SEED", None)
os.environ.pop("AIT_BASELINES", None)
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.fixture(scope="session")
def ait_home() -> str:
    return _HOME
