"""Byte-exact regression fixtures, one per incident class. The raw texts are written out
literally on purpose: these are the exact bytes that once made layers disagree."""

from __future__ import annotations

import pytest

from actors.round import RoundOutcome
from protocol.events import Lane
from protocol.notices import NoticeCode
from tests.roundkit import answer_text, chunks, codes, play, rules, tool_calls

# 1. An answer inside a fence written in an unusual but accepted habit.
UNUSUAL_FENCES = {
    "json_on_fence_line": (
        '<channel:thinking>Done.</channel:thinking>\n<channel:action>```json{"action": "complete", '
        '"final_answer": "Paris is rainy."}```</channel:action>'
    ),
    "capital_JSON": (
        '<channel:thinking>Done.</channel:thinking><channel:action>```JSON\n{"action":"complete",'
        '"final_answer":"Paris is rainy."}\n```</channel:action>'
    ),
    "trailing_spaces_before_closing_fence": (
        '<channel:thinking>Done.</channel:thinking><channel:action>\n```json\n{"final_answer": '
        '"Paris is rainy.", "action": "complete"}   \n   ```  \n</channel:action>'
    ),
    "bare_fence_no_language": (
        '<channel:thinking>Done.</channel:thinking> <channel:action>```{"action":"complete",'
        '"final_answer":"Paris is rainy."}```</channel:action>\n'
    ),
}


@pytest.mark.parametrize("name", sorted(UNUSUAL_FENCES))
@pytest.mark.parametrize("size", [1, 13, 97, 10**9])
def test_incident_1_unusual_fence_habit_is_accepted_with_one_answer(name: str, size: int) -> None:
    events, result = play(chunks(UNUSUAL_FENCES[name], size), rules(finish_legal=True))
    assert result.outcome is RoundOutcome.FINISH
    assert result.final is not None and result.final.final_answer == "Paris is rainy."
    assert answer_text(events) == "Paris is rainy."
    assert result.notices == []


# 2. The answer streams, then the JSON turns invalid after the final_answer string closed.
ANSWER_THEN_UNKNOWN_KEY = (
    '<channel:thinking>Answering.</channel:thinking><channel:action>```json\n{"action": "complete", '
    '"final_answer": "It is 12 degrees.", "confidence": 0.9}\n```</channel:action>'
)
ANSWER_THEN_MISSING_BRACE = (
    '<channel:thinking>Answering.</channel:thinking><channel:action>```json\n{"action": "complete", '
    '"final_answer": "It is 12 degrees."'
)


@pytest.mark.parametrize("raw", [ANSWER_THEN_UNKNOWN_KEY, ANSWER_THEN_MISSING_BRACE], ids=["unknown_key", "missing_brace"])
def test_incident_2_answer_streamed_then_invalid_json_is_salvaged_exactly(raw: str) -> None:
    events, result = play(chunks(raw, 5))
    assert result.outcome is RoundOutcome.SALVAGE
    assert result.answer_text == "It is 12 degrees."
    assert answer_text(events) == "It is 12 degrees."
    assert result.streamed_state.answer_streamed is True


# 3. A preamble before the thinking tag.
PREAMBLE = "Sure! <channel:thinking>I will look that up.</channel:thinking>"


def test_incident_3_preamble_aborts_at_first_impossible_delta() -> None:
    deltas = ["Su", "re! ", "<channel:thinking>", "I will look that up.", "</channel:thinking>"]
    events, result = play(deltas)
    assert events == []
    assert result.outcome is RoundOutcome.RETRY and result.preamble_aborted
    assert codes(result) == [NoticeCode.PREAMBLE]
    assert result.streamed_state.lanes == [] and result.calls == []


@pytest.mark.parametrize("deltas", [[PREAMBLE], ["S", "ure! <channel:thinking>"], ["x" * 1000 + PREAMBLE]])
def test_incident_3_preview_is_the_same_for_any_chunking_and_at_most_200_chars(deltas: list[str]) -> None:
    _, result = play(deltas)
    preview = result.notices[0].message.split("It began: ", 1)[1]
    expected = "'x'" if deltas[0].startswith("x") else "'S'"
    assert preview == expected and len(preview) <= 200


# 4. An exploration tool and complete in one round.
SEARCH_THEN_COMPLETE = (
    '<channel:thinking>Searching.</channel:thinking><channel:action>```json\n{"action": "call_tool", '
    '"tool_call": {"tool_id": "demo.search", "params": {"query": "paris weather"}}}\n```</channel:action>'
    '<channel:action>```json\n{"action": "complete", "final_answer": "It rains in Paris."}\n```</channel:action>'
)


