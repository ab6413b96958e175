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


# What llama-cpp-python 0.3.36's server answers (HTTP 500) to an assistant message with `"content": null`: pydantic's
# errors for every branch of the message union (the `ctx` entries left out), the one that matters third.
_CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "a", "type": "function", "function": {"name": "list_files", "arguments": "{}"}}]}
_ERRORS = [("literal_error", "System", "role", "Input should be 'system'", "assistant"),
           ("literal_error", "User", "role", "Input should be 'user'", "assistant"),
           ("string_type", "Assistant", "content", "Input should be a valid string", None),
           ("literal_error", "Tool", "role", "Input should be 'tool'", "assistant"),
           ("missing", "Tool", "tool_call_id", "Field required", _CALL),
           ("literal_error", "Function", "role", "Input should be 'function'", "assistant"),
           ("missing", "Function", "name", "Field required", _CALL)]
LLAMA_CPP_NULL_CONTENT = {"error": {"message": "\n".join(
    ["7 validation errors:"]
    + [f"  {dict(type=t, loc=('body', 'messages', 1, f'ChatCompletionRequest{b}Message', f), msg=m, input=i)}"
       for t, b, f, m, i in _ERRORS]
    + ["", '  File "/venv/lib/python3.11/site-packages/llama_cpp/server/app.py", line 376, in create_chat_completion',
       "    POST /v1/chat/completions"]), "type": "internal_server_error", "param": None, "code": None}}


class ChatServer:
    """Speaks POST /v1/chat/completions; each request takes the next scripted reply (a dict is sent as
    JSON, a str as text). GET .../models lists `models` (404 when None). With `strict_content`, a
    message whose content is not a string is answered 500, as llama-cpp-python's server does."""

    def __init__(self) -> None:
        self.script: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self.models: list[str] | None = None
        self.models_path = "/v1/models"
        self.strict_content = False
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                if server.strict_content and any(not isinstance(m.get("content"), str) for m in body["messages"]):
                    self.send({"body": LLAMA_CPP_NULL_CONTENT, "status": 500})
                    return
                reply = server.script.pop(0) if server.script else {"status": 400, "body": {"error": "script done"}}
                time.sleep(reply.get("delay", 0))
                self.send(reply)

            def do_GET(self) -> None:
                server.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": None})
                if server.models is None or self.path != server.models_path:
                    self.send({"status": 404, "body": {"detail": "Not Found"}})
                elif self.headers.get("Authorization") == "Bearer wrong":
                    self.send({"status": 401, "body": {"error": {"message": "Incorrect API key provided"}}})
                else:
                    self.send({"body": {"object": "list", "data": [{"id": m, "object": "model"} for m in server.models]}})

            def send(self, reply: dict[str, Any]) -> None:
                body = reply["body"]
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                kind = "text/plain" if isinstance(body, str) else "application/json"
                try:
                    self.send_response(reply.get("status", 200))
                    for k, v in {"Content-Type": kind, **reply.get("headers", {})}.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.root = f"http://127.0.0.1:{self.httpd.server_port}"
        self.url = f"{self.root}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def reply(self, body: dict[str, Any] | str, status: int = 200, delay: float = 0.0, **headers: str) -> None:
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


def test_full_episode_with_malformed_calls_and_mixed_pricing(server: ChatServer, tmp_path) -> None:
    """Priced by the provider, by the price table, and unpriced; malformed calls answered and counted."""
    job = reference_job("calc_chain")
    server.reply(completion([("write_file", {"path": "job.toml", "content": job["job.toml"]})], turn=1,
                            use=usage(900, 200, cost=0.001)))
    server.reply(completion([("write_file", {"path": "env.py", "content": job["env.py"]})], turn=2,
                            use=usage(1000, 800, cached=500)))
    server.reply(completion([("read_file", '{"path": "job.toml"'), ("launch", {}), ("read_file", {"file": "x"})],
                            turn=3, use=usage(2000, 40)))
    server.reply(completion([("submit_job", {})], turn=4))  # no usage block at all
    executor = fake_executor(ok_result(post=0.5))
    p, _ = policy(server)
    result = run_episode(load_spec(TASK), TASK, p, EpisodeConfig(), runs_dir=tmp_path / "runs",
                         baselines=BaselineStore(tmp_path / "b.json"), executor=executor)
    assert result.stop_reason is StopReason.job_done and len(executor.ran) == 1
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
    assert ["429" in r.error for r in p.retries] == [True, False, False]
    assert "502" in p.retries[1].error and "EmptyReply" in p.retries[2].error
    assert reply.usage.retries == p.retries  # the call's own retries travel with its reply


