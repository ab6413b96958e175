"""Replies whose JSON nests past the parser's depth (RecursionError, not JSONDecodeError) are treated
as malformed text by every parser a policy's reply goes through: the harness answers them with an
error and the episode goes on, rather than ending as policy_error or crashing an inner rollout."""

from __future__ import annotations

from ait.chat.parse import bare_tool_calls, json_tool_calls, parse_arguments, salvage_tool_calls

DEEP = "[" * 200_000 + "]" * 200_000
CALL = '{"name": "read_file", "arguments": ' + DEEP + "}"


def test_arguments_nested_too_deep_stay_raw_text() -> None:
    assert parse_arguments(DEEP) == DEEP


def test_a_tool_block_nested_too_deep_is_passed_on_raw() -> None:
    text, calls = salvage_tool_calls(f"<tool_call>\n{CALL}\n</tool_call>", "c")
    assert len(calls) == 1 and calls[0].name == "read_file" and calls[0].arguments == CALL and text == ""


def test_bare_json_nested_too_deep_is_a_call_with_raw_arguments() -> None:
    content, calls = json_tool_calls(f"Here: {CALL}", "c", {"read_file"})
    assert content == "Here:" and [(c.name, c.arguments) for c in calls] == [("read_file", CALL)]
    assert bare_tool_calls(f"Here: {CALL}") == []  # an inner rollout's reply: no call


def test_a_reply_of_brackets_stops_the_scan_after_max_failed_starts(monkeypatch) -> None:
    """Each bracket that starts no JSON value costs the decoder a pass over the text before it (4.5 s for
    the first reply below, quadratic in its length); the scan gives up after MAX_FAILED_STARTS of them,
    and a call after that is still passed on (raw)."""
    import json

    import ait.chat.parse as chat

    attempts = []

    class Counting(json.JSONDecoder):
        def raw_decode(self, s, idx=0):
            attempts.append(idx)
            return super().raw_decode(s, idx)

    monkeypatch.setattr(chat.json, "JSONDecoder", Counting)
    assert json_tool_calls("[{" * 50_000 + "}]" * 50_000, "c", {"read_file"})[1] == []
    assert len(attempts) == chat.MAX_FAILED_STARTS
    late = "{[" * 50_000 + ' {"name": "read_file", "arguments": {"path": "a"}}'
    (call,) = json_tool_calls(late, "c", {"read_file"})[1]
    assert call.name == "read_file" and call.arguments == late[late.index('{"name"'):]
