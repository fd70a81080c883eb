"""Steer (docs/design.md#steer), follow-ups (#follow-ups) and cancel, through LiteLLM with scripted models.

Slow scripts (`delay_ms`) keep a generation or tool wait in flight; the test acts when the event
that proves it is in flight is published, never after a guessed sleep.
"""

from __future__ import annotations

from protocol.notices import NoticeCode
from protocol.timeline import NoticeBlock
from tests.convkit import (
    action,
    answer_round,
    call,
    complete,
    harness,
    rounds_script,
    thinking,
    tool_round,
)

SLOW_THINKING = {
    "deltas": ["<channel:thinking>Look", "ing up ", "the weather ", "in every city ", "of the world",
               "</channel:thinking>", action(call("demo.search", query="weather"))],
    "delay_ms": 200,
}


async def test_steer_mid_generation_runs_one_finalize_round_that_sees_the_interrupted_raw() -> None:
    h = harness(rounds_script(
        SLOW_THINKING,
        tool_round("demo.clock", say="Let me check the time first."),    # finalize: tools are denied
        answer_round("Paris only: rain, 12 °C.", say="Finishing as asked."),
    ))
    h.when("thinking.delta", lambda e: h.conv.steer("just tell me about Paris"))
    done = await h.turn("weather everywhere?")

    first = h.rounds()[0]
    assert first.get("steered") is True
    assert h.named("tool.call") == []                                 # the cut call was never announced
    raw = h.text("thinking.delta", round=1)
    assert raw and "of the world" not in raw
    finalize = h.calls[1]
    steer_message = next(m["content"] for m in finalize.messages if m["content"].startswith("[steer]"))
    assert "just tell me about Paris" in steer_message
    assert "<channel:thinking>" + raw in steer_message                # the interrupted raw, as it streamed
    assert finalize.tools() == []                                     # only complete/exit
    assert h.notice_codes()[1] == [NoticeCode.TOOL_UNAVAILABLE]       # a tool call there is denied
    assert h.named("tool.call", round=2) == []
    assert done["reason"] == "complete" and done["final_answer"] == "Paris only: rain, 12 °C."
    assert h.model_calls == 3
    h.check_invariants()


async def test_steer_after_the_answer_streamed_is_salvaged_with_no_second_answer() -> None:
    answer = ["It is ", "raining ", "in Paris, ", "12 °C, ", "and it ", "will rain ", "all day."]
    h = harness(rounds_script(
        tool_round("demo.weather", city="Paris"),
        {"deltas": [thinking("Answering."), "<channel:action>{\"action\": \"complete\", \"final_answer\": \"",
                    *answer, "\"}</channel:action>"], "delay_ms": 150},
        answer_round("A second answer that must never be generated."),
    ))
    h.when("answer.delta", lambda e: h.conv.steer("stop there"))
    done = await h.turn("weather in paris?")

    streamed = h.text("answer.delta")
    assert streamed and streamed != "".join(answer)
    assert done["reason"] == "salvaged" and done["final_answer"] == streamed
    assert h.model_calls == 2
    assert [d["round"] for d in h.named("answer.delta")] == [2] * len(h.named("answer.delta"))
    assert len(h.completed()) == 1
    h.check_invariants()


async def test_steer_during_a_tool_wait_observes_steered_and_finalizes() -> None:
    h = harness(rounds_script(
        tool_round("demo.sleep", seconds=30),
        answer_round("Stopped waiting, as you asked."),
    ))
    h.when("round.completed", lambda e: h.conv.steer("never mind"), round=1)
    done = await h.turn("wait 30 seconds")

    [result] = h.results("demo.sleep")
    assert result["ok"] is False and result["error"] == "steered"
    finalize = h.calls[1]
    assert finalize.tools() == []
    assert any(m["content"].startswith("[steer] The user interrupted you: never mind") for m in finalize.messages)
    assert done["reason"] == "complete" and done["final_answer"] == "Stopped waiting, as you asked."
    h.check_invariants()


async def test_follow_up_mid_turn_starts_the_next_turn_after_this_one_ends() -> None:
    h = harness(rounds_script(
        {**tool_round("demo.weather", city="Paris"), "delay_ms": 30, "chunk_chars": 40},
        answer_round("Rain in Paris."),
        tool_round("demo.weather", city="London"),
        answer_round("Clouds in London."),
    ))
    sent_mid_turn: list[bool] = []

    def follow_up(e: object) -> None:
        sent_mid_turn.append(h.conv.busy and not h.completed())
        h.send("and London?", "m2")

    h.when("thinking.delta", follow_up, turn_id="t1")
    h.send("weather in paris?", "m1")
    await h.idle()

    assert sent_mid_turn == [True]
    order = [(e.event, getattr(e.data, "turn_id", None)) for e in h.events if e.event.startswith("turn.")]
    assert order == [("turn.started", "t1"), ("turn.completed", "t1"),
                     ("turn.started", "t2"), ("turn.completed", "t2")]
    turns = [e.data.turn_id for e in h.events if hasattr(e.data, "turn_id")]
    assert turns == sorted(turns)                                     # never interleaved
    assert [d["user_message_id"] for d in h.named("turn.started")] == ["m1", "m2"]
    assert [d["final_answer"] for d in h.completed()] == ["Rain in Paris.", "Clouds in London."]
    # The second turn's context holds the first turn and the new message.
    assert "Rain in Paris." in h.calls[2].text() and h.calls[2].messages[-1]["content"] == "and London?"
    h.check_invariants()


