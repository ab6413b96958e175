"""The OpenAI-compatible policy against a chat-completions server on 127.0.0.1, replies scripted
per test: tool calls, malformed arguments, 429/5xx then success, timeouts, usage with and without
a provider cost, keys from .env, and the `ait episode` output."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fakes import TASK, fake_executor, ok_result

from ait.evals.baselines import BaselineStore
from ait.harness.episode import run_episode
from ait.harness.tools import TOOL_SCHEMAS
from ait.harness.types import EpisodeConfig, Message, StopReason
from ait.metering import DEFAULT_PRICES, Ledger
from ait.policy.base import make_policy
from ait.policy.keys import parse_dotenv, resolve_endpoint
from ait.policy.openai_policy import OpenAIPolicy, PolicyError
from ait.policy.reference import reference_job
from ait.spec import load_spec

KEY_VARS = ("OPENAI_API_KEY", "OPENROUTER_API_KEY", "AIT_API_KEY", "OPENAI_BASE_URL")


class ChatServer:
    """Speaks POST /v1/chat/completions; each request takes the next scripted reply."""

    def __init__(self) -> None:
        self.script: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                reply = server.script.pop(0) if server.script else {"status": 400, "body": {"error": "script done"}}
                time.sleep(reply.get("delay", 0))
                data = json.dumps(reply["body"]).encode()
                try:
                    self.send_response(reply.get("status", 200))
                    for k, v in {"Content-Type": "application/json", **reply.get("headers", {})}.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def reply(self, body: dict[str, Any], status: int = 200, delay: float = 0.0, **headers: str) -> None:
        self.script.append({"body": body, "status": status, "delay": delay, "headers": headers})


def usage(prompt: int, completion: int, cached: int = 0, cost: float | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                           "prompt_tokens_details": {"cached_tokens": cached}}
    if cost is not None:
        out["cost"] = cost
    return out


def completion(calls: list[tuple[str, Any]] = (), content: str | None = None, use: dict | None = None,
               turn: int = 0) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [{"id": f"tc{turn}_{i}", "type": "function", "function": {
            "name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
            for i, (name, args) in enumerate(calls)]
    body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if calls else "stop"}]}
    if use is not None:
        body["usage"] = use
    return body


@pytest.fixture
def server():
    s = ChatServer()
    yield s
    s.httpd.shutdown()


@pytest.fixture(autouse=True)
def no_keys(monkeypatch, tmp_path):
    for name in KEY_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIT_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)  # no stray .env


def policy(server: ChatServer, model: str = "gpt-4o-mini", **kw: Any) -> tuple[OpenAIPolicy, list[float]]:
    sleeps: list[float] = []
    p = OpenAIPolicy(model, server.url, api_key="sk-test", sleep=sleeps.append, seed=0, **kw)
    return p, sleeps


START = [Message(role="system", content="sys"), Message(role="user", content="go")]


def test_tool_calls_and_provider_cost(server: ChatServer) -> None:
    server.reply(completion([("read_file", {"path": "job.toml"}), ("list_files", {})], content="Reading.",
                            use=usage(1200, 30, cached=1000, cost=0.00042)))
    p, _ = policy(server, temperature=0.2)
    reply = p.act(START, TOOL_SCHEMAS)
    assert reply.content == "Reading."
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("tc0_0", "read_file", {"path": "job.toml"}), ("tc0_1", "list_files", {})]
    u = reply.usage
    assert (u.prompt_tokens, u.completion_tokens, u.cached_tokens) == (1200, 30, 1000)
    assert u.usd == pytest.approx(0.00042) and u.usd_source == "provider"
    assert u.attempts == 1 and u.latency_s > 0
    req = server.requests[0]
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer sk-test"
    body = req["body"]
    assert body["model"] == "gpt-4o-mini" and body["temperature"] == 0.2 and body["tool_choice"] == "auto"
    assert [t["function"]["name"] for t in body["tools"]] == [t["function"]["name"] for t in TOOL_SCHEMAS]
    assert [m["role"] for m in body["messages"]] == ["system", "user"]


def test_full_episode_with_malformed_calls_and_mixed_pricing(server: ChatServer, monkeypatch, tmp_path) -> None:
    """Priced by the provider, by the price table, and unpriced; malformed calls answered and counted."""
    job = reference_job("calc_chain")
    server.reply(completion([("write_file", {"path": "job.toml", "content": job["job.toml"]})], turn=1,
                            use=usage(900, 200, cost=0.001)))
    server.reply(completion([("write_file", {"path": "env.py", "content": job["env.py"]})], turn=2,
                            use=usage(1000, 800, cached=500)))
    server.reply(completion([("read_file", '{"path": "job.toml"'), ("launch", {}), ("read_file", {"file": "x"})],
                            turn=3, use=usage(2000, 40)))
    server.reply(completion([("submit_job", {})], turn=4))  # no usage block at all
    ran = fake_executor(monkeypatch, ok_result(post=0.5))
    p, _ = policy(server)
    result = run_episode(load_spec(TASK), TASK, p, EpisodeConfig(), runs_dir=tmp_path / "runs",
                         baselines=BaselineStore(tmp_path / "b.json"))
    assert result.stop_reason is StopReason.job_done and len(ran) == 1
    assert result.reward.validation == 1.0
    assert result.malformed_tool_calls == 3

    # The malformed calls came back to the model as errors answering their own ids, raw arguments echoed.
    fourth = server.requests[3]["body"]["messages"]
    tool_msgs = {m["tool_call_id"]: m["content"] for m in fourth if m["role"] == "tool"}
    assert all(tool_msgs[f"tc3_{i}"].startswith("error:") for i in range(3))
    assert "JSON" in tool_msgs["tc3_0"] and "launch" in tool_msgs["tc3_1"] and "file" in tool_msgs["tc3_2"]
    sent = [m for m in fourth if m["role"] == "assistant"][-1]
    assert sent["tool_calls"][0]["function"]["arguments"] == '{"path": "job.toml"'

    price = DEFAULT_PRICES.llm["gpt-4o-mini"]
    table_usd = ((500 * price.prompt + 500 * price.cached_prompt + 800 * price.completion)
                 + (2000 * price.prompt + 40 * price.completion)) / 1e6
    c = result.cost
    assert c.llm_calls == 4 and c.prompt_tokens == 3900 and c.completion_tokens == 1040 and c.cached_tokens == 500
    assert c.llm_usd == pytest.approx(0.001 + table_usd)
    assert c.total_usd == pytest.approx(c.llm_usd + c.job_usd)

    lines = Ledger(tmp_path / "runs" / "costs.jsonl").entries()
    llm = [e for e in lines if e["kind"] == "llm"]
    assert [e["usd_source"] for e in llm] == ["provider", "price_table", "price_table", "price_table"]
    assert all(e["run_id"] == result.run_id and e["policy"] == "openai:gpt-4o-mini" for e in llm)
    assert [e["kind"] for e in lines].count("job") == 1
    events = [json.loads(x) for x in (Path(result.run_dir) / "trajectory.jsonl").read_text().splitlines()]
    replies = [e for e in events if e["kind"] == "message" and e["role"] == "assistant"]
    assert [e["usage"]["usd_source"] for e in replies] == ["provider", "price_table", "price_table", "price_table"]
    assert all(e["seconds"] >= 0 and e["usage"]["latency_s"] > 0 for e in replies)


def test_rate_limit_server_error_and_empty_reply_are_retried(server: ChatServer) -> None:
    server.reply({"error": {"message": "slow down"}}, status=429, **{"retry-after": "0.25"})
    server.reply({"error": {"message": "upstream died"}}, status=502)
    server.reply({"id": "x", "object": "chat.completion", "created": 1, "model": "m", "choices": []})
    server.reply(completion(content="hello", use=usage(10, 2)))
    p, sleeps = policy(server, backoff_base_s=1.0, backoff_max_s=60.0)
    reply = p.act(START, TOOL_SCHEMAS)
    assert reply.content == "hello" and reply.usage.attempts == 4
    assert len(server.requests) == 4
    assert sleeps[0] == 0.25  # the server's Retry-After wins
    assert 1.0 <= sleeps[1] <= 2.0 and 2.0 <= sleeps[2] <= 4.0  # 2^(n-1) window, half of it jittered
    assert ["429" in r["error"] for r in p.retries] == [True, False, False]
    assert "502" in p.retries[1]["error"] and "EmptyReply" in p.retries[2]["error"]


def test_timeout_is_retried(server: ChatServer) -> None:
    server.reply(completion(content="late"), delay=2.0)
    server.reply(completion(content="on time", use=usage(5, 1)))
    p, sleeps = policy(server, timeout_s=0.4)
    start = time.monotonic()
    reply = p.act(START, TOOL_SCHEMAS)
    assert reply.content == "on time" and reply.usage.attempts == 2
    assert time.monotonic() - start < 1.8  # did not wait for the slow reply
    assert "Timeout" in p.retries[0]["error"] and len(sleeps) == 1


def test_gives_up_after_bounded_attempts_and_the_episode_ends_cleanly(server: ChatServer, tmp_path) -> None:
    for _ in range(3):
        server.reply({"error": {"message": "overloaded"}}, status=503)
    p, sleeps = policy(server, max_attempts=3)
    result = run_episode(load_spec(TASK), TASK, p, EpisodeConfig(), runs_dir=tmp_path / "runs",
                         baselines=BaselineStore(tmp_path / "b.json"))
    assert result.stop_reason is StopReason.policy_error
    assert "gave up after 3 attempts" in result.error and "503" in result.error
    assert len(server.requests) == 3 and len(sleeps) == 2
    assert result.reward.total == -0.1 and result.cost.llm_calls == 0
    assert Ledger(tmp_path / "runs" / "costs.jsonl").entries() == []


def test_client_errors_are_not_retried(server: ChatServer) -> None:
    server.reply({"error": {"message": "bad key"}}, status=401)
    p, sleeps = policy(server)
    with pytest.raises(PolicyError, match="401.*not retryable"):
        p.act(START, TOOL_SCHEMAS)
    assert len(server.requests) == 1 and sleeps == []


def test_connection_refused_is_retried_then_reported() -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps: list[float] = []
    p = OpenAIPolicy("m", f"http://127.0.0.1:{port}/v1", api_key="k", sleep=sleeps.append, max_attempts=3)
    with pytest.raises(PolicyError, match="gave up after 3 attempts.*Connection"):
        p.act(START, TOOL_SCHEMAS)
    assert len(sleeps) == 2


def test_key_from_dotenv_never_written(server: ChatServer, tmp_path, monkeypatch) -> None:
    (tmp_path / ".env").write_text('# secrets\nexport OPENAI_API_KEY="sk-dotenv-123"  \nOTHER=1\n')
    server.reply(completion(content="nothing to do", use=usage(10, 3)))
    p = make_policy("openai:gpt-4o-mini", base_url=server.url)
    assert p.name == "openai:gpt-4o-mini"
    result = run_episode(load_spec(TASK), TASK, p, EpisodeConfig(max_nudges=0), runs_dir=tmp_path / "runs",
                         baselines=BaselineStore(tmp_path / "b.json"))
    assert server.requests[0]["auth"] == "Bearer sk-dotenv-123"
    assert result.stop_reason is StopReason.no_submission
    for f in (tmp_path / "runs").rglob("*"):
        if f.is_file():
            assert "sk-dotenv-123" not in f.read_text(errors="replace"), f


def test_endpoint_resolution(monkeypatch, tmp_path) -> None:
    assert parse_dotenv("A=1\nexport B='two words'\n# C=3\nD=x # note\nbad line\n") == {
        "A": "1", "B": "two words", "D": "x"}
    with pytest.raises(ValueError, match="no API key"):
        resolve_endpoint(None)
    assert resolve_endpoint("http://127.0.0.1:8000/v1") == ("http://127.0.0.1:8000/v1", "not-needed")  # local vLLM
    monkeypatch.setenv("OPENROUTER_API_KEY", "or-key")
    base, key = resolve_endpoint(None)
    assert "openrouter" in base and key == "or-key"
    (Path(tmp_path / "home") / ".env").write_text("OPENAI_API_KEY=home-key\n")
    assert resolve_endpoint(None) == (None, "home-key")  # AIT_HOME/.env is read too
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("gpt-4o")


def test_cli_prints_tokens_and_dollars(server: ChatServer, monkeypatch, tmp_path) -> None:
    from typer.testing import CliRunner

    from ait.cli import app

    monkeypatch.setenv("OPENAI_API_KEY", "sk-cli")
    monkeypatch.setenv("AIT_BASELINES", str(tmp_path / "b.json"))
    fake_executor(monkeypatch, ok_result())
    args = ["episode", "--task", str(TASK), "--policy", "openai:gpt-4o-mini", "--base-url", server.url,
            "--runs-dir", str(tmp_path / "runs")]
    for _ in range(3):  # the first reply and two nudged ones
        server.reply(completion(content="I give up.", use=usage(1234, 56, cost=0.0125)))
    out = CliRunner().invoke(app, [*args, "--json"])
    assert out.exit_code == 1, out.output  # the agent produced no job: exit 1 (the JSON is still printed)
    data = json.loads(out.stdout)
    assert data["stop_reason"] == "no_submission"
    assert data["cost"]["prompt_tokens"] == 3 * 1234 and data["cost"]["total_usd"] == pytest.approx(0.0375)

    server.reply(completion(content="Still nothing.", use=usage(2000, 10, cost=0.5)))
    text = CliRunner().invoke(app, [*args, "--budget-usd", "0.25"])
    assert text.exit_code == 1, text.output  # stopped by the budget before any job
    assert "2,000 prompt" in text.stdout and "$0.5000" in text.stdout and "budget" in text.stdout
