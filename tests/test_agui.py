"""Our event log as AG-UI 1.0 events, and RunAgentInput bodies as our commands (gateway/agui.py).

Pure Python: events built by hand. `check_stream` mirrors what `@ag-ui/client` 1.0 enforces
(the fields each event may have, per `@ag-ui/core`'s schemas, and the verifier's ordering rules),
`reduce_messages` what its reducer makes of a stream, so a snapshot can be compared with the
streams that told the same log. The streams here were also run through the official client once
(EventSchemas, verifyEvents and an HttpAgent over SSE): none was refused or warned about.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.agui import (
    END_OUTCOMES,
    HEADERS,
    AguiRun,
    RunInputError,
    RunRequest,
    messages_snapshot,
    parse_run_input,
    sse,
)
from protocol.events import (
    NOTHING_STREAMED,
    AnswerDelta,
    Approval,
    AskUser,
    ConversationDeleted,
    EndReason,
    Event,
    EventData,
    Fallback,
    RoundCompleted,
    Salvaged,
    ThinkingDelta,
    ToolCalled,
    ToolResult,
    TurnCompleted,
    TurnStarted,
    UiCommand,
    UserSaid,
)

CID = "c_agui"
T0 = 1796021140.0

PROPERTY_SETTINGS = settings(
    max_examples=int(os.environ.get("AGUI_PROPERTY_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# -- building logs -------------------------------------------------------------------------------


def ts(seq: int) -> float:
    return T0 + seq / 8  # exact in binary, so the millisecond timestamps below are exact too


def at(seq: int) -> dict[str, Any]:
    """The timestamp and metadata every event fed with this seq carries."""
    return {"timestamp": int(ts(seq) * 1000), "metadata": {"reactgate": {"seq": seq}}}


def log(*payloads: EventData, first_seq: int = 1) -> list[Event]:
    return [Event.of(CID, seq, data, ts(seq)) for seq, data in enumerate(payloads, first_seq)]


def thinking(text: str, turn: str = "t1", round_no: int = 1) -> ThinkingDelta:
    return ThinkingDelta(turn_id=turn, round=round_no, text=text)


def answer(text: str, turn: str = "t1", round_no: int = 1) -> AnswerDelta:
    return AnswerDelta(turn_id=turn, round=round_no, text=text)


def call(call_id: str, tool_id: str, params: dict[str, Any], turn: str = "t1", round_no: int = 1) -> ToolCalled:
    return ToolCalled(turn_id=turn, round=round_no, call_id=call_id, tool_id=tool_id, params=params, trait="neutral")


def result(call_id: str, tool_id: str, result: dict[str, Any] | None = None, error: str | None = None,
           turn: str = "t1", **detail: Any) -> ToolResult:
    return ToolResult(turn_id=turn, call_id=call_id, tool_id=tool_id, ok=error is None, duration_ms=0,
                      result=result, error=error, detail=detail or None)


def round_done(round_no: int, turn: str = "t1") -> RoundCompleted:
    return RoundCompleted(turn_id=turn, round=round_no, streamed_state=NOTHING_STREAMED, accepted=[], denied=[],
                          notices=[])


def completed(final_answer: str, reason: EndReason = EndReason.COMPLETE, turn: str = "t1", **more: Any) -> TurnCompleted:
    return TurnCompleted(turn_id=turn, reason=reason, final_answer=final_answer, used_tools=True,
                         finish_ok=reason in (EndReason.COMPLETE, EndReason.EXIT), **more)


def demo_turn(turn: str = "t1", message_id: str = "m1", first_seq: int = 1) -> list[Event]:
    """The demo: think, call demo.weather, observe, think, stream the answer."""
    call_id = f"{turn}.1.0"
    return log(
        UserSaid(message_id=message_id, text="What's the weather in Paris?"),
        TurnStarted(turn_id=turn, user_message_id=message_id),
        thinking("Checking ", turn), thinking("the weather.", turn),
        call(call_id, "demo.weather", {"city": "Paris"}, turn),
        round_done(1, turn),
        result(call_id, "demo.weather", {"city": "Paris", "condition": "rain", "temp_c": 12}, turn=turn),
        thinking("Answering.", turn, 2),
        answer("It rains ", turn, 2), answer("in Paris, 12 °C.", turn, 2),
        round_done(2, turn),
        completed("It rains in Paris, 12 °C.", turn=turn),
        first_seq=first_seq,
    )


def ask_turn() -> list[Event]:
    """The model asks which city (seq 6 is the question); the answer resumes the turn."""
    return log(
        UserSaid(message_id="m1", text="Weather?"),
        TurnStarted(turn_id="t1", user_message_id="m1"),
        thinking("Asking."),
        call("t1.1.0", "react.ask_user", {"question": "Which city?", "options": ["Paris", "Rome"]}),
        round_done(1),
        AskUser(turn_id="t1", ask_id="t1.1.0", question="Which city?", options=["Paris", "Rome"], timeout_s=300),
        result("t1.1.0", "react.ask_user", {"answer": "Paris"}),
        thinking("Answering.", round_no=2),
        answer("Paris it is.", round_no=2),
        round_done(2),
        completed("Paris it is."),
    )


def approval_turn() -> list[Event]:
    """A confirm tool's call waits on the user's yes (seq 6 is the request)."""
    params = {"text": "milk"}
    return log(
        UserSaid(message_id="m1", text="Note milk"),
        TurnStarted(turn_id="t1", user_message_id="m1"),
        thinking("Writing it down."),
        call("t1.1.0", "demo.write_note", params),
        round_done(1),
        AskUser(turn_id="t1", ask_id="t1.1.0", question="Run demo.write_note?", options=["Approve", "Deny", "Approve all"],
                timeout_s=300, kind="approval", tool_id="demo.write_note", params=params),
        Approval(turn_id="t1", call_id="t1.1.0", tool_id="demo.write_note", decision="approved"),
        result("t1.1.0", "demo.write_note", {"saved": True}),
        UiCommand(turn_id="t1", command="open_tab", args={"name": "Notes"}),
        answer("Noted.", round_no=2),
        round_done(2),
        completed("Noted."),
    )


def provider_error_turn() -> list[Event]:
    return log(
        UserSaid(message_id="m1", text="Hi"),
        TurnStarted(turn_id="t1", user_message_id="m1"),
        Fallback(from_model="openai/a", to_model="openai/b", error="rate_limit: slow down"),
        round_done(1),
        completed("Sorry — the model provider failed, so I have no answer this time. Please try again later.",
                  EndReason.PROVIDER_ERROR, error="rate_limit: slow down"),
    )


def runs_of(events: Sequence[Event]) -> list[list[Event]]:
    """The log split where the runs end: after each `ask_user` and `turn.completed`."""
    runs: list[list[Event]] = [[]]
    for event in events:
        runs[-1].append(event)
        if isinstance(event.data, AskUser | TurnCompleted):
            runs.append([])
    return [run for run in runs if run]


def play(events: Iterable[Event], run_id: str = "r1", snapshot: Sequence[Event] = ()) -> list[dict[str, Any]]:
    run = AguiRun(CID, run_id)
    out = run.start(snapshot)
    for event in events:
        out += run.feed(event)
    return out


# -- what @ag-ui/client 1.0 enforces, mirrored ----------------------------------------------------

BASE = {"type", "timestamp", "rawEvent", "metadata"}
ATTRIBUTED = BASE | {"subagentRunId"}
# The 1.0 schema of each event type we emit: (required fields, optional fields).
SCHEMAS: dict[str, tuple[set[str], set[str]]] = {
    "RUN_STARTED": ({"threadId", "runId"}, BASE | {"protocolVersion", "parentRunId", "input"}),
    "RUN_FINISHED": ({"threadId", "runId"}, BASE | {"result", "outcome", "usage"}),
    "RUN_ERROR": ({"message"}, BASE | {"code", "usage"}),
    "STEP_STARTED": ({"stepName"}, ATTRIBUTED),
    "STEP_FINISHED": ({"stepName"}, ATTRIBUTED),
    "TEXT_MESSAGE_START": ({"messageId"}, ATTRIBUTED | {"role", "name"}),
    "TEXT_MESSAGE_CONTENT": ({"messageId", "delta"}, ATTRIBUTED),
    "TEXT_MESSAGE_END": ({"messageId"}, ATTRIBUTED),
    "TOOL_CALL_START": ({"toolCallId", "toolCallName"}, ATTRIBUTED | {"parentMessageId"}),
    "TOOL_CALL_ARGS": ({"toolCallId", "delta"}, ATTRIBUTED),
    "TOOL_CALL_END": ({"toolCallId"}, ATTRIBUTED),
    "TOOL_CALL_RESULT": ({"messageId", "toolCallId", "content"}, ATTRIBUTED | {"role"}),
    "REASONING_START": ({"messageId"}, ATTRIBUTED),
    "REASONING_MESSAGE_START": ({"messageId", "role"}, ATTRIBUTED),
    "REASONING_MESSAGE_CONTENT": ({"messageId", "delta"}, ATTRIBUTED),
    "REASONING_MESSAGE_END": ({"messageId"}, ATTRIBUTED),
    "REASONING_END": ({"messageId"}, ATTRIBUTED),
    "MESSAGES_SNAPSHOT": ({"messages"}, BASE),
    "CUSTOM": ({"name", "value"}, ATTRIBUTED),
}
INTERRUPT_FIELDS = ({"id", "reason"}, {"subagentRunId", "message", "toolCallId", "responseSchema", "expiresAt", "metadata"})
OPENERS = {"TEXT_MESSAGE_START": "text", "TOOL_CALL_START": "tool", "REASONING_START": "span",
           "REASONING_MESSAGE_START": "reasoning", "STEP_STARTED": "step"}
CONTINUERS = {"TEXT_MESSAGE_CONTENT": "text", "TOOL_CALL_ARGS": "tool", "REASONING_MESSAGE_CONTENT": "reasoning"}
CLOSERS = {"TEXT_MESSAGE_END": "text", "TOOL_CALL_END": "tool", "REASONING_END": "span",
           "REASONING_MESSAGE_END": "reasoning", "STEP_FINISHED": "step"}


def entity(event: dict[str, Any]) -> str:
    return event.get("messageId") or event.get("toolCallId") or event["stepName"]


def check_fields(event: dict[str, Any]) -> None:
    required, optional = SCHEMAS[event["type"]]
    keys = set(event) - {"type"}
    assert required <= keys, f"{event['type']} lacks {required - keys}"
    assert keys <= required | optional, f"{event['type']} has fields 1.0 does not know: {keys - required - optional}"
    assert all(value is not None for value in event.values()), f"{event['type']} has a null field"
    assert isinstance(event.get("metadata", {}), dict)
    assert isinstance(event.get("timestamp", 0), int)
    if event["type"] == "REASONING_MESSAGE_START":
        assert event["role"] == "reasoning"
    if event["type"] == "TOOL_CALL_RESULT":
        assert isinstance(event["content"], str) and event.get("role", "tool") == "tool"
    if event["type"] == "RUN_FINISHED" and "outcome" in event:
        outcome = event["outcome"]
        assert outcome["type"] in ("success", "interrupt", "cancelled")
        if outcome["type"] == "interrupt":
            assert outcome["interrupts"], "an interrupt outcome names at least one interrupt"
            for interrupt in outcome["interrupts"]:
                keys = set(interrupt)
                assert INTERRUPT_FIELDS[0] <= keys <= INTERRUPT_FIELDS[0] | INTERRUPT_FIELDS[1], keys
        else:
            assert set(outcome) == {"type"}
    for name in ("THINKING_START", "THINKING_END", "THINKING_TEXT_MESSAGE_START"):
        assert event["type"] != name, "1.0 removed THINKING_*"


def check_stream(events: Sequence[dict[str, Any]], *, complete: bool = True) -> None:
    """One connection's events, as @ag-ui/client's verifyEvents reads them: RUN_STARTED first, each
    START before its content and END, nothing open at RUN_FINISHED, nothing after the run ended
    but a new RUN_STARTED. `complete`: the stream must end with the run."""
    open_: dict[str, set[str]] = {kind: set() for kind in ("text", "tool", "span", "reasoning", "step")}
    running = ended = False
    for i, event in enumerate(events):
        kind = event["type"]
        where = f"event {i} {kind}"
        check_fields(event)
        if i == 0:
            assert kind in ("RUN_STARTED", "RUN_ERROR"), f"{where}: the first event must be RUN_STARTED"
        if ended:
            assert kind == "RUN_STARTED", f"{where}: after the run ended"
        if kind == "RUN_STARTED":
            assert not running, f"{where}: a run is still active"
            running, ended = True, False
            open_ = {name: set() for name in open_}
        elif kind == "RUN_ERROR":
            running, ended = False, True
        elif kind == "RUN_FINISHED":
            assert not any(open_.values()), f"{where}: still open {open_}"
            running, ended = False, True
        elif kind in OPENERS:
            assert entity(event) not in open_[OPENERS[kind]], f"{where}: {entity(event)} is already open"
            open_[OPENERS[kind]].add(entity(event))
        elif kind in CONTINUERS:
            assert entity(event) in open_[CONTINUERS[kind]], f"{where}: {entity(event)} is not open"
        elif kind in CLOSERS:
            assert entity(event) in open_[CLOSERS[kind]], f"{where}: {entity(event)} is not open"
            open_[CLOSERS[kind]].discard(entity(event))
    if complete:
        assert ended, "the stream does not end its run"


def reduce_messages(streams: Iterable[Sequence[dict[str, Any]]], messages: list[dict[str, Any]] | None = None
                    ) -> list[dict[str, Any]]:
    """The messages @ag-ui/client's reducer builds from streams (metadata left out)."""
    messages = [] if messages is None else messages

    def find(mid: str) -> dict[str, Any] | None:
        return next((m for m in messages if m["id"] == mid), None)

    for stream in streams:
        for event in stream:
            match event["type"]:
                case "TEXT_MESSAGE_START" if find(event["messageId"]) is None:
                    messages.append({"id": event["messageId"], "role": event.get("role", "assistant"), "content": ""})
                case "TEXT_MESSAGE_CONTENT" | "REASONING_MESSAGE_CONTENT":
                    found = find(event["messageId"])
                    assert found is not None
                    found["content"] = found.get("content", "") + event["delta"]
                case "REASONING_MESSAGE_START" if find(event["messageId"]) is None:
                    messages.append({"id": event["messageId"], "role": "reasoning", "content": ""})
                case "TOOL_CALL_START":
                    parent = find(event["parentMessageId"])
                    if parent is None:
                        parent = {"id": event["parentMessageId"], "role": "assistant", "toolCalls": []}
                        messages.append(parent)
                    parent.setdefault("toolCalls", []).append(
                        {"id": event["toolCallId"], "type": "function",
                         "function": {"name": event["toolCallName"], "arguments": ""}})
                case "TOOL_CALL_ARGS":
                    calls = [c for m in messages for c in m.get("toolCalls", ()) if c["id"] == event["toolCallId"]]
                    calls[0]["function"]["arguments"] += event["delta"]
                case "TOOL_CALL_RESULT":
                    tool = {"id": event["messageId"], "toolCallId": event["toolCallId"], "role": "tool",
                            "content": event["content"]}
                    owner = next((i for i, m in enumerate(messages) if m["role"] == "assistant"
                                  and any(c["id"] == event["toolCallId"] for c in m.get("toolCalls", ()))), None)
                    if owner is None:
                        messages.append(tool)
                    else:
                        end = owner + 1
                        while end < len(messages) and messages[end]["role"] == "tool":
                            end += 1
                        messages.insert(end, tool)
                case "MESSAGES_SNAPSHOT":
                    snapshot = {m["id"]: m for m in json.loads(json.dumps(event["messages"]))}
                    messages[:] = [snapshot.get(m["id"], m) for m in messages if m["id"] in snapshot]
                    messages += [m for mid, m in snapshot.items() if mid not in {m["id"] for m in messages}]
    return messages


