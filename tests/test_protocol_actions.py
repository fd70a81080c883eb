"""The action schema and its incremental decoder (docs/design.md#decision-protocol): one decoder, any chunking."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from protocol.actions import FENCE_LANGS, ActionDecoder, ActionType, CallTool, Finish, validate_action
from tests.roundkit import chunks

COMPLETE = {"action": "complete", "final_answer": "Paris is rainy."}
CALL = {"action": "call_tool", "tool_call": {"tool_id": "demo.weather", "params": {"city": "Paris"}}}

# Every accepted fence habit (docs/design.md#decision-protocol): ``` / ```json / ```JSON, newline after the opener or not, any whitespace.
FENCE_HABITS = {
    "bare": ("", ""),
    "bare_with_whitespace": (" \n ", " \n"),
    "plain_fence_newline": ("```\n", "\n```"),
    "plain_fence_same_line": ("```", "```"),
    "json_newline": ("```json\n", "\n```"),
    "json_same_line": ("```json", "```"),
    "json_space": ("```json ", " ```"),
    "JSON_newline": ("```JSON\n", "\n```"),
    "JSON_same_line": ("```JSON", "```"),
    "whitespace_around": ("\n  ```json  \n\n", "  \n\t```   \n"),
    "blank_line_after_opener": ("```json\n\n", "\n\n```"),
}


def decode(deltas: list[str]) -> ActionDecoder:
    """Feed a block's inner text as the channel parser would (no `<` outside strings here)."""
    decoder = ActionDecoder()
    for delta in deltas:
        stop = decoder.feed(delta)
        assert stop == len(delta) or decoder.failed
    decoder.finish()
    return decoder


def test_accepted_fence_languages_are_exactly_the_spec_habits() -> None:
    assert frozenset({"", "json", "JSON"}) == FENCE_LANGS


@pytest.mark.parametrize("habit", sorted(FENCE_HABITS))
@pytest.mark.parametrize("size", [1, 3, 10**9])
def test_each_accepted_fence_habit(habit: str, size: int) -> None:
    opener, closer = FENCE_HABITS[habit]
    decoder = decode(chunks(opener + json.dumps(COMPLETE) + closer, size))
    assert decoder.result() == (Finish(ActionType.COMPLETE, "Paris is rainy."), [])


@pytest.mark.parametrize("lang", ["python", "Json", "js", "jsonc", "yaml"])
def test_unsupported_fence_language_rejected(lang: str) -> None:
    decoder = decode(chunks(f"```{lang}\n{json.dumps(COMPLETE)}\n```", 2))
    action, violations = decoder.result()
    assert action is None
    assert violations == ["unsupported fence language (accepted: ```, ```json, ```JSON)"]


@pytest.mark.parametrize("fence", ["``", "````"])
@pytest.mark.parametrize("size", [1, 10**9])
def test_fence_must_be_exactly_three_backticks(fence: str, size: int) -> None:
    decoder = decode(chunks(f"{fence}json\n{json.dumps(COMPLETE)}\n{fence}", size))
    assert decoder.result() == (None, ["a fence is exactly three backticks"])


@pytest.mark.parametrize("size", [1, 2, 3, 10**9])
def test_fence_error_does_not_depend_on_where_the_ticks_are_cut(size: int) -> None:
    # Regression: three ticks at the end of one delta and a fourth in the next used to decode
    # differently from the same six ticks in one delta.
    decoder = decode(chunks("``````", size))
    assert decoder.result() == (None, ["a fence is exactly three backticks"])


def test_unclosed_fence_rejected() -> None:
    decoder = decode(["```json\n" + json.dumps(COMPLETE) + "\n"])
    assert decoder.result() == (None, ["the ``` fence is not closed"])


def test_text_after_the_json_rejected() -> None:
    decoder = decode([json.dumps(COMPLETE) + " and more"])
    assert decoder.result() == (None, ["unexpected text after the action JSON"])


def test_second_object_in_one_block_rejected() -> None:
    decoder = decode([json.dumps(COMPLETE) + json.dumps(COMPLETE)])
    assert decoder.result() == (None, ["unexpected text after the action JSON"])


def test_empty_block_holds_no_json_object() -> None:
    assert decode(["  \n "]).result() == (None, ["the action block holds no JSON object"])


@pytest.mark.parametrize("obj", [COMPLETE, CALL, {"action": "exit", "final_answer": "I cannot.", "reason": "no access"}])
def test_keys_in_any_order(obj: dict[str, Any]) -> None:
    results = set()
    for keys in itertools.permutations(obj):
        decoder = decode(chunks(json.dumps({k: obj[k] for k in keys}), 2))
        action, violations = decoder.result()
        assert violations == []
        results.add(repr(action))
    assert len(results) == 1


def test_action_type_known_as_soon_as_its_value_is_read() -> None:
    decoder = ActionDecoder()
    decoder.feed('{"final_answer": "x", "action": "comp')
    assert not decoder.typed
    decoder.feed('lete", ')
    assert decoder.typed and decoder.action_type is ActionType.COMPLETE