def test_timeout_is_retried(server: ChatServer) -> None:
    server.reply(completion(content="late"), delay=2.0)
    server.reply(completion(content="on time", use=usage(5, 1)))
    p, sleeps = policy(server, timeout_s=0.4)
    start = time.monotonic()
    reply = p.act(START, TOOL_SCHEMAS)
    assert reply.content == "on time" and reply.usage.attempts == 2
    assert time.monotonic() - start < 1.8  # did not wait for the slow reply
    assert "timed out after 0.4 s" in p.retries[0].error and len(sleeps) == 1


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
    with pytest.raises(PolicyError, match="gave up after 3 attempts.*connection refused") as e:
        p.act(START, TOOL_SCHEMAS)
    assert len(sleeps) == 2
    assert f"cannot connect to http://127.0.0.1:{port}/v1/chat/completions" in str(e.value)


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
    monkeypatch.setenv("AIT_BASELINES", str(tmp_path / "b.json"))  # the agent submits nothing: no job runs
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


# ---- what broke against real servers (llama-cpp-python, `transformers serve`) ----------------------


def episode(p: OpenAIPolicy, tmp_path: Path, executor=None, **config: Any):
    return run_episode(load_spec(TASK), TASK, p, EpisodeConfig(**config), runs_dir=tmp_path / "runs",
                       baselines=BaselineStore(tmp_path / "b.json"), executor=executor)


def trajectory(result) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (Path(result.run_dir) / "trajectory.jsonl").read_text().splitlines()]


def test_an_assistant_turn_with_tool_calls_is_sent_with_string_content(server: ChatServer, tmp_path) -> None:
    """llama-cpp-python answers `"content": null` with a 500: every tool-using episode died at turn 2."""
    server.strict_content = True
    job = reference_job("calc_chain")
    server.reply(completion([("write_file", {"path": "job.toml", "content": job["job.toml"]})], turn=1))
    server.reply(completion([("write_file", {"path": "env.py", "content": job["env.py"]})], turn=2))
    server.reply(completion([("submit_job", {})], turn=3))
    p, sleeps = policy(server)
    result = episode(p, tmp_path, fake_executor(ok_result()))
    assert result.stop_reason is StopReason.job_done, result.error
    assert sleeps == [] and len(server.requests) == 3
    sent = [m for m in server.requests[2]["body"]["messages"] if m["role"] == "assistant"]
    assert [m["content"] for m in sent] == ["", ""] and all(m["tool_calls"] for m in sent)


@pytest.mark.parametrize("body, said", [
    ({"error": "Model 'nope' not found. Available: Qwen/Qwen2.5-0.5B-Instruct"}, "Model 'nope' not found"),  # a string
    ({"detail": "The model `nope` does not exist."}, "The model `nope` does not exist."),  # FastAPI
    ({"object": "error", "message": "nope is not a valid model ID", "code": 400}, "nope is not a valid model ID"),
    ("Bad Request: unknown model nope", "Bad Request: unknown model nope"),  # plain text
    ({"detail": [{"type": "missing", "loc": ["body", "messages", 0, "content"], "msg": "Field required"}]},
     "1 validation error: body.messages.0.content: Field required"),  # FastAPI's 422 shape
])
def test_client_errors_carry_the_url_the_status_and_what_the_server_said(server: ChatServer, body, said) -> None:
    server.reply(body, status=400)
    p, _ = policy(server, model="nope")
    with pytest.raises(PolicyError) as e:
        p.act(START, TOOL_SCHEMAS)
    msg = str(e.value)
    assert f"HTTP 400 from {server.url}/chat/completions" in msg and said in msg and "not retryable" in msg
    assert e.value.status == 400 and e.value.usage.attempts == 1


def test_a_404_asks_whether_the_base_url_ends_in_v1(server: ChatServer) -> None:
    server.reply("Not Found", status=404)
    p = OpenAIPolicy("m", server.root, api_key="k", sleep=lambda s: None)  # no /v1
    with pytest.raises(PolicyError) as e:
        p.act(START, TOOL_SCHEMAS)
    assert f"HTTP 404 from {server.root}/chat/completions (does the base URL end in /v1?): Not Found" in str(e.value)