def user_messages(events: Iterable[Event]) -> list[dict[str, Any]]:
    return [{"id": e.data.message_id, "role": "user", "content": e.data.text}
            for e in events if isinstance(e.data, UserSaid)]


def texts(events: Iterable[dict[str, Any]], kind: str = "TEXT_MESSAGE_CONTENT") -> str:
    return "".join(e["delta"] for e in events if e["type"] == kind)


def held(run_events: Sequence[Event]) -> list[dict[str, Any]]:
    """The messages a client holds before a run's stream: what its user typed (the app adds it)."""
    return user_messages(run_events)


# -- the demo turn ------------------------------------------------------------------------------


def test_a_demo_turn_gives_exactly_these_events() -> None:
    out = play(demo_turn())
    reasoning1, reasoning2 = "t1.1.thinking", "t1.2.thinking"
    assert out == [
        {"type": "RUN_STARTED", "threadId": CID, "runId": "r1", "protocolVersion": "1.0"},
        # seq 1 user.message and seq 2 turn.started give nothing: the client sent the message
        {"type": "STEP_STARTED", "stepName": "round 1", **at(3)},
        {"type": "REASONING_START", "messageId": reasoning1, **at(3)},
        {"type": "REASONING_MESSAGE_START", "messageId": reasoning1, "role": "reasoning", **at(3)},
        {"type": "REASONING_MESSAGE_CONTENT", "messageId": reasoning1, "delta": "Checking ", **at(3)},
        {"type": "REASONING_MESSAGE_CONTENT", "messageId": reasoning1, "delta": "the weather.", **at(4)},
        {"type": "REASONING_MESSAGE_END", "messageId": reasoning1, **at(5)},
        {"type": "REASONING_END", "messageId": reasoning1, **at(5)},
        {"type": "TOOL_CALL_START", "toolCallId": "t1.1.0", "toolCallName": "demo.weather",
         "parentMessageId": "t1.1.assistant", **at(5)},
        {"type": "TOOL_CALL_ARGS", "toolCallId": "t1.1.0", "delta": '{"city":"Paris"}', **at(5)},
        {"type": "TOOL_CALL_END", "toolCallId": "t1.1.0", **at(5)},
        {"type": "STEP_FINISHED", "stepName": "round 1", **at(6)},
        {"type": "TOOL_CALL_RESULT", "messageId": "t1.1.0.result", "toolCallId": "t1.1.0",
         "content": '{"city":"Paris","condition":"rain","temp_c":12}', "role": "tool", **at(7)},
        {"type": "STEP_STARTED", "stepName": "round 2", **at(8)},
        {"type": "REASONING_START", "messageId": reasoning2, **at(8)},
        {"type": "REASONING_MESSAGE_START", "messageId": reasoning2, "role": "reasoning", **at(8)},
        {"type": "REASONING_MESSAGE_CONTENT", "messageId": reasoning2, "delta": "Answering.", **at(8)},
        {"type": "REASONING_MESSAGE_END", "messageId": reasoning2, **at(9)},
        {"type": "REASONING_END", "messageId": reasoning2, **at(9)},
        {"type": "TEXT_MESSAGE_START", "messageId": "t1.2.assistant", "role": "assistant", **at(9)},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "t1.2.assistant", "delta": "It rains ", **at(9)},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "t1.2.assistant", "delta": "in Paris, 12 °C.", **at(10)},
        {"type": "TEXT_MESSAGE_END", "messageId": "t1.2.assistant", **at(11)},
        {"type": "STEP_FINISHED", "stepName": "round 2", **at(11)},
        {"type": "RUN_FINISHED", "threadId": CID, "runId": "r1",
         "result": {"turnId": "t1", "reason": "complete", "finalAnswer": "It rains in Paris, 12 °C.",
                    "usedTools": True, "finishOk": True}, **at(12)},
    ]
    check_stream(out)


