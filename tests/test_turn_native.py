"""Native function calling through a whole turn (docs/design.md#native): the same governance as the
channel protocol over the model's own calls, and every request the provider receives valid for it
(tests/nativekit.py checks each one)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from actors.gates import CONTINUE_EXPLORING, EXPLORATION_MARKER, STOP_EXPLORING
from protocol.deltas import ReasoningDelta, ReasoningSignature
from protocol.notices import NoticeCode
from tests.convkit import Harness, harness, profile_for
from tests.nativekit import NativeModel, NativeRound, answer_round, call, reasoning, text, tools_round

PREAMBLE = "I'll check the weather for you."
ANSWER = "It is raining in Paris, 12 °C. Take an umbrella."


def native(rounds: list[NativeRound], *, model: str = "openai/acme", mode: str = "agent",
           **policies: Any) -> tuple[Harness, NativeModel]:
    fake = NativeModel(rounds)
    profile = profile_for(model, **policies).model_copy(update={"decision": "native"})
    h = harness(profile=profile, stream=fake, mode=mode,
                count_tokens=lambda messages: sum(len(json.dumps(m)) for m in messages) // 4)
    return h, fake


def tool_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in messages if m["role"] == "tool"]


async def test_a_call_then_its_answer_natively_with_the_preamble_kept_out_of_the_answer() -> None:
    h, model = native([
        tools_round(text(PREAMBLE), call(0, "demo_weather", {"city": "Paris"})),
        answer_round(ANSWER),
    ])
    done = await h.turn("What's the weather in Paris?")

    assert done["reason"] == "complete" and done["final_answer"] == ANSWER == h.text("answer.delta")
    assert PREAMBLE not in h.text("answer.delta") and PREAMBLE in h.text("thinking.delta")
    [called] = h.named("tool.call")
    assert called["tool_id"] == "demo.weather" and called["params"] == {"city": "Paris"}
    first, second = model.requests
    # The request: functions, not a prompt catalog or channel teaching.
    assert "demo_weather" in first.functions and "react_ask_user" in first.functions
    assert "<channel:" not in first.system and "Tools available now" not in first.system
    # The history in the provider's shape: the call, answered by its observation.
    [assistant] = [m for m in second.messages if m.get("tool_calls")]
    assert assistant["content"] == PREAMBLE
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in assistant["tool_calls"]] \
        == [("t1_1_0", "demo_weather", {"city": "Paris"})]
    [answer] = tool_messages(second.messages)
    assert answer["tool_call_id"] == "t1_1_0" and json.loads(answer["content"])["condition"] == "rain"
    h.check_invariants()


async def test_finishing_before_any_observation_is_illegal_and_nothing_is_shown() -> None:
    h, model = native([
        answer_round("It is sunny, I am sure."),
        tools_round(call(0, "demo_weather", {"city": "Paris"})),
        answer_round(ANSWER),
    ])
    done = await h.turn("weather?")

    assert "sunny" not in h.text("answer.delta") and done["final_answer"] == ANSWER
    assert h.notice_codes()[0] == [NoticeCode.FINISH_ILLEGAL] and h.traces("illegal_finish")
    notices = [m for m in model.requests[1].messages if m["role"] == "user" and m["content"].startswith("[notice]")]
    assert [json.loads(m["content"][len("[notice] "):])["code"] for m in notices] == ["finish.illegal"]
    h.check_invariants()


async def test_incompatible_parallel_calls_run_the_first_and_answer_the_second_with_its_notice() -> None:
    h, model = native([
        tools_round(call(0, "demo_search", {"query": "q3"}), call(1, "demo_render", {"source": "q3", "format": "pdf"})),
        answer_round("Found it."),
    ])
    await h.turn("find q3 and render it")

    assert [r["tool_id"] for r in h.results()] == ["demo.search"]
    [assistant] = [m for m in model.requests[1].messages if m.get("tool_calls")]
    assert [json.loads(c["function"]["arguments"]) for c in assistant["tool_calls"]] == [{"query": "q3"}, {}]
    answers = {m["tool_call_id"]: json.loads(m["content"]) for m in tool_messages(model.requests[1].messages)}
    assert answers["t1_1_1"]["code"] == "multi_action.incompatible_traits" and "results" in answers["t1_1_0"]
    h.check_invariants()


async def test_a_third_call_is_past_the_limit_and_still_answered() -> None:
    h, model = native([
        tools_round(call(0, "demo_clock", {}), call(1, "demo_clock", {}), call(2, "demo_clock", {})),
        answer_round("Noon."),
    ])
    await h.turn("time?")

    assert len(h.results()) == 2 and h.notice_codes()[0] == [NoticeCode.TOO_MANY_ACTIONS]
    answers = {m["tool_call_id"]: json.loads(m["content"]) for m in tool_messages(model.requests[1].messages)}
    assert answers["t1_1_2"]["code"] == "protocol_violation.too_many_actions"


async def test_invalid_arguments_never_run_and_the_model_reads_the_violations() -> None:
    h, model = native([
        tools_round(call(0, "demo_weather", '{"city": "Par')),
        tools_round(call(0, "demo_weather", {"town": "Paris"})),
        tools_round(call(0, "demo_weather", {"city": "Paris"})),
        answer_round(ANSWER),
    ])
    await h.turn("weather?")

    assert [r["tool_id"] for r in h.results()] == ["demo.weather"]
    assert h.notice_codes()[:2] == [[NoticeCode.TOOL_CALL_INVALID], [NoticeCode.TOOL_CALL_INVALID]]
    [bad_json] = tool_messages(model.requests[1].messages)
    assert json.loads(bad_json["content"])["violations"] == ["the arguments are not valid JSON"]
    h.check_invariants()


async def test_ask_mode_leaves_write_tools_out_of_the_request_and_denies_a_call_to_one() -> None:
    h, model = native([
        tools_round(call(0, "demo_focus_project", {"name": "groceries"})),
        tools_round(call(0, "demo_write_note", {"text": "milk"})),
        answer_round("I cannot write notes in ask mode."),
    ], mode="ask")
    await h.turn("note milk")

    assert all("demo_write_note" not in r.functions for r in model.requests)
    assert h.notice_codes()[1] == [NoticeCode.ASK_MODE_DENIED]
    assert h.workspace().get("notes") in (None, [])


async def test_a_state_transition_changes_the_functions_of_the_next_request() -> None:
    h, model = native([
        tools_round(call(0, "demo_focus_project", {"name": "groceries"})),
        tools_round(call(0, "demo_write_note", {"text": "milk"})),
        answer_round("Noted."),
    ])
    done = await h.turn("note milk in groceries")

    assert "demo_write_note" not in model.requests[0].functions
    assert "demo_write_note" in model.requests[1].functions
    assert done["final_answer"] == "Noted." and [r["ok"] for r in h.results()] == [True, True]


async def test_the_exploration_budget_asks_the_user_through_the_ask_function() -> None:
    question = f"{EXPLORATION_MARKER} I have searched a lot. Go on?"
    h, model = native([
        tools_round(call(0, "demo_search", {"query": "a"}), call(1, "demo_search", {"query": "b"})),
        tools_round(call(0, "demo_clock", {})),
        tools_round(call(0, "react_ask_user", {"question": question, "options": [CONTINUE_EXPLORING, STOP_EXPLORING]})),
        tools_round(call(0, "demo_search", {"query": "c"})),
        answer_round("Done."),
    ], exploration_soft_cap=1)
    h.answer_asks(STOP_EXPLORING)
    done = await h.turn("search everything")

    assert [r.get("error") for r in h.results("demo.search")] == [None, "EXPLORATION_BUDGET_REACHED"]
    assert h.notice_codes()[1] == [NoticeCode.CONFIRMATION_REQUIRED]
    [ask] = h.named("ask_user")
    assert ask["question"] == question
    assert h.notice_codes()[3] == [NoticeCode.TOOL_UNAVAILABLE]           # "Stop for now": no more exploring
    assert "demo_search" not in model.requests[3].functions
    assert done["final_answer"] == "Done."
    h.check_invariants()


async def test_ask_user_is_a_function_whose_answer_is_its_observation() -> None:
    h, model = native([
        tools_round(call(0, "react_ask_user", {"question": "Which city?", "options": ["Paris", "Rome"]})),
        tools_round(call(0, "demo_weather", {"city": "Rome"})),
        answer_round("Rome is sunny."),
    ])
    h.answer_asks("Rome")
    await h.turn("weather?")

    [asked] = tool_messages(model.requests[1].messages)
    assert json.loads(asked["content"]) == {"answer": "Rome"}
    assert h.named("tool.call")[1]["params"] == {"city": "Rome"}


async def test_reasoning_is_thinking_and_signed_blocks_go_back_unchanged() -> None:
    h, model = native([
        tools_round([ReasoningDelta("The user wants Paris. "), ReasoningSignature("sig-1")],
                    call(0, "demo_weather", {"city": "Paris"})),
        answer_round(ANSWER, reasoning("Rain, then.")),
    ], model="anthropic/claude-acme")
    await h.turn("weather?")

    assert h.text("thinking.delta").startswith("The user wants Paris.")
    [assistant] = [m for m in model.requests[1].messages if m.get("tool_calls")]
    assert assistant["thinking_blocks"] == [{"type": "thinking", "thinking": "The user wants Paris. ", "signature": "sig-1"}]
    assert "sig-1" not in json.dumps(h.named("thinking.delta"))


async def test_an_answer_cut_by_the_provider_is_continued_from_a_prefill() -> None:
    half = "It is raining in Paris, "
    h, model = native([
        tools_round(call(0, "demo_weather", {"city": "Paris"})),
        NativeRound(text(half), error="server_error"),
        answer_round("12 °C."),
    ], model="anthropic/claude-acme", preamble_hold_chars=10)   # past the hold: the user saw it
    done = await h.turn("weather?")

    assert done["reason"] == "complete" and done["final_answer"] == half + "12 °C." == h.text("answer.delta")
    prefill = model.requests[2].messages[-1]
    assert prefill == {"role": "assistant", "content": half.rstrip()}
    h.check_invariants()


async def test_the_whitespace_a_prefill_left_off_is_not_shown_twice() -> None:
    half = "It is raining in Paris, "
    h, _ = native([
        tools_round(call(0, "demo_weather", {"city": "Paris"})),
        NativeRound(text(half), error="server_error"),
        answer_round(" 12 °C."),                       # the model continues with the space it was not sent
    ], model="anthropic/claude-acme", preamble_hold_chars=10)
    done = await h.turn("weather?")

    assert done["final_answer"] == half + "12 °C." == h.text("answer.delta")


async def test_a_cut_answer_of_another_provider_is_asked_to_continue() -> None:
    half = "It is raining in Paris, "
    h, model = native([
        tools_round(call(0, "demo_weather", {"city": "Paris"})),
        NativeRound(text(half), error="timeout"),
        answer_round("12 °C."),
    ], preamble_hold_chars=10)
    done = await h.turn("weather?")

    assert done["final_answer"] == half + "12 °C." == h.text("answer.delta")
    *_, cut, ask = model.requests[2].messages
    assert cut == {"role": "assistant", "content": half} and ask["content"].startswith("[continue]")


async def test_an_answer_cut_while_still_held_was_never_shown_and_is_asked_again() -> None:
    h, model = native([
        tools_round(call(0, "demo_weather", {"city": "Paris"})),
        NativeRound(text("It is rain"), error="server_error"),
        answer_round(ANSWER),
    ])
    done = await h.turn("weather?")

    assert done["final_answer"] == ANSWER == h.text("answer.delta")
    assert h.notice_codes()[1] == [NoticeCode.PROVIDER_ERROR] and len(model.requests) == 3
    assert model.requests[2].messages[-1]["role"] != "assistant"   # a new decision, not a continuation


async def test_a_cut_inside_a_call_never_runs_it_and_asks_again() -> None:
    h, _ = native([
        NativeRound(call(0, "demo_weather", {"city": "Paris"})[:2], error="server_error"),
        tools_round(call(0, "demo_weather", {"city": "Paris"})),
        answer_round(ANSWER),
    ])
    done = await h.turn("weather?")

    assert [r["call_id"] for r in h.results()] == ["t1.2.0"]
    assert h.notice_codes()[0] == [NoticeCode.PROVIDER_ERROR] and done["final_answer"] == ANSWER
    h.check_invariants()