def test_a_server_error_keeps_the_line_that_matters(server: ChatServer) -> None:
    """A long traceback in a 500: the exception at its end is what the error must show."""
    trace = ("Traceback (most recent call last):\n" + "".join(f'  File "/srv/app/mod{i}.py", line {i}, in f{i}\n'
                                                              f"    call_{i}(x)\n" for i in range(40))
             + "ValueError: Requested tokens exceed n_batch in prompt template rendering for role 'tool'\n")
    server.reply({"error": {"message": trace, "type": "internal_server_error"}}, status=500)
    p, _ = policy(server, max_attempts=1)
    with pytest.raises(PolicyError) as e:
        p.act(START, TOOL_SCHEMAS)
    msg = str(e.value)
    assert "HTTP 500 from" in msg and "ValueError: Requested tokens exceed n_batch" in msg and "role 'tool'" in msg
    assert len(msg) < 800
    server.reply(LLAMA_CPP_NULL_CONTENT, status=500)  # a union's validation errors: the one that matters
    with pytest.raises(PolicyError) as e:
        p.act(START, TOOL_SCHEMAS)
    assert ("7 validation errors: body.messages.1.ChatCompletionRequestAssistantMessage.content: Input should be a "
            "valid string (got None)") in str(e.value)
    long = "x" * 3000 + " the end"
    server.reply({"error": {"message": long}}, status=502)
    with pytest.raises(PolicyError) as e:
        p.act(START, TOOL_SCHEMAS)
    assert "the end" in str(e.value) and len(str(e.value)) < 800  # head and tail kept, the middle cut


def test_connection_errors_say_why() -> None:
    p = OpenAIPolicy("m", "http://no-such-host.invalid/v1", api_key="k", max_attempts=1)
    with pytest.raises(PolicyError, match=r"cannot connect to http://no-such-host\.invalid/v1/chat/completions: "
                                          r"DNS lookup failed"):
        p.act(START, TOOL_SCHEMAS)


def test_request_timeout_from_make_policy_and_retries_and_waits_in_the_call(server: ChatServer, monkeypatch,
                                                                           tmp_path) -> None:
    p = make_policy("openai:m", base_url=server.url, request_timeout_s=0.3, max_tokens=64)
    assert p.timeout_s == 0.3 and p.settings["timeout_s"] == 0.3 and p.settings["max_tokens"] == 64
    with pytest.raises(ValueError, match="openai:MODEL policy only"):
        make_policy("reference", request_timeout_s=5)

    server.reply(completion(content="late"), delay=1.5)  # past the 0.3 s timeout
    server.reply({"error": {"message": "model is loading"}}, status=503)
    server.reply(completion(content="I give up.", use=usage(10, 2)))
    p.sleep = lambda s: None  # a wait that takes no time: it must be counted all the same
    p.rng.seed(0)
    result = episode(p, tmp_path, max_nudges=0)
    assert result.stop_reason is StopReason.no_submission
    reply = [e for e in trajectory(result) if e["kind"] == "message" and e["role"] == "assistant"][0]
    u = reply["usage"]
    assert u["attempts"] == 3 and [r["attempt"] for r in u["retries"]] == [1, 2]
    assert "timed out after 0.3 s" in u["retries"][0]["error"] and u["retries"][0]["seconds"] >= 0.25
    assert "HTTP 503" in u["retries"][1]["error"] and "model is loading" in u["retries"][1]["error"]
    waits = sum(r["wait_s"] for r in u["retries"])
    assert waits >= 1.0  # 1 s window then 2 s window, half jittered
    assert u["latency_s"] >= waits + 0.25 and result.cost.llm_seconds == pytest.approx(u["latency_s"])
    line = [e for e in Ledger(tmp_path / "runs" / "costs.jsonl").entries() if e["kind"] == "llm"][0]
    assert line["retries"] == 2  # the ledger counts them; the trajectory has the messages


def test_a_failed_call_reports_its_time_and_retries(server: ChatServer) -> None:
    for _ in range(2):
        server.reply({"error": {"message": "overloaded"}}, status=503)
    p, sleeps = policy(server, max_attempts=2)
    with pytest.raises(PolicyError) as e:
        p.act(START, TOOL_SCHEMAS)
    assert e.value.usage.attempts == 2 and len(e.value.retries) == 2 and e.value.status == 503
    assert e.value.usage.latency_s >= sum(sleeps) > 0
    assert [r.wait_s > 0 for r in e.value.retries] == [True, False]


