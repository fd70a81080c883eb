"""gateway/aisdk.py: our event log → the Vercel AI SDK's UI message stream, and its chat requests back.

Events are built by hand, in the order the runtime logs them (docs/wire-protocol.md#7-events): a
round's calls are announced before its `round.completed`, run after it. The chunk shapes are the
`ai` package's (6.x `uiMessageChunkSchema`); the request bodies below are what its `Chat` with the
`DefaultChatTransport` posted, captured from the real package.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.aisdk import (
    DONE,
    END_REASONS,
    EVENT_CHUNKS,
    HEADERS,
    ChatRequest,
    ChatRequestError,
    UIMessageStream,
    parse_chat_request,
    sse,
    ui_messages,
)
from protocol.events import (
    EVENT_KINDS,
    AcceptedAction,
    AnswerDelta,
    Approval,
    AskUser,
    EndReason,
    Event,
    EventData,
    EventRef,
    Fallback,
    IllegalFinish,
    IterationLimit,
    MessageKind,
    NoToolFinish,
    RoundCompleted,
    Salvaged,
    StreamedState,
    ThinkingDelta,
    ToolCalled,
    ToolResult,
    TurnCompleted,
    TurnStarted,
    UiCommand,
    UserSaid,
)

CID = "c_aisdk"
ANSWER = "It is raining in Paris, 12 °C. Take an umbrella."


def log(*payloads: EventData, first_seq: int = 1) -> list[Event]:
    return [Event.of(CID, seq, data, 1_796_021_100.0 + seq) for seq, data in enumerate(payloads, first_seq)]


def response(events: Sequence[Event], message_id: str = "t1") -> list[dict[str, Any]]:
    """One response, as the HTTP shell makes it: start, then each event's chunks until the end."""
    stream = UIMessageStream(message_id)
    chunks = stream.start()
    for event in events:
        chunks += stream.feed(event)
    return chunks


def until_done(events: Sequence[Event]) -> int:
    """How many events one response takes: up to the one that ends it."""
    stream = UIMessageStream("t")
    for i, event in enumerate(events, 1):
        stream.feed(event)
        if stream.done:
            return i
    return len(events)


def texts(chunks: Sequence[dict[str, Any]]) -> str:
    return "".join(c["delta"] for c in chunks if c["type"] == "text-delta")


# -- payloads ------------------------------------------------------------------------------------------


def said(message_id: str, text: str) -> UserSaid:
    return UserSaid(message_id=message_id, text=text)


def started(turn: str, message_id: str) -> TurnStarted:
    return TurnStarted(turn_id=turn, user_message_id=message_id)


def think(turn: str, round_no: int, text: str) -> ThinkingDelta:
    return ThinkingDelta(turn_id=turn, round=round_no, text=text)


def answer(turn: str, round_no: int, text: str) -> AnswerDelta:
    return AnswerDelta(turn_id=turn, round=round_no, text=text)


def call(turn: str, round_no: int, call_id: str, tool_id: str, params: dict[str, Any]) -> ToolCalled:
    return ToolCalled(turn_id=turn, round=round_no, call_id=call_id, tool_id=tool_id, params=params, trait="neutral")


def ok(turn: str, call_id: str, tool_id: str, result: dict[str, Any]) -> ToolResult:
    return ToolResult(turn_id=turn, call_id=call_id, tool_id=tool_id, ok=True, duration_ms=3, result=result)


def failed(turn: str, call_id: str, tool_id: str, error: str, detail: dict[str, Any] | None = None) -> ToolResult:
    return ToolResult(turn_id=turn, call_id=call_id, tool_id=tool_id, ok=False, duration_ms=0, error=error,
                      detail=detail)


def round_done(turn: str, round_no: int, answer_text: str = "", *actions: str) -> RoundCompleted:
    return RoundCompleted(
        turn_id=turn, round=round_no,
        streamed_state=StreamedState(answer_streamed=bool(answer_text), answer_text=answer_text, lanes=[]),
        accepted=[AcceptedAction(index=i, action=a) for i, a in enumerate(actions)], denied=[], notices=[])


def completed(turn: str, final: str, reason: EndReason = EndReason.COMPLETE, **more: Any) -> TurnCompleted:
    return TurnCompleted(turn_id=turn, reason=reason, final_answer=final, used_tools=True,
                         finish_ok=reason is EndReason.COMPLETE, **more)


def question(turn: str, ask_id: str, text: str, options: list[str]) -> AskUser:
    return AskUser(turn_id=turn, ask_id=ask_id, question=text, options=options, timeout_s=300)


def approval(turn: str, ask_id: str, tool_id: str, params: dict[str, Any]) -> AskUser:
    return AskUser(turn_id=turn, ask_id=ask_id, question=f"Run {tool_id}?", options=["Approve", "Deny", "Approve all"],
                   timeout_s=300, kind="approval", tool_id=tool_id, params=params)


WEATHER = {"city": "Paris", "condition": "rain", "temp_c": 12}

