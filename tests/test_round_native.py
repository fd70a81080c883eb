"""The native decision protocol in one round (docs/design.md#native): typed model deltas through the
native decoder into the same round engine, gates and rules as the channel protocol."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.round import RoundEngine, RoundEvent, RoundOutcome, RoundResult, ToolCallReady
from protocol.deltas import (
    ModelDelta,
    ModelOutput,
    ReasoningDelta,
    ReasoningSignature,
    ToolCallArgs,
    ToolCallEnd,
    ToolCallStart,
    decode_deltas,
    encode_deltas,
)
from protocol.events import AnswerDelta, ThinkingDelta
from protocol.frames import Mode
from protocol.native import NativeDecoder
from protocol.notices import NoticeCode
from tests.roundkit import CATALOG, merged, rules

NAMES = {d.tool_id.replace(".", "_"): d.tool_id for d in CATALOG}


def engine(hold: int | None = 0, **overrides: Any) -> RoundEngine:
    return RoundEngine(rules(**overrides), turn_id="t1", round_no=1,
                       native=NativeDecoder(NAMES, hold_chars=hold, code_tools={"demo.eval"}))


def play(deltas: Sequence[ModelOutput], *, hold: int | None = 0, cut: bool = False,
         **overrides: Any) -> tuple[list[RoundEvent], RoundResult]:
    e = engine(hold, **overrides)
    events: list[RoundEvent] = []
    for d in deltas:
        events += e.feed_delta(d)
    tail, result = e.finish(cut=None if not cut else _cut())
    return events + tail, result


def _cut() -> Any:
    from protocol.notices import Notice

    return Notice(code=NoticeCode.PROVIDER_ERROR, message="the model provider failed (timeout)")


def tool(index: int, name: str, args: dict[str, Any] | str, *, split: int = 3) -> list[ModelOutput]:
    text = args if isinstance(args, str) else json.dumps(args)
    pieces = [text[i:i + split] for i in range(0, len(text), split)] or [""]
    return [ToolCallStart(index, f"call_{index}", name), *(ToolCallArgs(index, p) for p in pieces), ToolCallEnd(index)]


def text(*pieces: str) -> list[ModelOutput]:
    return [ModelDelta(p) for p in pieces]


def answer_chars(events: Sequence[RoundEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, AnswerDelta))


def thinking_chars(events: Sequence[RoundEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, ThinkingDelta))


def codes(result: RoundResult) -> list[str]:
    return [str(n.code) for n in result.notices]


# -- calls ---------------------------------------------------------------------------------------------


def test_a_call_is_an_action_typed_when_its_name_is_known_and_ready_when_it_ends() -> None:
    e = engine()
    assert e.feed_delta(ToolCallStart(0, "call_a", "demo_weather")) == []
    assert e.feed_delta(ToolCallArgs(0, '{"ci')) == []
    [ready] = e.feed_delta(ToolCallArgs(0, 'ty": "Paris"}')) + e.feed_delta(ToolCallEnd(0))
    assert isinstance(ready, ToolCallReady) and ready.call.tool_id == "demo.weather"
    assert ready.call.params == {"city": "Paris"} and ready.call.call_id == "t1.1.0"
    _, result = e.finish()
    assert result.outcome is RoundOutcome.TOOLS and result.notices == []


def test_reasoning_goes_to_the_thinking_lane_and_signatures_nowhere() -> None:
    events, result = play([ReasoningDelta("Let me think"), ReasoningDelta("."), ReasoningSignature("sig=="),
                           *tool(0, "demo_clock", {})])
    assert thinking_chars(events) == "Let me think." and result.thinking == "Let me think."
    assert "sig" not in json.dumps([str(e) for e in events])


def test_a_preamble_before_a_call_is_commentary_never_the_answer() -> None:
    events, result = play([*text("I'll check ", "the weather for you."), *tool(0, "demo_weather", {"city": "Paris"})],
                          hold=None, finish_legal=False)
    assert answer_chars(events) == "" and result.answer_text == ""
    assert thinking_chars(events) == "I'll check the weather for you."
    assert result.outcome is RoundOutcome.TOOLS and result.final is None


def test_a_preamble_is_told_apart_within_the_hold_even_where_finishing_is_legal() -> None:
    events, result = play([*text("Let me look", " that up."), *tool(0, "demo_search", {"query": "x"})], hold=40)
    assert answer_chars(events) == "" and result.outcome is RoundOutcome.TOOLS


def test_content_alone_is_the_answer_released_at_the_hold_then_streamed() -> None:
    e = engine(hold=10)
    assert e.feed_delta(ModelDelta("It is ")) == []          # held: it might still be a preamble
    [first] = e.feed_delta(ModelDelta("raining "))           # 14 chars ≥ 10: the answer
    assert isinstance(first, AnswerDelta) and first.text == "It is raining "
    [rest] = e.feed_delta(ModelDelta("in Paris."))
    assert rest.text == "in Paris."
    _, result = e.finish()
    assert result.outcome is RoundOutcome.FINISH and result.final is not None
    assert result.final.final_answer == "It is raining in Paris." == result.answer_text


def test_a_short_answer_is_released_when_the_message_ends() -> None:
    e = engine(hold=100)
    assert e.feed_delta(ModelDelta("Yes.")) == []
    tail, result = e.finish()
    assert answer_chars(tail) == "Yes." and result.final is not None and result.final.final_answer == "Yes."


def test_content_where_finishing_is_illegal_is_an_illegal_finish_and_shows_nothing() -> None:
    events, result = play(text("It is sunny."), hold=None, finish_legal=False, finish_illegal_reason="observe first")
    assert answer_chars(events) == "" and result.outcome is RoundOutcome.RETRY
    assert codes(result) == [NoticeCode.FINISH_ILLEGAL]


def test_a_call_after_the_released_answer_is_denied_as_after_the_final_action() -> None:
    events, result = play([*text("Here is the whole answer."), *tool(0, "demo_clock", {})], hold=5)
    assert answer_chars(events) == "Here is the whole answer."
    assert result.outcome is RoundOutcome.FINISH and codes(result) == [NoticeCode.AFTER_FINAL]
    assert not [e for e in events if isinstance(e, ToolCallReady)]


def test_incompatible_parallel_calls_deny_the_second() -> None:
    events, result = play([*tool(0, "demo_search", {"query": "q3"}), *tool(1, "demo_render", {"source": "q3", "format": "pdf"})])
    assert [e.call.tool_id for e in events if isinstance(e, ToolCallReady)] == ["demo.search"]
    assert codes(result) == [NoticeCode.INCOMPATIBLE_TRAITS]


def test_a_third_call_is_past_the_actions_per_round() -> None:
    events, result = play([*tool(0, "demo_clock", {}), *tool(1, "demo_clock", {}), *tool(2, "demo_clock", {})])
    assert len([e for e in events if isinstance(e, ToolCallReady)]) == 2
    assert codes(result) == [NoticeCode.TOO_MANY_ACTIONS]


def test_arguments_that_are_not_json_or_fail_the_schema_never_run() -> None:
    events, result = play([*tool(0, "demo_weather", '{"city": "Par'), *tool(1, "demo_weather", {"town": "Paris"})])
    assert not [e for e in events if isinstance(e, ToolCallReady)]
    assert codes(result) == [NoticeCode.TOOL_CALL_INVALID, NoticeCode.TOOL_CALL_INVALID]
    assert result.notices[0].violations == ("the arguments are not valid JSON",)
    assert result.notices[1].violations and "town" in " ".join(result.notices[1].violations)


def test_a_write_tool_in_ask_mode_and_an_unknown_function_are_denied() -> None:
    _, result = play([*tool(0, "demo_write_note", {"text": "x"}), *tool(1, "nope", {})], mode=Mode.ASK)
    assert codes(result) == [NoticeCode.ASK_MODE_DENIED, NoticeCode.TOOL_CALL_INVALID]


def test_a_cut_inside_the_arguments_never_runs_the_half_received_call() -> None:
    e = engine()
    e.feed_delta(ToolCallStart(0, "call_a", "demo_weather"))
    e.feed_delta(ToolCallArgs(0, '{"city": "Pa'))
    assert not e.continuable
    tail, result = e.finish(cut=_cut())
    assert not [x for x in tail if isinstance(x, ToolCallReady)]
    assert result.outcome is RoundOutcome.RETRY and codes(result) == [NoticeCode.PROVIDER_ERROR]


def test_a_cut_answer_is_continuable_and_salvaged_as_shown() -> None:
    e = engine(hold=0)
    e.feed_delta(ModelDelta("The answer is"))
    assert e.continuable and e.answer_streamed
    e.feed_delta(ModelDelta(" forty"))                        # a continuation goes into the same engine
    _, result = e.finish(cut=_cut())
    assert result.outcome is RoundOutcome.SALVAGE and result.answer_text == "The answer is forty"


def test_a_code_tool_gets_its_code_from_the_code_argument() -> None:
    events, _ = play(tool(0, "demo_eval", {"code": "6*7"}))
    [ready] = [e for e in events if isinstance(e, ToolCallReady)]
    assert ready.call.code == "6*7" and ready.call.params == {}


def test_an_empty_message_is_a_violation_to_retry() -> None:
    _, result = play([ReasoningDelta("Hmm.")])
    assert result.outcome is RoundOutcome.RETRY and codes(result) == [NoticeCode.CHANNELS]
    assert result.notices[0].violations == ("a response needs an answer or a tool call",)


def test_the_deltas_round_trip_through_their_recording() -> None:
    deltas = [ReasoningDelta("a"), ReasoningSignature("s"), *tool(0, "demo_clock", {}), ModelDelta("b")]
    assert decode_deltas(encode_deltas(deltas)) == deltas


# -- delta-boundary invariance ----------------------------------------------------------------------------

CALLS = [("demo_weather", {"city": "Paris"}), ("demo_clock", {}), ("demo_search", {"query": "é \"q\" 😀"}),
         ("demo_render", {"source": "s", "format": "pdf"}), ("demo_weather", '{"city": '), ("nope", {})]
PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def messages(draw: st.DrawFn) -> list[tuple[str, Any]]:
    parts: list[tuple[str, Any]] = []
    if draw(st.booleans()):
        parts.append(("reasoning", draw(st.text(max_size=20))))
    if draw(st.booleans()):
        parts.append(("text", draw(st.text(min_size=1, max_size=60))))
    for _ in range(draw(st.integers(0, 3))):
        parts.append(("call", draw(st.sampled_from(CALLS))))
    if draw(st.booleans()):
        parts.append(("text", draw(st.text(min_size=1, max_size=30))))
    return parts


def chunked(parts: list[tuple[str, Any]], cuts: st.DataObject) -> list[ModelOutput]:
    out: list[ModelOutput] = []
    index = 0
    for kind, value in parts:
        if kind == "call":
            name, args = value
            body = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            out.append(ToolCallStart(index, f"c{index}", name))
            out += [ToolCallArgs(index, p) for p in _split(body, cuts)]
            out.append(ToolCallEnd(index))
            index += 1
        else:
            cls = ReasoningDelta if kind == "reasoning" else ModelDelta
            out += [cls(p) for p in _split(value, cuts)]
    return out


def _split(s: str, cuts: st.DataObject) -> list[str]:
    points = sorted(cuts.draw(st.sets(st.integers(1, max(1, len(s) - 1)), max_size=4))) if len(s) > 1 else []
    bounds = [0, *points, len(s)]
    return [s[a:b] for a, b in itertools.pairwise(bounds)]


@PROPERTY
@given(parts=messages(), data=st.data(), hold=st.sampled_from([None, 0, 8, 1000]), legal=st.booleans())
def test_splitting_the_same_message_differently_changes_nothing(
    parts: list[tuple[str, Any]], data: st.DataObject, hold: int | None, legal: bool,
) -> None:
    one = play(chunked(parts, data), hold=hold, finish_legal=legal)
    two = play(chunked(parts, data), hold=hold, finish_legal=legal)
    assert merged(one[0]) == merged(two[0])
    assert one[1].outcome == two[1].outcome and one[1].notices == two[1].notices
    assert one[1].streamed_state == two[1].streamed_state
    # Guarantee 1: the answer is only ever what a legal, allowed answer lane let through.
    if not legal:
        assert answer_chars(one[0]) == ""
    if one[1].final is not None:
        assert one[1].final.final_answer == answer_chars(one[0]) == one[1].answer_text