@pytest.mark.parametrize("status, body", [
    (400, {"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it",
                     "type": "exceed_context_size_error"}}),  # llama.cpp's server
    (400, {"error": {"message": "This model's maximum context length is 32768 tokens. However, you requested "
                                "40000 tokens.", "type": "invalid_request_error", "code": "context_length_exceeded"}}),
    (400, {"object": "error", "message": "This model's maximum context length is 4096 tokens.", "code": 400}),  # vLLM
    (400, {"error": {"message": "Requested tokens (9000) exceed context window of 8192"}}),  # llama-cpp-python
    (400, {"error": {"message": "prompt is too long: 210000 tokens > 200000 maximum"}}),
    (413, "Input validation error: `inputs` must have less than 4096 tokens"),  # TGI
    (500, {"error": {"message": "too many tokens in the prompt"}}),
])
def test_a_context_length_error_ends_the_episode_as_context_full(server: ChatServer, tmp_path, status, body) -> None:
    server.reply(body, status=status)
    p, sleeps = policy(server)
    result = episode(p, tmp_path)
    assert result.stop_reason is StopReason.context_full, result.error
    assert "no longer fits" in result.error and f"HTTP {status}" in result.error
    assert len(server.requests) == 1 and sleeps == []  # not retried


def test_a_loopback_model_without_a_price_is_local_zero(server: ChatServer, tmp_path) -> None:
    from ait.metering import Usage, price_usage
    from ait.policy.openai_policy import is_loopback

    server.reply(completion(content="nothing to do", use=usage(500, 20)))
    p, _ = policy(server, model="qwen")
    result = episode(p, tmp_path, max_nudges=0)
    line = [e for e in Ledger(tmp_path / "runs" / "costs.jsonl").entries() if e["kind"] == "llm"][0]
    assert line["usd_source"] == "local" and line["usd"] == 0.0
    assert result.cost.unpriced_calls == 0 and result.cost.llm_calls == 1
    assert [is_loopback(u) for u in ("http://localhost:8080/v1", "http://[::1]:8000/v1", "http://127.0.0.5/v1",
                                     "http://10.0.0.2:8000/v1", "https://api.openai.com/v1", None)] == [
        True, True, True, False, False, False]
    remote = price_usage(Usage(model="qwen", prompt_tokens=5), DEFAULT_PRICES)
    assert remote.usd_source == "unpriced"
    priced = price_usage(Usage(model="gpt-4o-mini", prompt_tokens=10**6, local=True), DEFAULT_PRICES)
    assert priced.usd_source == "price_table" and priced.usd > 0  # a price the user gave still wins


def test_preflight(server: ChatServer) -> None:
    import socket

    server.models = ["qwen", "other-model"]
    p, _ = policy(server, model="qwen")
    assert p.preflight() is None
    assert server.requests[-1]["path"] == "/v1/models"

    server.reply({"error": {"message": "The model `nope` does not exist.", "code": 404}}, status=404)
    problem = policy(server, model="nope")[0].preflight()
    assert "'nope' is not served at" in problem and "qwen, other-model" in problem and "does not exist" in problem

    server.models = ["/models/qwen2.5-coder-0.5b-q4_k_m.gguf"]  # llama.cpp: one model, any name answered
    server.reply(completion(content="h", use=usage(3, 1)))
    assert policy(server, model="qwen")[0].preflight() is None
    assert server.requests[-1]["body"]["max_tokens"] == 1

    problem = OpenAIPolicy("qwen", server.url, api_key="wrong").preflight()
    assert "refused the key" in problem and "401" in problem and "Incorrect API key" in problem

    problem = OpenAIPolicy("qwen", server.root, api_key="k").preflight()  # no /v1
    assert problem and f"--base-url {server.url}" in problem

    server.models = None  # a server without /models: cannot check, not blocked
    assert policy(server)[0].preflight() is None
    assert OpenAIPolicy("qwen", server.root, api_key="k").preflight() is None

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    problem = OpenAIPolicy("m", f"http://127.0.0.1:{port}/v1", api_key="k").preflight(timeout_s=2)
    assert f"cannot connect to http://127.0.0.1:{port}/v1/models: connection refused" in problem


TEXT_CALL = '<tool_call>\n{"name": "read_file", "arguments": {"path": "job.toml"}}\n</tool_call>'


def test_tool_calls_written_as_text_are_reported(server: ChatServer, tmp_path) -> None:
    for _ in range(3):  # the first reply and two nudged ones
        server.reply(completion(content=TEXT_CALL, use=usage(100, 20)))
    p, _ = policy(server, model="qwen")
    result = episode(p, tmp_path)
    assert result.stop_reason is StopReason.no_submission and result.malformed_tool_calls == 0
    d = p.diagnostics()
    assert (d["replies"], d["structured_tool_call_replies"], d["text_tool_call_replies"]) == (3, 0, 3)
    assert "never as structured calls (3 of 3 replies)" in d["note"] and "--salvage-tool-calls" in d["note"]
    p.reset(load_spec(TASK))
    assert p.diagnostics()["note"] is None and p.diagnostics()["replies"] == 0


