"""The round's rules, one test per rule of docs/design.md#round (the incident fixtures live in
test_round_incidents.py, the generated properties in test_round_properties.py)."""

from __future__ import annotations

import json

import msgspec
import pytest

from actors.catalog import ASK_USER_TOOL, Catalog, ToolDecl, Trait
from actors.gates import (
    CONTINUE_EXPLORING,
    EXPLORATION_MARKER,
    STOP_EXPLORING,
    TRAIT_MATRIX,
    GateStatus,
)
from actors.round import RoundEngine, RoundOutcome, ToolCallReady
from protocol.events import AnswerDelta, DeniedAction, Lane, StreamedState, ThinkingDelta
from protocol.notices import NoticeCode
from tests.roundkit import (
    action,
    answer_text,
    call,
    chunks,
    codes,
    complete,
    play,
    rules,
    thinking,
    tool_calls,
)

T = thinking("Checking.")


def lane(state: StreamedState, index: int) -> Lane:
    return state.lanes[index]


# == the decision protocol (#decision-protocol) =======================================================================


def test_thinking_must_come_first() -> None:
    events, result = play(action(complete("x")) + T)
    assert events == []
    assert result.preamble_aborted and codes(result) == [NoticeCode.PREAMBLE]
    assert result.streamed_state.lanes == []


def test_thinking_exactly_once() -> None:
    events, result = play(T + thinking("again") + action(call("demo.clock")))
    assert [e.text for e in events if isinstance(e, ThinkingDelta)] == ["Checking."]
    assert codes(result) == [NoticeCode.CHANNELS]
    assert result.notices[0].violations == ("thinking must come first, exactly once",)


def test_no_action_block_is_channels_violation() -> None:
    _, result = play(T)
    assert result.outcome is RoundOutcome.RETRY
    assert codes(result) == [NoticeCode.CHANNELS]
    assert result.notices[0].violations == ("a response needs at least one <channel:action> block",)


def test_max_actions_per_round_defaults_to_two() -> None:
    _, result = play(T + action(call("demo.clock")) * 3)
    assert [lane(result.streamed_state, i).status for i in range(3)] == ["allowed", "allowed", "denied"]


def test_tag_inside_json_string_is_text() -> None:
    answer = "Use </channel:action> literally, and ```json fences```."
    events, result = play(chunks(T + action(complete(answer)), 3))
    assert result.outcome is RoundOutcome.FINISH
    assert answer_text(events) == answer


def test_tag_like_text_inside_code_channel_is_text() -> None:
    raw = T + action(call("demo.eval")) + "<channel:code>1 + 2 </channel:action> <b></channel:code>"
    events, result = play(chunks(raw, 2))
    assert [e.call.code for e in tool_calls(events)] == ["1 + 2 </channel:action> <b>"]
    assert result.notices == []


def test_final_answer_on_call_tool_is_ignored_and_tool_runs() -> None:
    obj = {"final_answer": "Never shown.", **call("demo.clock")}
    events, result = play(chunks(T + action(obj), 4))
    assert answer_text(events) == ""
    assert result.streamed_state.answer_streamed is False
    assert [c.call.tool_id for c in result.calls] == ["demo.clock"]
    assert result.notices == []


def test_unknown_key_is_schema_violation() -> None:
    _, result = play(T + action({**call("demo.clock"), "confidence": 0.9}))
    assert result.outcome is RoundOutcome.RETRY
    assert codes(result) == [NoticeCode.SCHEMA]
    assert result.notices[0].violations == ("unknown key 'confidence'",)


def test_keys_in_any_order() -> None:
    body = json.dumps({"final_answer": "It rains.", "action": "complete"})
    events, result = play(chunks(T + action(body), 3))
    assert result.outcome is RoundOutcome.FINISH
    assert answer_text(events) == "It rains."


@pytest.mark.parametrize(
    ("opener", "closer"),
    [("", ""), ("```", "```"), ("```\n", "\n```"), ("```json", "```"), ("```json\n", "\n```"),
     ("```JSON", "```"), ("```JSON\n", "\n```"), ("\n ```json \n", " \n ``` \n")],
)
def test_each_accepted_fence_habit(opener: str, closer: str) -> None:
    events, result = play(chunks(T + action(complete("Done."), opener, closer), 3))
    assert result.outcome is RoundOutcome.FINISH and result.notices == []
    assert answer_text(events) == "Done."