# The demo turn: think, call demo.weather, observe, think, answer in several deltas.
DEMO = log(
    said("m1", "What's the weather in Paris?"),
    started("t1", "m1"),
    think("t1", 1, "Checking the "), think("t1", 1, "weather."),
    call("t1", 1, "t1.1.0", "demo.weather", {"city": "Paris"}),
    round_done("t1", 1, "", "call_tool"),
    ok("t1", "t1.1.0", "demo.weather", WEATHER),
    think("t1", 2, "Writing the answer."),
    answer("t1", 2, "It is raining"), answer("t1", 2, " in Paris, 12 °C."), answer("t1", 2, " Take an umbrella."),
    round_done("t1", 2, ANSWER, "complete"),
    completed("t1", ANSWER),
)

# The model asks the user (react.ask_user), then goes on with the answer.
ASK = log(
    said("m1", "What's the weather in Paris?"),
    started("t1", "m1"),
    think("t1", 1, "Which unit?"),
    call("t1", 1, "t1.1.0", "react.ask_user", {"question": "Celsius or Fahrenheit?", "options": ["Celsius", "Fahrenheit"]}),
    round_done("t1", 1, "", "call_tool"),
    question("t1", "t1.1.0", "Celsius or Fahrenheit?", ["Celsius", "Fahrenheit"]),
    # -- the turn waits; the next response goes on from here
    ok("t1", "t1.1.0", "react.ask_user", {"answer": "Celsius"}),
    think("t1", 2, "Checking."),
    call("t1", 2, "t1.2.0", "demo.weather", {"city": "Paris"}),
    round_done("t1", 2, "", "call_tool"),
    ok("t1", "t1.2.0", "demo.weather", WEATHER),
    answer("t1", 3, "It is raining in Paris, "), answer("t1", 3, "12 °C. Take an umbrella."),
    round_done("t1", 3, ANSWER, "complete"),
    completed("t1", ANSWER),
)
ASK_PAUSE = until_done(ASK)

NOTE = {"text": "milk"}



def approved_turn(turn: str, message_id: str) -> list[EventData]:
    """A confirm tool: the call waits for the user's approval, then runs."""
    return [
        said(message_id, "Note: milk"),
        started(turn, message_id),
        think(turn, 1, "Saving it."),
        call(turn, 1, f"{turn}.1.0", "demo.write_note", NOTE),
        round_done(turn, 1, "", "call_tool"),
        approval(turn, f"{turn}.1.0", "demo.write_note", NOTE),
        # -- the turn waits; the next response goes on from here
        Approval(turn_id=turn, call_id=f"{turn}.1.0", tool_id="demo.write_note", decision="approved"),
        ok(turn, f"{turn}.1.0", "demo.write_note", {"saved": True}),
        answer(turn, 2, "Noted: milk."),
        round_done(turn, 2, "Noted: milk.", "complete"),
        completed(turn, "Noted: milk."),
    ]


APPROVE = log(*approved_turn("t1", "m1"))
APPROVE_PAUSE = until_done(APPROVE)

DENY = [*APPROVE[:APPROVE_PAUSE], *log(
    Approval(turn_id="t1", call_id="t1.1.0", tool_id="demo.write_note", decision="denied"),
    failed("t1", "t1.1.0", "demo.write_note", "denied_by_user",
           {"decision": "denied", "message": "the user did not approve this call: it did not run"}),
    answer("t1", 2, "I did not save it."),
    round_done("t1", 2, "I did not save it.", "complete"),
    completed("t1", "I did not save it."),
    first_seq=APPROVE_PAUSE + 1)]

PROVIDER_ERROR_ANSWER = "Sorry — the model provider failed, so I have no answer this time. Please try again later."
PROVIDER_ERROR = log(
    said("m1", "Hello?"),
    started("t1", "m1"),
    think("t1", 1, "Think"),
    round_done("t1", 1),
    completed("t1", PROVIDER_ERROR_ANSWER, EndReason.PROVIDER_ERROR, error="rate_limit: scripted rate_limit"),
)

LIMIT_ANSWER = "Sorry — I reached my step limit for this request before finishing."
# The turn hits max_iterations right after a tool round: its final answer never streamed.
LIMIT = log(
    said("m1", "Check everything."),
    started("t1", "m1"),
    think("t1", 1, "Checking."),
    call("t1", 1, "t1.1.0", "demo.weather", {"city": "Paris"}),
    round_done("t1", 1, "", "call_tool"),
    ok("t1", "t1.1.0", "demo.weather", WEATHER),
    IterationLimit(turn_id="t1", rounds=1),
    completed("t1", LIMIT_ANSWER, EndReason.ITERATION_LIMIT),
)

# Each scenario as the responses the client gets, for checking them with the `ai` package itself
# (its parseJsonEventStream + uiMessageChunkSchema, readUIMessageStream, and its Chat): outside this suite.
SCENARIOS: dict[str, list[list[Event]]] = {
    "demo": [DEMO],
    "ask": [ASK[:ASK_PAUSE], ASK[ASK_PAUSE:]],
    "approve": [APPROVE[:APPROVE_PAUSE], APPROVE[APPROVE_PAUSE:]],
    "deny": [DENY[:APPROVE_PAUSE], DENY[APPROVE_PAUSE:]],
    "provider_error": [PROVIDER_ERROR],
    "limit": [LIMIT],
}