async def test_a_later_round_that_closes_empty_is_never_backfilled_with_an_earlier_answer() -> None:
    partial = "Rain in Paris, 12"
    h = harness(rounds_script(
        tool_round("demo.weather", city="Paris"),
        {"text": thinking("Answering.") + action(complete(partial + " °C."))[:-25], "error": "server_error"},
        # The follow-up turn: every round closes without an answer.
        {"text": thinking("Thinking about London"), "error": "server_error"},
        {"text": thinking("Still thinking") + "<channel:action>", "error": "server_error"},
    ), max_protocol_retries=1)
    h.when("thinking.delta", lambda e: h.send("and London?", "m2"), turn_id="t1")
    h.send("weather in paris?", "m1")
    await h.idle()

    first, second = h.completed()
    assert first["reason"] == "salvaged" and first["final_answer"].startswith(partial)
    assert second["reason"] == "provider_error"     # both rounds were cut by the provider, not the model
    assert partial not in second["final_answer"]
    assert h.named("answer.delta", turn_id="t2") == []
    assert all(not r["streamed_state"]["answer_streamed"] for r in h.rounds("t2"))
    h.check_invariants()


async def test_cancel_ends_the_turn_as_cancelled_and_a_queued_follow_up_still_runs() -> None:
    h = harness(rounds_script(
        tool_round("demo.sleep", seconds=30),
        tool_round("demo.clock"),
        answer_round("It is 2026."),
    ))

    def follow_up_then_cancel(e: object) -> None:
        h.send("what time is it?", "m2")
        h.conv.cancel()

    h.when("round.completed", follow_up_then_cancel, round=1, turn_id="t1")
    h.send("wait 30 seconds", "m1")
    await h.idle()

    first, second = h.completed()
    assert first["turn_id"] == "t1" and first["reason"] == "cancelled" and first["finish_ok"] is False
    assert second["turn_id"] == "t2" and second["reason"] == "complete"
    assert second["final_answer"] == "It is 2026."
    [sleep] = h.results("demo.sleep")
    assert sleep["ok"] is False                                       # the cut call still has its observation
    h.check_invariants()


async def test_cancel_in_a_later_round_observes_only_the_calls_still_owed() -> None:
    # Calls of earlier rounds already have their observation; a cancel must not give them another.
    h = harness(rounds_script(tool_round("demo.clock"), tool_round("demo.sleep", seconds=30)))
    h.when("tool.call", lambda e: h.conv.cancel(), round=2)
    done = await h.turn("time, then wait")

    assert done["reason"] == "cancelled"
    assert [(r["tool_id"], r["ok"]) for r in h.results()] == [("demo.clock", True), ("demo.sleep", False)]
    h.check_invariants()


async def test_cancel_mid_generation_ends_the_turn_as_cancelled() -> None:
    h = harness(rounds_script(SLOW_THINKING, tool_round("demo.clock"), answer_round("It is 2026.")))
    h.when("thinking.delta", lambda e: h.conv.cancel())
    done = await h.turn("weather everywhere?")

    assert done["reason"] == "cancelled"
    assert h.model_calls == 1
    assert not h.conv.busy
    h.check_invariants()


async def test_cancel_after_a_call_was_announced_still_gives_it_an_observation() -> None:
    h = harness(rounds_script({
        "deltas": [thinking("Two calls."), action(call("demo.clock")), "<channel:action>{\"action\": ",
                   "\"call_tool\", ", "\"tool_call\": {\"tool_id\": \"demo.clock\", \"params\": {}}}",
                   "</channel:action>"],
        "delay_ms": 200,
    }))
    h.when("tool.call", lambda e: h.conv.cancel())
    done = await h.turn("time?")

    assert done["reason"] == "cancelled"
    [result] = h.results("demo.clock")
    assert result["ok"] is False and result["error"] == "cancelled"
    h.check_invariants()


async def test_steer_while_waiting_for_the_user_observes_steered_and_forgets_the_question() -> None:
    h = harness(rounds_script(
        tool_round("react.ask_user", question="Which city?"),
        answer_round("Fine, I will stop asking."),
    ))
    asked = h.when("ask_user", lambda e: h.conv.steer("forget it"))
    done = await h.turn("weather?")

    [result] = h.results("react.ask_user")
    assert result["error"] == "steered"
    assert h.conv.pending_asks() == []
    assert not h.conv.answer(asked.result().data.ask_id, "Paris")     # too late: nothing waits for it
    assert done["reason"] == "complete" and h.calls[1].tools() == []
    h.check_invariants()


async def test_cancel_while_waiting_for_the_user_ends_the_turn_and_observes_the_question() -> None:
    h = harness(rounds_script(tool_round("react.ask_user", question="Which city?")))
    h.when("ask_user", lambda e: h.conv.cancel())
    done = await h.turn("weather?")

    assert done["reason"] == "cancelled"
    assert [r["error"] for r in h.results("react.ask_user")] == ["cancelled"]
    assert h.conv.pending_asks() == [] and h.model_calls == 1
    h.check_invariants()


async def test_steer_with_no_turn_running_is_a_message_of_its_own() -> None:
    h = harness(rounds_script(tool_round("demo.clock"), answer_round("It is 2026.")))
    h.conv.steer("what time is it?")
    await h.idle()

    [started] = h.named("turn.started")
    assert started["user_message_id"].startswith("steer-")
    assert h.completed()[0]["reason"] == "complete"
    h.check_invariants()


async def test_a_round_cut_by_a_steer_is_not_reported_to_the_model_as_malformed() -> None:
    h = harness(rounds_script(SLOW_THINKING, answer_round("Paris only: rain, 12 °C.", say="Finishing.")))
    h.when("thinking.delta", lambda e: h.conv.steer("just Paris"))
    await h.turn("weather everywhere?")
    first = h.rounds()[0]
    assert first.get("steered") is True
    assert first["notices"] == []  # the unclosed thinking block is the steer's doing, not the model's
    assert not any(isinstance(block, NoticeBlock) for block in h.conv.state.timeline)
