"""Our event log → AG-UI 1.0 events, and a POST /agui body → our commands: a translator, sans-I/O.

AG-UI (`@ag-ui/core` 1.0, `@ag-ui/client` 1.0) is the event protocol agent frontends such as
CopilotKit read. An HTTP shell answers a POST of a `RunAgentInput` (`parse_run_input`) with one
*run* as server-sent events (`sse`, `HEADERS`): it sends our commands, subscribes to the
conversation and hands every event, in seq order, to an `AguiRun`, which says what AG-UI events it
gives (`TRANSLATIONS`). No socket, no clock and no backend here: events in, plain dicts out
(camelCase, null fields omitted), so every rule is a unit test (tests/test_agui.py).

The guarantee it protects is the gateway's first two (docs/design.md#guarantees), carried to another
protocol: the user sees only what the runtime allowed — the translator invents nothing, it only
re-shapes what the log holds, so every `answer.delta` character appears exactly once, in order, and
the `TEXT_MESSAGE_CONTENT` deltas of a turn that ends in `RUN_FINISHED` concatenate to its
`turn.completed.final_answer`. An id is made from the log alone (`turn.round`, `call_id`), so a run
streamed live, a `MESSAGES_SNAPSHOT` of the same log (`messages_snapshot`) and a stream re-attached
after a cut (`AguiRun.reopen`) name each message alike, and the client's reducer merges them.

What the official client checks, and this module keeps (tests mirror the checks): `RUN_STARTED`
first; every `*_START` before its content and its `*_END`; nothing open at `RUN_FINISHED`; nothing
after `RUN_FINISHED` or `RUN_ERROR` but a new `RUN_STARTED`; no field the 1.0 schemas do not
describe (the client strips those with an `[ag-ui]` warning). Our seq rides in each event's
`metadata` (`{"reactgate": {"seq": 7}}`), the one open-by-key field of every 1.0 event, and on the
SSE `id:` line.

Human in the loop: an `ask_user` ends the run with `RUN_FINISHED` and an `interrupt` outcome whose
interrupt id is the `ask_id` (docs/design.md#ask-user, #execute-confirmation); the next POST answers
it with `resume: [{interruptId, status, payload}]`, and its run continues the same turn.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal

import msgspec

from protocol.events import (
    AnswerDelta,
    AskUser,
    ConversationDeleted,
    EndReason,
    Event,
    EventData,
    Fallback,
    RoundCompleted,
    ThinkingDelta,
    ToolCalled,
    ToolResult,
    Trace,
    TurnCompleted,
    TurnStarted,
    UiCommand,
    UserSaid,
    payload_builtins,
)
from protocol.frames import ID_MAX_CHARS, Mode

PROTOCOL_VERSION: Final = "1.0"

HEADERS: Final[dict[str, str]] = {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    "x-accel-buffering": "no",    # nginx and its ingress: pass each event on at once, unbuffered
}

_json: Final = msgspec.json.Encoder()


def sse(event: Mapping[str, Any], seq: int | None) -> bytes:
    """One server-sent event: `id: {seq}` when given, then `data: {compact JSON}`.

    Give the seq only with the last AG-UI event an `AguiRun.feed` returned for it: a client that
    reconnects sends the last id it saw (`Last-Event-ID`) and gets the events after that seq, so an
    id written before its event's whole batch would lose the rest of the batch."""
    head = b"" if seq is None else b"id: %d\n" % seq
    return head + b"data: " + _json.encode(dict(event)) + b"\n\n"


def _text(value: Any) -> str:
    """Compact JSON text, as `TOOL_CALL_ARGS.delta` and `TOOL_CALL_RESULT.content` carry it."""
    return _json.encode(value).decode()


def _fields(**fields: Any) -> dict[str, Any]:
    """The fields that are not None: 1.0 rejects a null where a field is optional."""
    return {name: value for name, value in fields.items() if value is not None}


def _agui(type_: str, **fields: Any) -> dict[str, Any]:
    """An AG-UI event: its type, then its fields."""
    return {"type": type_, **_fields(**fields)}


# -- ids: from the log alone, so a live run, a snapshot and a reattached stream agree ----------------


def reasoning_id(turn_id: str, round_no: int) -> str:
    """The reasoning message (and span) of a round's `thinking.delta`s."""
    return f"{turn_id}.{round_no}.thinking"


def assistant_id(turn_id: str, round_no: int) -> str:
    """The assistant message of a round: its answer text and its tool calls."""
    return f"{turn_id}.{round_no}.assistant"


