"""The events a client can see of a conversation: one typed struct per kind (docs/design.md#event-log).

An `Event` is the durable envelope: conversation, `seq`, kind name, payload, `ts`. Its payload is
one of the structs below, chosen by the kind name (`EVENT_KINDS`). Field names and field order are
the wire format (docs/wire-protocol.md#8-event-reference): a payload encodes to exactly the `data`
object a client reads, so a new field goes last, with a default, and a new kind is one struct here
plus the code that emits it and the code that shows it.

`seq` is per conversation, strictly increasing by 1 and never reused; the event id is
`conversation_id/seq`. An event reaches a client only after the store made it durable
(docs/design.md#write-ahead).

Decoding is tolerant in one way: a kind this version does not know (written by a newer version,
or sent by a newer server) decodes to a plain dict, so old readers skip what they do not
understand instead of failing (docs/wire-protocol.md#13-writing-a-client-checklist). Clients are
also lenient about a known kind whose data does not fit its struct (`lenient=True`): the event
still counts for seq tracking, as plain data. The store is strict: its data is ours.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar, Final

import msgspec

from protocol.notices import Notice, NoticeCode


class EndReason(StrEnum):
    """Why a turn ended (`turn.completed.reason`)."""

    COMPLETE = "complete"
    EXIT = "exit"
    SALVAGED = "salvaged"
    ITERATION_LIMIT = "iteration_limit"
    PROTOCOL_VIOLATION = "protocol_violation"
    PROVIDER_ERROR = "provider_error"    # the retries were spent and the last round failed at the provider
    CANCELLED = "cancelled"
    ERROR = "error"


class EventData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Base of every payload. `KIND` is the event's name on the wire (`event`)."""

    KIND: ClassVar[str]


# -- the turn ----------------------------------------------------------------------------------


class MessageKind(StrEnum):
    """Which frame brought the user's words (`user.message.kind`)."""

    MESSAGE = "message"      # a user_message that starts a turn
    FOLLOW_UP = "follow_up"  # a user_message queued behind a running turn: it starts the next one
    STEER = "steer"          # a steer: it interrupts the running turn, or starts one if none runs


class UserSaid(EventData, frozen=True):
    """What the user wrote, logged when accepted, before the turn it starts or joins
    (docs/wire-protocol.md#usermessage): a conversation reads back as both sides wrote it."""

    KIND: ClassVar[str] = "user.message"
    message_id: str
    text: str
    kind: MessageKind = MessageKind.MESSAGE


class TurnStarted(EventData, frozen=True):
    KIND: ClassVar[str] = "turn.started"
    turn_id: str
    user_message_id: str


class ThinkingDelta(EventData, frozen=True):
    """Status text of the thinking lane (always allowed: docs/design.md#gates)."""

    KIND: ClassVar[str] = "thinking.delta"
    turn_id: str
    round: int
    text: str


class AnswerDelta(EventData, frozen=True):
    """Final-answer characters a gate let through (docs/design.md#gates)."""

    KIND: ClassVar[str] = "answer.delta"
    turn_id: str
    round: int
    text: str


class TurnCompleted(EventData, frozen=True):
    KIND: ClassVar[str] = "turn.completed"
    turn_id: str
    reason: EndReason
    final_answer: str
    used_tools: bool
    finish_ok: bool              # true only for a legal finish (docs/design.md#observe-before-finish)
    partial: bool = False        # salvaged: the answer was cut and could not be continued (#continuation)
    error: str | None = None     # provider_error: the provider's failure, "kind: message", keys scrubbed


# -- tools -------------------------------------------------------------------------------------


class ExternalClient(msgspec.Struct, frozen=True):
    """Who made a call from outside the conversation's own turns: an external agent through the MCP
    face (docs/design.md#mcp-face). On `tool.call`, `tool.result`, `ask_user` and the approval
    trace of such a call; absent on the agent's own. `face` is the way in (`mcp`), `name` the
    client's own name for itself (its `clientInfo.name`), as it declared it."""

    face: str
    name: str


class ToolCalled(EventData, frozen=True):
    """An allowed call whose JSON is complete and valid: it will run (docs/design.md#gates)."""

    KIND: ClassVar[str] = "tool.call"
    turn_id: str
    round: int
    call_id: str
    tool_id: str
    params: dict[str, Any]
    trait: str
    client: ExternalClient | None = None   # an external client's call (docs/design.md#mcp-face)