def well_formed(chunks: Sequence[dict[str, Any]], known_calls: frozenset[str] = frozenset()) -> None:
    """What the SDK's reader needs of a response: one start and one finish around it, steps that do not
    nest, at most one text or reasoning part open and every delta inside its part, one tool part per
    call, and every output, approval or denial about a call the client holds."""
    assert chunks[0]["type"] == "start" and chunks[-1]["type"] == "finish"
    step, lane, calls = False, None, set(known_calls)
    for chunk in chunks[1:-1]:
        kind = chunk["type"]
        if kind == "start-step":
            assert not step
            step = True
        elif kind == "finish-step":
            assert step and lane is None
            step = False
        elif kind in ("text-start", "reasoning-start"):
            assert lane is None
            lane = (kind.removesuffix("-start"), chunk["id"])
        elif kind in ("text-delta", "reasoning-delta"):
            assert lane == (kind.removesuffix("-delta"), chunk["id"]) and chunk["delta"]
        elif kind in ("text-end", "reasoning-end"):
            assert lane == (kind.removesuffix("-end"), chunk["id"])
            lane = None
        elif kind == "tool-input-start":
            assert chunk["toolCallId"] not in calls
            calls.add(chunk["toolCallId"])
        elif kind in ("tool-input-available", "tool-approval-request", "tool-output-available",
                      "tool-output-error", "tool-output-denied"):
            assert chunk["toolCallId"] in calls
        else:
            assert kind == "error" or kind.startswith("data-reactgate-"), kind
    assert lane is None and not step


# -- the wire --------------------------------------------------------------------------------------------


def test_headers_and_sse_lines_are_the_sdk_stream_protocol() -> None:
    assert HEADERS == {"content-type": "text/event-stream", "cache-control": "no-cache",
                       "x-vercel-ai-ui-message-stream": "v1", "x-accel-buffering": "no"}
    line = sse({"type": "text-delta", "id": "t1.2.1", "delta": "12 °C\n"})
    assert line == 'data: {"type":"text-delta","id":"t1.2.1","delta":"12 °C\\n"}\n\n'.encode()
    assert line.count(b"\n") == 2   # one SSE event: the JSON holds no raw newline
    assert DONE == b"data: [DONE]\n\n"


def test_every_event_kind_has_a_row_in_the_mapping() -> None:
    assert set(EVENT_CHUNKS) >= set(EVENT_KINDS)
    assert set(END_REASONS) == set(EndReason)


# -- one turn ---------------------------------------------------------------------------------------------


def test_the_demo_turn_gives_exactly_these_chunks() -> None:
    assert response(DEMO) == [
        {"type": "start", "messageId": "t1"},
        {"type": "start-step"},
        {"type": "reasoning-start", "id": "t1.1.0"},
        {"type": "reasoning-delta", "id": "t1.1.0", "delta": "Checking the "},
        {"type": "reasoning-delta", "id": "t1.1.0", "delta": "weather."},
        {"type": "reasoning-end", "id": "t1.1.0"},
        {"type": "tool-input-start", "toolCallId": "t1.1.0", "toolName": "demo.weather", "providerExecuted": True},
        {"type": "tool-input-available", "toolCallId": "t1.1.0", "toolName": "demo.weather",
         "input": {"city": "Paris"}, "providerExecuted": True},
        {"type": "finish-step"},
        {"type": "tool-output-available", "toolCallId": "t1.1.0", "output": WEATHER},
        {"type": "start-step"},
        {"type": "reasoning-start", "id": "t1.2.0"},
        {"type": "reasoning-delta", "id": "t1.2.0", "delta": "Writing the answer."},
        {"type": "reasoning-end", "id": "t1.2.0"},
        {"type": "text-start", "id": "t1.2.1"},
        {"type": "text-delta", "id": "t1.2.1", "delta": "It is raining"},
        {"type": "text-delta", "id": "t1.2.1", "delta": " in Paris, 12 °C."},
        {"type": "text-delta", "id": "t1.2.1", "delta": " Take an umbrella."},
        {"type": "text-end", "id": "t1.2.1"},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "stop"},
    ]


def test_the_text_is_the_final_answer_each_character_once() -> None:
    chunks = response(DEMO)
    assert texts(chunks) == ANSWER == DEMO[-1].data.final_answer  # type: ignore[union-attr]
    well_formed(chunks)


def test_a_response_is_done_only_at_the_turns_end() -> None:
    stream = UIMessageStream("t1")
    for event in DEMO[:-1]:
        stream.feed(event)
        assert not stream.done
    assert stream.feed(DEMO[-1])[-1] == {"type": "finish", "finishReason": "stop"}
    assert stream.done
    assert stream.feed(DEMO[-1]) == [] and stream.error("late") == []   # the response ended


# -- ask_user: the model's question is a client-side tool -------------------------------------------------