def test_unsupported_fence_language_rejected() -> None:
    events, result = play(T + action(complete("Done."), "```python\n", "\n```"))
    assert answer_text(events) == ""
    assert result.outcome is RoundOutcome.RETRY
    assert result.notices[0].violations == ("unsupported fence language (accepted: ```, ```json, ```JSON)",)


def test_unicode_escapes_and_surrogate_pairs_split_across_deltas() -> None:
    answer = "Température: 12 °C 🌧️ 𝄞"
    events, result = play(list(T + action(json.dumps(complete(answer), ensure_ascii=True))))
    assert answer_text(events) == answer
    assert result.final is not None and result.final.final_answer == answer


# -- the prefix policy ------------------------------------------------------------------------------


def test_preamble_leading_whitespace_allowed() -> None:
    _, result = play(["\n  ", "\t", T + action(complete("ok"))])
    assert result.outcome is RoundOutcome.FINISH


def test_preamble_split_tag_allowed() -> None:
    raw = T + action(complete("ok"))
    _, result = play(["<", "chan", "nel:thin", "king>", raw[len("<channel:thinking>") :]])
    assert result.outcome is RoundOutcome.FINISH


def test_preamble_aborts_at_first_impossible_delta_and_ignores_the_rest() -> None:
    engine = RoundEngine(rules(), turn_id="t1", round_no=1)
    assert engine.feed("<channel:") == []
    assert engine.feed("answer>") == []
    assert engine.aborted
    assert engine.feed("</channel:answer>" + T + action(complete("x"))) == []
    _, result = engine.finish()
    assert result.outcome is RoundOutcome.RETRY and codes(result) == [NoticeCode.PREAMBLE]
    assert result.accepted == [] and result.calls == [] and result.thinking == ""


# == lanes and gates (#gates) ===========================================================================


def test_thinking_lane_streams_at_once() -> None:
    engine = RoundEngine(rules(), turn_id="t1", round_no=1)
    assert engine.feed("<channel:thinking>Look") == [ThinkingDelta(turn_id="t1", round=1, text="Look")]
    assert engine.feed("ing") == [ThinkingDelta(turn_id="t1", round=1, text="ing")]


def test_answer_lane_streams_final_answer_as_it_arrives() -> None:
    engine = RoundEngine(rules(), turn_id="t1", round_no=1)
    engine.feed(T + '<channel:action>{"action": "complete", "final_answer": "It ')
    assert engine.feed("rains") == [AnswerDelta(turn_id="t1", round=1, text="rains")]


def test_pending_gate_buffers_until_type_known() -> None:
    engine = RoundEngine(rules(), turn_id="t1", round_no=1)
    engine.feed(T)
    assert engine.feed('<channel:action>{"final_answer": "Paris is ') == []
    assert engine.feed('rainy.", "act') == []
    assert engine.feed('ion": "complete"}') == [AnswerDelta(turn_id="t1", round=1, text="Paris is rainy.")]


@pytest.mark.parametrize("answer_first", [True, False], ids=["buffered_then_denied", "denied_then_streamed"])
def test_deny_drops_buffer_and_swallows_rest(answer_first: bool) -> None:
    obj = {"final_answer": "Hidden.", "action": "complete"} if answer_first else complete("Hidden.")
    events, result = play(chunks(T + action(obj), 2), rules(finish_legal=False, finish_illegal_reason="observe first"))
    assert answer_text(events) == ""
    assert lane(result.streamed_state, 0) == Lane(index=0, lane="answer", status="denied", emitted_chars=0)


def test_call_tool_lane_emits_nothing_while_streaming() -> None:
    raw = T + action(call("demo.search", query="paris"))
    engine = RoundEngine(rules(), turn_id="t1", round_no=1)
    streamed = [e for d in chunks(raw[:-len("</channel:action>")], 3) for e in engine.feed(d)]
    assert all(isinstance(e, ThinkingDelta) for e in streamed)


def test_tool_call_event_only_after_allowed_and_valid() -> None:
    engine = RoundEngine(rules(), turn_id="t1", round_no=1)
    engine.feed(T + '<channel:action>{"action": "call_tool", "tool_call": {"tool_id": "demo.weather", ')
    assert engine.feed('"params": {"city": "Paris"}}}') == []
    [event] = engine.feed("</channel:action>")
    assert isinstance(event, ToolCallReady)
    assert (event.call.call_id, event.call.tool_id, dict(event.call.params)) == ("t1.1.0", "demo.weather", {"city": "Paris"})
    assert event.trait is Trait.EXPLORATION