class ToolResult(EventData, frozen=True):
    """The one observation of a call (docs/design.md#observations): `result` when ok, else
    `error` (a code) and, when there is more to say, `detail`."""

    KIND: ClassVar[str] = "tool.result"
    turn_id: str
    call_id: str
    tool_id: str
    ok: bool
    duration_ms: int
    result: dict[str, Any] | None = None
    error: str | None = None
    detail: dict[str, Any] | None = None
    client: ExternalClient | None = None   # an external client's call (docs/design.md#mcp-face)

    def payload(self) -> dict[str, Any]:
        """The JSON the model sees as this call's observation."""
        if self.ok:
            return dict(self.result or {})
        return {"error": self.error, **(self.detail or {})}


class AskUser(EventData, frozen=True):
    """A question the turn waits on: the model's (`react.ask_user`), or an approval the runtime asks
    before a `confirm` tool runs (`kind` "approval", with the call's tool and validated params,
    docs/design.md#execute-confirmation). The client answers with one of `options`."""

    KIND: ClassVar[str] = "ask_user"
    turn_id: str
    ask_id: str
    question: str
    options: list[str]
    timeout_s: int | float
    # "approval", or None (omitted) for the model's question. Not a "question" default: msgspec's
    # omit_defaults compares a str default by identity, and an event unpickled in a Ray gateway holds
    # an equal but other str, so the live frame would carry a key the stored one omits (guarantee:
    # live and replayed frames are byte-identical, docs/wire-protocol.md §10).
    kind: str | None = None
    tool_id: str | None = None          # an approval's call
    params: dict[str, Any] | None = None
    client: ExternalClient | None = None   # asked for an external client's call (docs/design.md#mcp-face)


class UiCommand(EventData, frozen=True):
    KIND: ClassVar[str] = "ui_command"
    turn_id: str
    command: str
    args: dict[str, Any]


# -- the model ---------------------------------------------------------------------------------


class Fallback(EventData, frozen=True):
    """A provider failed before its first delta; the next model takes over (docs/design.md#fallback)."""

    KIND: ClassVar[str] = "fallback"
    from_model: str = msgspec.field(name="from")
    to_model: str = msgspec.field(name="to")
    error: str                   # "kind: message"


# -- the round ---------------------------------------------------------------------------------


class Lane(msgspec.Struct, frozen=True):
    index: int
    lane: str                    # "answer", "tool", or "unknown" (never typed)
    status: str                  # the gate's status: pending, allowed, denied
    emitted_chars: int           # characters actually sent to clients


class StreamedState(msgspec.Struct, frozen=True):
    """What the user saw of a round, from the gates' own counters (docs/design.md#streamed-state)."""

    answer_streamed: bool
    answer_text: str
    lanes: list[Lane]


NOTHING_STREAMED: Final = StreamedState(answer_streamed=False, answer_text="", lanes=[])


class AcceptedAction(msgspec.Struct, frozen=True, omit_defaults=True):
    index: int
    action: str
    tool_id: str | None = None


class DeniedAction(msgspec.Struct, frozen=True, omit_defaults=True):
    index: int
    code: NoticeCode | None      # always sent, null when a gate shut a lane without a rule's code
    tool_id: str | None = None


class RoundCompleted(EventData, frozen=True):
    KIND: ClassVar[str] = "round.completed"
    turn_id: str
    round: int
    streamed_state: StreamedState
    accepted: list[AcceptedAction]
    denied: list[DeniedAction]
    notices: list[Notice]
    steered: bool = False        # a steer cut the round (docs/design.md#steer)
    interrupted: bool = False    # a crash cut the round (docs/design.md#recovery)


# -- traces: facts for operators, one struct per kind ----------------------------------------------


class Trace(EventData, frozen=True, tag_field="kind"):
    KIND: ClassVar[str] = "trace"


class EventRef(msgspec.Struct, frozen=True, omit_defaults=True):
    """An event of the turn so far, as evidence in a trace."""

    event: str
    call_id: str | None = None


class IllegalFinish(Trace, frozen=True, tag="illegal_finish"):
    """A finish the gates refused: no observation yet (docs/design.md#observe-before-finish)."""

    turn_id: str
    round: int
    events: list[EventRef]


class NoToolFinish(Trace, frozen=True, tag="no_tool_finish"):
    turn_id: str
    round: int


class IterationLimit(Trace, frozen=True, tag="iteration_limit"):
    turn_id: str
    rounds: int


