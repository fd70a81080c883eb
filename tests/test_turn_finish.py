"""The turn's ending rules, each driven by a script through LiteLLM: observe before finish (docs/design.md#observe-before-finish),
every tool call gets an observation (#observations), the iteration limit (#limits) and the protocol-retry
limit (#validation)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from actors.llm.stream import ModelDelta, ModelFinished
from actors.turn_machine import GIVE_UP_MESSAGES
from protocol.notices import NoticeCode
from tests.convkit import (
    action,
    answer_round,
    call,
    complete,
    harness,
    rounds_script,
    text_round,
    thinking,
    tool_round,
)

FINISH_FIRST = rounds_script(
    answer_round("Paris is rainy.", say="I know this one."),          # complete before any tool
    tool_round("demo.weather", city="Paris"),
    answer_round("It is raining in Paris, 12 °C."),
)


async def test_finish_before_any_tool_is_never_shown_and_retried_after_a_tool() -> None:
    h = harness(FINISH_FIRST)
    done = await h.turn("weather in paris?")

    assert h.named("answer.delta", round=1) == []                      # the illegal answer never streamed
    first = h.rounds()[0]
    assert [n["code"] for n in first["notices"]] == [NoticeCode.FINISH_ILLEGAL]
    assert first["streamed_state"]["answer_streamed"] is False
    [trace] = h.traces("illegal_finish")
    assert trace["round"] == 1
    assert trace["events"][0]["event"] == "turn.started"                 # the turn's events so far
    assert "thinking.delta" in [e["event"] for e in trace["events"]]

    assert done["reason"] == "complete"
    assert done["final_answer"] == "It is raining in Paris, 12 °C."
    assert done["finish_ok"] is True and done["used_tools"] is True
    assert h.text("answer.delta") == "It is raining in Paris, 12 °C."
    assert h.traces("no_tool_finish") == []
    h.check_invariants()


async def test_finish_without_tool_is_allowed_and_flagged_under_allow_no_tool() -> None:
    h = harness(FINISH_FIRST, finish_policy="allow_no_tool")
    done = await h.turn("weather in paris?")

    assert done["reason"] == "complete"
    assert done["final_answer"] == "Paris is rainy."
    assert done["used_tools"] is False and done["finish_ok"] is True
    assert len(h.traces("no_tool_finish")) == 1
    assert h.traces("illegal_finish") == []
    assert h.model_calls == 1
    h.check_invariants()


async def test_tool_timeout_becomes_an_error_observation_and_finishing_after_it_is_legal() -> None:
    h = harness(
        rounds_script(tool_round("demo.sleep", seconds=5), answer_round("The wait timed out.")),
        tool_timeout_s=0.05,
    )
    done = await h.turn("wait a bit")

    [result] = h.results("demo.sleep")
    assert result["ok"] is False and result["error"] == "timeout"
    assert "result" not in result
    assert done["reason"] == "complete" and done["finish_ok"] is True
    assert '"error": "timeout"' in h.calls[1].text()                   # the model saw the observation
    h.check_invariants()


async def test_tool_exception_becomes_an_error_observation_and_finishing_after_it_is_legal() -> None:
    h = harness(rounds_script(tool_round("demo.fail", message="disk on fire"), answer_round("The tool failed.")))
    done = await h.turn("try it")

    [result] = h.results("demo.fail")
    assert result["ok"] is False and result["error"] == "tool_error"
    assert result["detail"]["message"] == "disk on fire"
    assert done["reason"] == "complete" and done["finish_ok"] is True
    assert "disk on fire" in h.calls[1].text()
    h.check_invariants()


async def test_max_iterations_ends_the_turn_with_iteration_limit() -> None:
    h = harness(rounds_script(tool_round("demo.clock"), loop=True), max_iterations=3)
    done = await h.turn("what time is it, forever")

    assert done["reason"] == "iteration_limit"
    assert done["finish_ok"] is False
    assert done["final_answer"] == GIVE_UP_MESSAGES["iteration_limit"]
    [trace] = h.traces("iteration_limit")
    assert trace["rounds"] == 3
    assert len(h.rounds()) == 3 and h.model_calls == 3
    h.check_invariants()


async def test_protocol_retries_exhausted_end_the_turn_with_a_plain_message() -> None:
    h = harness(rounds_script(text_round("Sure! Here is my answer."), loop=True), max_protocol_retries=2)
    done = await h.turn("hello")

    assert done["reason"] == "protocol_violation"
    assert done["finish_ok"] is False
    assert done["final_answer"] == GIVE_UP_MESSAGES["protocol_violation"]
    assert "<channel:" not in done["final_answer"] and "{" not in done["final_answer"]
    assert h.notice_codes() == [[NoticeCode.PREAMBLE]] * 3                 # the first try + 2 retries
    assert h.model_calls == 3
    assert h.named("thinking.delta") == [] and h.named("answer.delta") == []
    h.check_invariants()


async def test_a_preamble_stops_reading_and_closes_the_provider_stream() -> None:
    read: list[str] = []
    closed: list[bool] = []

    async def provider(models: Any, messages: Any, **kwargs: Any) -> AsyncIterator[Any]:
        try:
            for text in ["Sure", "! ", thinking("late"), action(complete("never shown"))]:
                read.append(text)
                yield ModelDelta(text)
            yield ModelFinished("stop", models[0])
        finally:
            closed.append(True)

    h = harness(model="scripted/unused", stream=provider, max_protocol_retries=0)
    done = await h.turn("hello")

    assert read == ["Sure"]                       # the first impossible delta ends the generation
    assert closed == [True]
    assert done["reason"] == "protocol_violation"
    assert h.notice_codes() == [[NoticeCode.PREAMBLE]]
    h.check_invariants()


async def test_retry_goes_decision_to_decision_without_running_a_tool() -> None:
    # A round whose only action is malformed runs nothing and is retried with a notice.
    bad = text_round(thinking("Trying."), "<channel:action>{\"action\": \"call_tool\", \"tool_call\": 3}</channel:action>")
    h = harness(rounds_script(bad, tool_round("demo.clock"), answer_round("Done.")))
    done = await h.turn("hello")

    assert h.notice_codes()[0] == [NoticeCode.SCHEMA]
    assert h.named("tool.call", round=1) == []
    assert done["reason"] == "complete" and done["finish_ok"] is True
    assert "[notice]" in h.calls[1].text()
    h.check_invariants()


async def test_valid_action_runs_when_its_sibling_is_malformed() -> None:
    mixed = text_round(
        thinking("Two things."),
        action(call("demo.clock")),
        "<channel:action>{\"action\": \"call_tool\", \"tool_call\": {\"tool_id\": \"demo.search\"}}</channel:action>",
    )
    h = harness(rounds_script(mixed, answer_round("It is 2026.")))
    done = await h.turn("time?")

    assert [d["tool_id"] for d in h.named("tool.call")] == ["demo.clock"]
    assert [n["code"] for n in h.rounds()[0]["notices"]] == [NoticeCode.TOOL_CALL_INVALID]
    assert h.results("demo.clock")[0]["result"] == {"now": "2026-01-01T00:00:00Z"}
    assert done["reason"] == "complete"
    h.check_invariants()


async def test_exit_after_an_observation_ends_the_turn_with_reason_exit() -> None:
    h = harness(rounds_script(
        tool_round("demo.weather", city="Atlantis"),
        text_round(thinking("No data."), action({"action": "exit", "final_answer": "I have no data for Atlantis.",
                                                 "reason": "unknown city"})),
    ))
    done = await h.turn("weather in atlantis?")

    assert done["reason"] == "exit" and done["final_answer"] == "I have no data for Atlantis."
    assert done["finish_ok"] is True
    assert h.text("answer.delta") == "I have no data for Atlantis."
    h.check_invariants()