def test_salvaged_tool_calls_reach_the_harness(server: ChatServer, tmp_path) -> None:
    job = reference_job("calc_chain")
    write_toml = json.dumps({"name": "write_file", "arguments": {"path": "job.toml", "content": job["job.toml"]}})
    write_env = json.dumps({"name": "write_file", "arguments": {"path": "env.py", "content": job["env.py"]}})
    server.reply(completion(content=f"I will write the config.\n```json\n{write_toml}\n```", use=usage(100, 50)))
    server.reply(completion(content=f"<tool_call>\n{write_env}\n</tool_call>", use=usage(200, 50)))
    server.reply(completion(content='{"name": "submit_job", "arguments": {}}', use=usage(300, 10)))
    executor = fake_executor(ok_result())
    p, _ = policy(server, model="qwen", salvage_tool_calls=True)
    result = episode(p, tmp_path, executor)
    assert result.stop_reason is StopReason.job_done and len(executor.ran) == 1 and result.malformed_tool_calls == 0
    d = p.diagnostics()
    assert (d["structured_tool_call_replies"], d["text_tool_call_replies"], d["salvaged_replies"]) == (0, 3, 3)
    assert "salvaged" in d["note"]
    replies = [e for e in trajectory(result) if e["kind"] == "message" and e["role"] == "assistant"]
    assert replies[0]["content"] == "I will write the config." and replies[0]["tool_calls"][0]["name"] == "write_file"
    # Sent back as structured calls, each answered by its tool result.
    later = server.requests[2]["body"]["messages"]
    assert [m["tool_calls"][0]["function"]["name"] for m in later if m.get("tool_calls")] == ["write_file"] * 2
    assert [m["tool_call_id"] for m in later if m["role"] == "tool"] == ["call_1_0", "call_2_0"]


def test_salvage_leaves_prose_alone_and_answers_a_broken_call() -> None:
    from ait.chat.parse import salvage_tool_calls

    names = {t["function"]["name"] for t in TOOL_SCHEMAS}
    prose = 'The config looks like {"name": "calc", "steps": 3}; done.'
    assert salvage_tool_calls(prose, "c", bare_json=True, tool_names=names) == (prose, [])
    content, calls = salvage_tool_calls('Writing:\n{"name": "write_file", "arguments": {"path": "job.toml", "content": '
                                        '"x = \\q"}}', "c", bare_json=True, tool_names=names)
    assert content == "Writing:" and calls[0].name == "write_file" and isinstance(calls[0].arguments, str)
    # Raw newlines inside a JSON string (small models write files so) still parse.
    content, calls = salvage_tool_calls('{"name": "write_file", "arguments": {"path": "a", "content": "1\n2"}}', "c",
                                        bare_json=True, tool_names=names)
    assert calls[0].arguments == {"path": "a", "content": "1\n2"}


def test_salvage_reads_what_llama_cpp_servers_really_returned() -> None:
    """Replies seen from llama-cpp-python 0.3.36 serving Qwen2.5-Coder-0.5B (docs/real-servers.md)."""
    from ait.chat.parse import looks_like_tool_call, salvage_tool_calls

    names = {t["function"]["name"] for t in TOOL_SCHEMAS}
    # chatml-function-calling, when the model takes its "message:" branch: the call's name as text, no arguments.
    assert looks_like_tool_call("functions.read_file:", names)
    content, calls = salvage_tool_calls("functions.read_file:", "c", bare_json=True, tool_names=names)
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("read_file", {})]
    content, calls = salvage_tool_calls('functions.read_file:\n{"path": "INSTRUCTIONS.md"}', "c", bare_json=True,
                                        tool_names=names)
    assert calls[0].arguments == {"path": "INSTRUCTIONS.md"}
    # The GGUF's own template: a made-up tool with placeholder values, in a fence. Passed on (the harness
    # answers "unknown tool"), the fence it opened not left behind as content.
    text = '```json\n{\n  "name": "chain_arithmetic",\n  "arguments": {\n    "start_number": <number>\n  }\n}\n```'
    content, calls = salvage_tool_calls(text, "c", bare_json=True, tool_names=names)
    assert content == "" and calls[0].name == "chain_arithmetic" and isinstance(calls[0].arguments, str)
    assert not looks_like_tool_call('{"name": "bob"}', names)  # no arguments and not a tool: not a call
