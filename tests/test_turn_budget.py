"""The exploration budget and its confirmation protocol (docs/design.md#exploration-budget) and ask_user (#ask-user), through LiteLLM."""

from __future__ import annotations

import asyncio

from actors.gates import CONTINUE_EXPLORING, EXPLORATION_MARKER, STOP_EXPLORING
from protocol.notices import NoticeCode
from tests.convkit import (
    action,
    answer_round,
    call,
    harness,
    rounds_script,
    text_round,
    thinking,
    tool_round,
)

BUDGET_QUESTION = f"{EXPLORATION_MARKER} I have searched a lot. Go on?"


def two_searches(n: int) -> dict[str, object]:
    return text_round(
        thinking(f"Searching, batch {n}."),
        action(call("demo.search", query=f"paris weather {2 * n - 1}")),
        action(call("demo.search", query=f"paris guide {2 * n}")),
    )


def budget_script(*after: dict[str, object]) -> dict[str, object]:
    """Four rounds of two searches (8 calls, cap 7), a non-ask call, then the budget question."""
    return rounds_script(
        *(two_searches(n) for n in range(1, 5)),
        tool_round("demo.clock", say="Checking the time instead."),       # must be the question → notice
        tool_round("react.ask_user", say="Asking.", question=BUDGET_QUESTION,
                   options=[CONTINUE_EXPLORING, STOP_EXPLORING]),
        *after,
    )


async def test_exploration_over_the_cap_is_not_executed_and_the_next_call_must_be_the_question() -> None:
    h = harness(budget_script(tool_round("demo.search", query="eiffel tower"), answer_round("Done.")),
                exploration_soft_cap=7)
    h.answer_asks(CONTINUE_EXPLORING)
    done = await h.turn("find everything about paris")

    searches = h.results("demo.search")
    assert [r["ok"] for r in searches[:8]] == [True] * 7 + [False]
    assert searches[7]["error"] == "EXPLORATION_BUDGET_REACHED"
    assert "result" not in searches[7]                                    # not executed
    # The call after the budget was reached is not the question: denied, nothing runs.
    assert h.notice_codes()[4] == [NoticeCode.CONFIRMATION_REQUIRED]
    assert h.named("tool.call", round=5) == []
    [ask] = h.named("ask_user")
    assert EXPLORATION_MARKER in ask["question"]
    assert ask["options"] == [CONTINUE_EXPLORING, STOP_EXPLORING]
    # "Continue exploring" resets the count: a further search executes.
    assert searches[8]["ok"] is True and len(searches) == 9
    assert done["reason"] == "complete" and done["finish_ok"] is True
    h.check_invariants()


async def test_stop_for_now_denies_exploration_for_the_rest_of_the_turn() -> None:
    h = harness(budget_script(tool_round("demo.search", query="eiffel tower"), answer_round("Stopping here.")),
                exploration_soft_cap=7)
    h.answer_asks(STOP_EXPLORING)
    done = await h.turn("find everything about paris")

    after_stop = h.rounds()[6]
    assert [n["code"] for n in after_stop["notices"]] == [NoticeCode.TOOL_UNAVAILABLE]
    assert after_stop["denied"] == [{"index": 0, "code": NoticeCode.TOOL_UNAVAILABLE, "tool_id": "demo.search"}]
    assert len(h.results("demo.search")) == 8                               # nothing more was executed
    assert "demo.search" not in h.calls[-1].tools()                         # nor offered to the model
    assert done["reason"] == "complete"
    h.check_invariants()


async def test_budget_question_without_the_marker_is_refused() -> None:
    # A question without the marker before the proper one.
    script = budget_script(answer_round("Done."))
    script["rounds"].insert(5, tool_round("react.ask_user", question="Go on?",  # type: ignore[attr-defined]
                                          options=[CONTINUE_EXPLORING, STOP_EXPLORING]))
    h = harness(script, exploration_soft_cap=7)
    h.answer_asks(CONTINUE_EXPLORING)
    done = await h.turn("find everything about paris")

    assert h.notice_codes()[5] == [NoticeCode.CONFIRMATION_REQUIRED]
    assert len(h.named("ask_user")) == 1
    assert done["reason"] == "complete"
    h.check_invariants()


async def test_ask_user_answer_becomes_the_observation_and_no_model_call_while_paused() -> None:
    h = harness(rounds_script(
        tool_round("react.ask_user", question="Which city?", options=["Paris", "London"]),
        tool_round("demo.weather", city="London"),
        answer_round("Cloudy in London, 9 °C."),
    ))
    h.send("what's the weather?")
    ask = await h.wait_event("ask_user")
    assert ask.data.question == "Which city?" and ask.data.options == ["Paris", "London"]
    assert ask.data.timeout_s == 300
    calls_at_ask = h.model_calls
    # Let the loop run freely while paused: still no model call.
    for _ in range(50):
        await asyncio.sleep(0)
    assert h.model_calls == calls_at_ask == 1
    assert h.conv.pending_asks() == [ask.data.ask_id]

    assert h.conv.answer(ask.data.ask_id, "London")
    await h.idle()
    [result] = h.results("react.ask_user")
    assert result["ok"] is True and result["result"] == {"answer": "London"}
    assert '{"answer": "London"}' in h.calls[1].text()
    assert h.completed()[-1]["final_answer"] == "Cloudy in London, 9 °C."
    assert not h.conv.answer(ask.data.ask_id, "Paris")                  # a late second answer does nothing
    h.check_invariants()


async def test_ask_user_timeout_becomes_an_error_observation_and_the_loop_goes_on() -> None:
    h = harness(
        rounds_script(tool_round("react.ask_user", question="Which city?"), answer_round("No answer; stopping.")),
        ask_user_timeout_s=0.05,
    )
    done = await h.turn("weather?")

    [result] = h.results("react.ask_user")
    assert result["ok"] is False and result["error"] == "ask_user_timeout"
    assert '{"error": "ask_user_timeout"}' in h.calls[1].text()
    assert done["reason"] == "complete" and done["finish_ok"] is True
    assert h.conv.pending_asks() == []
    h.check_invariants()