def test_call_tool_typed_only_once_tool_id_known() -> None:
    decoder = ActionDecoder()
    decoder.feed('{"action": "call_tool", "tool_call": {"params": {}, ')
    assert decoder.action_type is ActionType.CALL_TOOL and not decoder.typed
    decoder.feed('"tool_id": "demo.clock"')
    assert decoder.typed and decoder.tool_id == "demo.clock"


def test_tool_id_before_action_key_types_call_tool_at_the_action_key() -> None:
    decoder = ActionDecoder()
    decoder.feed('{"tool_call": {"tool_id": "demo.clock", "params": {}}, ')
    assert not decoder.typed
    decoder.feed('"action": "call_tool"}')
    assert decoder.typed and decoder.tool_id == "demo.clock"


def test_final_answer_characters_stream_decoded_before_the_string_closes() -> None:
    decoder = ActionDecoder()
    decoder.feed('{"action": "complete", "final_answer": "a\\"b\\\\c\\n')
    assert decoder.answer_so_far() == 'a"b\\c\n'
    assert decoder.result() == (None, ["the action JSON is incomplete"])


@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_unicode_escapes_and_surrogate_pairs_split_across_deltas(ensure_ascii: bool) -> None:
    answer = "café 😀 \u2028 𝄞 ok"
    raw = json.dumps({"action": "complete", "final_answer": answer}, ensure_ascii=ensure_ascii)
    for size in range(1, 14):
        decoder = decode(chunks(raw, size))
        assert decoder.answer_so_far() == answer
        assert decoder.result() == (Finish(ActionType.COMPLETE, answer), [])


def test_tag_inside_json_string_is_text() -> None:
    answer = "close with </channel:action> and ```json fences```"
    raw = json.dumps({"action": "complete", "final_answer": answer})
    decoder = ActionDecoder()
    assert decoder.feed(raw) == len(raw)
    decoder.finish()
    assert decoder.result() == (Finish(ActionType.COMPLETE, answer), [])


def test_lt_outside_a_string_stops_the_decoder_for_the_parser() -> None:
    decoder = ActionDecoder()
    text = json.dumps(COMPLETE) + "</channel:action>"
    assert decoder.feed(text) == len(json.dumps(COMPLETE))


def test_final_answer_on_call_tool_is_schema_valid_and_ignored() -> None:
    action, violations = validate_action({**CALL, "final_answer": "never shown"})
    assert violations == []
    assert action == CallTool("demo.weather", {"city": "Paris"})


def test_final_answer_on_call_tool_is_not_an_answer_nested_path() -> None:
    decoder = decode([json.dumps({"action": "complete", "final_answer": "a", "x": {"final_answer": "b"}})])
    assert decoder.answer_so_far() == "a"


@pytest.mark.parametrize(
    ("obj", "violation"),
    [
        ({**COMPLETE, "confidence": 0.9}, "unknown key 'confidence'"),
        ({**CALL, "reason": "x"}, "unknown key 'reason'"),
        ({**COMPLETE, "reason": "x"}, "unknown key 'reason'"),
        ({**CALL, "tool_call": {"tool_id": "demo.clock", "params": {}, "extra": 1}}, "unknown key 'tool_call.extra'"),
    ],
)
def test_unknown_key_is_schema_violation(obj: dict[str, Any], violation: str) -> None:
    action, violations = validate_action(obj)
    assert action is None
    assert violations == [violation]


@pytest.mark.parametrize(
    ("obj", "violation"),
    [
        ({"final_answer": "x"}, "missing key 'action' (one of: call_tool, complete, exit)"),
        ({"action": "answer", "final_answer": "x"}, "'action' must be one of: call_tool, complete, exit"),
        ({"action": "complete"}, "missing key 'final_answer'"),
        ({"action": "complete", "final_answer": 42}, "'final_answer' must be a string"),
        ({"action": "exit", "final_answer": "x", "reason": 1}, "'reason' must be a string"),
        ({"action": "call_tool"}, "'tool_call' must be an object with 'tool_id' and 'params'"),
        ({"action": "call_tool", "tool_call": {"params": {}}}, "'tool_call.tool_id' must be a non-empty string"),
        ({"action": "call_tool", "tool_call": {"tool_id": "t", "params": []}}, "'tool_call.params' must be an object"),
    ],
)
def test_schema_violations_name_the_key(obj: dict[str, Any], violation: str) -> None:
    assert validate_action(obj) == (None, [violation])


def test_schema_violations_never_quote_values() -> None:
    _, violations = validate_action({"action": "complete", "final_answer": "x", "SECRET": "SECRET-VALUE"})
    assert "SECRET-VALUE" not in str(violations)


def test_params_default_to_an_empty_object() -> None:
    assert validate_action({"action": "call_tool", "tool_call": {"tool_id": "demo.clock"}}) == (
        CallTool("demo.clock", {}),
        [],
    )


def test_result_reads_the_decoders_own_state() -> None:
    # No second parse: a decoder that has not seen the end of the object says so.
    decoder = ActionDecoder()
    decoder.feed(json.dumps(COMPLETE)[:-1])
    assert decoder.result() == (None, ["the action JSON is incomplete"])
    decoder.feed("}")
    assert decoder.result() == (Finish(ActionType.COMPLETE, "Paris is rainy."), [])