def result_id(call_id: str) -> str:
    """The tool message of a call's observation."""
    return f"{call_id}.result"


def _step_name(round_no: int) -> str:
    return f"round {round_no}"


# -- policy tables ----------------------------------------------------------------------------------

# How a turn's end reason ends the run: `RUN_FINISHED` (success, or the cancelled outcome), or
# `RUN_ERROR` with the reason as its code and `final_answer` (the apology written for the user) as
# its message. Every give-up is an error: no answer streamed (docs/wire-protocol.md#turncompleted).
END_OUTCOMES: Final[Mapping[EndReason, Literal["success", "cancelled", "error"]]] = {
    EndReason.COMPLETE:           "success",
    EndReason.EXIT:               "success",
    EndReason.SALVAGED:           "success",    # result.partial when it was cut short
    EndReason.CANCELLED:          "cancelled",
    EndReason.ITERATION_LIMIT:    "error",
    EndReason.PROTOCOL_VIOLATION: "error",
    EndReason.PROVIDER_ERROR:     "error",      # the provider's cause in metadata.reactgate.error
    EndReason.ERROR:              "error",
}  # fmt: skip

# An `ask_user` kind → the interrupt's reason (an open string in 1.0).
INTERRUPT_REASONS: Final[Mapping[str | None, str]] = {
    None:       "reactgate.ask_user",    # the model's question (react.ask_user), or the exploration budget's
    "approval": "reactgate.approval",    # Execute confirmation: Approve, Deny, Approve all
}  # fmt: skip

# What a `cancelled` resume entry answers: an approval is denied by anything but a yes, and "Deny"
# says so verbatim (docs/design.md#execute-confirmation); the model's own question reads it as the
# user declining.
CANCELLED_ANSWER: Final = "Deny"

# An open entity's START event type → its END event type and the field naming it. What is open is
# kept as its START event, so closing it and re-announcing it after a cut (`reopen`) are both lookups.
_CLOSERS: Final[Mapping[str, tuple[str, str]]] = {
    "STEP_STARTED":            ("STEP_FINISHED", "stepName"),
    "REASONING_START":         ("REASONING_END", "messageId"),
    "REASONING_MESSAGE_START": ("REASONING_MESSAGE_END", "messageId"),
    "TEXT_MESSAGE_START":      ("TEXT_MESSAGE_END", "messageId"),
}  # fmt: skip


# -- the run ------------------------------------------------------------------------------------