def test_tool_call_failing_validation_never_appears() -> None:
    events, result = play(T + action(call("demo.weather", town="Paris")))
    assert tool_calls(events) == []
    assert codes(result) == [NoticeCode.TOOL_CALL_INVALID]


def test_denied_tool_call_never_appears() -> None:
    events, _ = play(T + action(call("demo.write_note", text="x")), rules(mode="ask"))
    assert tool_calls(events) == []


# rule 1


def test_too_many_actions_denied() -> None:
    events, result = play(T + action(call("demo.clock")) + action(complete("x")), rules(max_actions=1))
    assert answer_text(events) == ""
    assert result.denied == [DeniedAction(1, NoticeCode.TOO_MANY_ACTIONS)]
    assert [c.call.tool_id for c in result.calls] == ["demo.clock"]


def test_too_many_actions_comes_before_after_final() -> None:
    _, result = play(T + action(complete("x")) + action(call("demo.clock")), rules(max_actions=1))
    assert result.denied == [DeniedAction(1, NoticeCode.TOO_MANY_ACTIONS)]


# rule 2


def test_after_final_denied() -> None:
    events, result = play(T + action(complete("Done.")) + action(call("demo.clock")))
    assert result.denied == [DeniedAction(1, NoticeCode.AFTER_FINAL, "demo.clock")]
    assert tool_calls(events) == [] and result.calls == []
    assert result.outcome is RoundOutcome.FINISH and answer_text(events) == "Done."


# rule 3


def test_complete_allowed_with_neutral_tool() -> None:
    events, result = play(T + action(call("demo.clock")) + action(complete("It is noon.")))
    assert answer_text(events) == "It is noon."
    assert result.outcome is RoundOutcome.FINISH
    assert result.denied == []


def test_answer_lane_denied_after_exploration_tool() -> None:
    events, result = play(T + action(call("demo.weather", city="Paris")) + action(complete("Rain.")))
    assert answer_text(events) == ""
    assert codes(result) == [NoticeCode.ANSWER_LANE_DENIED]
    assert [c.call.tool_id for c in result.calls] == ["demo.weather"]


def test_answer_lane_denied_after_exploitation_tool() -> None:
    events, result = play(T + action(call("demo.render", source="q3", format="pdf")) + action(complete("Done.")))
    assert answer_text(events) == ""
    assert codes(result) == [NoticeCode.ANSWER_LANE_DENIED]


def test_finish_illegal_denied_when_finish_not_legal() -> None:
    reason = "observe before finish: no tool result in this turn yet"
    events, result = play(T + action(complete("Guess.")), rules(finish_legal=False, finish_illegal_reason=reason))
    assert answer_text(events) == ""
    assert result.outcome is RoundOutcome.RETRY
    [notice] = result.notices
    assert (notice.code, notice.message, notice.index) == (NoticeCode.FINISH_ILLEGAL, reason, 0)


def test_answer_lane_denial_comes_before_finish_illegal() -> None:
    raw = T + action(call("demo.search", query="x")) + action(complete("x"))
    _, result = play(raw, rules(finish_legal=False, finish_illegal_reason="no"))
    assert codes(result) == [NoticeCode.ANSWER_LANE_DENIED]


# rule 4


def test_unknown_tool_is_tool_call_invalid() -> None:
    _, result = play(T + action(call("demo.teleport")))
    assert result.denied == [DeniedAction(0, NoticeCode.TOOL_CALL_INVALID, "demo.teleport")]
    assert result.outcome is RoundOutcome.RETRY


def test_tool_unavailable_in_state() -> None:
    # As in the demo profile (#demo-tools): demo.write_note only in state `focused`.
    catalog = rules().catalog.with_overrides(states={"demo.write_note": frozenset({"focused"})})
    _, result = play(T + action(call("demo.write_note", text="x")), rules(catalog=catalog, state="default"))
    assert codes(result) == [NoticeCode.TOOL_UNAVAILABLE]
    assert result.calls == []


def test_ask_mode_denies_write_tool() -> None:
    _, result = play(T + action(call("demo.write_note", text="x")), rules(mode="ask"))
    assert codes(result) == [NoticeCode.ASK_MODE_DENIED]
    assert result.calls == []


def test_ask_mode_allows_safe_tools() -> None:
    _, result = play(T + action(call("demo.clock")), rules(mode="ask"))
    assert [c.call.tool_id for c in result.calls] == ["demo.clock"]


def test_confirmation_required_denies_other_tools() -> None:
    _, result = play(T + action(call("demo.search", query="more")), rules(confirmation_required=True))
    assert codes(result) == [NoticeCode.CONFIRMATION_REQUIRED]
    assert result.calls == []


