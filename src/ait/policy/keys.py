"""API keys and endpoints from the environment or a `.env` file; keys are never printed or logged.

Lookup order for each name: the process environment, then `./.env`, then `AIT_HOME/.env`.
A `.env` line is `NAME=value` (optionally `export NAME=value`, quoted values, `#` comments).
"""

from __future__ import annotations

import os
from pathlib import Path

from ait.home import ait_home

OPENROUTER_URL = "https://openrouter.ai/api/v1"


def parse_dotenv(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, value = line.split("=", 1)
        name = name.removeprefix("export ").strip()
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        elif " #" in value:  # an inline comment after an unquoted value
            value = value.split(" #", 1)[0].rstrip()
        if name:
            out[name] = value
    return out


def dotenv_paths() -> list[Path]:
    return [Path.cwd() / ".env", ait_home() / ".env"]


def lookup(name: str) -> str | None:
    """The variable from the environment, else the first .env that sets it (empty counts as unset)."""
    if os.environ.get(name):
        return os.environ[name]
    for path in dotenv_paths():
        try:
            value = parse_dotenv(path.read_text()).get(name)
        except OSError:
            continue
        if value:
            return value
    return None


def is_openrouter(base_url: str | None) -> bool:
    return bool(base_url) and "openrouter.ai" in str(base_url)


def resolve_endpoint(base_url: str | None) -> tuple[str | None, str]:
    """(base_url, api_key) for an OpenAI-compatible endpoint.

    An explicit base URL (or OPENAI_BASE_URL) takes AIT_API_KEY, the provider's own key
    (OPENROUTER_API_KEY for OpenRouter) or OPENAI_API_KEY; a local server with none of them gets a
    placeholder, since vLLM and friends accept any key. Without a base URL, OPENAI_API_KEY goes to
    the SDK's default endpoint and OPENROUTER_API_KEY alone selects OpenRouter."""
    base_url = base_url or lookup("OPENAI_BASE_URL")
    names = ["AIT_API_KEY", *(["OPENROUTER_API_KEY"] if is_openrouter(base_url) else []), "OPENAI_API_KEY"]
    for name in names:
        if key := lookup(name):
            return base_url, key
    if base_url is None and (key := lookup("OPENROUTER_API_KEY")):
        return OPENROUTER_URL, key
    if base_url is not None and not is_openrouter(base_url):
        return base_url, "not-needed"
    raise ValueError("no API key: set OPENAI_API_KEY (or OPENROUTER_API_KEY, or AIT_API_KEY) in the environment "
                     "or a .env file, or pass --base-url for a local OpenAI-compatible server")