class AguiRun:
    """One AG-UI run over our events: RUN_STARTED … RUN_FINISHED/RUN_ERROR.

    Feed it the run's own events, in seq order: for a new message, from that message's `user.message`
    (its `message_id` is the input message's id) — events of a turn still running before it belong
    to that turn's run; for a resume, from the event after the `ask_user` it answers. The run is
    `done` at `turn.completed`, at an `ask_user` (the interrupt) or at `conversation.deleted`; the
    events after it belong to the next run, and `feed` gives nothing for them.

    After a cut, to continue the stream for a client that saw everything up to a seq: feed this run
    the events up to that seq (or a new one, started as the first was, with the same snapshot, its
    output thrown away), send `reopen()`, then feed on.
    """

    def __init__(self, thread_id: str, run_id: str) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self._open: dict[tuple[str, str], dict[str, Any]] = {}  # (START type, id) → its START event, in order
        self._round: tuple[str, int] | None = None  # the (turn, round) whose step is open
        self._snapshot_sent = False
        self._done = False
        self._out: list[dict[str, Any]] = []
        self._stamp: dict[str, Any] = {}  # timestamp and metadata of the event being fed

    @property
    def done(self) -> bool:
        """RUN_FINISHED or RUN_ERROR was produced: the turn completed, or paused on an `ask_user`."""
        return self._done

    def start(self, snapshot: Sequence[Event] = ()) -> list[dict[str, Any]]:
        """RUN_STARTED, then the conversation so far (`snapshot`: the log before this run) as one
        MESSAGES_SNAPSHOT, when there is any."""
        out = [self._run_started()]
        if snapshot:
            self._snapshot_sent = True
            out.append(_agui("MESSAGES_SNAPSHOT", messages=messages_snapshot(snapshot),
                             metadata=_metadata(snapshot[-1].seq)))
        return out

    def feed(self, event: Event) -> list[dict[str, Any]]:
        """The AG-UI events `event` gives (maybe none), each carrying its seq in `metadata`."""
        if self._done:
            return []
        translate = _translation(event.data)
        if translate is None:
            return []  # a kind this version does not know: skipped, like every reader skips it
        self._out = []
        self._stamp = {"timestamp": int(event.ts * 1000), "metadata": _metadata(event.seq)}
        translate(self, event.data)
        return self._out

    def reopen(self) -> list[dict[str, Any]]:
        """RUN_STARTED again, then the START of every step, reasoning and message open at the last
        fed event, as first sent: a client's new stream continues after the last seq it saw, and
        its ordering checks (START before CONTENT and END) pass. Nothing once the run is done."""
        if self._done:
            return []
        return [self._run_started(), *(dict(start) for start in self._open.values())]

    def finish(self) -> list[dict[str, Any]]:
        """RUN_FINISHED for a run fed no event, in which no turn goes on: a page (re)loading the
        thread gets the snapshot `start` gave, and the run ends (docs/frontends.md#ag-ui)."""
        assert not self._open, "finish() is for a run fed nothing"
        if self._done:
            return []
        self._done = True
        return [_agui("RUN_FINISHED", threadId=self.thread_id, runId=self.run_id)]

    def error(self, message: str, code: str | None = None) -> list[dict[str, Any]]:
        """RUN_ERROR, for a run the shell cannot go on with. Nothing is closed first: 1.0 accepts
        RUN_ERROR with a message open, and an END would call complete a message that was cut."""
        if self._done:
            return []
        self._done = True
        return [_agui("RUN_ERROR", message=message, code=code)]

    # -- what each event gives (TRANSLATIONS) -----------------------------------------------------

    def _user_message(self, data: UserSaid) -> None:
        # The client holds what it sent; after a MESSAGES_SNAPSHOT of the log before the run, which
        # replaced its messages, it holds none of this run's: then they are streamed back to it.
        if self._snapshot_sent:
            self._emit("TEXT_MESSAGE_START", messageId=data.message_id, role="user")
            self._emit("TEXT_MESSAGE_CONTENT", messageId=data.message_id, delta=data.text)
            self._emit("TEXT_MESSAGE_END", messageId=data.message_id)

    def _nothing(self, data: EventData) -> None:
        pass

    def _thinking(self, data: ThinkingDelta) -> None:
        if not data.text:
            return
        self._enter_round(data.turn_id, data.round)
        rid = reasoning_id(data.turn_id, data.round)
        if ("REASONING_START", rid) not in self._open:
            self._begin("REASONING_START", messageId=rid)
            self._begin("REASONING_MESSAGE_START", messageId=rid, role="reasoning")
        self._emit("REASONING_MESSAGE_CONTENT", messageId=rid, delta=data.text)

    def _answer(self, data: AnswerDelta) -> None:
        if not data.text:
            return
        self._enter_round(data.turn_id, data.round)
        self._close("REASONING_START", "REASONING_MESSAGE_START")
        mid = assistant_id(data.turn_id, data.round)
        if ("TEXT_MESSAGE_START", mid) not in self._open:
            self._begin("TEXT_MESSAGE_START", messageId=mid, role="assistant")
        self._emit("TEXT_MESSAGE_CONTENT", messageId=mid, delta=data.text)

    def _tool_call(self, data: ToolCalled) -> None:
        self._enter_round(data.turn_id, data.round)
        self._close("REASONING_START", "REASONING_MESSAGE_START")
        self._emit("TOOL_CALL_START", toolCallId=data.call_id, toolCallName=data.tool_id,
                   parentMessageId=assistant_id(data.turn_id, data.round))
        self._emit("TOOL_CALL_ARGS", toolCallId=data.call_id, delta=_text(data.params))
        self._emit("TOOL_CALL_END", toolCallId=data.call_id)

    def _tool_result(self, data: ToolResult) -> None:
        self._emit("TOOL_CALL_RESULT", messageId=result_id(data.call_id), toolCallId=data.call_id,
                   content=_text(data.payload()), role="tool")

    def _round_completed(self, data: RoundCompleted) -> None:
        self._enter_round(data.turn_id, data.round)  # a round that showed nothing is a step all the same
        self._close_all()
        self._round = None

    def _ask(self, data: AskUser) -> None:
        self._close_all()
        self._finish(outcome={"type": "interrupt", "interrupts": [_interrupt(data, self._stamp["timestamp"])]})

    def _turn_completed(self, data: TurnCompleted) -> None:
        self._close_all()
        match END_OUTCOMES[data.reason]:
            case "success":
                result = {"turnId": data.turn_id, "reason": data.reason.value, "finalAnswer": data.final_answer,
                          "usedTools": data.used_tools, "finishOk": data.finish_ok}
                self._finish(result=result | ({"partial": True} if data.partial else {}))
            case "cancelled":
                self._finish(outcome={"type": "cancelled"})
            case "error":
                error = self._emit("RUN_ERROR", message=data.final_answer, code=data.reason.value)
                if data.error is not None:
                    error["metadata"]["reactgate"]["error"] = data.error  # the provider's cause, keys masked
                self._done = True

    def _custom(self, data: UiCommand | Fallback | Trace) -> None:
        self._emit("CUSTOM", name=f"reactgate.{data.KIND}", value=payload_builtins(data))

    def _deleted(self, data: ConversationDeleted) -> None:
        self._emit("RUN_ERROR", message="the conversation was deleted", code="conversation_deleted")
        self._done = True

    # -- the open entities ----------------------------------------------------------------------

    def _run_started(self) -> dict[str, Any]:
        return _agui("RUN_STARTED", threadId=self.thread_id, runId=self.run_id, protocolVersion=PROTOCOL_VERSION)

    def _emit(self, type_: str, **fields: Any) -> dict[str, Any]:
        event = _agui(type_, **fields) | {"timestamp": self._stamp["timestamp"],
                                          "metadata": {"reactgate": dict(self._stamp["metadata"]["reactgate"])}}
        self._out.append(event)
        return event

    def _begin(self, type_: str, **fields: Any) -> None:
        """Open an entity: its START event, remembered until its END."""
        start = self._emit(type_, **fields)
        self._open[type_, start[_CLOSERS[type_][1]]] = start

    def _close(self, *types: str) -> None:
        """Close the open entities of these START types, the last opened first."""
        for key in reversed(list(self._open)):
            if key[0] in types:
                end, field = _CLOSERS[key[0]]
                self._emit(end, **{field: key[1]})
                del self._open[key]

    def _close_all(self) -> None:
        self._close(*_CLOSERS)

    def _enter_round(self, turn_id: str, round_no: int) -> None:
        """Make (turn, round)'s step the open one, closing another round's first."""
        if self._round == (turn_id, round_no):
            return
        self._close_all()
        self._round = (turn_id, round_no)
        self._begin("STEP_STARTED", stepName=_step_name(round_no))

    def _finish(self, **fields: Any) -> None:
        self._emit("RUN_FINISHED", threadId=self.thread_id, runId=self.run_id, **fields)
        self._done = True