def test_the_content_deltas_of_a_turn_are_its_final_answer() -> None:
    events = demo_turn()
    out = play(events)
    final = events[-1].data
    assert isinstance(final, TurnCompleted)
    assert texts(out) == final.final_answer
    assert texts(out, "REASONING_MESSAGE_CONTENT") == "Checking the weather.Answering."


def test_every_event_fed_carries_its_seq_in_metadata_and_a_feed_after_the_end_gives_nothing() -> None:
    run = AguiRun(CID, "r1")
    run.start()
    for event in demo_turn():
        assert not run.done
        assert all(out["metadata"] == {"reactgate": {"seq": event.seq}} for out in run.feed(event))
    assert run.done
    assert run.feed(demo_turn("t2", "m2", first_seq=13)[0]) == []


# -- human in the loop ---------------------------------------------------------------------------


def test_ask_user_ends_the_run_with_an_interrupt() -> None:
    events = ask_turn()
    run = AguiRun(CID, "r1")
    out = run.start()
    for event in events[:6]:
        out += run.feed(event)
    assert run.done
    check_stream(out)
    assert out[-1] == {
        "type": "RUN_FINISHED", "threadId": CID, "runId": "r1",
        "outcome": {"type": "interrupt", "interrupts": [{
            "id": "t1.1.0", "reason": "reactgate.ask_user", "message": "Which city?",
            "responseSchema": {"type": "string", "enum": ["Paris", "Rome"]},
            "expiresAt": "2026-11-30T06:50:40.750Z",   # the question's time + timeout_s
        }]},
        **at(6),
    }
    # the question's call streamed as a tool call, its result still to come
    assert [e["type"] for e in out if e.get("toolCallId") == "t1.1.0"] == ["TOOL_CALL_START", "TOOL_CALL_ARGS",
                                                                           "TOOL_CALL_END"]


