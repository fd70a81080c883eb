"""Auto-continuation on `length` and provider fallback (docs/design.md#continuation), through LiteLLM with scripted models."""

from __future__ import annotations

from actors.continuation import CONTINUE_PROMPT, CUT_PROMPT
from actors.turn_machine import GIVE_UP_MESSAGES
from protocol.notices import NoticeCode
from tests.convkit import (
    action,
    answer_round,
    complete,
    harness,
    rounds_script,
    script_model,
    text_round,
    thinking,
    tool_round,
)

ANSWER = "It is raining in Paris, 12 °C. Take an umbrella and a light jacket."


def cut(text: str, at: str) -> tuple[str, str]:
    i = text.index(at)
    return text[:i], text[i:]


async def test_length_cut_off_is_continued_into_one_round_without_loss_or_repetition() -> None:
    full = thinking("Answering.") + action(complete(ANSWER))
    head, tail = cut(full, "umbrella")                        # cut inside the final_answer string
    h = harness(rounds_script(
        tool_round("demo.weather", city="Paris"),
        text_round(head, finish_reason="length", chunk_chars=5),
        text_round(tail, chunk_chars=3),
    ))
    done = await h.turn("weather in paris?")

    assert done["reason"] == "complete" and done["final_answer"] == ANSWER
    assert h.text("answer.delta") == ANSWER                   # stitched: no loss, no repetition
    assert h.text("thinking.delta", round=2) == "Answering."
    assert [r["round"] for r in h.rounds()] == [1, 2]         # the continuation is the same round
    assert h.rounds()[1]["notices"] == []
    assert h.model_calls == 3
    continuation = h.calls[2].messages
    assert continuation[-2] == {"role": "assistant", "content": head}
    assert continuation[-1] == {"role": "user", "content": CONTINUE_PROMPT}
    h.check_invariants()


async def test_empty_output_cut_at_length_is_notice_output_truncated() -> None:
    h = harness(rounds_script(
        {"deltas": [], "finish_reason": "length"},
        tool_round("demo.clock"),
        answer_round("It is 2026."),
    ))
    done = await h.turn("time?")

    assert h.notice_codes()[0] == [NoticeCode.OUTPUT_TRUNCATED]          # the whole diagnosis, nothing invented
    assert done["reason"] == "complete"
    assert h.model_calls == 3                                 # no continuation of nothing
    h.check_invariants()


async def test_continuations_are_bounded_by_auto_continue_max() -> None:
    full = thinking("Answering.") + action(complete(ANSWER))
    h = harness(rounds_script(
        tool_round("demo.clock"),
        text_round(full[:20], finish_reason="length"),
        text_round(full[20:30], finish_reason="length"),
        tool_round("demo.clock"),
        answer_round("It is 2026."),
    ), auto_continue_max=1)
    done = await h.turn("time?")

    codes = h.notice_codes()[1]
    assert NoticeCode.OUTPUT_TRUNCATED in codes
    assert done["reason"] == "complete" and done["final_answer"] == "It is 2026."
    h.check_invariants()


async def test_provider_error_before_any_delta_falls_back_to_the_next_model() -> None:
    # Every model call takes the next call index, the fallback's too: first, fallback, first.
    first = script_model(rounds_script(
        {"error": "rate_limit"},
        {"error": "bad_request"},                             # never played: call 1 is the fallback's
        answer_round("Rain in Paris, 12 °C.", say="Answering from the first model."),
    ))
    second = script_model(rounds_script(
        {"error": "bad_request"},                             # never played: call 0 is the first model's
        tool_round("demo.weather", say="The fallback model speaks.", city="Paris"),
    ))
    h = harness(model=first, fallbacks=[second])
    done = await h.turn("weather in paris?")

    [fallback] = h.named("fallback")
    assert fallback["from"] == first and fallback["to"] == second
    assert "rate_limit" in fallback["error"]
    names = h.names()
    assert names.index("fallback") < names.index("thinking.delta")
    assert h.text("thinking.delta", round=1) == "The fallback model speaks."
    assert h.results("demo.weather")[0]["ok"] is True
    assert done["reason"] == "complete" and done["final_answer"] == "Rain in Paris, 12 °C."
    assert h.model_calls == 3                                 # calls to a fallback count as model calls
    assert len(h.calls) == 2                                  # two decisions
    h.check_invariants()