def test_a_question_is_a_client_tool_call_and_ends_the_response() -> None:
    assert ASK[ASK_PAUSE - 1].event == "ask_user"
    assert response(ASK[:ASK_PAUSE]) == [
        {"type": "start", "messageId": "t1"},
        {"type": "start-step"},
        {"type": "reasoning-start", "id": "t1.1.0"},
        {"type": "reasoning-delta", "id": "t1.1.0", "delta": "Which unit?"},
        {"type": "reasoning-end", "id": "t1.1.0"},
        {"type": "finish-step"},   # the round is over; the turn runs its calls, the question last
        {"type": "tool-input-start", "toolCallId": "t1.1.0", "toolName": "ask_user"},
        {"type": "tool-input-available", "toolCallId": "t1.1.0", "toolName": "ask_user",
         "input": {"question": "Celsius or Fahrenheit?", "options": ["Celsius", "Fahrenheit"]}},
        {"type": "finish", "finishReason": "tool-calls"},
    ]


def test_the_next_response_goes_on_after_the_answer() -> None:
    chunks = response(ASK[ASK_PAUSE:])
    assert chunks[:2] == [
        {"type": "start", "messageId": "t1"},
        # the client holds the question's part: no second tool-input-start
        {"type": "tool-output-available", "toolCallId": "t1.1.0", "output": {"answer": "Celsius"}},
    ]
    assert [c["type"] for c in chunks[2:]] == [
        "start-step", "reasoning-start", "reasoning-delta", "reasoning-end", "tool-input-start",
        "tool-input-available", "finish-step", "tool-output-available",
        "start-step", "text-start", "text-delta", "text-delta", "text-end", "finish-step", "finish",
    ]
    assert texts(chunks) == ANSWER
    well_formed(chunks, known_calls=frozenset({"t1.1.0"}))


def test_a_question_the_turn_never_asked_shows_nothing() -> None:
    """Two questions in a round are asked one at a time; a steer cut the turn during the first."""
    events = log(
        started("t1", "m1"), think("t1", 1, "Two questions."),
        call("t1", 1, "t1.1.0", "react.ask_user", {"question": "Unit?"}),
        call("t1", 1, "t1.1.1", "react.ask_user", {"question": "City?"}),
        round_done("t1", 1, "", "call_tool", "call_tool"),
        question("t1", "t1.1.0", "Unit?", []),
        failed("t1", "t1.1.0", "react.ask_user", "steered"),
        failed("t1", "t1.1.1", "react.ask_user", "steered"),
        answer("t1", 2, "Fine."), round_done("t1", 2, "Fine.", "complete"), completed("t1", "Fine."),
    )
    pause = until_done(events)
    first, second = response(events[:pause]), response(events[pause:])
    assert [c.get("toolCallId") for c in first if c["type"] == "tool-input-start"] == ["t1.1.0"]
    # The asked question was cut while it waited, in the response before: whether the client still
    # holds its part this response cannot know, so it sends nothing about either question.
    assert not any("toolCallId" in c for c in second)
    whole = ui_messages(events)[-1]["parts"]
    assert [p["state"] for p in whole if p["type"] == "tool-ask_user"] == ["output-error"]
    assert texts(second) == "Fine."


# -- execute confirmation: the SDK's tool approval ----------------------------------------------------------


def test_an_approval_is_a_tool_approval_request_and_ends_the_response() -> None:
    chunks = response(APPROVE[:APPROVE_PAUSE])
    assert chunks[5:] == [
        {"type": "tool-input-start", "toolCallId": "t1.1.0", "toolName": "demo.write_note", "providerExecuted": True},
        {"type": "tool-input-available", "toolCallId": "t1.1.0", "toolName": "demo.write_note", "input": NOTE,
         "providerExecuted": True},
        {"type": "finish-step"},
        # the call's part was started above: only the request
        {"type": "tool-approval-request", "approvalId": "t1.1.0", "toolCallId": "t1.1.0"},
        {"type": "finish", "finishReason": "tool-calls"},
    ]
    well_formed(chunks)


def test_an_approved_call_runs_in_the_next_response() -> None:
    chunks = response(APPROVE[APPROVE_PAUSE:])
    assert chunks[:3] == [
        {"type": "start", "messageId": "t1"},
        {"type": "data-reactgate-trace", "id": f"{CID}/{APPROVE_PAUSE + 1}",
         "data": {"kind": "approval", "turn_id": "t1", "call_id": "t1.1.0", "tool_id": "demo.write_note",
                  "decision": "approved"}},
        {"type": "tool-output-available", "toolCallId": "t1.1.0", "output": {"saved": True}},
    ]
    assert not any(c["type"] == "tool-input-start" for c in chunks)
    assert texts(chunks) == "Noted: milk."
    well_formed(chunks, known_calls=frozenset({"t1.1.0"}))


def test_a_denied_call_is_an_output_denied() -> None:
    chunks = response(DENY[APPROVE_PAUSE:])
    assert chunks[2] == {"type": "tool-output-denied", "toolCallId": "t1.1.0"}
    parts = ui_messages(DENY)[-1]["parts"]
    assert parts[2] == {"type": "tool-demo.write_note", "toolCallId": "t1.1.0", "state": "output-denied",
                        "input": NOTE, "providerExecuted": True, "approval": {"id": "t1.1.0", "approved": False}}