def test_budget_question_must_carry_marker_and_options() -> None:
    ask = call(ASK_USER_TOOL, question="Shall I go on?", options=[CONTINUE_EXPLORING, STOP_EXPLORING])
    _, result = play(T + action(ask), rules(confirmation_required=True))
    assert codes(result) == [NoticeCode.CONFIRMATION_REQUIRED]
    assert result.calls == []


def test_budget_question_with_marker_and_options_runs() -> None:
    ask = call(ASK_USER_TOOL, question=f"{EXPLORATION_MARKER} Go on?", options=[CONTINUE_EXPLORING, STOP_EXPLORING])
    _, result = play(T + action(ask), rules(confirmation_required=True))
    assert result.notices == []
    assert [c.call.tool_id for c in result.calls] == [ASK_USER_TOOL]


def test_exploration_stopped_denies_exploration_tools() -> None:
    _, result = play(T + action(call("demo.search", query="x")), rules(exploration_stopped=True))
    assert codes(result) == [NoticeCode.TOOL_UNAVAILABLE]


def test_finalize_only_round_denies_tools() -> None:
    _, result = play(T + action(call("demo.clock")), rules(finalize_only=True))
    assert codes(result) == [NoticeCode.TOOL_UNAVAILABLE]
    assert result.calls == []


def test_finalize_only_round_allows_complete() -> None:
    _, result = play(T + action(complete("Stopping here.")), rules(finalize_only=True))
    assert result.outcome is RoundOutcome.FINISH


# the trait matrix (#trait-matrix, #traits)

TRAIT_TOOLS = {trait: f"synthetic.{trait}" for trait in Trait}
TRAIT_CATALOG = Catalog(ToolDecl(tool_id, trait=trait) for trait, tool_id in TRAIT_TOOLS.items())


# The matrix as docs/design.md#trait-matrix writes it, cell by cell: (accepted, candidate) → may the
# candidate share the round? Written out here, not read from the code, so a flipped cell fails.
EXPECTED_TRAIT_MATRIX = {
    ("exploration", "exploration"): True,
    ("exploration", "exploitation"): False,   # it may read the in-flight result
    ("exploration", "neutral"): True,
    ("exploration", "unknown"): False,
    ("exploitation", "exploration"): True,
    ("exploitation", "exploitation"): True,
    ("exploitation", "neutral"): True,
    ("exploitation", "unknown"): False,
    ("neutral", "exploration"): True,
    ("neutral", "exploitation"): True,
    ("neutral", "neutral"): True,
    ("neutral", "unknown"): False,
    ("unknown", "exploration"): False,
    ("unknown", "exploitation"): False,
    ("unknown", "neutral"): False,
    ("unknown", "unknown"): False,
}


def test_trait_matrix_table_is_the_documented_one() -> None:
    assert {(str(a), str(c)): v for (a, c), v in TRAIT_MATRIX.items()} == EXPECTED_TRAIT_MATRIX


@pytest.mark.parametrize(("pair", "compatible"), EXPECTED_TRAIT_MATRIX.items(), ids=lambda v: "-".join(v) if isinstance(v, tuple) else str(v))
def test_trait_matrix(pair: tuple[str, str], compatible: bool) -> None:
    accepted, candidate = Trait(pair[0]), Trait(pair[1])
    raw = T + action(call(TRAIT_TOOLS[accepted])) + action(call(TRAIT_TOOLS[candidate]))
    _, result = play(chunks(raw, 7), rules(catalog=TRAIT_CATALOG, validate_params=None))
    assert lane(result.streamed_state, 0).status == GateStatus.ALLOWED
    if compatible:
        assert lane(result.streamed_state, 1).status == GateStatus.ALLOWED
        assert [c.call.tool_id for c in result.calls] == [TRAIT_TOOLS[accepted], TRAIT_TOOLS[candidate]]
        assert result.notices == []
    else:
        assert lane(result.streamed_state, 1).status == GateStatus.DENIED
        assert [c.call.tool_id for c in result.calls] == [TRAIT_TOOLS[accepted]]
        assert codes(result) == [NoticeCode.INCOMPATIBLE_TRAITS]


def test_incompatible_traits_notice_names_both_tools_and_traits() -> None:
    _, result = play(T + action(call("demo.search", query="q3")) + action(call("demo.render", source="q3", format="pdf")))
    [notice] = result.notices
    assert notice.code is NoticeCode.INCOMPATIBLE_TRAITS
    assert (notice.index, notice.tool_id) == (1, "demo.render")
    for word in ("demo.search", "exploration", "demo.render", "exploitation"):
        assert word in notice.message