def test_incident_4_answer_lane_denied_after_exploration_tool() -> None:
    events, result = play(chunks(SEARCH_THEN_COMPLETE, 4))
    assert answer_text(events) == ""
    answer_lane = result.streamed_state.lanes[1]
    assert answer_lane == Lane(index=1, lane="answer", status="denied", emitted_chars=0)
    assert result.outcome is RoundOutcome.TOOLS
    assert [c.call.tool_id for c in result.calls] == ["demo.search"]
    assert codes(result) == [NoticeCode.ANSWER_LANE_DENIED]


# 5. Two exploitation renders in one round.
TWO_RENDERS = (
    '<channel:thinking>Rendering both.</channel:thinking>'
    '<channel:action>{"action":"call_tool","tool_call":{"tool_id":"demo.render","params":{"source":"q3","format":"pdf"}}}</channel:action>'
    '<channel:action>{"action":"call_tool","tool_call":{"tool_id":"demo.render","params":{"source":"q3","format":"pptx"}}}</channel:action>'
)


def test_incident_5_two_exploitation_renders_are_both_accepted() -> None:
    events, result = play(chunks(TWO_RENDERS, 7))
    assert result.outcome is RoundOutcome.TOOLS
    assert [dict(c.call.params)["format"] for c in result.calls] == ["pdf", "pptx"]
    assert [e.call.tool_id for e in tool_calls(events)] == ["demo.render", "demo.render"]
    assert result.notices == []


# 6. A valid call and a malformed call.
VALID_THEN_MALFORMED = (
    '<channel:thinking>Two things.</channel:thinking>'
    '<channel:action>{"action":"call_tool","tool_call":{"tool_id":"demo.weather","params":{"city":"Paris"}}}</channel:action>'
    '<channel:action>{"action":"call_tool","tool_call":{"tool_id":"demo.search","params":{"query":"SECRET-QUERY-VALUE","limit":"many"}}}</channel:action>'
)


def test_incident_6_valid_call_survives_malformed_sibling_becomes_notice() -> None:
    events, result = play(chunks(VALID_THEN_MALFORMED, 3))
    assert [c.call.tool_id for c in result.calls] == ["demo.weather"]
    assert [e.call.tool_id for e in tool_calls(events)] == ["demo.weather"]
    [notice] = result.notices
    assert notice.code is NoticeCode.TOOL_CALL_INVALID
    assert notice.tool_id == "demo.search" and notice.index == 1
    assert notice.violations and any("limit" in v for v in notice.violations)
    assert "SECRET-QUERY-VALUE" not in str(notice.to_dict()) and "many" not in str(notice.to_dict())


# 7. A third action.
THREE_ACTIONS = (
    '<channel:thinking>Three.</channel:thinking>'
    '<channel:action>{"action":"call_tool","tool_call":{"tool_id":"demo.clock","params":{}}}</channel:action>'
    '<channel:action>{"action":"call_tool","tool_call":{"tool_id":"demo.clock","params":{}}}</channel:action>'
    '<channel:action>{"action":"call_tool","tool_call":{"tool_id":"demo.clock","params":{}}}</channel:action>'
)


def test_incident_7_third_action_is_denied_too_many_actions() -> None:
    _, result = play(chunks(THREE_ACTIONS, 11))
    assert [c.index for c in result.calls] == [0, 1]
    assert codes(result) == [NoticeCode.TOO_MANY_ACTIONS]
    assert result.streamed_state.lanes[2].status == "denied"


# 8. Only thinking streamed, then invalid action JSON.
THINKING_THEN_BAD_JSON = (
    '<channel:thinking>Let me answer.</channel:thinking><channel:action>```json\n{"action": "complete", '
    '"final_answer": 42}\n```</channel:action>'
)


def test_incident_8_thinking_then_invalid_json_keeps_thinking_and_retries() -> None:
    _, result = play(chunks(THINKING_THEN_BAD_JSON, 6))
    assert result.outcome is RoundOutcome.RETRY
    assert result.thinking == "Let me answer."
    assert result.streamed_state.answer_streamed is False
    assert codes(result) == [NoticeCode.SCHEMA]
    text = str(result.notices[0].to_dict()).lower()
    assert "streamed" not in text and "was shown" not in text and "you answered" not in text