def _metadata(seq: int) -> dict[str, Any]:
    return {"reactgate": {"seq": seq}}


def _interrupt(data: AskUser, timestamp_ms: int) -> dict[str, Any]:
    """The 1.0 Interrupt an `ask_user` is: answered by a resume entry naming its id."""
    approval = data.kind == "approval"
    schema: dict[str, Any] = {"type": "string", "enum": list(data.options)} if data.options else {"type": "string"}
    expires = datetime.fromtimestamp(timestamp_ms / 1000 + data.timeout_s, UTC)
    return _fields(
        id=data.ask_id,
        reason=INTERRUPT_REASONS.get(data.kind, f"reactgate.{data.kind}"),
        message=data.question,
        toolCallId=data.ask_id if approval else None,
        responseSchema=schema,
        expiresAt=expires.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        metadata={"reactgate": {"toolId": data.tool_id, "params": data.params}} if approval else None,
    )


Translate = Callable[[AguiRun, Any], None]

# Our event → what it gives. Every id is made from the log (`reasoning_id`, `assistant_id`,
# `result_id`); "step" is STEP_STARTED "round N", opened by the round's first event.
TRANSLATIONS: Final[Mapping[type[EventData], Translate]] = {
    #  our event          translation               AG-UI events
    UserSaid:            AguiRun._user_message,    # none: the client sent it (TEXT_MESSAGE_* role user after a snapshot)
    TurnStarted:         AguiRun._nothing,         # none: the run is the turn
    ThinkingDelta:       AguiRun._thinking,        # step; REASONING_START + REASONING_MESSAGE_START once; REASONING_MESSAGE_CONTENT
    AnswerDelta:         AguiRun._answer,          # step; reasoning closed; TEXT_MESSAGE_START once; TEXT_MESSAGE_CONTENT
    ToolCalled:          AguiRun._tool_call,       # step; reasoning closed; TOOL_CALL_START, TOOL_CALL_ARGS (params), TOOL_CALL_END
    ToolResult:          AguiRun._tool_result,     # TOOL_CALL_RESULT (content: the observation's JSON)
    RoundCompleted:      AguiRun._round_completed, # the round's reasoning and text closed; STEP_FINISHED
    AskUser:             AguiRun._ask,             # all closed; RUN_FINISHED outcome interrupt
    TurnCompleted:       AguiRun._turn_completed,  # all closed; RUN_FINISHED (result, or outcome cancelled) or RUN_ERROR
    UiCommand:           AguiRun._custom,          # CUSTOM reactgate.ui_command
    Fallback:            AguiRun._custom,          # CUSTOM reactgate.fallback
    Trace:               AguiRun._custom,          # CUSTOM reactgate.trace (every kind)
    ConversationDeleted: AguiRun._deleted,         # RUN_ERROR conversation_deleted
}  # fmt: skip


