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


ERROR_CODES: Final[dict[ErrorCode, str]] = {
    ErrorCode.BAD_REQUEST: "invalid JSON, unknown frame type, or a missing/ill-typed field; "
    "the connection stays open (10 in a row close it with 1008)",
    ErrorCode.UNAUTHORIZED: "missing, invalid or expired JWT: the handshake is refused with HTTP 401",
    ErrorCode.FORBIDDEN: "the caller does not own the conversation (same reply whether or not it exists)",
    ErrorCode.NOT_FOUND: "`open` named an agent profile the server does not serve",
    ErrorCode.RATE_LIMITED: "the connection's token bucket is empty; the frame was not processed",
    ErrorCode.TOO_LARGE: "a frame over max_frame_bytes: the connection is closed with 1009",
    ErrorCode.SLOW_CONSUMER: "the send queue overflowed: the conversation's subscription is paused; "
    "re-subscribe with `last_seq` to lose nothing",
    ErrorCode.OVERLOADED: "a per-connection limit is reached (e.g. 64 watched conversations); "
    "at the server level, max connections closes with 1013",
    ErrorCode.INTERNAL: "an unexpected server error; details are logged, never sent",
    ErrorCode.QUOTA_EXCEEDED: "a quota refused the frame or the connection (`quota`, `scope`, and `resets_at` "
    "for a windowed one); the connection stays open, except over a connection quota (then 1013)",
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
)
CommandFrame = UserMessageFrame | SteerFrame | AnswerFrame | SetModeFrame | CancelFrame
CLIENT_FRAME_TYPES: Final[tuple[str, ...]] = (
    "open", "subscribe", "unsubscribe", "user_message", "steer", "answer", "set_mode", "cancel", "ping",
    "delete", "export",
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


ServerFrame = Ack | ErrorFrame | Pong | ExportCompleted
ReceivedFrame = Ack | ErrorFrame | Event | Pong | ExportCompleted

_encoder: Final = msgspec.json.Encoder()
_server_decoder: Final = msgspec.json.Decoder(Ack | ErrorFrame | EventFrame | Pong | ExportCompleted)
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
    frame: Ack | ErrorFrame | EventFrame | Pong | ExportCompleted = _server_decoder.decode(data)
    if type(frame) is EventFrame:
        return Event(conversation_id=frame.conversation_id, seq=frame.seq, event=frame.event,
                     data=decode_data(frame.event, frame.data, lenient=True), ts=frame.ts)
    assert not isinstance(frame, EventFrame)
    return frame
