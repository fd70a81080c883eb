"""The wire frames of `reactgate.v1` (docs/wire-protocol.md), sans-I/O.

Every client frame is a msgspec `Struct` tagged by `type` and decoded straight from the
WebSocket payload by one decoder, so a bad frame fails in exactly one place with a message
that names the field (`Expected `str`, got `int` - at `$.text``). The gateway turns a
`FrameError` into an `error` frame and keeps the connection open
(docs/wire-protocol.md#5-error-codes).

Server frames share one encoder. Events are the hot path: `encode_event` splices the
`type` tag in front of the already-durable `Event`'s own encoding instead of copying it into
another struct. Clients decode an event frame straight into the same typed `Event`.
"""

from __future__ import annotations

import base64
import binascii
import math
from enum import IntEnum, StrEnum
from typing import Annotated, Any, Final, Literal

import msgspec

from protocol.events import Event, decode_data

SUBPROTOCOL: Final = "reactgate.v1"
WS_PATH: Final = "/ws"

# ---------------------------------------------------------------------------------------------
# Policy tables: error codes and close codes, referenced by name everywhere else.


class ErrorCode(StrEnum):
    BAD_REQUEST = "bad_request"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    RATE_LIMITED = "rate_limited"
    TOO_LARGE = "too_large"
    SLOW_CONSUMER = "slow_consumer"
    OVERLOADED = "overloaded"
    INTERNAL = "internal"
    QUOTA_EXCEEDED = "quota_exceeded"
    UNAVAILABLE = "unavailable"


ERROR_CODES: Final[dict[ErrorCode, str]] = {
    ErrorCode.BAD_REQUEST: "invalid JSON, unknown frame type, or a missing/ill-typed field; "
    "the connection stays open (10 in a row close it with 1008)",
    ErrorCode.UNAUTHORIZED: "missing, invalid or expired JWT: the handshake is refused with HTTP 401",
    ErrorCode.FORBIDDEN: "the caller does not own the conversation (same reply whether or not it exists)",
    ErrorCode.NOT_FOUND: "`open` named an agent profile the server does not serve, or the conversation's agent is "
    "not served any more",
    ErrorCode.RATE_LIMITED: "the connection's token bucket is empty; the frame was not processed",
    ErrorCode.TOO_LARGE: "a frame over max_frame_bytes: the connection is closed with 1009",
    ErrorCode.SLOW_CONSUMER: "the send queue overflowed: the conversation's subscription is paused; "
    "re-subscribe with `last_seq` to lose nothing",
    ErrorCode.OVERLOADED: "a per-connection limit is reached (e.g. 64 watched conversations); "
    "at the server level, max connections closes with 1013",
    ErrorCode.INTERNAL: "an unexpected server error; details are logged, never sent",
    ErrorCode.QUOTA_EXCEEDED: "a quota refused the frame or the connection (`quota`, `scope`, and `resets_at` "
    "for a windowed one); the connection stays open, except over a connection quota (then 1013)",
    ErrorCode.UNAVAILABLE: "the store cannot take the frame now (a failover, a restart, a full disk) and may later: "
    "the frame was not acted on; send it again, same id, after `retry_after_ms` (the message names the cause)",
}


class CloseCode(IntEnum):
    """WebSocket close codes the gateway uses (RFC 6455 §7.4, IANA registry)."""

    POLICY_VIOLATION = 1008   # too many bad frames in a row
    MESSAGE_TOO_BIG = 1009    # a frame over max_frame_bytes (websockets' max_size)
    INTERNAL_ERROR = 1011     # the gateway itself failed (never for bad input)
    SERVICE_RESTART = 1012    # drain on SIGTERM
    TRY_AGAIN_LATER = 1013    # max connections reached
    TOKEN_EXPIRED = 4001      # the connection's JWT reached its `exp`: reconnect with a fresh token


# ---------------------------------------------------------------------------------------------
# Client -> gateway.

FrameId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
ConversationId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
Seq = Annotated[int, msgspec.Meta(ge=0)]


