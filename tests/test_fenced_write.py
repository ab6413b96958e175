"""write_file without `content`: the file is the last fenced code block of the assistant's message.

The block rules (ait.harness.fenced), the harness path (an episode with a scripted agent),
the tool description the agent sees, the reference agent writing env.py this way (probe-valid,
submitted; the warm start's transcript), and the HF policy's parser keeping the block's text
beside the tool call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fakes import TASK, fake_executor, ok_result

from ait.evals.baselines import BaselineStore
from ait.harness.episode import run_episode
from ait.harness.fenced import fenced, last_fenced_block
from ait.harness.tools import TOOL_SCHEMAS
from ait.harness.types import EpisodeConfig, EpisodeResult, Message, StopReason, ToolCallRequest
from ait.policy.reference import ReferencePolicy, reference_job
from ait.spec import TaskSpec, load_spec

# Whitespace, quotes, backslashes, tabs, blank lines, a trailing space, non-ASCII: all kept.
TRICKY = ('"""A docstring with \\"quotes\\" and a \\\\ backslash."""\n\n\n'
          "def f(x):\t# tab before the comment \n"
          "    return {'a': \"b\\n\", 'é': x}  \n"
          "\n")


# ---- the block rules ------------------------------------------------------------------------


def test_block_text_is_verbatim_and_its_info_string_ignored() -> None:
    for info in ("python", "", " py ", "toml {.x}"):
        assert last_fenced_block(f"Here is env.py:\n```{info}\n{TRICKY}```\nThen I write it.") == TRICKY
    assert last_fenced_block("```\nx = 1\n```") == "x = 1\n"  # the closing fence's own line ends the text
    assert last_fenced_block("```\n```") == ""  # an empty block is an empty file
    assert last_fenced_block("```\r\nx = 1\r\n```\r\n") == "x = 1\r\n"  # CRLF lines kept as they came


def test_last_block_wins_and_a_longer_fence_holds_backticks() -> None:
    text = "first:\n```python\na = 1\n```\nsecond:\n```python\nb = 2\n```\ndone"
    assert last_fenced_block(text) == "b = 2\n"
    inner = 'DOC = """\n```python\nprint(1)\n```\n"""\n'
    assert last_fenced_block(f"````python\n{inner}````") == inner
    # A fence of three inside a block of four neither closes it nor starts a new one.
    assert last_fenced_block(f"```\nold\n```\n````\n{inner}````\n") == inner


def test_no_block_is_none_and_only_column_zero_fences_count() -> None:
    for text in ("", "no code here", "inline ```x``` is not a block", "  ```python\n  x = 1\n  ```\n"):
        assert last_fenced_block(text) is None, text


def test_a_fence_left_open_runs_to_the_end() -> None:
    assert last_fenced_block("```python\nx = 1\ny = 2") == "x = 1\ny = 2"
    assert last_fenced_block("```python\nx = 1\n") == "x = 1\n"
    assert last_fenced_block("```\na\n```\n```python\nb = 1\n") == "b = 1\n"


@pytest.mark.parametrize("text", [TRICKY, "no final newline", "```\ninside\n```\n", "x = '````'\n", ""])
def test_fenced_round_trips(text: str) -> None:
    block = fenced(text, "python")
    assert block.splitlines()[0].endswith("python")
    expected = text if not text or text.endswith("\n") else text + "\n"
    assert last_fenced_block(f"Writing it:\n{block}\n") == expected


# ---- through the harness ----------------------------------------------------------------------


class Speaker:
    """Plays (text, calls) per turn, then stops talking."""

    name = "speaker"

    def __init__(self, turns: list[tuple[str, list[ToolCallRequest]]]):
        self.turns = turns

    def reset(self, spec: TaskSpec) -> None:
        self.step = 0

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> Message:
        self.step += 1
        if self.step > len(self.turns):
            return Message(role="assistant", content="done")
        text, calls = self.turns[self.step - 1]
        return Message(role="assistant", content=text,
                       tool_calls=[c.model_copy(update={"id": f"t{self.step}-{j}"}) for j, c in enumerate(calls)])


def write(arguments: dict[str, Any]) -> ToolCallRequest:
    return ToolCallRequest(id="x", name="write_file", arguments=arguments)


def run(tmp_path: Path, policy, **config: Any) -> EpisodeResult:
    return run_episode(load_spec(TASK), TASK, policy, EpisodeConfig(max_nudges=0, **config),
                       runs_dir=tmp_path / "runs", baselines=BaselineStore(tmp_path / "b.json"),
                       executor=fake_executor(ok_result()))


def events(result: EpisodeResult) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (Path(result.run_dir) / "trajectory.jsonl").read_text().splitlines()]


def results(result: EpisodeResult) -> list[str]:
    return [e["content"] for e in events(result) if e["kind"] == "tool_result"]


def test_write_file_without_content_writes_the_last_block(tmp_path) -> None:
    policy = Speaker([
        (f"A draft:\n```python\nDRAFT = 1\n```\nThe file:\n```python\n{TRICKY}```", [write({"path": "notes/a.py"})]),
        ("", [ToolCallRequest(id="x", name="read_file", arguments={"path": "notes/a.py"})]),
    ])
    result = run(tmp_path, policy)
    wrote, read = results(result)
    data = TRICKY.encode()
    assert wrote == f"wrote notes/a.py ({len(data)} bytes)"
    assert (Path(result.run_dir) / "workspace" / "notes" / "a.py").read_bytes() == data
    assert read == TRICKY and result.malformed_tool_calls == 0


def test_missing_block_is_an_error_the_agent_sees_and_the_episode_goes_on(tmp_path) -> None:
    policy = Speaker([
        ("I will write env.py now.", [write({"path": "env.py"})]),
        ("", [write({"path": "env.py", "content": None})]),  # null counts as omitted
        ("```python\nX = 2\n```", [write({"path": "env.py"})]),
    ])
    result = run(tmp_path, policy)
    first, second, third = results(result)
    for error in (first, second):
        assert error.startswith("error: ") and "```python" in error and "content" in error, error
    assert third == "wrote env.py (6 bytes)"
    assert (Path(result.run_dir) / "workspace" / "env.py").read_text() == "X = 2\n"
    assert result.malformed_tool_calls == 2  # counted like any other call missing its arguments
    assert result.turns == 4 and result.stop_reason is StopReason.no_submission


def test_content_wins_over_a_block(tmp_path) -> None:
    policy = Speaker([
        ("```python\nFROM_BLOCK = 1\n```", [write({"path": "a.py", "content": "FROM_CONTENT = 1\n"})]),
        ("```python\nFROM_BLOCK = 1\n```", [write({"path": "b.py", "content": ""})]),  # empty content is content
    ])
    result = run(tmp_path, policy)
    ws = Path(result.run_dir) / "workspace"
    assert ws.joinpath("a.py").read_text() == "FROM_CONTENT = 1\n"
    assert ws.joinpath("b.py").read_text() == ""
    assert results(result) == ["wrote a.py (17 bytes)", "wrote b.py (0 bytes)"]


def test_hostile_paths_are_still_refused_with_a_block(tmp_path) -> None:
    absolute = tmp_path / "abs-escape.txt"
    block = "```python\npwned = True\n```"
    policy = Speaker([(block, [write({"path": "../escape.txt"})]), (block, [write({"path": "task.json"})]),
                      (block, [write({"path": str(absolute)})]), (block, [write({"path": "INSTRUCTIONS.md"})])])
    result = run(tmp_path, policy)
    assert all(r.startswith("error: ") for r in results(result)) and len(results(result)) == 4
    assert not absolute.exists() and not list(tmp_path.rglob("escape.txt"))
    ws = Path(result.run_dir) / "workspace"
    assert "pwned" not in ws.joinpath("task.json").read_text() + ws.joinpath("INSTRUCTIONS.md").read_text()


def test_the_tool_description_tells_the_agent() -> None:
    (schema,) = [s["function"] for s in TOOL_SCHEMAS if s["function"]["name"] == "write_file"]
    assert schema["parameters"]["required"] == ["path"]
    assert set(schema["parameters"]["properties"]) == {"path", "content"}
    assert "```python" in schema["description"] and "omit content" in schema["description"]
    others = [s["function"]["parameters"]["required"] for s in TOOL_SCHEMAS if s["function"]["name"] == "edit_file"]
    assert others == [["path", "old", "new"]]  # every other parameter stays required
    instructions = (Path(__file__).resolve().parents[1] / "src" / "ait" / "job" / "template" / "INSTRUCTIONS.md")
    assert "fenced" in instructions.read_text() and "```python" in instructions.read_text()


# ---- the reference agent ------------------------------------------------------------------


def test_reference_agent_writes_env_py_as_a_block_and_submits_a_valid_job(tmp_path) -> None:
    spec = load_spec(TASK)
    result = run(tmp_path, ReferencePolicy(jobs=1))
    assert result.stop_reason is StopReason.job_done, result.error
    assert result.submissions and result.submissions[0].report.valid, result.submissions[0].report.summary()
    assert result.reward.validation == 1.0 and result.job is not None and result.job.ok
    replies = [e for e in events(result) if e["kind"] == "message" and e["role"] == "assistant"]
    writes = {c["arguments"]["path"]: (e["content"], c["arguments"]) for e in replies for c in e["tool_calls"]
              if c["name"] == "write_file"}
    text, arguments = writes["env.py"]
    assert arguments == {"path": "env.py"}  # no content: the body is the block in the message
    expected = reference_job(spec.family)["env.py"]
    assert last_fenced_block(text) == expected
    submitted = Path(result.run_dir) / "submissions" / "1" / "workspace" / "env.py"
    assert submitted.read_text() == expected
    assert "content" in writes["job.toml"][1]  # a short file keeps using content
    assert result.malformed_tool_calls == 0


def test_warm_start_transcript_carries_the_block_before_the_call(tmp_path) -> None:
    from ait.outer.warmstart import reference_transcript

    spec = load_spec(TASK)
    transcript = reference_transcript(spec, tmp_path / "t").messages
    (i, reply), = [(i, m) for i, m in enumerate(transcript) if m.role == "assistant"
                   and any(c.name == "write_file" and c.arguments == {"path": "env.py"} for c in m.tool_calls)]
    assert last_fenced_block(reply.content) == reference_job(spec.family)["env.py"]
    assert transcript[i + 1].role == "tool" and transcript[i + 1].content.startswith("wrote env.py")
    assert (tmp_path / "t" / "workspace" / "env.py").read_text() == reference_job(spec.family)["env.py"]


# ---- the HF policy: rendering and parsing ---------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    from ait.policy.base import make_policy

    return make_policy("hf:tiny", temperature=1.0, max_tokens=40)


def test_hf_parser_keeps_the_block_beside_the_call(tiny) -> None:
    prompt = tiny.render([Message(role="user", content="go")], TOOL_SCHEMAS)

    def parse(text: str):
        return tiny.parse(prompt, tiny.tokenizer(text, add_special_tokens=False)["input_ids"], TOOL_SCHEMAS)

    call = '<tool_call>\n{"name": "write_file", "arguments": {"path": "env.py"}}\n</tool_call><|im_end|>'
    content, calls = parse(f"env.py:\n```python\n{TRICKY}```\n{call}")
    assert [(c.name, c.arguments) for c in calls] == [("write_file", {"path": "env.py"})]
    assert last_fenced_block(content) == TRICKY
    # A call the template parser rejects is salvaged; the block's text still comes back with it.
    broken = '<tool_call>\n{"name": "write_file", "arguments": {"path": </tool_call><|im_end|>'
    content, calls = parse(f"```python\n{TRICKY}```\n{broken}")
    assert len(calls) == 1 and calls[0].name == "write_file" and isinstance(calls[0].arguments, str)
    assert last_fenced_block(content) == TRICKY


def test_a_fenced_turn_renders_as_text_then_the_call(tiny) -> None:
    """What the warm start trains on: the block first, then the call, in one assistant turn that
    the parser reads back into the same content and call."""
    from ait.outer.warmstart import completion_ids

    body = "X = 1\n"
    reply = Message(role="assistant", content=f"env.py:\n{fenced(body, 'python')}",
                    tool_calls=[ToolCallRequest(id="c", name="write_file", arguments={"path": "env.py"})])
    history = [Message(role="system", content="sys"), Message(role="user", content="go")]
    ids = completion_ids(tiny.tokenizer, history, reply)
    text = tiny.tokenizer.decode(ids)
    assert text.index("```python\nX = 1\n```") < text.index("<tool_call>") < text.index('"path": "env.py"')
    content, calls = tiny.parse(tiny.render(history, TOOL_SCHEMAS), ids, TOOL_SCHEMAS)
    assert last_fenced_block(content) == body and [c.arguments for c in calls] == [{"path": "env.py"}]