class Salvaged(Trace, frozen=True, tag="salvaged"):
    """The turn ended with exactly the answer text the user saw (docs/design.md#salvage)."""

    turn_id: str
    round: int
    answer_chars: int
    partial: bool = False


class Approval(Trace, frozen=True, tag="approval"):
    """The user's decision on a call of a `confirm` tool (docs/design.md#execute-confirmation):
    `approved` (it runs, once), `approved_all` (it and the rest of the turn's), `denied` or `timeout`
    (it never runs). Logged before the call runs or is refused; replay reads it."""

    turn_id: str
    call_id: str
    tool_id: str
    decision: str
    client: ExternalClient | None = None   # an external client's call (docs/design.md#mcp-face)


TraceData = IllegalFinish | NoToolFinish | IterationLimit | Salvaged | Approval


# -- the end of a conversation: sent, never stored -------------------------------------------------


class ConversationDeleted(EventData, frozen=True):
    """The conversation was deleted (docs/wire-protocol.md#conversationdeleted): the last event a
    subscription sends, then it ends. Never stored — the log it would belong to is gone — so its
    `seq` is the subscription's own last seq + 1, which every client takes as the next event.
    `last_seq` is the last seq the log had published: a subscription that ends before it missed
    events that no longer exist."""

    KIND: ClassVar[str] = "conversation.deleted"
    last_seq: int


Payload = (
    UserSaid | TurnStarted | ThinkingDelta | AnswerDelta | TurnCompleted | ToolCalled | ToolResult | AskUser | UiCommand
    | Fallback | RoundCompleted | TraceData | ConversationDeleted
)

# Kind name → the type its payload decodes to: the kinds a log stores.
EVENT_KINDS: Final[dict[str, Any]] = {
    cls.KIND: cls
    for cls in (UserSaid, TurnStarted, ThinkingDelta, AnswerDelta, TurnCompleted, ToolCalled, ToolResult, AskUser,
                UiCommand, Fallback, RoundCompleted)
}
EVENT_KINDS[Trace.KIND] = TraceData
# Kinds only a stream carries, never a log.
STREAM_KINDS: Final[dict[str, Any]] = {ConversationDeleted.KIND: ConversationDeleted}

# Deltas of one lane may be merged into one event (docs/design.md#event-log).
DELTA_KINDS: Final = (ThinkingDelta, AnswerDelta)


class Event(msgspec.Struct, frozen=True, kw_only=True):
    """The durable envelope. `event` always equals `data.KIND` (build it with `Event.of`); a payload
    of a kind this version does not know is kept as a dict."""

    conversation_id: str
    seq: int
    event: str
    data: Payload | dict[str, Any]
    ts: float                  # unix seconds, set when the event was made

    @classmethod
    def of(cls, conversation_id: str, seq: int, data: EventData, ts: float) -> Event:
        return cls(conversation_id=conversation_id, seq=seq, event=data.KIND, data=data, ts=ts)  # type: ignore[arg-type]

    @property
    def event_id(self) -> str:
        return f"{self.conversation_id}/{self.seq}"


# -- encoding and decoding: one decoder per kind, built once -------------------------------------

_encoder: Final = msgspec.json.Encoder()
_decoders: Final = {kind: msgspec.json.Decoder(t) for kind, t in (EVENT_KINDS | STREAM_KINDS).items()}
_unknown: Final = msgspec.json.Decoder(dict[str, Any])


def encode_data(data: EventData | dict[str, Any]) -> bytes:
    """A payload's `data` object, as it is stored and sent."""
    return _encoder.encode(data)


def decode_data(kind: str, raw: bytes | str, *, lenient: bool = False) -> Payload | dict[str, Any]:
    """The payload of an event of `kind` from its `data` JSON. A known kind whose data does not match
    its struct raises msgspec.ValidationError (naming the field), or with `lenient` is plain data."""
    decoder = _decoders.get(kind)
    if decoder is None:
        return _unknown.decode(raw)
    try:
        return decoder.decode(raw)  # type: ignore[no-any-return]
    except msgspec.ValidationError:
        if not lenient:
            raise
        return _unknown.decode(raw)


def payload_builtins(data: EventData | dict[str, Any]) -> dict[str, Any]:
    """The payload as plain JSON-able data, exactly as a client decodes it from the wire."""
    return msgspec.to_builtins(data)  # type: ignore[no-any-return]
