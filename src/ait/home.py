"""Where ait keeps state outside every workspace: model cache, baselines, the hidden secret.

`AIT_HOME` (default ~/.ait) is never mounted or copied into a workspace; the hidden
eval seed is derived from a secret stored here (or `AIT_HIDDEN_SEED`), so no TaskSpec,
workspace or agent-written file can carry it.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path


class HomeError(OSError):
    """AIT_HOME cannot be created or written; the message says which directory and what to do."""


def ait_home() -> Path:
    home = Path(os.environ.get("AIT_HOME") or Path.home() / ".ait").expanduser()
    if home.exists() and not home.is_dir():
        raise HomeError(20, f"AIT_HOME {home} is not a directory: point AIT_HOME at a writable directory")
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise HomeError(e.errno, f"AIT_HOME {home} cannot be created ({e.strerror}): point AIT_HOME at a "
                                 "writable directory") from None
    if not os.access(home, os.W_OK | os.X_OK):
        raise HomeError(13, f"AIT_HOME {home} is not writable: point AIT_HOME at a writable directory")
    return home


def models_dir() -> Path:
    d = ait_home() / "models"
    d.mkdir(parents=True, exist_ok=True)
    return d


def baselines_path() -> Path:
    return Path(os.environ.get("AIT_BASELINES") or ait_home() / "baselines.json")


def hidden_secret() -> str:
    """The secret the hidden eval seeds derive from: `AIT_HIDDEN_SEED`, else a per-install
    random value created once (mode 0600)."""
    env = os.environ.get("AIT_HIDDEN_SEED")
    if env:
        return env
    path = ait_home() / "hidden_secret"
    if not path.exists():
        # Write to a private temp file (mkstemp: mode 0600, a name of its own for every writer, threads of
        # one process included), then link it into place: writers racing here all end up reading the one
        # secret that won, and nobody rewrites it once linked.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".hidden_secret.")
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(16))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    return path.read_text().strip()
