"""Client frame → backend call, and refusal → error frame: the gateway's two tables.

`HANDLERS` says what each client frame type does (docs/wire-protocol.md#3-client-frames): which
backend call it makes and what it is answered. `REFUSALS` says what a handler's exception becomes
on the wire (docs/wire-protocol.md#5-error-codes). `dispatch` reads both for one decoded frame.

No socket here: the connection is a `Peer` (`gateway.session.Session` is one) whose `send` only
queues, so both tables are driven with a fake backend and a recording peer
(tests/test_gateway_dispatch.py). Reading the socket, decoding frames and the rate and bad-frame
limits stay in gateway/server.py, before a frame gets here.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from enum import Enum
from typing import Any, Final, Protocol

from opentelemetry.context import Context
from websockets.exceptions import ConnectionClosed

from actors import tracing
from actors.hosting.backend import (
    AgentNotServed,
    Answer,
    Backend,
    Cancel,
    Command,
    ConfigurationReplaced,
    Export,
    Forbidden,
    Owner,
    SetMode,
    Steer,
    UnknownAgent,
    UnknownAsk,
    UserMessage,
)
from actors.identity import Caller
from actors.quotas import QuotaExceeded
from actors.store.base import StoreUnavailable
from gateway.session import FORBIDDEN_MESSAGE
from protocol.frames import (
    Ack,
    AnswerFrame,
    CancelFrame,
    ClientFrame,
    CommandFrame,
    ConversationsFrame,
    DeleteFrame,
    ErrorCode,
    ErrorFrame,
    ExportFrame,
    InvalidCursor,
    ListFrame,
    Open,
    Ping,
    Pong,
    ServerFrame,
    SetModeFrame,
    SteerFrame,
    Subscribe,
    Unsubscribe,
    UserMessageFrame,
)

log = logging.getLogger("reactgate.gateway")

NO_QUESTION_MESSAGE: Final = "no question is waiting for this ask_id (answered, timed out, or never asked)"


class Peer(Protocol):
    """What a handler needs of the connection it answers. Nothing here awaits the socket: a slow
    client never holds up a backend call (docs/wire-protocol.md#11-limits-slow-consumers-drain)."""

    @property
    def owner(self) -> Owner: ...
    @property
    def caller(self) -> Caller: ...
    @property
    def trace_parent(self) -> Context | None: ...
    @property
    def max_watched(self) -> int: ...

    def send(self, frame: ServerFrame) -> None: ...
    def can_watch(self, conversation_id: str) -> bool: ...
    def watching(self, conversation_id: str) -> bool: ...
    def watch(self, conversation_id: str, after_seq: int) -> None: ...
    def unwatch(self, conversation_id: str) -> None: ...
    def export(self, frame_id: str, conversation_id: str, export: Export) -> None: ...


# -- frame → backend call ---------------------------------------------------------------------


async def _ping(frame: Ping, peer: Peer, backend: Backend) -> None:
    peer.send(Pong(id=frame.id))


async def _open(frame: Open, peer: Peer, backend: Backend) -> None:
    opened = await backend.open(peer.owner, frame.conversation_id, frame.agent, frame.mode)
    peer.send(Ack(id=frame.id, status="accepted", conversation_id=opened.conversation_id, last_seq=opened.last_seq))


async def _subscribe(frame: Subscribe, peer: Peer, backend: Backend) -> None:
    cid = frame.conversation_id
    if not peer.can_watch(cid):
        # A resource limit, like rate_limited, not a malformed frame (docs/wire-protocol.md#14-details-worth-knowing).
        peer.send(ErrorFrame(code=ErrorCode.OVERLOADED, message=f"this connection already watches "
                             f"{peer.max_watched} conversations: unsubscribe one first", id=frame.id,
                             conversation_id=cid))
        return
    # Ownership before the ack: re-opening raises Forbidden for a caller who does not own the
    # conversation, whether or not it exists.
    opened = await backend.open(peer.owner, cid, None, None)
    peer.send(Ack(id=frame.id, status="accepted", conversation_id=cid, last_seq=opened.last_seq,
                  after_seq=frame.after_seq))
    peer.watch(cid, frame.after_seq)  # after the ack: its replay starts at after_seq + 1


async def _unsubscribe(frame: Unsubscribe, peer: Peer, backend: Backend) -> None:
    cid = frame.conversation_id
    if peer.watching(cid):
        peer.unwatch(cid)
    else:
        await backend.open(peer.owner, cid, None, None)  # forbidden for anything not owned
    peer.send(Ack(id=frame.id, status="accepted", conversation_id=cid))


async def _command(frame: CommandFrame, peer: Peer, backend: Backend) -> None:
    kind = str(type(frame).__struct_config__.tag)
    # One span per command, child of the connection's upgrade trace (docs/design.md#tracing).
    with tracing.command(peer.trace_parent, frame.conversation_id, kind, frame.id) as trace:
        status = await backend.command(peer.owner, frame.conversation_id, _to_command(frame, trace, peer.caller))
    peer.send(Ack(id=frame.id, status=status, conversation_id=frame.conversation_id))


def _to_command(frame: CommandFrame, trace: dict[str, str], caller: Caller) -> Command:
    """The backend's command for a command frame; the trace and the caller ride on those that start
    a turn (docs/design.md#tracing, #your-tools)."""
    match frame:
        case UserMessageFrame():
            return UserMessage(id=frame.id, text=frame.text, trace=trace, caller=caller)
        case SteerFrame():
            return Steer(id=frame.id, text=frame.text, trace=trace, caller=caller)
        case AnswerFrame():
            return Answer(id=frame.id, ask_id=frame.ask_id, answer=frame.answer)
        case SetModeFrame():
            return SetMode(id=frame.id, mode=frame.mode)
        case CancelFrame():
            return Cancel(id=frame.id)


async def _delete(frame: DeleteFrame, peer: Peer, backend: Backend) -> None:
    # Its watchers, on this connection too, get `conversation.deleted` from the backend; like any
    # command's events, that may come before this ack or after it (docs/wire-protocol.md#delete).
    status = await backend.delete(peer.owner, frame.conversation_id, frame.id)
    peer.send(Ack(id=frame.id, status=status, conversation_id=frame.conversation_id))


async def _export(frame: ExportFrame, peer: Peer, backend: Backend) -> None:
    export = await backend.export(peer.owner, frame.conversation_id, frame.id)
    peer.send(Ack(id=frame.id, status=export.status, conversation_id=frame.conversation_id,
                  last_seq=export.last_seq))
    peer.export(frame.id, frame.conversation_id, export)  # after the ack, on the same queue (docs/wire-protocol.md#export)


async def _list(frame: ListFrame, peer: Peer, backend: Backend) -> None:
    page = await backend.list_conversations(peer.owner, frame.limit, frame.before)
    peer.send(ConversationsFrame(id=frame.id, conversations=page.conversations, next_before=page.next_before))


Handler = Callable[[Any, Peer, Backend], Awaitable[None]]

# Every frame that names a conversation reaches a backend call that checks its owner (`forbidden`
# otherwise), except `unsubscribe` of one this connection watches: watching it was checked.
HANDLERS: Final[Mapping[type[ClientFrame], Handler]] = {
    #  frame             handler         backend call → reply
    Ping:             _ping,          # none → pong
    Open:             _open,          # open (create, or re-open an owned one) → ack last_seq
    Subscribe:        _subscribe,     # open (ownership) → ack last_seq after_seq, then the stream
    Unsubscribe:      _unsubscribe,   # none if watched, else open (ownership) → ack
    UserMessageFrame: _command,       # command → ack accepted | duplicate
    SteerFrame:       _command,       # command → ack accepted | duplicate
    AnswerFrame:      _command,       # command → ack accepted | duplicate
    SetModeFrame:     _command,       # command → ack
    CancelFrame:      _command,       # command → ack
    DeleteFrame:      _delete,        # delete → ack accepted | duplicate
    ExportFrame:      _export,        # export → ack last_seq, the events, export.completed
    ListFrame:        _list,          # conversations (the caller's own, by the store) → conversations
}  # fmt: skip


# -- refusal → error frame --------------------------------------------------------------------


class Drain(Enum):
    """No reply: this replica must stop serving (docs/design.md#generations). It drains and closes
    with 1012; the client sends the frame again, same id, to a current replica."""

    DRAIN = "drain"


def quota_error(refused: QuotaExceeded, frame_id: str | None = None, conversation_id: str | None = None) -> ErrorFrame:
    """`quota_exceeded`, naming the quota, its scope and, for a windowed one, when it resets
    (docs/wire-protocol.md#5-error-codes): the frame was not acted on."""
    return ErrorFrame(code=ErrorCode.QUOTA_EXCEEDED, message=refused.message, id=frame_id,
                      conversation_id=conversation_id, quota=refused.quota.value, scope=refused.scope.value,
                      resets_at=refused.resets_at_iso)


CAUSE_MAX_CHARS: Final = 120
_UNPRINTABLE: Final = re.compile(r"[\x00-\x1f\x7f]+")


def safe_cause(cause: str) -> str:
    """A store outage's cause as it may be shown to a client or a probe: one line, cut short. The
    store words it for that (`StoreUnavailable.cause`: "failover", "disk full", …); this only keeps a
    long or multi-line one from reaching the wire as it is."""
    line = " ".join(_UNPRINTABLE.sub(" ", cause).split()) or "unknown cause"
    return line if len(line) <= CAUSE_MAX_CHARS else line[: CAUSE_MAX_CHARS - 1] + "…"


def unavailable_error(outage: StoreUnavailable, frame_id: str | None = None,
                      conversation_id: str | None = None) -> ErrorFrame:
    """`unavailable`, naming the store's cause and when to send the frame again (docs/wire-protocol.md#5-error-codes):
    the frame was not acted on, so the same frame, same id, may follow after `retry_after_ms`. No
    ref and nothing logged at error level: an outage is the store's to report, not a bug of this frame."""
    retry_after_ms = max(0, int(outage.retry_after_ms))
    return ErrorFrame(code=ErrorCode.UNAVAILABLE, id=frame_id, conversation_id=conversation_id,
                      message=f"store unavailable: {safe_cause(outage.cause)}; frame not processed, "
                              f"send it again (same id) after {retry_after_ms} ms",
                      retry_after_ms=retry_after_ms)


def _conversation(frame: ClientFrame) -> str | None:
    return None if isinstance(frame, Ping | ListFrame) else frame.conversation_id


def _forbidden(exc: Forbidden, frame: ClientFrame) -> ErrorFrame:
    return ErrorFrame(code=ErrorCode.FORBIDDEN, message=FORBIDDEN_MESSAGE, id=frame.id,
                      conversation_id=_conversation(frame))


def _unknown_agent(exc: UnknownAgent, frame: ClientFrame) -> ErrorFrame:
    agent = frame.agent if isinstance(frame, Open) else None
    return ErrorFrame(code=ErrorCode.NOT_FOUND, message=f"unknown agent {agent!r}" if agent else str(exc), id=frame.id)


def _not_served(exc: AgentNotServed, frame: ClientFrame) -> ErrorFrame:
    return ErrorFrame(code=ErrorCode.NOT_FOUND, message=str(exc), id=frame.id, conversation_id=_conversation(frame))


def _bad_cursor(exc: InvalidCursor, frame: ClientFrame) -> ErrorFrame:
    return ErrorFrame(code=ErrorCode.BAD_REQUEST, message=str(exc), id=frame.id)


def _no_question(exc: UnknownAsk, frame: ClientFrame) -> ErrorFrame:
    return ErrorFrame(code=ErrorCode.NOT_FOUND, message=NO_QUESTION_MESSAGE, id=frame.id,
                      conversation_id=_conversation(frame))


def _over_quota(exc: QuotaExceeded, frame: ClientFrame) -> ErrorFrame:
    return quota_error(exc, frame.id, _conversation(frame))


def _store_down(exc: StoreUnavailable, frame: ClientFrame) -> ErrorFrame:
    log.debug("frame %s not processed: %s", type(frame).__name__, exc)
    return unavailable_error(exc, frame.id, _conversation(frame))


def _replaced(exc: ConfigurationReplaced, frame: ClientFrame) -> Drain:
    return Drain.DRAIN


def _internal(exc: Exception, frame: ClientFrame) -> ErrorFrame:
    # Details are logged under a ref, never sent (protocol/frames.py ERROR_CODES): the client quotes the ref.
    ref = uuid.uuid4().hex[:12]
    log.error("frame %s failed (ref %s)", type(frame).__name__, ref, exc_info=exc)
    return ErrorFrame(code=ErrorCode.INTERNAL, message=f"internal error (ref {ref})", id=frame.id,
                      conversation_id=_conversation(frame))


Refusal = Callable[[Any, ClientFrame], ErrorFrame | Drain]

# The row of the exception's most specific class that has one decides; `Exception` takes the rest.
# A refused frame was not acted on: the client may send it again with its id.
REFUSALS: Final[Mapping[type[Exception], Refusal]] = {
    #  raised                refusal          on the wire
    Forbidden:             _forbidden,      # forbidden, the same whether or not the conversation exists
    UnknownAgent:          _unknown_agent,  # not_found: unknown agent 'x' (open only)
    AgentNotServed:        _not_served,     # not_found: unknown agent 'x': this conversation's agent is not served here
    InvalidCursor:         _bad_cursor,     # bad_request: before: not a cursor of this server
    UnknownAsk:            _no_question,    # not_found: no question is waiting for this ask_id
    QuotaExceeded:         _over_quota,     # quota_exceeded with quota, scope, resets_at
    StoreUnavailable:      _store_down,     # unavailable: store unavailable: <cause>; …, with retry_after_ms
    ConfigurationReplaced: _replaced,       # nothing: the replica drains, 1012 follows
    Exception:             _internal,       # internal (ref …); the exception itself only in the log
}  # fmt: skip


def refusal(exc: Exception, frame: ClientFrame) -> ErrorFrame | Drain:
    """What `frame` gets for the exception its handler raised."""
    row = next(REFUSALS[cls] for cls in type(exc).__mro__ if issubclass(cls, Exception) and cls in REFUSALS)
    return row(exc, frame)


async def dispatch(frame: ClientFrame, peer: Peer, backend: Backend, drain: Callable[[], None]) -> None:
    """Carry out one decoded frame: its handler's backend call and reply, or its refusal."""
    try:
        await HANDLERS[type(frame)](frame, peer, backend)
    except ConnectionClosed:
        raise  # the socket is gone, the frame was not refused: the read loop ends
    except Exception as exc:
        answer = refusal(exc, frame)
        if isinstance(answer, Drain):
            drain()
        else:
            peer.send(answer)