def test_a_question_without_options_asks_for_free_text() -> None:
    ask = AskUser(turn_id="t1", ask_id="t1.1.0", question="Which city?", options=[], timeout_s=60)
    out = play(log(ask))
    assert out[-1]["outcome"]["interrupts"][0]["responseSchema"] == {"type": "string"}


def test_an_approval_request_is_an_interrupt_about_the_tool_call() -> None:
    events = approval_turn()
    out = play(events[:6])
    check_stream(out)
    (interrupt,) = out[-1]["outcome"]["interrupts"]
    assert interrupt == {
        "id": "t1.1.0", "reason": "reactgate.approval", "message": "Run demo.write_note?",
        "toolCallId": "t1.1.0",
        "responseSchema": {"type": "string", "enum": ["Approve", "Deny", "Approve all"]},
        "expiresAt": "2026-11-30T06:50:40.750Z",
        "metadata": {"reactgate": {"toolId": "demo.write_note", "params": {"text": "milk"}}},
    }
    # the call it concerns was streamed before it, in the same run
    assert any(e["type"] == "TOOL_CALL_START" and e["toolCallId"] == interrupt["toolCallId"] for e in out)


@pytest.mark.parametrize("turn", [ask_turn, approval_turn])
def test_a_resumed_run_continues_the_same_turn(turn: Any) -> None:
    events = turn()
    first, second = runs_of(events)
    streams = [play(first, "r1"), play(second, "r2")]
    for stream in streams:
        check_stream(stream)
    resumed = streams[1]
    assert resumed[0] == {"type": "RUN_STARTED", "threadId": CID, "runId": "r2", "protocolVersion": "1.0"}
    assert resumed[1]["type"] in ("TOOL_CALL_RESULT", "CUSTOM")  # the answer's observation comes first
    assert resumed[-1]["result"]["finalAnswer"] == texts(resumed)
    assert reduce_messages(streams, held(first)) == messages_snapshot(events)