def test_an_approval_after_an_earlier_pause_sends_the_part_again() -> None:
    """Two confirm calls in one round: the second is asked in the response after the first pause;
    the client holds its part, and the SDK's reader rewrites the same part with the same input."""
    events = log(
        started("t1", "m1"), think("t1", 1, "Two notes."),
        call("t1", 1, "t1.1.0", "demo.write_note", {"text": "a"}),
        call("t1", 1, "t1.1.1", "demo.write_note", {"text": "b"}),
        round_done("t1", 1, "", "call_tool", "call_tool"),
        approval("t1", "t1.1.0", "demo.write_note", {"text": "a"}),
        Approval(turn_id="t1", call_id="t1.1.0", tool_id="demo.write_note", decision="approved"),
        approval("t1", "t1.1.1", "demo.write_note", {"text": "b"}),
    )
    pause = until_done(events)
    assert [c["type"] for c in response(events[pause:])] == [
        "start", "data-reactgate-trace", "tool-input-start", "tool-input-available", "tool-approval-request",
        "finish"]


# -- failures -----------------------------------------------------------------------------------------------


def test_a_failed_call_is_an_output_error_with_readable_text() -> None:
    events = log(
        started("t1", "m1"), call("t1", 1, "t1.1.0", "demo.weather", {"city": "Paris"}), round_done("t1", 1),
        failed("t1", "t1.1.0", "demo.weather", "timeout", {"timeout_s": 30}),
        call("t1", 2, "t1.2.0", "demo.weather", {"city": "Paris"}), round_done("t1", 2),
        failed("t1", "t1.2.0", "demo.weather", "tool_error", {"message": "boom", "exception": "ValueError"}),
    )
    outputs = [c for c in response(events) if c["type"].startswith("tool-output")]
    assert outputs == [
        {"type": "tool-output-error", "toolCallId": "t1.1.0", "errorText": "timeout (timeout_s=30)"},
        {"type": "tool-output-error", "toolCallId": "t1.2.0", "errorText": "tool_error: boom (exception=ValueError)"},
    ]


def test_a_provider_error_end_shows_the_final_answer_then_error_then_finish() -> None:
    assert response(PROVIDER_ERROR) == [
        {"type": "start", "messageId": "t1"},
        {"type": "start-step"},
        {"type": "reasoning-start", "id": "t1.1.0"},
        {"type": "reasoning-delta", "id": "t1.1.0", "delta": "Think"},
        {"type": "reasoning-end", "id": "t1.1.0"},
        {"type": "finish-step"},
        # never streamed as answer.delta: the text to show (docs/wire-protocol.md#turncompleted)
        {"type": "text-start", "id": "t1.final"},
        {"type": "text-delta", "id": "t1.final", "delta": PROVIDER_ERROR_ANSWER},
        {"type": "text-end", "id": "t1.final"},
        {"type": "error",
         "errorText": "provider_error: the model provider failed (rate_limit: scripted rate_limit)"},
        {"type": "finish", "finishReason": "error"},
    ]


def test_an_iteration_limit_shows_its_final_answer_and_the_trace() -> None:
    chunks = response(LIMIT)
    assert chunks[-6:] == [
        {"type": "tool-output-available", "toolCallId": "t1.1.0", "output": WEATHER},
        {"type": "data-reactgate-trace", "id": f"{CID}/7", "data": {"kind": "iteration_limit", "turn_id": "t1", "rounds": 1}},
        {"type": "text-start", "id": "t1.final"},
        {"type": "text-delta", "id": "t1.final", "delta": LIMIT_ANSWER},
        {"type": "text-end", "id": "t1.final"},
        {"type": "finish", "finishReason": "length"},
    ]


@pytest.mark.parametrize(("reason", "finish_reason", "error"), [
    (EndReason.COMPLETE, "stop", False),
    (EndReason.EXIT, "stop", False),
    (EndReason.SALVAGED, "stop", False),
    (EndReason.ITERATION_LIMIT, "length", False),
    (EndReason.CANCELLED, "other", False),
    (EndReason.PROTOCOL_VIOLATION, "error", True),
    (EndReason.PROVIDER_ERROR, "error", True),
    (EndReason.ERROR, "error", True),
])
def test_each_end_reason_finishes_so(reason: EndReason, finish_reason: str, error: bool) -> None:
    chunks = response(log(started("t1", "m1"), completed("t1", "" if reason is EndReason.CANCELLED else "Bye.", reason)))
    assert chunks[-1] == {"type": "finish", "finishReason": finish_reason}
    assert (chunks[-2]["type"] == "error") is error
    assert texts(chunks) == ("" if END_REASONS[reason].answer_streamed or reason is EndReason.CANCELLED else "Bye.")


def test_an_answer_cut_by_the_backend_closes_its_part_before_the_error() -> None:
    stream = UIMessageStream("t1")
    for event in DEMO[:9]:   # the answer has begun
        stream.feed(event)
    assert stream.error("backend unavailable") == [
        {"type": "text-end", "id": "t1.2.1"},
        {"type": "finish-step"},
        {"type": "error", "errorText": "backend unavailable"},
        {"type": "finish", "finishReason": "error"},
    ]
    assert stream.done