def _translation(data: EventData | dict[str, Any]) -> Translate | None:
    """The row of the payload's most specific class that has one (a trace kind → `Trace`)."""
    return next((TRANSLATIONS[cls] for cls in type(data).__mro__ if cls in TRANSLATIONS), None)


# -- the conversation as AG-UI messages ----------------------------------------------------------


def messages_snapshot(events: Iterable[Event]) -> list[dict[str, Any]]:
    """The AG-UI messages of a log, as a client's reducer builds them from the runs' streams (plus
    the user's own messages): per round a reasoning message and an assistant message (its answer
    text and tool calls), each observation a tool message right after its call's assistant message.
    What no run streams as a message is not here either: the apology of a failed turn is its
    RUN_ERROR's message."""
    messages: list[dict[str, Any]] = []
    by_id: dict[str, dict[str, Any]] = {}

    def message(mid: str, role: str) -> dict[str, Any]:
        if mid not in by_id:
            by_id[mid] = {"id": mid, "role": role}
            messages.append(by_id[mid])
        return by_id[mid]

    for event in events:
        match event.data:
            case UserSaid(message_id=mid, text=text):
                message(mid, "user")["content"] = text
            case ThinkingDelta(turn_id=turn, round=round_no, text=text) if text:
                reasoning = message(reasoning_id(turn, round_no), "reasoning")
                reasoning["content"] = reasoning.get("content", "") + text
            case AnswerDelta(turn_id=turn, round=round_no, text=text) if text:
                assistant = message(assistant_id(turn, round_no), "assistant")
                assistant["content"] = assistant.get("content", "") + text
            case ToolCalled(turn_id=turn, round=round_no, call_id=call_id, tool_id=tool_id, params=params):
                call = {"id": call_id, "type": "function", "function": {"name": tool_id, "arguments": _text(params)}}
                message(assistant_id(turn, round_no), "assistant").setdefault("toolCalls", []).append(call)
            case ToolResult(call_id=call_id) as result:
                tool = {"id": result_id(call_id), "role": "tool", "toolCallId": call_id, "content": _text(result.payload())}
                messages.insert(_result_position(messages, call_id), tool)
    return messages


def _result_position(messages: list[dict[str, Any]], call_id: str) -> int:
    """Where a tool message goes: after its call's assistant message and the tool messages that
    follow it, else last (the client's reducer places TOOL_CALL_RESULT so)."""
    for i, msg in enumerate(messages):
        if msg["role"] == "assistant" and any(call["id"] == call_id for call in msg.get("toolCalls", ())):
            end = i + 1
            while end < len(messages) and messages[end]["role"] == "tool":
                end += 1
            return end
    return len(messages)


# -- POST /agui: RunAgentInput → our commands -----------------------------------------------------

_Id = Annotated[str, msgspec.Meta(min_length=1, max_length=ID_MAX_CHARS)]


class RunInputError(ValueError):
    """A malformed RunAgentInput (or Last-Event-ID); the message names the field (`- at `$.runId``)."""


class _Part(msgspec.Struct):
    type: str
    text: Any = None


class _Message(msgspec.Struct):
    id: str
    role: Literal["developer", "system", "assistant", "user", "tool", "activity", "reasoning"]
    content: Any = None


class _Tool(msgspec.Struct):
    name: str
    description: str


class _Context(msgspec.Struct):
    description: str
    value: str


class _ResumeEntry(msgspec.Struct, rename="camel"):
    interrupt_id: _Id
    status: Literal["resolved", "cancelled"]
    payload: Any = None