def test_the_answer_to_an_approval_comes_back_as_our_answer() -> None:
    events = approval_turn()
    interrupt = play(events[:6])[-1]["outcome"]["interrupts"][0]
    for status, payload, answer_text in [("resolved", "Approve", "Approve"), ("resolved", {"answer": "Approve all"}, "Approve all"),
                                         ("cancelled", None, "Deny")]:
        entry = {"interruptId": interrupt["id"], "status": status} | ({} if payload is None else {"payload": payload})
        body = {"threadId": CID, "runId": "r2", "messages": [], "resume": [entry]}
        assert parse_run_input(json.dumps(body).encode()).resume == ((interrupt["id"], answer_text),)


def test_the_traces_ui_commands_and_fallbacks_are_custom_events() -> None:
    out = play(approval_turn()[6:9] + provider_error_turn()[2:3])
    assert [(e["type"], e.get("name")) for e in out[1:]] == [
        ("CUSTOM", "reactgate.trace"), ("TOOL_CALL_RESULT", None), ("CUSTOM", "reactgate.ui_command"),
        ("CUSTOM", "reactgate.fallback")]
    assert out[1]["value"] == {"kind": "approval", "turn_id": "t1", "call_id": "t1.1.0", "tool_id": "demo.write_note",
                               "decision": "approved"}
    assert out[3]["value"] == {"turn_id": "t1", "command": "open_tab", "args": {"name": "Notes"}}
    assert out[4]["value"] == {"from": "openai/a", "to": "openai/b", "error": "rate_limit: slow down"}


# -- how a turn ends ------------------------------------------------------------------------------


def test_a_provider_error_ends_the_run_with_run_error() -> None:
    events = provider_error_turn()
    out = play(events)
    check_stream(out)
    assert out[-1] == {
        "type": "RUN_ERROR",
        "message": "Sorry — the model provider failed, so I have no answer this time. Please try again later.",
        "code": "provider_error",
        "timestamp": at(5)["timestamp"],
        "metadata": {"reactgate": {"seq": 5, "error": "rate_limit: slow down"}},
    }
    assert [e["type"] for e in out] == ["RUN_STARTED", "CUSTOM", "STEP_STARTED", "STEP_FINISHED", "RUN_ERROR"]


@pytest.mark.parametrize(("reason", "ends"), [
    (EndReason.ITERATION_LIMIT, ("RUN_ERROR", "iteration_limit")),
    (EndReason.PROTOCOL_VIOLATION, ("RUN_ERROR", "protocol_violation")),
    (EndReason.ERROR, ("RUN_ERROR", "error")),
    (EndReason.CANCELLED, ("RUN_FINISHED", {"type": "cancelled"})),
])
def test_a_turn_that_gave_no_answer_ends_as_its_reason_says(reason: EndReason, ends: tuple[str, Any]) -> None:
    out = play(log(thinking("Calling a tool."), completed("", reason)))
    check_stream(out)
    assert out[-1]["type"] == ends[0]
    assert out[-1].get("code", out[-1].get("outcome")) == ends[1]
    assert "TEXT_MESSAGE_START" not in [e["type"] for e in out]  # no apology is streamed as an answer


def test_every_end_reason_has_its_outcome() -> None:
    assert set(END_OUTCOMES) == set(EndReason)


def test_a_salvaged_partial_answer_says_so_in_the_result() -> None:
    events = log(answer("Half an"), round_done(1), Salvaged(turn_id="t1", round=1, answer_chars=7, partial=True),
                 completed("Half an", EndReason.SALVAGED, partial=True))
    out = play(events)
    check_stream(out)
    assert out[-1]["result"] == {"turnId": "t1", "reason": "salvaged", "finalAnswer": "Half an", "usedTools": True,
                                 "finishOk": False, "partial": True}
    assert texts(out) == "Half an"


def test_an_answer_continued_after_a_fallback_stays_one_message() -> None:
    events = log(answer("It rai"), Fallback(from_model="a", to_model="b", error="timeout: idle"), answer("ns."),
                 round_done(1), completed("It rains."))
    out = play(events)
    check_stream(out)
    assert [e["type"] for e in out if e["type"].startswith("TEXT")] == [
        "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END"]
    assert texts(out) == "It rains."


def test_a_deleted_conversation_and_a_shell_error_end_the_run_with_run_error() -> None:
    run = AguiRun(CID, "r1")
    out = run.start() + run.feed(log(answer("It"))[0])
    out += run.feed(Event.of(CID, 2, ConversationDeleted(last_seq=1), ts(2)))
    assert out[-1]["type"] == "RUN_ERROR" and out[-1]["code"] == "conversation_deleted"
    check_stream(out)
    assert run.done and run.error("late") == [] and run.reopen() == []

    run = AguiRun(CID, "r1")
    out = run.start() + run.feed(log(answer("It"))[0])
    out += run.error("the backend went away", "unavailable")
    # nothing closed: 1.0 allows RUN_ERROR with a message open, and the message was cut, not complete
    assert out[-1] == {"type": "RUN_ERROR", "message": "the backend went away", "code": "unavailable"}
    check_stream(out)
    assert run.done


def test_an_event_of_a_kind_this_version_does_not_know_gives_nothing() -> None:
    run = AguiRun(CID, "r1")
    unknown = Event(conversation_id=CID, seq=1, event="turn.paused", data={"turn_id": "t1"}, ts=ts(1))
    assert run.feed(unknown) == []