# -- data parts, and what gives nothing ------------------------------------------------------------------------


def test_ui_commands_fallbacks_and_traces_worth_showing_are_data_parts() -> None:
    events = log(
        started("t1", "m1"),
        Fallback(from_model="openai/a", to_model="openai/b", error="rate_limit: slow down"),
        think("t1", 1, "Hm."),
        IllegalFinish(turn_id="t1", round=1, events=[EventRef(event="turn.started")]),
        NoToolFinish(turn_id="t1", round=1),
        round_done("t1", 1),
        UiCommand(turn_id="t1", command="open_tab", args={"name": "Weather"}),
        Salvaged(turn_id="t1", round=2, answer_chars=3, partial=True),
    )
    # A kind this version does not know (written by a newer one) decodes to a dict: skipped.
    events.append(Event(conversation_id=CID, seq=9, event="turn.paused", data={"turn_id": "t1"}, ts=1.0))
    data = [c for c in response(events) if c["type"].startswith("data-")]
    assert data == [
        {"type": "data-reactgate-fallback", "id": f"{CID}/2",
         "data": {"from": "openai/a", "to": "openai/b", "error": "rate_limit: slow down"}},
        {"type": "data-reactgate-trace", "id": f"{CID}/4",
         "data": {"kind": "illegal_finish", "turn_id": "t1", "round": 1, "events": [{"event": "turn.started"}]}},
        {"type": "data-reactgate-ui_command", "id": f"{CID}/7",
         "data": {"turn_id": "t1", "command": "open_tab", "args": {"name": "Weather"}}},
        {"type": "data-reactgate-trace", "id": f"{CID}/8",
         "data": {"kind": "salvaged", "turn_id": "t1", "round": 2, "answer_chars": 3, "partial": True}},
    ]


def test_a_data_part_does_not_split_the_answer() -> None:
    """A fallback mid-answer: the next model goes on with the same answer (docs/design.md#fallback)."""
    events = log(started("t1", "m1"), answer("t1", 1, "It is "),
                 Fallback(from_model="a", to_model="b", error="timeout: silent"), answer("t1", 1, "raining."))
    kinds = [c["type"] for c in response(events)]
    assert kinds == ["start", "start-step", "text-start", "text-delta", "data-reactgate-fallback", "text-delta"]


# -- ui_messages: a reloaded page ------------------------------------------------------------------------------


def test_ui_messages_rebuild_a_conversation_of_two_turns() -> None:
    second = approved_turn("t2", "m2")
    # A follow-up typed while t2 ran: logged then, shown just before its own turn.
    second.insert(4, UserSaid(message_id="m3", text="Thanks!", kind=MessageKind.FOLLOW_UP))
    events = [*DEMO, *log(*second, started("t3", "m3"), answer("t3", 1, "You're welcome."), first_seq=len(DEMO) + 1)]
    approval_seq = next(e.seq for e in events if e.event == "trace")

    assert ui_messages(events) == [
        {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "What's the weather in Paris?"}]},
        {"id": "t1", "role": "assistant", "parts": [
            {"type": "step-start"},
            {"type": "reasoning", "id": "t1.1.0", "text": "Checking the weather.", "state": "done"},
            {"type": "tool-demo.weather", "toolCallId": "t1.1.0", "state": "output-available",
             "input": {"city": "Paris"}, "output": WEATHER, "providerExecuted": True},
            {"type": "step-start"},
            {"type": "reasoning", "id": "t1.2.0", "text": "Writing the answer.", "state": "done"},
            {"type": "text", "text": ANSWER, "state": "done"},
        ]},
        {"id": "m2", "role": "user", "parts": [{"type": "text", "text": "Note: milk"}]},
        {"id": "t2", "role": "assistant", "parts": [
            {"type": "step-start"},
            {"type": "reasoning", "id": "t2.1.0", "text": "Saving it.", "state": "done"},
            {"type": "tool-demo.write_note", "toolCallId": "t2.1.0", "state": "output-available",
             "input": NOTE, "output": {"saved": True}, "providerExecuted": True,
             "approval": {"id": "t2.1.0", "approved": True}},
            {"type": "data-reactgate-trace", "id": f"{CID}/{approval_seq}",
             "data": {"kind": "approval", "turn_id": "t2", "call_id": "t2.1.0", "tool_id": "demo.write_note",
                      "decision": "approved"}},
            {"type": "step-start"},
            {"type": "text", "text": "Noted: milk.", "state": "done"},
        ]},
        {"id": "m3", "role": "user", "parts": [{"type": "text", "text": "Thanks!"}]},
        {"id": "t3", "role": "assistant", "parts": [   # still streaming when the page was reloaded
            {"type": "step-start"},
            {"type": "text", "text": "You're welcome.", "state": "streaming"},
        ]},
    ]