async def test_provider_error_mid_answer_is_continued_and_the_answer_streams_once_whole() -> None:
    full = thinking("Answering.") + action(complete(ANSWER))
    head, rest = cut(full, "umbrella")
    h = harness(rounds_script(
        tool_round("demo.weather", city="Paris"),
        {"text": head, "error": "server_error"},          # cut inside the final_answer string
        text_round(rest),                                  # the continuation: from the next character
    ))
    done = await h.turn("weather in paris?")

    assert h.text("answer.delta") == ANSWER                   # every character once, in order
    assert done["reason"] == "complete" and done["final_answer"] == ANSWER
    assert "partial" not in done
    assert len(h.rounds()) == 2                                # the continuation is the same round
    assert h.rounds()[1]["notices"] == []                     # the cut was not the model's mistake
    continuation = h.calls[2]
    assert continuation.messages[-2] == {"role": "assistant", "content": head}
    assert continuation.messages[-1]["content"] == CUT_PROMPT
    assert h.model_calls == 3
    h.check_invariants()


async def test_a_fallback_model_supplies_the_continuation_after_a_mid_answer_failure() -> None:
    full = thinking("Answering.") + action(complete(ANSWER))
    head, rest = cut(full, "umbrella")
    first = script_model(rounds_script(tool_round("demo.weather", city="Paris"), {"text": head, "error": "unavailable"}))
    second = script_model(rounds_script({"error": "bad_request"}, {"error": "bad_request"}, text_round(rest)))
    h = harness(model=first, fallbacks=[second])
    done = await h.turn("weather in paris?")

    [fallback] = h.named("fallback")
    assert (fallback["from"], fallback["to"]) == (first, second) and "unavailable" in fallback["error"]
    names = h.names()
    assert names.index("answer.delta") < names.index("fallback") < len(names) - names[::-1].index("answer.delta")
    assert h.calls[2].models == (second,)                      # the continuation goes to the fallback
    assert h.text("answer.delta") == ANSWER and done["final_answer"] == ANSWER
    assert done["reason"] == "complete"
    h.check_invariants()


async def test_a_provider_silent_between_chunks_is_cut_and_continued() -> None:
    full = thinking("Answering.") + action(complete(ANSWER))
    head, rest = cut(full, "umbrella")
    h = harness(rounds_script(
        tool_round("demo.weather", city="Paris"),
        {"deltas": [head, "never sent"], "hang_after": 1},   # the provider goes silent mid-answer
        text_round(rest),
    ), stream_idle_timeout_s=0.2)
    done = await h.turn("weather in paris?")

    assert h.text("answer.delta") == ANSWER and done["final_answer"] == ANSWER
    assert "never sent" not in h.text("answer.delta")
    assert done["reason"] == "complete"
    h.check_invariants()


async def test_a_continuation_that_starts_over_ends_the_turn_partial() -> None:
    full = thinking("Answering.") + action(complete(ANSWER))
    head, _ = cut(full, "umbrella")
    h = harness(rounds_script(
        tool_round("demo.weather", city="Paris"),
        {"text": head, "error": "server_error"},
        text_round(full),                                  # the model starts over instead
    ))
    done = await h.turn("weather in paris?")

    streamed = h.text("answer.delta")
    assert streamed == ANSWER[: ANSWER.index("umbrella")]     # nothing of the restart reached the user
    assert done["reason"] == "salvaged" and done["final_answer"] == streamed and done["partial"] is True
    [trace] = h.traces("salvaged")
    assert trace["partial"] is True and trace["answer_chars"] == len(streamed)
    assert h.model_calls == 3
    h.check_invariants()


async def test_a_spent_continuation_budget_ends_the_turn_partial() -> None:
    full = thinking("Answering.") + action(complete(ANSWER))
    head, _ = cut(full, "umbrella")
    h = harness(rounds_script(
        tool_round("demo.weather", city="Paris"),
        {"text": head, "error": "server_error"},
        answer_round("A second answer that must never be generated."),
    ), auto_continue_max=0)
    done = await h.turn("weather in paris?")

    streamed = h.text("answer.delta")
    assert streamed == ANSWER[: ANSWER.index("umbrella")]
    assert done["reason"] == "salvaged" and done["final_answer"] == streamed and done["partial"] is True
    assert h.model_calls == 2
    assert NoticeCode.PROVIDER_ERROR in h.notice_codes()[1]
    h.check_invariants()