class Mode(StrEnum):
    """A conversation's mode, sticky until changed (docs/design.md#ask-mode)."""

    AGENT = "agent"
    ASK = "ask"

ID_MAX_CHARS: Final = 128


class _ClientFrame(
    msgspec.Struct, tag_field="type", forbid_unknown_fields=True, frozen=True, kw_only=True
):
    id: FrameId


class Open(_ClientFrame, tag="open", frozen=True):
    conversation_id: ConversationId | None = None
    agent: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None
    mode: Mode | None = None


class Subscribe(_ClientFrame, tag="subscribe", frozen=True):
    conversation_id: ConversationId
    after_seq: Seq = 0


class Unsubscribe(_ClientFrame, tag="unsubscribe", frozen=True):
    conversation_id: ConversationId


class UserMessageFrame(_ClientFrame, tag="user_message", frozen=True):
    conversation_id: ConversationId
    text: Annotated[str, msgspec.Meta(min_length=1)]


class SteerFrame(_ClientFrame, tag="steer", frozen=True):
    conversation_id: ConversationId
    text: Annotated[str, msgspec.Meta(min_length=1)]


class AnswerFrame(_ClientFrame, tag="answer", frozen=True):
    conversation_id: ConversationId
    ask_id: Annotated[str, msgspec.Meta(min_length=1, max_length=ID_MAX_CHARS)]
    answer: str


class SetModeFrame(_ClientFrame, tag="set_mode", frozen=True):
    conversation_id: ConversationId
    mode: Mode


class CancelFrame(_ClientFrame, tag="cancel", frozen=True):
    conversation_id: ConversationId


class Ping(_ClientFrame, tag="ping", frozen=True):
    pass


class DeleteFrame(_ClientFrame, tag="delete", frozen=True):
    """Delete the conversation for good (docs/wire-protocol.md#delete): owner only, idempotent by id."""

    conversation_id: ConversationId


class ExportFrame(_ClientFrame, tag="export", frozen=True):
    """The conversation's whole log as event frames, then `export.completed` (docs/wire-protocol.md#export)."""

    conversation_id: ConversationId


LIST_LIMIT_MAX: Final = 100
CURSOR_MAX_CHARS: Final = 512  # room for the cursor of any server-generated id (docs/wire-protocol.md#2-frames)


class ListFrame(_ClientFrame, tag="list", frozen=True):
    """A page of the caller's own conversations, newest activity first (docs/wire-protocol.md#list):
    `before` is the `next_before` of the previous page."""

    limit: Annotated[int, msgspec.Meta(ge=1, le=LIST_LIMIT_MAX)]
    before: Annotated[str, msgspec.Meta(min_length=1, max_length=CURSOR_MAX_CHARS)] | None = None


ClientFrame = (
    Open
    | Subscribe
    | Unsubscribe
    | UserMessageFrame
    | SteerFrame
    | AnswerFrame
    | SetModeFrame
    | CancelFrame
    | Ping
    | DeleteFrame
    | ExportFrame
    | ListFrame
)
CommandFrame = UserMessageFrame | SteerFrame | AnswerFrame | SetModeFrame | CancelFrame
CLIENT_FRAME_TYPES: Final[tuple[str, ...]] = (
    "open", "subscribe", "unsubscribe", "user_message", "steer", "answer", "set_mode", "cancel", "ping",
    "delete", "export", "list",
)


class FrameError(Exception):
    """A client frame the gateway cannot act on. Becomes an `error` frame, never a crash."""

    def __init__(self, code: ErrorCode, message: str, id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.id = id


class _IdProbe(msgspec.Struct):
    """Reads only `id` of a frame that failed to decode, skipping everything else."""

    id: Any = None


_client_decoder: Final = msgspec.json.Decoder(ClientFrame)
_id_probe: Final = msgspec.json.Decoder(_IdProbe)
_DECODE_ERRORS: Final = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)