def test_unknown_trait_is_compatible_with_nothing() -> None:
    unknown = TRAIT_TOOLS[Trait.UNKNOWN]
    for other in TRAIT_TOOLS.values():
        for first, second in ((unknown, other), (other, unknown)):
            _, result = play(T + action(call(first)) + action(call(second)), rules(catalog=TRAIT_CATALOG, validate_params=None))
            assert codes(result) == [NoticeCode.INCOMPATIBLE_TRAITS], (first, second)


def test_tool_declaring_no_trait_is_unknown() -> None:
    assert ToolDecl("t.bare").trait is Trait.UNKNOWN


def test_profile_trait_override_changes_the_verdict() -> None:
    catalog = rules().catalog.with_overrides(traits={"demo.search": Trait.NEUTRAL})
    events, result = play(T + action(call("demo.search", query="x")) + action(complete("Done.")), rules(catalog=catalog))
    assert answer_text(events) == "Done."
    assert result.outcome is RoundOutcome.FINISH


# == channels consistency, post-stream validation (#validation) ===========================================


def test_code_only_with_uses_code_tool() -> None:
    events, result = play(chunks(T + action(call("demo.eval")) + "<channel:code>(1 + 2) * 3</channel:code>", 4))
    [event] = tool_calls(events)
    assert (event.call.tool_id, event.call.code) == ("demo.eval", "(1 + 2) * 3")
    assert result.calls[0].call.code == "(1 + 2) * 3"
    assert result.notices == []


def test_code_block_without_uses_code_tool_is_channels_violation() -> None:
    _, result = play(T + action(call("demo.clock")) + "<channel:code>1 + 2</channel:code>")
    assert codes(result) == [NoticeCode.CHANNELS]
    assert result.notices[0].violations == ("a <channel:code> block is only allowed with a tool that uses code",)


def test_uses_code_tool_without_code_block_is_not_run() -> None:
    events, result = play(T + action(call("demo.eval")))
    assert tool_calls(events) == [] and result.calls == []
    assert codes(result) == [NoticeCode.CHANNELS]
    assert (result.notices[0].index, result.notices[0].tool_id) == (0, "demo.eval")


def test_summary_only_with_complete_or_exit() -> None:
    _, result = play(T + action(call("demo.clock")) + "<channel:summary>So far: nothing.</channel:summary>")
    assert codes(result) == [NoticeCode.CHANNELS]
    assert result.notices[0].violations == ("a <channel:summary> block is only allowed with complete or exit",)


def test_summary_with_complete_is_kept() -> None:
    _, result = play(T + action(complete("Done.")) + "<channel:summary>We found rain.</channel:summary>")
    assert result.outcome is RoundOutcome.FINISH
    assert result.summary == "We found rain."


def test_out_of_order_blocks_swallowed() -> None:
    raw = T + action(call("demo.eval")) + "<channel:code>1</channel:code>" + action(complete("Sneaky."))
    events, result = play(raw)
    assert answer_text(events) == ""
    assert len(result.streamed_state.lanes) == 1
    assert result.notices[-1].violations == ("action blocks must come before code and summary",)


def test_unclosed_block_at_end_of_stream() -> None:
    _, result = play(T + action(call("demo.clock"))[:-len("</channel:action>")])
    assert result.calls == [] and result.outcome is RoundOutcome.RETRY
    channels = [n for n in result.notices if n.code is NoticeCode.CHANNELS]
    assert channels[0].violations == ("block <channel:action> was not closed",)


def test_valid_round_finishes_with_no_notices() -> None:
    _events, result = play(chunks(T + action(complete("Paris: rain, 12 °C.")), 3))
    assert result.outcome is RoundOutcome.FINISH
    assert result.final is not None and result.final.final_answer == "Paris: rain, 12 °C."
    assert result.notices == []


def test_exit_finishes_with_reason() -> None:
    body = {"action": "exit", "final_answer": "I cannot reach that system.", "reason": "no access"}
    _, result = play(T + action(body))
    assert result.outcome is RoundOutcome.FINISH
    assert result.final is not None and result.final.reason == "no access"


def test_final_answer_streamed_then_validation_fails_is_salvaged() -> None:
    raw = T + action(complete("Rain in Paris."))[: -len("\n```</channel:action>")] + "<channel:summary>s"
    events, result = play(chunks(raw, 4))
    assert result.outcome is RoundOutcome.SALVAGE
    assert result.answer_text == answer_text(events) == "Rain in Paris."