def test_ui_messages_place_a_steer_where_it_was_logged_and_survive_an_odd_log() -> None:
    events = log(
        said("m1", "Weather?"), started("t1", "m1"), think("t1", 1, "Checking."),
        UserSaid(message_id="m2", text="Just say hi.", kind=MessageKind.STEER),   # joins t1: no turn of its own
        failed("t1", "t1.1.0", "demo.weather", "steered"),   # its tool.call is not in this log
        answer("t1", 2, "Hi."), round_done("t1", 2, "Hi.", "complete"), completed("t1", "Hi."),
    )
    messages = ui_messages(events)
    assert [(m["id"], m["role"]) for m in messages] == [("m1", "user"), ("t1", "assistant"), ("m2", "user")]
    assert [p["type"] for p in messages[1]["parts"]] == ["step-start", "reasoning", "step-start", "text"]


def test_ui_messages_hold_a_paused_question_waiting() -> None:
    parts = ui_messages(ASK[:ASK_PAUSE])[-1]["parts"]
    assert parts[-1] == {"type": "tool-ask_user", "toolCallId": "t1.1.0", "state": "input-available",
                         "input": {"question": "Celsius or Fahrenheit?", "options": ["Celsius", "Fahrenheit"]}}
    whole = ui_messages(ASK)[-1]["parts"]
    assert whole[2]["state"] == "output-available" and whole[2]["output"] == {"answer": "Celsius"}
    assert "".join(p["text"] for p in whole if p["type"] == "text") == ANSWER


# -- properties ------------------------------------------------------------------------------------------------

pieces = st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(thinking=st.lists(pieces, min_size=0, max_size=3), answer_pieces=pieces,
       results=st.lists(st.booleans(), min_size=0, max_size=3), pause_after=st.integers(0, 40))
def test_any_split_of_the_answer_gives_the_same_text_once(
        thinking: list[list[str]], answer_pieces: list[str], results: list[bool], pause_after: int) -> None:
    """Tool rounds with any thinking, then an answer in any deltas; the shell may also drop the
    response anywhere and open the next (a reconnect): the text is the final answer, once."""
    final = "".join(answer_pieces)
    payloads: list[EventData] = [said("m1", "go"), started("t1", "m1")]
    for r, (text, good) in enumerate(zip(thinking, results, strict=False), 1):
        payloads += [think("t1", r, t) for t in text]
        payloads += [call("t1", r, f"t1.{r}.0", "demo.weather", {"city": "Paris"}), round_done("t1", r)]
        payloads.append(ok("t1", f"t1.{r}.0", "demo.weather", WEATHER) if good
                        else failed("t1", f"t1.{r}.0", "demo.weather", "timeout", {"timeout_s": 30}))
    last = len(thinking) + 1
    payloads += [answer("t1", last, t) for t in answer_pieces]
    payloads += [round_done("t1", last, final, "complete"), completed("t1", final)]
    events = log(*payloads)

    whole = response(events)
    well_formed(whole)
    assert texts(whole) == final
    assert "".join(p["text"] for p in ui_messages(events)[-1]["parts"] if p["type"] == "text") == final

    # Two responses cut at a round boundary, as after a pause: together, the same text once.
    cut = min(pause_after, len(events))
    while 0 < cut < len(events) and events[cut - 1].event not in ("round.completed", "tool.result"):
        cut -= 1
    first, rest = response(events[:cut]), response(events[cut:])
    assert texts(first) + texts(rest) == final


# -- the request: parse_chat_request ---------------------------------------------------------------------------

# POST bodies the `ai` package's Chat sent through its DefaultChatTransport (ai 6.0.x), served the
# responses of the scenarios above: each is byte for byte `body(...)` of the dict below.
USER = {"parts": [{"type": "text", "text": "What's the weather in Paris?"}], "id": "m1", "role": "user"}
NEW_MESSAGE = {"id": "c_aisdk", "messages": [USER], "trigger": "submit-message"}
ASK_ANSWERED = {"id": "c_aisdk", "messages": [USER, {"id": "t1", "role": "assistant", "parts": [
    {"type": "step-start"},
    {"type": "reasoning", "id": "t1.1.0", "text": "Which unit?", "state": "done"},
    {"type": "tool-ask_user", "toolCallId": "t1.1.0", "state": "output-available",
     "input": {"question": "Celsius or Fahrenheit?", "options": ["Celsius", "Fahrenheit"]}, "output": "Celsius"},
]}], "trigger": "submit-message", "messageId": "t1"}


def approval_response(approval: dict[str, Any]) -> dict[str, Any]:
    return {"id": "c_aisdk", "messages": [
        {"parts": [{"type": "text", "text": "Note: milk"}], "id": "m1", "role": "user"},
        {"id": "t1", "role": "assistant", "parts": [
            {"type": "step-start"},
            {"type": "reasoning", "id": "t1.1.0", "text": "Saving it.", "state": "done"},
            {"type": "tool-demo.write_note", "toolCallId": "t1.1.0", "state": "approval-responded",
             "input": {"text": "milk"}, "providerExecuted": True, "approval": approval},
        ]}], "trigger": "submit-message", "messageId": "t1"}


APPROVED = approval_response({"id": "t1.1.0", "approved": True})
DENIED = approval_response({"id": "t1.1.0", "approved": False, "reason": "not now"})