# -- reattaching after a cut ------------------------------------------------------------------------


def cut_and_reopen(events: Sequence[Event], k: int, *, rebuilt: bool
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The stream of a run cut after `events[:k]`, then the reattached stream that continues it
    (`reopen()`, then the rest), from the same run or from a new one fed the first k events again
    (its output thrown away)."""
    run = AguiRun(CID, "r1")
    first = run.start()
    for event in events[:k]:
        first += run.feed(event)
    if rebuilt:
        run = AguiRun(CID, "r1")
        for event in events[:k]:
            run.feed(event)
    reopened = run.reopen()
    rest = [out for event in events[k:] for out in run.feed(event)]
    return first, reopened, rest


@pytest.mark.parametrize("turn", [demo_turn, ask_turn, approval_turn, provider_error_turn])
@pytest.mark.parametrize("rebuilt", [False, True])
def test_reopen_after_a_cut_at_every_position_keeps_the_client_s_rules(turn: Any, rebuilt: bool) -> None:
    events = turn()
    run_events = runs_of(events)[0]
    whole = play(run_events)
    for k in range(len(run_events)):  # the client saw events[:k] whole; the run had not ended
        first, reopened, rest = cut_and_reopen(run_events, k, rebuilt=rebuilt)
        second = reopened + rest
        check_stream(first, complete=False)
        check_stream(second)
        # each character once: what the two connections streamed is what one would have
        for kind in ("TEXT_MESSAGE_CONTENT", "REASONING_MESSAGE_CONTENT"):
            assert texts(first, kind) + texts(second, kind) == texts(whole, kind), k
        # and the client's messages end up as if nothing had been cut
        assert (reduce_messages([first, second], held(run_events))
                == reduce_messages([whole], held(run_events))), k
        # the STARTs re-announced are those the uncut stream sent, as it sent them
        assert reopened[0]["type"] == "RUN_STARTED" and all(start in first for start in reopened[1:]), k


def test_reopen_re_announces_what_was_open_in_the_order_it_opened() -> None:
    run = AguiRun(CID, "r1")
    run.start()
    for event in log(thinking("Hm", round_no=1), answer("It", round_no=1)):
        run.feed(event)
    assert [(e["type"], e.get("messageId", e.get("stepName"))) for e in run.reopen()] == [
        ("RUN_STARTED", None), ("STEP_STARTED", "round 1"), ("TEXT_MESSAGE_START", "t1.1.assistant")]


# -- the snapshot -----------------------------------------------------------------------------------


def test_the_snapshot_of_a_two_turn_log() -> None:
    events = demo_turn() + demo_turn("t2", "m2", first_seq=13)
    assert messages_snapshot(events) == [
        {"id": "m1", "role": "user", "content": "What's the weather in Paris?"},
        {"id": "t1.1.thinking", "role": "reasoning", "content": "Checking the weather."},
        {"id": "t1.1.assistant", "role": "assistant", "toolCalls": [
            {"id": "t1.1.0", "type": "function", "function": {"name": "demo.weather", "arguments": '{"city":"Paris"}'}}]},
        {"id": "t1.1.0.result", "role": "tool", "toolCallId": "t1.1.0",
         "content": '{"city":"Paris","condition":"rain","temp_c":12}'},
        {"id": "t1.2.thinking", "role": "reasoning", "content": "Answering."},
        {"id": "t1.2.assistant", "role": "assistant", "content": "It rains in Paris, 12 °C."},
        {"id": "m2", "role": "user", "content": "What's the weather in Paris?"},
        {"id": "t2.1.thinking", "role": "reasoning", "content": "Checking the weather."},
        {"id": "t2.1.assistant", "role": "assistant", "toolCalls": [
            {"id": "t2.1.0", "type": "function", "function": {"name": "demo.weather", "arguments": '{"city":"Paris"}'}}]},
        {"id": "t2.1.0.result", "role": "tool", "toolCallId": "t2.1.0",
         "content": '{"city":"Paris","condition":"rain","temp_c":12}'},
        {"id": "t2.2.thinking", "role": "reasoning", "content": "Answering."},
        {"id": "t2.2.assistant", "role": "assistant", "content": "It rains in Paris, 12 °C."},
    ]
    # a client that followed both runs holds the same messages
    streams = [play(run) for run in runs_of(events)]
    assert reduce_messages(streams, []) == [m for m in messages_snapshot(events) if m["role"] != "user"]


def test_a_failed_observation_is_its_error_in_the_tool_message() -> None:
    events = log(call("t1.1.0", "demo.sleep", {}), result("t1.1.0", "demo.sleep", error="timeout", timeout_s=30))
    assert messages_snapshot(events)[-1]["content"] == '{"error":"timeout","timeout_s":30}'


def test_start_with_a_snapshot_sends_the_conversation_then_streams_the_user_s_message_back() -> None:
    earlier, now = demo_turn(), demo_turn("t2", "m2", first_seq=13)
    out = play(now, "r2", snapshot=earlier)
    check_stream(out)
    assert out[1] == {"type": "MESSAGES_SNAPSHOT", "messages": messages_snapshot(earlier),
                      "metadata": {"reactgate": {"seq": 12}}}
    # the snapshot replaced the client's messages, so the run's own user message comes back to it
    assert [(e["type"], e.get("role")) for e in out[2:5]] == [
        ("TEXT_MESSAGE_START", "user"), ("TEXT_MESSAGE_CONTENT", None), ("TEXT_MESSAGE_END", None)]
    client = [{"id": "m2", "role": "user", "content": "What's the weather in Paris?"}]  # what it held
    assert reduce_messages([out], client) == messages_snapshot(earlier + now)


# -- properties: any turn -----------------------------------------------------------------------------

words = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=6)


@st.composite
def turns(draw: st.DrawFn) -> list[Event]:
    """A turn as the runtime logs one: rounds of thinking and tool calls (results after the round,
    a question now and then), customs anywhere, and an end with or without a streamed answer."""
    payloads: list[EventData] = [UserSaid(message_id="m1", text="go"), TurnStarted(turn_id="t1", user_message_id="m1")]
    rounds = draw(st.integers(0, 3))
    for round_no in range(1, rounds + 1):
        payloads += [thinking(t, round_no=round_no) for t in draw(st.lists(words, max_size=3))]
        calls = [call(f"t1.{round_no}.{i}", "demo.weather", {"city": draw(words)}, round_no=round_no)
                 for i in range(draw(st.integers(0, 2)))]
        payloads += calls
        if draw(st.booleans()):
            payloads.append(Fallback(from_model="a", to_model="b", error="x"))
        payloads.append(round_done(round_no))
        for c in calls:
            if draw(st.integers(0, 3)) == 0:
                payloads.append(AskUser(turn_id="t1", ask_id=c.call_id, question="?", options=[], timeout_s=300))
            payloads.append(result(c.call_id, c.tool_id, {"ok": 1}))
    last = rounds + 1
    reason = draw(st.sampled_from(list(EndReason)))
    final = ""
    if reason in (EndReason.COMPLETE, EndReason.EXIT, EndReason.SALVAGED):
        payloads += [thinking(t, round_no=last) for t in draw(st.lists(words, max_size=2))]
        for piece in draw(st.lists(words, min_size=1, max_size=4)):
            payloads.append(answer(piece, round_no=last))
            final += piece
            if draw(st.integers(0, 4)) == 0:
                payloads.append(Fallback(from_model="a", to_model="b", error="cut"))
        payloads.append(round_done(last))
    elif reason is not EndReason.CANCELLED:
        final = "Sorry."
    payloads.append(completed(final, reason))
    return log(*payloads)


@PROPERTY_SETTINGS
@given(events=turns(), data=st.data())
def test_any_turn_keeps_the_rules_each_character_once_and_the_snapshot_agrees(events: list[Event], data: Any) -> None:
    runs = runs_of(events)
    streams = [play(run, f"r{i}") for i, run in enumerate(runs)]
    for stream in streams:
        check_stream(stream)
    final = events[-1].data
    assert isinstance(final, TurnCompleted)
    streamed = "".join(texts(stream) for stream in streams)
    assert streamed == "".join(e.data.text for e in events if isinstance(e.data, AnswerDelta))
    if streams[-1][-1]["type"] == "RUN_FINISHED":
        assert streamed == final.final_answer
    assert reduce_messages(streams, held(runs[0])) == messages_snapshot(events)
    # cut the last run anywhere: the reattached stream keeps the rules and repeats nothing
    k = data.draw(st.integers(0, len(runs[-1]) - 1))
    first, reopened, rest = cut_and_reopen(runs[-1], k, rebuilt=data.draw(st.booleans()))
    check_stream(first, complete=False)
    check_stream(reopened + rest)
    assert texts(first) + texts(rest) == texts(streams[-1])


# -- RunAgentInput ----------------------------------------------------------------------------------


def body(**fields: Any) -> bytes:
    return json.dumps({"threadId": CID, "runId": "r1", "messages": [], "tools": [], "context": []} | fields).encode()


# Bodies @ag-ui/client 1.0.0's HttpAgent POSTed (recorded): the thread's second message, after a
# run it followed (each message keeps the metadata of its last event), and the answer to a question.
CLIENT_BODY = json.dumps({
    "threadId": CID, "runId": "1fe3ed0e-c8c3-4852-9c87-2c958101f388", "protocolVersion": "1.0", "state": {},
    "messages": [
        {"id": "m1", "role": "user", "content": "What's the weather in Paris?"},
        {"id": "t1.1.thinking", "role": "reasoning", "content": "Checking the weather.",
         "metadata": {"reactgate": {"seq": 5}}},
        {"id": "t1.1.assistant", "role": "assistant", "toolCalls": [
            {"id": "t1.1.0", "type": "function", "function": {"name": "demo.weather", "arguments": '{"city":"Paris"}'},
             "metadata": {"reactgate": {"seq": 5}}}]},
        {"id": "t1.1.0.result", "role": "tool", "content": '{"city":"Paris","condition":"rain","temp_c":12}',
         "toolCallId": "t1.1.0", "metadata": {"reactgate": {"seq": 7}}},
        {"id": "t1.2.thinking", "role": "reasoning", "content": "Answering.", "metadata": {"reactgate": {"seq": 9}}},
        {"id": "t1.2.assistant", "role": "assistant", "metadata": {"reactgate": {"seq": 11}},
         "content": "It rains in Paris, 12 °C."},
        {"id": "m2", "role": "user", "content": "What's the weather in Paris?"},
    ],
    "tools": [], "context": [], "forwardedProps": {},
}).encode()
CLIENT_RESUME_BODY = json.dumps({
    "threadId": CID, "runId": "f73366fe-44e4-4433-af68-17bf3e35afe2", "protocolVersion": "1.0", "state": {},
    "messages": [
        {"id": "m1", "role": "user", "content": "Weather?"},
        {"id": "t1.1.thinking", "role": "reasoning", "content": "Asking.", "metadata": {"reactgate": {"seq": 4}}},
        {"id": "t1.1.assistant", "role": "assistant", "toolCalls": [
            {"id": "t1.1.0", "type": "function",
             "function": {"name": "react.ask_user", "arguments": '{"question":"Which city?","options":["Paris","Rome"]}'},
             "metadata": {"reactgate": {"seq": 4}}}]},
    ],
    "tools": [], "context": [], "forwardedProps": {},
    "resume": [{"interruptId": "t1.1.0", "status": "resolved", "payload": "Paris"}],
}).encode()


def test_the_official_client_s_bodies() -> None:
    assert parse_run_input(CLIENT_BODY) == RunRequest(
        thread_id=CID, run_id="1fe3ed0e-c8c3-4852-9c87-2c958101f388",
        user_message=("m2", "What's the weather in Paris?"), resume=(), mode=None, agent=None, after_seq=None)
    assert parse_run_input(CLIENT_RESUME_BODY) == RunRequest(
        thread_id=CID, run_id="f73366fe-44e4-4433-af68-17bf3e35afe2", user_message=None,
        resume=(("t1.1.0", "Paris"),), mode=None, agent=None, after_seq=None)


def test_a_new_message_in_text_parts_and_only_the_last_message_is_new_input() -> None:
    parts = [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}]
    assert parse_run_input(body(messages=[{"id": "m1", "role": "user", "content": parts}])).user_message == (
        "m1", "Hello, world")
    answered = [{"id": "m1", "role": "user", "content": "Hi"}, {"id": "a1", "role": "assistant", "content": "Hello"}]
    assert parse_run_input(body(messages=answered)).user_message is None
    # tools and context may be absent (1.0 requires only threadId, runId and messages), nulls as absent
    minimal = {"threadId": CID, "runId": "r1", "messages": [], "state": None, "forwardedProps": None}
    assert parse_run_input(json.dumps(minimal).encode()) == RunRequest(CID, "r1", None, (), None, None, None)


def test_resume_entries_in_order() -> None:
    resume = [{"interruptId": "t1.1.0", "status": "resolved", "payload": "Paris"},
              {"interruptId": "t1.2.0", "status": "resolved", "payload": {"answer": "Approve"}, "metadata": {"k": 1}},
              {"interruptId": "t1.3.0", "status": "cancelled"}]
    assert parse_run_input(body(resume=resume)).resume == (("t1.1.0", "Paris"), ("t1.2.0", "Approve"), ("t1.3.0", "Deny"))


def test_forwarded_props_and_last_event_id() -> None:
    props = {"mode": "ask", "agent": "weather", "after_seq": 12, "theirs": [1, 2]}
    request = parse_run_input(body(forwardedProps=props))
    assert (request.mode, request.agent, request.after_seq) == ("ask", "weather", 12)
    assert parse_run_input(body(forwardedProps=props), last_event_id="40").after_seq == 40  # the header wins
    assert parse_run_input(body(), last_event_id="7").after_seq == 7
    assert parse_run_input(body(forwardedProps="opaque")).after_seq is None  # any JSON may be there


@pytest.mark.parametrize(("raw", "last_event_id", "names"), [
    (b"{not json", None, "malformed"),
    (b"[]", None, "Expected `object`"),
    (json.dumps({"runId": "r1", "messages": []}).encode(), None, "threadId"),
    (body(runId=7), None, "$.runId"),
    (body(threadId=""), None, "$.threadId"),
    (body(messages={}), None, "$.messages"),
    (body(messages=[{"id": "m1", "role": "robot", "content": "x"}]), None, "$.messages[0].role"),
    (body(messages=[{"role": "user", "content": "x"}]), None, "id"),
    (body(messages=[{"id": "m1", "role": "user", "content": 5}]), None, "$.messages[0].content"),
    (body(messages=[{"id": "m1", "role": "user", "content": ""}]), None, "$.messages[0].content"),
    (body(messages=[{"id": "m" * 129, "role": "user", "content": "x"}]), None, "$.messages[0].id"),
    (body(messages=[{"id": "m1", "role": "user", "content": [
        {"type": "image", "source": {"type": "url", "value": "https://x/y.png"}}]}]), None, "$.messages[0].content[0]"),
    (body(tools=[{"name": 1, "description": "d"}]), None, "$.tools[0].name"),
    (body(context=[{"description": "d"}]), None, "value"),
    (body(resume=[{"interruptId": "t1.1.0", "status": "rejected"}]), None, "$.resume[0].status"),
    (body(resume=[{"status": "resolved", "payload": "x"}]), None, "interruptId"),
    (body(resume=[{"interruptId": "t1.1.0", "status": "resolved"}]), None, "$.resume[0].payload"),
    (body(resume=[{"interruptId": "t1.1.0", "status": "resolved", "payload": {"answer": 3}}]), None,
     "$.resume[0].payload"),
    (body(forwardedProps={"mode": "chat"}), None, "$.forwardedProps.mode"),
    (body(forwardedProps={"after_seq": -1}), None, "$.forwardedProps.after_seq"),
    (body(forwardedProps={"after_seq": True}), None, "$.forwardedProps.after_seq"),
    (body(forwardedProps={"agent": ""}), None, "$.forwardedProps.agent"),
    (body(), "abc", "Last-Event-ID"),
    (body(), "-3", "Last-Event-ID"),
    (body(), "²", "Last-Event-ID"),
])
def test_a_malformed_input_is_refused_naming_the_field(raw: bytes, last_event_id: str | None, names: str) -> None:
    with pytest.raises(RunInputError) as refused:
        parse_run_input(raw, last_event_id)
    assert names in str(refused.value)


# -- SSE ------------------------------------------------------------------------------------------------


def test_sse_frames_an_event_with_its_seq_as_the_id() -> None:
    event = {"type": "TEXT_MESSAGE_CONTENT", "messageId": "t1.2.assistant", "delta": "12 °C"}
    assert sse(event, 17) == b'id: 17\ndata: {"type":"TEXT_MESSAGE_CONTENT","messageId":"t1.2.assistant","delta":"12 \xc2\xb0C"}\n\n'
    assert sse(event, None).startswith(b"data: {")
    assert HEADERS == {"content-type": "text/event-stream", "cache-control": "no-cache", "x-accel-buffering": "no"}
