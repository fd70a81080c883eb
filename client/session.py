"""One conversation's client side of `reactgate.v1`, sans-I/O (docs/wire-protocol.md#13-writing-a-client-checklist).

`ClientSession` is the protocol logic every client of this repository shares, in the style of
websockets' own core: inputs in — `connected()`, `receive(frame)`, `disconnected()` and the
commands — and typed outputs out, drained with `outputs()`: frames to `Send`, each `Event` delivered
in seq order exactly once, and facts for the shell to show or act on (`Opened`, `Resumed`,
`RetryLater`, `CommandLost`, `Fatal`, …). It owns no socket, no clock and no event loop, so every
rule below is tested on plain frames (tests/test_client_session.py).

What it guarantees (docs/wire-protocol.md#10-delivery-idempotency-resume-multiplexing):

- **One conversation.** The first `open` creates it (with `agent` and `mode`) or re-opens the one it
  was given; every later `open`, after a reconnect, re-opens the same one. The mode is sticky on the
  server and may have changed since (a `set_mode`, another client), so it is never re-applied.
- **Resume.** On the `open` ack it subscribes after the last seq it delivered, then sends every
  pending command. Nothing but the `open` is sent before that ack.
- **Commands keep their id.** A command is pending until acked. After a reconnect it is sent again
  with the same id (`RESENT_AFTER_RECONNECT`): the server acks a repeat `duplicate` and does nothing.
  A `cancel` is never sent again — a repeat could cancel the next turn — and the shell is told it
  may not have arrived (`CommandLost`).
- **Delete.** `delete()` is a command like the others (re-sent with its id; a repeat is acked
  `duplicate`). Once the conversation is gone — our delete acked, a `conversation.deleted` event
  (anyone's delete), or `forbidden` on re-opening it while our delete was pending (its ack was
  lost with a connection) — the session ends with `Deleted` (docs/wire-protocol.md#delete).
- **Export.** `export()` asks for the whole log: each of its events comes out once, in order, as
  `Exported`, then `ExportDone`. Its event frames are the very events the subscription sends, so
  they are told apart by seq alone: after the export's ack (its `last_seq` is the export's end),
  the next seq the export lacks is the export's; a copy that does not follow on from the stream is
  left to the stream's own copy, and nothing the export takes ever counts as a gap. Re-sent after a
  reconnect like a command, it goes on where it stopped (docs/wire-protocol.md#export).
- **Events once, in order.** An event with seq ≤ the last delivered is dropped (a restarted
  subscription replays); a gap is never delivered and re-subscribes from the last delivered seq,
  once per subscription in flight (events of the old subscription still arriving are dropped by the
  same rules).
- **Errors are a table** (`ERROR_REACTIONS`): what an error frame does depends on its code and on
  what it answers — our `open`, a head check, our `subscribe`, a pending command, or our stream.
- **A frame the server did not process** (`rate_limited`; `unavailable`: the store is down) goes
  again, same id, after `RetryLater.pause_s` (`retry_pause`): the server's `retry_after_ms` for
  `unavailable`, else an exponential pause, bounded by UNAVAILABLE_PAUSE_MAX_S, that starts over
  at the next ack.
- **The head.** `check_head()` asks for the conversation's last seq (an `open` ack's `last_seq`);
  the answer comes as `Head`, from this connection or from the next one's `open` ack.
- **Token expiry.** A connection the server closed with 4001 (its token reached `exp`) is reported
  as `TokenExpired`: the shell reconnects with a fresh token, and the session resumes like after
  any other drop. The stale token would only be refused (HTTP 401).

Several conversations on one connection: use one session per conversation. On every (re)connect
call `connected()` on each; feed every server frame to each session (or route it by
`conversation_id` and frame id: a session ignores events, acks and errors of other conversations,
and reports an error that names no conversation); send what each returns. Each session has its own ids, so their frames never collide. The server lets one
connection watch at most 64 conversations (docs/wire-protocol.md#11-limits-slow-consumers-drain).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

import msgspec

from protocol.events import ConversationDeleted, Event
from protocol.frames import (
    Ack,
    AckStatus,
    AnswerFrame,
    CancelFrame,
    ClientFrame,
    CloseCode,
    CommandFrame,
    ConversationsFrame,
    DeleteFrame,
    ErrorCode,
    ErrorFrame,
    ExportCompleted,
    ExportFrame,
    Mode,
    Open,
    Pong,
    ReceivedFrame,
    SetModeFrame,
    SteerFrame,
    Subscribe,
    UserMessageFrame,
    decode_server_frame,
)


def new_frame_id() -> str:
    """A fresh frame id: 128 random bits, so ids of many sessions and processes never collide."""
    return uuid.uuid4().hex


# ---------------------------------------------------------------------------------------------
# Policies.

# The frames a session keeps pending until they are answered: the commands, `delete` and `export`.
PendingFrame = CommandFrame | DeleteFrame | ExportFrame

# Which commands are sent again, with the same id, on the next connection when no ack came back.
RESENT_AFTER_RECONNECT: Final[Mapping[type[PendingFrame], bool]] = {
    UserMessageFrame: True,  # idempotent by (conversation_id, id): a repeat is acked `duplicate`
    SteerFrame: True,        # same key space
    AnswerFrame: True,       # same key space
    SetModeFrame: True,      # not deduped, but a value, not a toggle: a repeat changes nothing
    CancelFrame: False,      # neither: a repeat could cancel the next turn
    DeleteFrame: True,       # idempotent by id: the delete that removed it, repeated, is `duplicate`
    ExportFrame: True,       # changes nothing; a repeat (`duplicate`) is exported again, whole
}

# A pause the caller may use before `retry` (rate limits refill at 20 frames/s,
# docs/wire-protocol.md#11-limits-slow-consumers-drain).
RETRY_PAUSE_S: Final = 0.5
# The longest pause before sending again a frame the store could not take (`unavailable`), whatever
# its `retry_after_ms` says; without one the pause doubles from RETRY_PAUSE_S up to this.
UNAVAILABLE_PAUSE_MAX_S: Final = 30.0


def retry_pause(error: ErrorFrame, streak: int = 0) -> float:
    """Seconds to wait before sending again the frame `error` refused (docs/wire-protocol.md#5-error-codes):
    for `unavailable`, its `retry_after_ms`, or without one RETRY_PAUSE_S·2^streak (`streak`: the
    `unavailable` errors since the last ack), both at most UNAVAILABLE_PAUSE_MAX_S; else RETRY_PAUSE_S."""
    if error.code is not ErrorCode.UNAVAILABLE:
        return RETRY_PAUSE_S
    if error.retry_after_ms is not None:
        return min(UNAVAILABLE_PAUSE_MAX_S, max(0, error.retry_after_ms) / 1000)
    return min(UNAVAILABLE_PAUSE_MAX_S, RETRY_PAUSE_S * 2 ** min(streak, 16))


class Target(Enum):
    """What an error frame answers."""

    OPEN = "open"            # this connection's `open`
    HEAD = "head"            # a head check (an `open` of the conversation we hold)
    SUBSCRIBE = "subscribe"  # our current `subscribe`
    COMMAND = "command"      # a pending command
    STREAM = "stream"        # no id, our conversation: the server paused or ended our stream


class Reaction(Enum):
    FATAL = "fatal"              # no reconnect can fix it: the session ends (`Fatal`)
    RESUBSCRIBE = "resubscribe"  # subscribe again after the last delivered seq: nothing is lost
    RETRY = "retry"              # the frame was not processed: send it again, same id, after a pause
    DROP = "drop"                # the command will never be acted on: forget it (`CommandFailed`)
    REPORT = "report"            # tell the shell (`ServerError`); nothing to do


F, S, R, D, P = Reaction.FATAL, Reaction.RESUBSCRIBE, Reaction.RETRY, Reaction.DROP, Reaction.REPORT
ERROR_TARGETS: Final = (Target.OPEN, Target.HEAD, Target.SUBSCRIBE, Target.COMMAND, Target.STREAM)

# (code, what it answers) → what the session does (docs/wire-protocol.md#5-error-codes). Without
# the `open` ack nothing else can happen on a connection, so an error on it is fatal unless the
# frame was merely not processed (`rate_limited`, `unavailable`: retried, same id, after
# `retry_pause`). An `internal` on a command drops it: the turn it belonged to is not started, which
# the user (or the load test) must see. `unavailable` on our stream (the store could not feed it)
# re-subscribes from our last seq. `unauthorized` and `too_large` are never sent as frames; their
# rows are there so that the table is total.
ERROR_REACTIONS: Final[Mapping[tuple[ErrorCode, Target], Reaction]] = {
    (code, target): reaction
    for code, row in {
        #                         open head subscribe command stream
        ErrorCode.BAD_REQUEST:   (F,   F,   F,        D,      P),
        ErrorCode.UNAUTHORIZED:  (F,   F,   F,        D,      F),
        ErrorCode.FORBIDDEN:     (F,   F,   F,        D,      F),  # stream: ended, not ours
        ErrorCode.NOT_FOUND:     (F,   F,   F,        D,      P),
        ErrorCode.RATE_LIMITED:  (R,   R,   R,        R,      P),
        ErrorCode.TOO_LARGE:     (F,   F,   F,        D,      P),
        ErrorCode.SLOW_CONSUMER: (S,   S,   S,        S,      S),  # always the stream: paused
        ErrorCode.OVERLOADED:    (F,   F,   F,        D,      P),
        ErrorCode.INTERNAL:      (F,   F,   R,        D,      S),  # stream: ended after server retries
        ErrorCode.QUOTA_EXCEEDED: (F,  F,   F,        D,      P),  # command: not before `resets_at`
        ErrorCode.UNAVAILABLE:   (R,   R,   R,        R,      S),  # the store is down: after retry_after_ms
    }.items()
    for target, reaction in zip(ERROR_TARGETS, row, strict=True)
}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Outputs. `Event` (protocol/events.py) is one of them: an event delivered in order, exactly once.


@dataclass(frozen=True, slots=True)
class Send:
    """A frame to send now, in this order."""

    frame: ClientFrame
    resend: bool = False        # a pending command sent again after a reconnect, with its id


@dataclass(frozen=True, slots=True)
class Opened:
    """The first `open` was acked: the conversation exists (created, or re-opened by id)."""

    conversation_id: str
    head: int                   # its last seq


@dataclass(frozen=True, slots=True)
class Resumed:
    """Reconnected: the conversation is open again; the stream resumes after `after_seq`."""

    after_seq: int
    head: int


@dataclass(frozen=True, slots=True)
class Subscribed:
    """A `subscribe` was acked: events after `after_seq` follow; those ≤ `head` are a replay."""

    after_seq: int
    head: int


@dataclass(frozen=True, slots=True)
class Head:
    """The answer to `check_head()`: the conversation's last seq."""

    head: int


@dataclass(frozen=True, slots=True)
class Acked:
    command: PendingFrame
    status: AckStatus           # `duplicate`: an earlier copy of this id had already arrived
    resent: bool                # it was sent more than once


@dataclass(frozen=True, slots=True)
class CommandFailed:
    """The server refused the command; it will never be acted on, and is not pending any more."""

    command: PendingFrame
    code: ErrorCode
    message: str


@dataclass(frozen=True, slots=True)
class RetryLater:
    """The frame was not processed: after `pause_s`, call `retry(frame.id)` (same id)."""

    frame: ClientFrame
    code: ErrorCode
    pause_s: float = RETRY_PAUSE_S  # `retry_pause`: the server's retry_after_ms for `unavailable`


@dataclass(frozen=True, slots=True)
class CommandLost:
    """A command that is never re-sent was sent and the connection dropped before its ack: it may
    or may not have reached the server."""

    command: PendingFrame


@dataclass(frozen=True, slots=True)
class GapDetected:
    """An event skipped seqs: it was not delivered; the stream restarts after `after_seq`."""

    after_seq: int
    got: int


@dataclass(frozen=True, slots=True)
class Resubscribing:
    """The server paused or ended the stream (`code`); it restarts after `after_seq`."""

    after_seq: int
    code: ErrorCode


@dataclass(frozen=True, slots=True)
class ServerError:
    """An error frame about nothing the session tracks."""

    code: ErrorCode
    message: str


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A server frame that does not decode; it was skipped."""

    detail: str


@dataclass(frozen=True, slots=True)
class TokenExpired:
    """The server closed the connection at the token's `exp` (close 4001): reconnect with a fresh
    token (docs/wire-protocol.md#6-close-codes); the session resumes after its last seq."""


@dataclass(frozen=True, slots=True)
class Exported:
    """One event of the export `export_id`: every seq from 1 to its end, in order, once."""

    export_id: str
    event: Event


@dataclass(frozen=True, slots=True)
class ExportDone:
    """The export `export_id` is complete: `events` were output (`Exported`), and the log ended at
    `last_seq` when it was asked for. Fewer events than `last_seq`: deleted while it was exported."""

    export_id: str
    events: int
    last_seq: int


@dataclass(frozen=True, slots=True)
class Deleted:
    """The conversation was deleted: the session is over (`ended` is "deleted"), nothing more is sent."""

    conversation_id: str


@dataclass(frozen=True, slots=True)
class Fatal:
    """The session is over: no reconnect can fix this. Nothing more is sent."""

    reason: str


Output = (
    Send | Event | Opened | Resumed | Subscribed | Head | Acked | CommandFailed | RetryLater | CommandLost
    | GapDetected | Resubscribing | TokenExpired | ServerError | Unreadable | Fatal
    | Exported | ExportDone | Deleted
)


# ---------------------------------------------------------------------------------------------
# The session.


@dataclass(slots=True)
class _Pending:
    """A command not yet acked. Kept without a conversation id, so that it can be issued before the
    first `open` is acked; its frame is built whenever it is sent."""

    kind: type[PendingFrame]
    id: str
    fields: dict[str, Any]
    times_sent: int = 0
    on_this_connection: bool = False   # sent since the last connect
    waiting: bool = False              # not processed (e.g. rate limited): waits for `retry`

    def frame(self, conversation_id: str) -> PendingFrame:
        return self.kind(id=self.id, conversation_id=conversation_id, **self.fields)


@dataclass(slots=True)
class _Export:
    """An export in flight: its end (the ack's `last_seq`, once acked) and the next seq it lacks."""

    last_seq: int | None = None
    next: int = 1


class ClientSession:
    """One conversation's protocol state. See the module docstring for the rules."""

    def __init__(
        self,
        conversation_id: str | None = None,
        *,
        agent: str | None = None,
        mode: Mode | str | None = None,
        new_id: Callable[[], str] = new_frame_id,
    ) -> None:
        self._conversation_id = conversation_id
        self._agent = agent
        self._mode = Mode(mode) if mode is not None else None
        self._new_id = new_id
        self._outputs: list[Output] = []
        self._last_seq = 0                 # events ≤ this were delivered; a resume starts after it
        self._opened = False               # an `open` of this session was ever acked
        self._ready = False                # this connection's `open` was acked
        self._open: Open | None = None
        self._subscribe: Subscribe | None = None
        self._subscribe_acked = True       # no (re-)subscribe in flight
        self._head: Open | None = None
        self._head_wanted = False
        self._pending: dict[str, _Pending] = {}
        self._exports: dict[str, _Export] = {}
        self._ended: str | None = None
        self._duplicates = 0
        self._unavailable = 0              # `unavailable` errors since the last ack (`retry_pause`)

    # -- what a shell may read ----------------------------------------------------------------------

    @property
    def conversation_id(self) -> str | None:
        return self._conversation_id

    @property
    def last_seq(self) -> int:
        """The seq of the last event delivered."""
        return self._last_seq

    @property
    def ready(self) -> bool:
        """This connection's `open` was acked: commands go out at once."""
        return self._ready

    @property
    def ended(self) -> str | None:
        """Why the session is over (the `Fatal` reason, or "deleted"), or None."""
        return self._ended

    @property
    def pending_ids(self) -> tuple[str, ...]:
        """Commands not acked yet, in the order they were issued."""
        return tuple(self._pending)

    @property
    def duplicates_dropped(self) -> int:
        """Events dropped because their seq was already delivered."""
        return self._duplicates

    def outputs(self) -> list[Output]:
        """Everything produced since the last call, in order."""
        out, self._outputs = self._outputs, []
        return out

    # -- the connection ------------------------------------------------------------------------------

    def connected(self) -> None:
        """A new connection: (re-)open the conversation. Everything else waits for the ack."""
        if self._ended is not None:
            return
        self._ready = False
        first = not self._opened
        self._open = Open(
            id=self._new_id(),
            conversation_id=self._conversation_id,
            agent=self._agent if first and self._conversation_id is None else None,
            mode=self._mode if first else None,  # sticky server-side: never re-applied
        )
        self._emit(Send(self._open))

    def disconnected(self, close_code: int | None = None) -> None:
        """The connection is gone; `close_code` is the server's close code, when it sent one."""
        if close_code == CloseCode.TOKEN_EXPIRED and self._ended is None:
            self._emit(TokenExpired())
        self._ready = False
        self._open = self._subscribe = self._head = None  # an unanswered head check stays wanted
        self._subscribe_acked = True
        for pending in list(self._pending.values()):
            if pending.on_this_connection and not RESENT_AFTER_RECONNECT[pending.kind]:
                del self._pending[pending.id]
                self._emit(CommandLost(pending.frame(self._cid())))
            pending.on_this_connection = False

    def receive(self, raw: str | bytes) -> None:
        """One text frame from the server."""
        try:
            frame = decode_server_frame(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self._emit(Unreadable(str(exc)))
            return
        self.receive_frame(frame)

    def receive_frame(self, frame: ReceivedFrame) -> None:
        """One server frame, already decoded (for a caller that reads frames itself)."""
        if self._ended is not None:
            return
        match frame:
            case Event():
                self._on_event(frame)
            case Ack():
                self._on_ack(frame)
            case ErrorFrame():
                self._on_error(frame)
            case ExportCompleted():
                self._on_export_completed(frame)
            case Pong() | ConversationsFrame():
                pass  # a `list` is no conversation's: whoever sent it reads the reply

    # -- commands: each returns its frame id -----------------------------------------------------------

    def user_message(self, text: str) -> str:
        return self._command(UserMessageFrame, text=text)

    def steer(self, text: str) -> str:
        return self._command(SteerFrame, text=text)

    def answer(self, ask_id: str, answer: str) -> str:
        return self._command(AnswerFrame, ask_id=ask_id, answer=answer)

    def set_mode(self, mode: Mode | str) -> str:
        return self._command(SetModeFrame, mode=Mode(mode))

    def cancel(self) -> str:
        return self._command(CancelFrame)

    def delete(self) -> str:
        """Delete the conversation for good; the session then ends with `Deleted`."""
        return self._command(DeleteFrame)

    def export(self) -> str:
        """Export the conversation's log: `Exported` per event, then `ExportDone`."""
        frame_id = self._command(ExportFrame)
        self._exports[frame_id] = _Export()
        return frame_id

    def check_head(self) -> None:
        """Ask for the conversation's head; the answer is a `Head` output."""
        if self._conversation_id is None:
            raise RuntimeError("check_head() before the conversation was opened")
        self._head_wanted = True
        if self._ready and self._head is None:
            self._head = Open(id=self._new_id(), conversation_id=self._conversation_id)
            self._emit(Send(self._head))
        # not connected: the next `open` ack carries the head

    def retry(self, frame_id: str) -> None:
        """Send again, with the same id, a frame a `RetryLater` named (a stale id does nothing)."""
        pending = self._pending.get(frame_id)
        if pending is not None:
            if pending.waiting:
                pending.waiting = False
                if self._ready:  # else it goes out with the next `open` ack
                    self._send_pending(pending)
            return
        if self._open is not None and self._open.id == frame_id and not self._ready:
            self._emit(Send(self._open))
        elif self._ready:
            for control in (self._subscribe, self._head):
                if control is not None and control.id == frame_id:
                    self._emit(Send(control))

    # -- acks -------------------------------------------------------------------------------------------

    def _on_ack(self, ack: Ack) -> None:
        self._unavailable = 0  # the store took a call again: a later outage's pauses start short
        if self._open is not None and ack.id == self._open.id:
            self._on_opened(ack)
        elif self._head is not None and ack.id == self._head.id:
            self._head = None
            self._answer_head(ack.last_seq or 0)
        elif self._subscribe is not None and ack.id == self._subscribe.id:
            self._subscribe_acked = True
            self._emit(Subscribed(self._subscribe.after_seq, ack.last_seq or 0))
        elif (export := self._exports.get(ack.id)) is not None:
            export.last_seq = ack.last_seq or 0  # pending until `export.completed`: its events follow
        elif (pending := self._pending.pop(ack.id, None)) is not None:
            self._emit(Acked(pending.frame(self._cid()), ack.status, resent=pending.times_sent > 1))
            if pending.kind is DeleteFrame:
                self._gone()

    def _on_export_completed(self, done: ExportCompleted) -> None:
        export = self._exports.pop(done.id, None)
        if export is None:
            return  # another session's
        self._pending.pop(done.id, None)
        self._emit(ExportDone(done.id, export.next - 1, done.last_seq))

    def _on_opened(self, ack: Ack) -> None:
        if ack.conversation_id is None:
            self._end("the server acked open without a conversation id")
            return
        if self._conversation_id is not None and ack.conversation_id != self._conversation_id:
            self._end(f"asked to re-open {self._conversation_id}, the server opened {ack.conversation_id}")
            return
        self._conversation_id = ack.conversation_id
        self._ready = True
        head = ack.last_seq or 0
        if self._opened:
            self._emit(Resumed(self._last_seq, head))
        else:
            self._opened = True
            self._emit(Opened(ack.conversation_id, head))
        if self._head_wanted:
            self._answer_head(head)
        self._send_subscribe()
        for pending in self._pending.values():  # same ids: the server answers a repeat `duplicate`
            if not pending.waiting:
                self._send_pending(pending)

    def _answer_head(self, head: int) -> None:
        self._head_wanted = False
        self._emit(Head(head))

    # -- errors -----------------------------------------------------------------------------------------

    def _on_error(self, error: ErrorFrame) -> None:
        target = self._target(error)
        if (error.code is ErrorCode.FORBIDDEN and target not in (None, Target.COMMAND)
                and any(p.kind is DeleteFrame for p in self._pending.values())):
            self._gone()  # our delete went through; its ack was lost with the connection
            return
        if target is None:
            # About nothing we track; one naming another conversation is that session's to act on.
            if error.conversation_id in (None, self._conversation_id):
                self._emit(ServerError(error.code, error.message))
            return
        match ERROR_REACTIONS[error.code, target]:
            case Reaction.FATAL:
                self._end(f"{error.code}: {error.message}")
            case Reaction.RESUBSCRIBE:
                # Our own last delivered seq, not the error's: resuming from it loses nothing.
                self._emit(Resubscribing(self._last_seq, error.code))
                if self._ready:
                    self._send_subscribe()
            case Reaction.RETRY:
                if target is Target.COMMAND:  # not re-sent by a reconnect: `retry` sends it
                    self._pending[str(error.id)].waiting = True
                pause = retry_pause(error, self._unavailable)
                self._unavailable += error.code is ErrorCode.UNAVAILABLE
                self._emit(RetryLater(self._frame_named(error.id, target), error.code, pause))
            case Reaction.DROP:
                pending = self._pending.pop(str(error.id))
                self._exports.pop(pending.id, None)
                self._emit(CommandFailed(pending.frame(self._cid()), error.code, error.message))
            case Reaction.REPORT:
                self._emit(ServerError(error.code, error.message))

    def _target(self, error: ErrorFrame) -> Target | None:
        frame_id = error.id
        if frame_id is not None:
            if self._open is not None and frame_id == self._open.id:
                return Target.OPEN
            if self._head is not None and frame_id == self._head.id:
                return Target.HEAD
            if self._subscribe is not None and frame_id == self._subscribe.id:
                return Target.SUBSCRIBE
            if frame_id in self._pending:
                return Target.COMMAND
            return None  # a frame we no longer track (superseded, acked, dropped), or another session's
        if error.conversation_id is not None and error.conversation_id == self._conversation_id:
            return Target.STREAM
        return None

    def _frame_named(self, frame_id: str | None, target: Target) -> ClientFrame:
        match target:
            case Target.OPEN if self._open is not None:
                return self._open
            case Target.HEAD if self._head is not None:
                return self._head
            case Target.SUBSCRIBE if self._subscribe is not None:
                return self._subscribe
            case Target.COMMAND:
                return self._pending[str(frame_id)].frame(self._cid())
        raise ValueError(f"{target} names no frame to retry")  # ERROR_REACTIONS retries only named frames

    # -- events -----------------------------------------------------------------------------------------

    def _on_event(self, event: Event) -> None:
        if event.conversation_id != self._conversation_id:
            return
        if isinstance(event.data, ConversationDeleted):  # the last event there is, whatever its seq
            self._last_seq = max(self._last_seq, event.seq)
            self._emit(event)
            self._gone()
            return
        if self._take_exported(event) and event.seq != self._last_seq + 1:
            return  # an export's copy: the subscription sends its own, so it is never a gap
        if event.seq <= self._last_seq:  # replayed by a restarted subscription: already delivered
            self._duplicates += 1
            return
        if event.seq != self._last_seq + 1:
            if self._ready and self._subscribe_acked:
                self._emit(GapDetected(self._last_seq, event.seq))
                self._send_subscribe()
            return
        self._last_seq = event.seq
        self._emit(event)

    def _take_exported(self, event: Event) -> bool:
        """Output `event` for each acked export whose next seq it is. The same seq is the same event
        (the log is append-only), so it does not matter which stream this copy came from."""
        taken = False
        for export_id, export in self._exports.items():
            if export.last_seq is not None and export.next <= export.last_seq and event.seq == export.next:
                export.next += 1
                self._emit(Exported(export_id, event))
                taken = True
        return taken

    # -- sending ----------------------------------------------------------------------------------------

    def _command(self, kind: type[PendingFrame], **fields: Any) -> str:
        pending = _Pending(kind, self._new_id(), fields)
        self._pending[pending.id] = pending
        if self._ready:
            self._send_pending(pending)
        return pending.id

    def _send_pending(self, pending: _Pending) -> None:
        pending.times_sent += 1
        resend = not pending.on_this_connection and pending.times_sent > 1
        pending.on_this_connection = True
        self._emit(Send(pending.frame(self._cid()), resend=resend))

    def _send_subscribe(self) -> None:
        self._subscribe = Subscribe(id=self._new_id(), conversation_id=self._cid(), after_seq=self._last_seq)
        self._subscribe_acked = False
        self._emit(Send(self._subscribe))

    def _end(self, reason: str) -> None:
        self._ended = reason
        self._ready = False
        self._emit(Fatal(reason))

    def _gone(self) -> None:
        """The conversation was deleted: the session is over, nothing more is sent."""
        self._ended = "deleted"
        self._ready = False
        self._emit(Deleted(self._cid()))

    def _emit(self, output: Output) -> None:
        self._outputs.append(output)

    def _cid(self) -> str:
        assert self._conversation_id is not None, "only a ready session builds frames"
        return self._conversation_id