def body(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def test_a_new_message_starts_a_turn() -> None:
    assert body(NEW_MESSAGE) == (b'{"id":"c_aisdk","messages":[{"parts":[{"type":"text","text":"What\'s the weather '
                                 b'in Paris?"}],"id":"m1","role":"user"}],"trigger":"submit-message"}')
    assert parse_chat_request(body(NEW_MESSAGE)) == ChatRequest("c_aisdk", ("m1", "What's the weather in Paris?"), ())


def test_an_ask_user_output_is_the_answer() -> None:
    assert parse_chat_request(body(ASK_ANSWERED)) == ChatRequest("c_aisdk", None, (("t1.1.0", "Celsius"),))


@pytest.mark.parametrize(("doc", "answer_text"), [(APPROVED, "Approve"), (DENIED, "Deny")])
def test_an_approval_response_is_approve_or_deny(doc: dict[str, Any], answer_text: str) -> None:
    assert parse_chat_request(body(doc)) == ChatRequest("c_aisdk", None, (("t1.1.0", answer_text),))


def test_only_answers_the_client_wrote_count() -> None:
    """The client sends the whole message again: the first question's output is now the observation
    the stream sent back (an object), the second one's the user's new answer (a string)."""
    doc = json.loads(body(ASK_ANSWERED))
    parts = doc["messages"][-1]["parts"]
    parts[2]["output"] = {"answer": "Celsius"}
    parts.append({"type": "tool-demo.weather", "toolCallId": "t1.2.0", "state": "output-available",
                  "input": {"city": "Paris"}, "output": WEATHER, "providerExecuted": True})
    parts.append({"type": "tool-ask_user", "toolCallId": "t1.3.0", "state": "output-available",
                  "input": {"question": "Again?", "options": []}, "output": ""})
    assert parse_chat_request(body(doc)).answers == (("t1.3.0", ""),)


def _with(doc: dict[str, Any], path: str, value: Any) -> bytes:
    """`doc` with the value at a dotted path (`messages.-1.parts.2.output`) replaced; `...` deletes it."""
    doc = json.loads(body(doc))
    *keys, last = [int(k) if k.lstrip("-").isdigit() else k for k in path.split(".")]
    target: Any = doc
    for key in keys:
        target = target[key]
    if value is ...:
        del target[last]
    else:
        target[last] = value
    return body(doc)


@pytest.mark.parametrize(("raw", "field"), [
    (b"{not json", "body"),
    (b"\xff\xfe", "body"),
    (b'["a list"]', "body"),
    (_with(NEW_MESSAGE, "id", ...), "id"),
    (_with(NEW_MESSAGE, "id", ""), "id"),
    (_with(NEW_MESSAGE, "id", 7), "id"),
    (_with(NEW_MESSAGE, "messages", ...), "messages"),
    (_with(NEW_MESSAGE, "messages", []), "messages"),
    (_with(NEW_MESSAGE, "messages", {"0": USER}), "messages"),
    (_with(NEW_MESSAGE, "messages.0", "hello"), "messages[-1]"),
    (_with(NEW_MESSAGE, "messages.0.parts", ...), "messages[-1].parts"),
    (_with(NEW_MESSAGE, "messages.0.role", "system"), "messages[-1].role"),
    (_with(NEW_MESSAGE, "messages.0.id", ...), "messages[-1].id"),
    (_with(NEW_MESSAGE, "messages.0.id", "x" * 129), "messages[-1].id"),
    (_with(NEW_MESSAGE, "messages.0.parts", [{"type": "file", "mediaType": "image/png", "url": "data:,"}]),
     "messages[-1].parts"),
    (_with(NEW_MESSAGE, "messages.0.parts.0.text", ""), "messages[-1].parts"),
    (_with(NEW_MESSAGE, "messages.0.parts.0.text", 5), "messages[-1].parts[0].text"),
    (_with(NEW_MESSAGE, "messages.0.parts.0", "text"), "messages[-1].parts[0]"),
    (_with(NEW_MESSAGE, "trigger", "regenerate-message"), "trigger"),
    (_with(ASK_ANSWERED, "messages.-1.parts.2.output", {"answer": "Celsius"}), "messages[-1].parts"),
    (_with(ASK_ANSWERED, "messages.-1.parts.2.state", "input-available"), "messages[-1].parts"),
    (_with(ASK_ANSWERED, "messages.-1.parts.2.toolCallId", ...), "messages[-1].parts[2].toolCallId"),
    (_with(APPROVED, "messages.-1.parts.2.approval", ...), "messages[-1].parts[2].approval"),
    (_with(APPROVED, "messages.-1.parts.2.approval.approved", "yes"), "messages[-1].parts[2].approval"),
    (_with(APPROVED, "messages.-1.parts.2.approval.id", ...), "messages[-1].parts[2].approval.id"),
])
def test_a_malformed_request_names_the_field(raw: bytes, field: str) -> None:
    with pytest.raises(ChatRequestError) as refused:
        parse_chat_request(raw)
    assert str(refused.value).startswith(f"{field}: "), str(refused.value)