class _RunAgentInput(msgspec.Struct, rename="camel"):
    """1.0 `RunAgentInputSchema`: what we read of it, nulls of optional fields taken as absent."""

    thread_id: _Id
    run_id: _Id
    messages: list[_Message]
    tools: list[_Tool] | None = None
    context: list[_Context] | None = None
    protocol_version: str | None = None
    parent_run_id: str | None = None
    state: Any = None
    forwarded_props: Any = None
    resume: list[_ResumeEntry] | None = None


class _Forwarded(msgspec.Struct):
    """The keys of `forwardedProps` we read; the application's others pass by."""

    mode: Mode | None = None
    agent: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None
    after_seq: Annotated[int, msgspec.Meta(ge=0)] | None = None


_input_decoder: Final = msgspec.json.Decoder(_RunAgentInput)


@dataclass(frozen=True)
class RunRequest:
    """What a POST /agui asks of us: the commands to send, and where its stream starts."""

    thread_id: str
    run_id: str
    user_message: tuple[str, str] | None    # (message id, text) of the last message when it is the user's: new input
    resume: tuple[tuple[str, str], ...]      # (interruptId = our ask_id, answer text), in the body's order
    mode: str | None                         # forwardedProps.mode: "agent" | "ask"
    agent: str | None                        # forwardedProps.agent: the agent a new conversation gets
    after_seq: int | None                    # reattach: Last-Event-ID, else forwardedProps.after_seq


def parse_run_input(body: bytes, last_event_id: str | None = None) -> RunRequest:
    """A POST /agui body (a 1.0 `RunAgentInput`) and its `Last-Event-ID` header (our seq: the
    reattach extension; it wins over `forwardedProps.after_seq`) as our request. Raises
    `RunInputError` naming the field for anything malformed."""
    try:
        run = _input_decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        raise RunInputError(str(exc)) from None
    forwarded = _forwarded(run.forwarded_props)
    after_seq = _seq(last_event_id) if last_event_id else forwarded.after_seq
    return RunRequest(thread_id=run.thread_id, run_id=run.run_id, user_message=_new_input(run.messages),
                      resume=tuple(_resume_answer(i, entry) for i, entry in enumerate(run.resume or ())),
                      mode=None if forwarded.mode is None else forwarded.mode.value, agent=forwarded.agent,
                      after_seq=after_seq)


def _forwarded(props: Any) -> _Forwarded:
    if not isinstance(props, dict):
        return _Forwarded()  # any JSON is allowed there; only an object can carry our keys
    try:
        return msgspec.convert(props, _Forwarded)
    except msgspec.ValidationError as exc:
        raise RunInputError(str(exc).replace("`$", "`$.forwardedProps")) from None


def _seq(header: str) -> int:
    digits = header.strip()
    if not (digits.isascii() and digits.isdigit()):
        raise RunInputError(f"Expected a seq (a non-negative integer), got {header!r} - at `Last-Event-ID`")
    return int(digits)


def _new_input(messages: list[_Message]) -> tuple[str, str] | None:
    """The last message when it is the user's (nothing answered it yet), with its text."""
    if not messages or messages[-1].role != "user":
        return None
    at = f"$.messages[{len(messages) - 1}]"
    last = messages[-1]
    if not 1 <= len(last.id) <= ID_MAX_CHARS:
        raise RunInputError(f"Expected `str` of length 1 to {ID_MAX_CHARS} - at `{at}.id`")
    text = _user_text(last.content, f"{at}.content")
    if not text:
        raise RunInputError(f"Expected a non-empty text - at `{at}.content`")
    return last.id, text


def _user_text(content: Any, at: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RunInputError(f"Expected `str | array`, got `{type(content).__name__}` - at `{at}`")
    texts = []
    for j, part in enumerate(content):
        try:
            parsed = msgspec.convert(part, _Part)
        except msgspec.ValidationError as exc:
            raise RunInputError(str(exc).replace("`$", f"`{at}[{j}]")) from None
        if parsed.type != "text" or not isinstance(parsed.text, str):
            raise RunInputError(f"Only text parts are supported, got {parsed.type!r} - at `{at}[{j}]`")
        texts.append(parsed.text)
    return "".join(texts)


def _resume_answer(i: int, entry: _ResumeEntry) -> tuple[str, str]:
    """A resume entry as our `answer`: a string payload, or `{"answer": "…"}`; cancelled denies."""
    if entry.status == "cancelled":
        return entry.interrupt_id, CANCELLED_ANSWER
    match entry.payload:
        case str(text) | {"answer": str(text)}:
            return entry.interrupt_id, text
    raise RunInputError(f'Expected a string or {{"answer": string}} - at `$.resume[{i}].payload`')