def recover_id(data: bytes | str) -> str | None:
    """The frame's `id` when it is an object with a valid string id, else None."""
    try:
        probe = _id_probe.decode(data)
    except _DECODE_ERRORS:
        return None
    if isinstance(probe.id, str) and 1 <= len(probe.id) <= ID_MAX_CHARS:
        return probe.id
    return None


def decode_client_frame(data: bytes | str) -> ClientFrame:
    """Decode one client text frame. Raises only `FrameError` (code bad_request)."""
    try:
        return _client_decoder.decode(data)
    except msgspec.ValidationError as exc:
        message = str(exc)
        if message.startswith("Invalid value") and message.endswith("`$.type`"):
            message = f"{message}; known types: {', '.join(CLIENT_FRAME_TYPES)}"
        raise FrameError(ErrorCode.BAD_REQUEST, message, recover_id(data)) from None
    except msgspec.DecodeError as exc:
        raise FrameError(ErrorCode.BAD_REQUEST, f"invalid JSON: {exc}", None) from None
    except RecursionError:
        raise FrameError(ErrorCode.BAD_REQUEST, "JSON nested too deeply", recover_id(data)) from None


# ---------------------------------------------------------------------------------------------
# Gateway -> client.

AckStatus = Literal["accepted", "duplicate"]


class _ServerFrame(msgspec.Struct, tag_field="type", frozen=True, kw_only=True, omit_defaults=True):
    pass


class Ack(_ServerFrame, tag="ack", frozen=True):
    id: str
    status: AckStatus               # always sent: omit_defaults must not drop it
    conversation_id: str | None = None
    last_seq: int | None = None     # open: the conversation's head; subscribe: its head at subscribe;
                                    # export: the last seq the export holds
    after_seq: int | None = None    # subscribe: where the stream starts


class ErrorFrame(_ServerFrame, tag="error", frozen=True):
    code: ErrorCode
    message: str
    id: str | None = None
    conversation_id: str | None = None
    last_seq: int | None = None     # slow_consumer: the last seq delivered before the pause
    # quota_exceeded only (docs/design.md#quotas); omitted otherwise, so every other error frame
    # keeps its bytes: which quota, for whom (`user`, `tenant`, `ip`), and when a windowed one resets
    # (ISO 8601 UTC, e.g. "2026-01-02T03:04:00Z").
    quota: str | None = None
    scope: str | None = None
    resets_at: str | None = None
    # unavailable only (docs/wire-protocol.md#5-error-codes): how long to wait before sending the frame
    # again, same id. Omitted otherwise, like the quota fields.
    retry_after_ms: int | None = None


class EventFrame(_ServerFrame, tag="event", frozen=True):
    """An event as it arrives: `data` is decoded by `event` in a second step (its type depends on it)."""

    conversation_id: str
    seq: int
    event: str
    data: msgspec.Raw
    ts: float


class Pong(_ServerFrame, tag="pong", frozen=True):
    id: str


class ExportCompleted(_ServerFrame, tag="export.completed", frozen=True):
    """The end of an export: its own frame type, never an event, so that a client tells it apart from
    anything a subscription sends; `id` is the `export` frame's (docs/wire-protocol.md#export)."""

    id: str
    conversation_id: str
    events: int                     # event frames this export sent: 1..last_seq, unless deleted meanwhile
    last_seq: int                   # the head the export covers (its ack's last_seq)


# -- the conversation list and the agents (docs/wire-protocol.md#16-agents-and-the-conversation-list) --

TITLE_MAX_CHARS: Final = 80


class ConversationEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One conversation of a list page: the same fields for the `list` frame, GET /v1/conversations and
    `reactgate conversations`."""

    conversation_id: str
    agent: str
    created_at: float               # unix seconds
    last_active_at: float           # the last accepted message, steer or answer, or the end of the last turn
    last_seq: int
    title: str                      # the first user message, cut (`title_of`); "" before the first one
    running: bool                   # a turn is running, paused on ask_user, or queued


class ConversationPage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The body of GET /v1/conversations: a page, and the cursor of the next one (none on the last)."""

    conversations: list[ConversationEntry]
    next_before: str | None = None