def test_salvage_keeps_exactly_the_streamed_text_of_a_cut_answer() -> None:
    raw = T + '<channel:action>{"action": "complete", "final_answer": "Rain in Pa'
    events, result = play(chunks(raw, 4))
    assert result.outcome is RoundOutcome.SALVAGE
    assert result.answer_text == answer_text(events) == "Rain in Pa"


def test_progress_streamed_no_final_answer_keeps_thinking_and_retries() -> None:
    _, result = play(T + action('{"action": "call_tool", "tool_call": }'))
    assert result.outcome is RoundOutcome.RETRY
    assert result.thinking == "Checking."
    assert result.streamed_state.answer_streamed is False
    assert codes(result) == [NoticeCode.SCHEMA]


def test_nothing_reached_a_lane_notice_only_retry() -> None:
    events, result = play("<channel:thinking></channel:thinking><channel:action>{oops}</channel:action>")
    assert events == []
    assert result.outcome is RoundOutcome.RETRY and result.thinking == ""
    assert all(lane.emitted_chars == 0 for lane in result.streamed_state.lanes)
    assert codes(result) == [NoticeCode.SCHEMA]


def test_valid_action_runs_in_partly_invalid_round() -> None:
    raw = T + action(call("demo.clock")) + action({**call("demo.clock"), "why": "twice"})
    events, result = play(raw)
    assert result.outcome is RoundOutcome.TOOLS
    assert [c.index for c in result.calls] == [0]
    assert [e.index for e in tool_calls(events)] == [0]
    assert codes(result) == [NoticeCode.SCHEMA] and result.notices[0].index == 1


def test_denied_action_does_not_fail_validation() -> None:
    _, result = play(T + action(complete("Done.")) + action(call("demo.clock")))
    assert result.outcome is RoundOutcome.FINISH
    assert codes(result) == [NoticeCode.AFTER_FINAL]


# == streamed_state (#streamed-state) ===========================================================================


def test_streamed_state_from_gate_counters() -> None:
    raw = T + action(call("demo.clock")) + action(complete('Say "hi"\\n\n'))
    events, result = play(chunks(raw, 3))
    assert msgspec.to_builtins(result.streamed_state) == {  # as round.completed carries it
        "answer_streamed": True,
        "answer_text": 'Say "hi"\\n\n',
        "lanes": [
            {"index": 0, "lane": "tool", "status": "allowed", "emitted_chars": 0},
            {"index": 1, "lane": "answer", "status": "allowed", "emitted_chars": len('Say "hi"\\n\n')},
        ],
    }
    assert answer_text(events) == result.streamed_state.answer_text


def test_streamed_state_ignores_answers_that_never_reached_a_client() -> None:
    raw = T + action(call("demo.search", query="x")) + action(complete("Denied answer."))
    _, result = play(raw)
    assert result.streamed_state.answer_streamed is False
    assert result.streamed_state.answer_text == ""


def test_thinking_is_never_evidence_of_an_answer() -> None:
    _, result = play(thinking("The answer is 42.") + "<channel:action>{")
    assert result.thinking == "The answer is 42."
    assert msgspec.to_builtins(result.streamed_state) == {  # as round.completed carries it
        "answer_streamed": False,
        "answer_text": "",
        "lanes": [{"index": 0, "lane": "unknown", "status": "denied", "emitted_chars": 0}],
    }


# == notices (#notices) ==================================================================================


def test_notice_carries_code_index_tool_and_violations() -> None:
    _, result = play(T + action(call("demo.render", source="q3", format="docx")))
    [notice] = result.notices
    d = notice.to_dict()
    assert set(d) == {"code", "message", "index", "tool_id", "violations"}
    assert (d["code"], d["index"], d["tool_id"]) == (NoticeCode.TOOL_CALL_INVALID, 0, "demo.render")
    assert any(v.startswith("format:") for v in d["violations"])


def test_notice_does_not_echo_rejected_params() -> None:
    _, result = play(T + action(call("demo.render", source="TOP-SECRET-SOURCE", format="docx")))
    assert "TOP-SECRET-SOURCE" not in json.dumps([n.to_dict() for n in result.notices])
    assert "docx" not in json.dumps([n.to_dict() for n in result.notices])


def test_channel_notice_has_no_index() -> None:
    _, result = play(T)
    assert "index" not in result.notices[0].to_dict()