async def test_a_whole_answer_with_a_broken_tail_is_salvaged_not_partial() -> None:
    broken = thinking("Answering.") + '<channel:action>{"action": "complete", "final_answer": "' + ANSWER + '", }'
    h = harness(rounds_script(tool_round("demo.weather", city="Paris"), text_round(broken + "</channel:action>")))
    done = await h.turn("weather in paris?")

    assert done["reason"] == "salvaged" and done["final_answer"] == ANSWER
    assert "partial" not in done
    assert h.model_calls == 2                                  # a model's own mistake is not continued
    h.check_invariants()


async def test_provider_error_mid_stream_without_an_answer_is_notice_and_retry() -> None:
    h = harness(rounds_script(
        {"text": thinking("Looking it up") + "<channel:action>{\"action\": \"call", "error": "server_error"},
        tool_round("demo.clock"),
        answer_round("It is 2026."),
    ))
    done = await h.turn("time?")

    assert h.notice_codes()[0][-1] == NoticeCode.PROVIDER_ERROR
    assert h.named("tool.call", round=1) == []
    assert h.named("fallback") == []
    assert done["reason"] == "complete"
    assert h.model_calls == 3
    h.check_invariants()


async def test_two_continuations_stitch_three_pieces_into_one_round() -> None:
    full = thinking("Answering.") + action(complete(ANSWER))
    a, b = len(full) // 3, 2 * len(full) // 3
    h = harness(rounds_script(
        tool_round("demo.weather", city="Paris"),
        text_round(full[:a], finish_reason="length"),
        text_round(full[a:b], finish_reason="length"),
        text_round(full[b:]),
    ), auto_continue_max=2)
    done = await h.turn("weather in paris?")

    assert done["final_answer"] == ANSWER and h.text("answer.delta") == ANSWER
    assert len(h.rounds()) == 2 and h.rounds()[1]["notices"] == []
    second = h.calls[3].messages
    assert second[-2] == {"role": "assistant", "content": full[:b]}          # the whole raw so far, once
    assert [m["content"] for m in second].count(CONTINUE_PROMPT) == 1
    assert second[:-2] == h.calls[1].messages
    h.check_invariants()


async def test_provider_error_with_no_fallback_left_is_notice_and_retry() -> None:
    h = harness(rounds_script({"error": "unavailable"}, tool_round("demo.clock"), answer_round("It is 2026.")))
    done = await h.turn("time?")

    assert h.notice_codes()[0] == [NoticeCode.PROVIDER_ERROR]
    assert h.named("fallback") == []
    assert done["reason"] == "complete"
    h.check_invariants()


async def test_retries_spent_on_provider_failures_end_the_turn_as_provider_error_naming_the_cause() -> None:
    first = script_model(rounds_script({"error": "auth"}, loop=True))
    second = script_model(rounds_script({"error": "unavailable"}, loop=True))
    h = harness(model=first, fallbacks=[second], max_protocol_retries=1)
    done = await h.turn("weather in paris?")

    assert done["reason"] == "provider_error" and done["finish_ok"] is False
    assert done["final_answer"] == GIVE_UP_MESSAGES["provider_error"]
    assert done["error"] == "unavailable: scripted unavailable"       # the last model's, as the round's notice says
    assert h.notice_codes() == [[NoticeCode.PROVIDER_ERROR]] * 2
    assert h.rounds()[0]["notices"][0]["message"] == (
        f"the model provider failed (unavailable) for model {second!r}: scripted unavailable. This is not your mistake.")
    assert [f["error"] for f in h.named("fallback")] == ["auth: scripted auth"] * 2
    assert h.named("answer.delta") == []
    h.check_invariants()


async def test_a_turn_the_model_itself_failed_last_still_ends_as_protocol_violation() -> None:
    h = harness(rounds_script({"error": "server_error"}, text_round("Sure! Here you go."), loop=True),
                max_protocol_retries=1)
    done = await h.turn("hello")

    assert done["reason"] == "protocol_violation" and "error" not in done
    assert h.notice_codes() == [[NoticeCode.PROVIDER_ERROR], [NoticeCode.PREAMBLE]]
    h.check_invariants()