class ConversationsFrame(_ServerFrame, tag="conversations", frozen=True):
    """The reply to `list`: its own frame type, like `export.completed` (docs/wire-protocol.md#conversations)."""

    id: str
    conversations: list[ConversationEntry]
    next_before: str | None = None  # omitted on the last page


class AgentEntry(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    description: str


class AgentList(msgspec.Struct, frozen=True, kw_only=True):
    """The body of GET /agents: every agent the gateway serves (the default first, then the others in
    their configuration's order), and the one `open` without `agent` creates a conversation of."""

    default: str
    agents: list[AgentEntry]


def title_of(text: str) -> str:
    """A conversation's title from its first user message: whitespace folded to single spaces, cut
    to TITLE_MAX_CHARS characters (the last one an ellipsis when cut)."""
    folded = " ".join(text.split())
    return folded if len(folded) <= TITLE_MAX_CHARS else folded[: TITLE_MAX_CHARS - 1] + "…"


class InvalidCursor(ValueError):
    """A `before` that no page of this protocol gave out: the request is refused (`bad_request`)."""


Cursor = tuple[float, str]  # (last_active_at, conversation_id) of the last entry of a page: where the next one starts

_cursor_encoder: Final = msgspec.json.Encoder()
_cursor_decoder: Final = msgspec.json.Decoder(tuple[float, str])


def encode_cursor(entry: ConversationEntry) -> str:
    """The opaque `next_before` after `entry`: a keyset position, not an offset, so a page never
    repeats an entry of the one before, however the list changed in between."""
    raw = _cursor_encoder.encode((entry.last_active_at, entry.conversation_id))
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_cursor(text: str) -> Cursor:
    """The position a `before` names. Raises InvalidCursor. A position is only ever compared within
    the caller's own conversations, so a forged one shows nothing of anyone else's."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        at, conversation_id = _cursor_decoder.decode(raw)
    except (binascii.Error, ValueError, msgspec.DecodeError, msgspec.ValidationError):
        raise InvalidCursor("before: not a cursor of this server (pass a page's next_before)") from None
    if not math.isfinite(at) or not conversation_id:
        raise InvalidCursor("before: not a cursor of this server (pass a page's next_before)")
    return at, conversation_id


ServerFrame = Ack | ErrorFrame | Pong | ExportCompleted | ConversationsFrame
ReceivedFrame = Ack | ErrorFrame | Event | Pong | ExportCompleted | ConversationsFrame

_encoder: Final = msgspec.json.Encoder()
_server_decoder: Final = msgspec.json.Decoder(
    Ack | ErrorFrame | EventFrame | Pong | ExportCompleted | ConversationsFrame)
_EVENT_PREFIX: Final = b'{"type":"event",'


def encode_frame(frame: ServerFrame) -> bytes:
    return _encoder.encode(frame)


def encode_event(event: Event) -> bytes:
    """`{"type":"event", <the Event's own fields>}` without copying the event into a new struct.

    An `Event` encodes as a JSON object that starts with `{`: replacing that byte by the tag
    prefix gives the frame (docs/wire-protocol.md#7-events).
    """
    return _EVENT_PREFIX + _encoder.encode(event)[1:]


def decode_server_frame(data: bytes | str) -> ReceivedFrame:
    """For clients: one decoder for everything the gateway sends; an event comes out typed (or, when
    its data does not fit its kind, as plain data: its seq still counts). Raises msgspec.DecodeError /
    msgspec.ValidationError on a frame whose envelope does not fit."""
    frame: Ack | ErrorFrame | EventFrame | Pong | ExportCompleted | ConversationsFrame = _server_decoder.decode(data)
    if type(frame) is EventFrame:
        return Event(conversation_id=frame.conversation_id, seq=frame.seq, event=frame.event,
                     data=decode_data(frame.event, frame.data, lenient=True), ts=frame.ts)
    assert not isinstance(frame, EventFrame)
    return frame
