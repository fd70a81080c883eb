"""One simulated user of `reactgate loadtest`, and what it measures — without I/O.

What it measures, and why it can be trusted:

- **Correctness (docs/design.md#guarantees, 5).** `SeqTracker` classifies every event of the
  user's conversation by its `seq`, as it arrives on the wire (before the session drops repeats). A
  resume subscribes after the last seq delivered, so the server owes exactly the events after it:
  any seq seen twice is a *duplicate* (never an expected replay overlap), a seq below the highest
  seen that fills an earlier gap is *out of order*, and a gap never filled — or a head the stream
  never reached at the end — is *lost*. All three must be 0, and every turn must complete with the
  `final_answer` its `answer.delta`s spelled out (else *garbled*); a frame that does not decode, an
  event of a conversation the user did not open, or a user whose stream was never seen to reach the
  server's head fails the run too.
- **Time to first delta** per turn: from the first send of the `user_message` (a re-send after a
  reconnect keeps the same id *and* the original start time, so an outage counts against it) to
  the first `thinking.delta`/`answer.delta` of that turn.
- **Delivery latency** per event: client receive time − the event's `ts` (same machine, same
  clock). `ts` is when the event was made — for coalesced deltas, when the lane's first delta of
  the batch arrived — so it includes coalescing (`flush_interval_ms`), the durable write, and the
  send queue. Events replayed after a reconnect (seq ≤ the head the subscribe ack reported) go to
  a separate *resume* histogram: they waited through the outage by design.
- **Re-sent commands**: after a reconnect the session re-sends every unacked command with the same
  id; the server acks a repeat `duplicate` (docs/wire-protocol.md#10-delivery-idempotency-resume-multiplexing).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

import msgspec
from hdrh.histogram import HdrHistogram

from client.session import (
    Acked,
    ClientSession,
    Fatal,
    Head,
    Opened,
    Output,
    Resumed,
    RetryLater,
    Send,
    Subscribed,
    new_frame_id,
)
from protocol.events import (
    AnswerDelta,
    AskUser,
    EndReason,
    Event,
    Payload,
    ThinkingDelta,
    TurnCompleted,
    TurnStarted,
)
from protocol.frames import ClientFrame, ErrorFrame, decode_server_frame

DEFAULT_MESSAGE: Final = "What is the weather in Paris?"
# A turn that ended with one of these reasons delivered an answer; any other reason is a failed turn.
COMPLETED_REASONS: Final = frozenset({EndReason.COMPLETE, EndReason.EXIT, EndReason.SALVAGED})
# Latencies are recorded in µs, from 1 µs to 1 h, with 3 significant digits.
HIST_HIGHEST_US: Final = 3_600_000_000
HIST_DIGITS: Final = 3
# A jump in seq larger than this is not remembered seq by seq (it could never be filled anyway).
MAX_TRACKED_GAP: Final = 100_000


# ---------------------------------------------------------------------------------------------
# Correctness: one conversation's seq stream.


class Seen(Enum):
    NEW = "new"                    # the next seq, or a later one (the skipped ones are now missing)
    OUT_OF_ORDER = "out_of_order"  # below the highest seq seen, filling a gap: late but not lost
    DUPLICATE = "duplicate"        # already received


@dataclass
class SeqTracker:
    """Classifies the seqs of one conversation as they arrive.

    Resuming subscribes after `last` (the highest seq seen), so the server owes exactly the seqs
    above it, once each, in order: there is no expected overlap, and every repeat is a duplicate.
    """

    last: int = 0                 # highest seq received: the resume point
    received: int = 0             # distinct seqs received
    duplicated: int = 0
    out_of_order: int = 0
    tail_lost: int = 0            # seqs up to the final head that never arrived (see `settle`)
    untracked_lost: int = 0       # parts of huge jumps not remembered seq by seq
    missing: set[int] = field(default_factory=set)

    def observe(self, seq: int) -> Seen:
        if seq > self.last:
            gap = seq - self.last - 1
            if gap > MAX_TRACKED_GAP:
                self.untracked_lost += gap - MAX_TRACKED_GAP
                gap = MAX_TRACKED_GAP
            self.missing.update(range(seq - gap, seq))
            self.last = seq
            self.received += 1
            return Seen.NEW
        if seq in self.missing:
            self.missing.discard(seq)
            self.out_of_order += 1
            self.received += 1
            return Seen.OUT_OF_ORDER
        self.duplicated += 1
        return Seen.DUPLICATE

    @property
    def lost(self) -> int:
        """Gaps never filled, plus the tail counted by `settle`."""
        return len(self.missing) + self.untracked_lost + self.tail_lost

    def settle(self, head: int) -> None:
        """End of the run: the server said its head is `head`; whatever we never got up to it is lost."""
        self.tail_lost = max(0, head - self.last)


# ---------------------------------------------------------------------------------------------
# Measurements, shared by all users (one event loop: no locks).


def new_histogram() -> HdrHistogram:
    return HdrHistogram(1, HIST_HIGHEST_US, HIST_DIGITS)


def record_seconds(hist: HdrHistogram, seconds: float) -> None:
    """Record a duration in µs, clamped to the histogram's range (a clock step can go negative)."""
    hist.record_value(min(HIST_HIGHEST_US, max(1, round(seconds * 1_000_000))))


@dataclass
class Stats:
    """Everything the run measures. `SimUser`s write to it; the report reads it."""

    ttfd: HdrHistogram = field(default_factory=new_histogram)          # per turn
    delivery: HdrHistogram = field(default_factory=new_histogram)      # per live event
    resume_delivery: HdrHistogram = field(default_factory=new_histogram)  # per replayed event
    turn_time: HdrHistogram = field(default_factory=new_histogram)     # user_message → turn.completed
    errors: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    turns_started: int = 0
    turns_completed: int = 0     # turn.completed with a reason in COMPLETED_REASONS
    turns_failed: int = 0        # turn.completed with any other reason
    garbled_turns: int = 0       # turn.completed whose final_answer is not the answer.delta text delivered
    events: int = 0
    reconnects: int = 0          # drops we injected
    resent: int = 0              # commands re-sent with the same id after a reconnect
    duplicate_acks: int = 0      # ... that the server had already received
    asks_answered: int = 0
    events_per_s: list[int] = field(default_factory=list)   # by whole second since the start
    turns_per_s: list[int] = field(default_factory=list)

    def bucket(self, series: list[int], offset_s: float) -> None:
        i = max(0, int(offset_s))
        if i >= len(series):
            series.extend([0] * (i + 1 - len(series)))
        series[i] += 1

    @property
    def turns_ended(self) -> int:
        return self.turns_completed + self.turns_failed


# ---------------------------------------------------------------------------------------------
# One simulated user.


@dataclass
class _Turn:
    message_id: str
    started_at: float                     # monotonic, first send of the user_message
    turn_id: str | None = None
    first_delta_at: float | None = None
    answer: list[str] = field(default_factory=list)   # the answer.delta text delivered, in order


class SimUser:
    """One simulated user: frames and times in, frames out, measurements into `stats`.

    Feed it `connected()`, `receive(raw, mono, wall)`, `due(mono)` and `disconnected()`; send
    what they return, in order. `mono` is a monotonic clock (turn timing), `wall` the unix time
    compared with the events' `ts`. Stops starting turns once `mono ≥ send_until`; `finished`
    once its last turn ended and it has seen every event up to the head.
    """

    def __init__(
        self,
        stats: Stats,
        *,
        send_until: float,
        started_at: float,
        message: str = DEFAULT_MESSAGE,
        new_id: Callable[[], str] = new_frame_id,
    ) -> None:
        self.stats = stats
        self.send_until = send_until
        self.started_at = started_at      # the run's start: for the per-second series
        self.message = message
        self.session = ClientSession(new_id=new_id)
        self.tracker = SeqTracker()
        self.turn: _Turn | None = None
        self.verifying = False            # past the deadline, last turn over: waiting for the head
        self.head: int | None = None      # the conversation's head reported while verifying
        self.finished = False
        self.verified = False             # every event up to the server's final head was received
        self.fatal: str | None = None
        self.replay_until = 0             # seqs ≤ this on this connection are a resume's backlog
        # `--cut-fraction`: the first answer.delta received at or after this time asks the shell to
        # cut the connection (`cut_due`), so the cut lands mid-answer, once.
        self.cut_after: float | None = None
        self.cut_due = False
        self._retry_at: dict[str, float] = {}   # frame id → when to send it again (rate limited)

    @property
    def conversation_id(self) -> str | None:
        return self.session.conversation_id

    # -- connection lifecycle ---------------------------------------------------------------------

    def connected(self) -> list[ClientFrame]:
        self.session.connected()
        return [out.frame for out in self.session.outputs() if isinstance(out, Send)]

    def disconnected(self) -> None:
        self.session.disconnected()
        self.session.outputs()  # only a lost `cancel` would be reported, and a user never cancels

    def abandon(self) -> None:
        """The run is over for this user (hard deadline): settle what can be settled."""
        if self.verifying and self.head is not None:
            self.tracker.settle(self.head)

    # -- inputs --------------------------------------------------------------------------------------

    def receive(self, raw: str | bytes, mono: float, wall: float) -> list[ClientFrame]:
        try:
            frame = decode_server_frame(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.stats.errors["client.unreadable_frame"] += 1
            return []
        match frame:
            case Event() if frame.conversation_id != self.session.conversation_id:
                self.stats.errors["client.foreign_event"] += 1
                return []
            case Event():
                # Judge the server's stream as it arrives; the session still sees every event, since
                # it alone decides what is delivered (a repeat may be the replay a gap asked for).
                self.tracker.observe(frame.seq)
            case ErrorFrame():
                self.stats.errors[str(frame.code)] += 1
        self.session.receive_frame(frame)
        return self._react(mono, wall)

    def due(self, mono: float) -> list[ClientFrame]:
        """Frames whose rate-limit pause is over."""
        for frame_id, at in list(self._retry_at.items()):
            if mono >= at:
                del self._retry_at[frame_id]
                self.session.retry(frame_id)
        return self._react(mono, wall=0.0)  # a retry only sends: no event to time

    # -- the session's outputs ------------------------------------------------------------------------

    def _react(self, mono: float, wall: float) -> list[ClientFrame]:
        frames: list[ClientFrame] = []
        while outputs := self.session.outputs():  # reacting may issue commands: their frames follow
            for output in outputs:
                self._on_output(output, frames, mono, wall)
        return frames

    def _on_output(self, output: Output, frames: list[ClientFrame], mono: float, wall: float) -> None:
        stats = self.stats
        match output:
            case Send(frame=frame, resend=resend):
                frames.append(frame)
                stats.resent += resend
            case Event():
                self._on_event(output, mono, wall)
            case Opened() | Resumed() if not self.verifying:
                if self.turn is None:
                    self._next_turn(mono)
            case Resumed(head=head):
                self._on_head(head)  # a reconnect while verifying: a fresh head
            case Subscribed(head=head):
                self.replay_until = head
            case Head(head=head):
                self._on_head(head)
            case Acked(status="duplicate", resent=True):
                stats.duplicate_acks += 1
            case RetryLater(frame=frame, pause_s=pause_s):
                self._retry_at[frame.id] = mono + pause_s   # RETRY_PAUSE_S, or a store outage's retry_after_ms
            case Fatal(reason=reason):
                self.fatal = reason
                self.finished = True
            # A command the server refused leaves its turn incomplete: the result counts it.

    def _on_event(self, event: Event, mono: float, wall: float) -> None:
        stats = self.stats
        stats.events += 1
        stats.bucket(stats.events_per_s, mono - self.started_at)
        hist = stats.resume_delivery if event.seq <= self.replay_until else stats.delivery
        record_seconds(hist, wall - event.ts)
        if isinstance(event.data, dict):
            return  # a kind this version does not know: it counts, it drives nothing
        self._on_turn_event(event.data, mono)
        if self.verifying and self.head is not None and self.session.last_seq >= self.head:
            self.finished = self.verified = True

    def _on_turn_event(self, data: Payload, mono: float) -> None:
        turn = self.turn
        if turn is None:
            return
        match data:
            case TurnStarted(turn_id=turn_id, user_message_id=message_id):
                if message_id == turn.message_id:
                    turn.turn_id = turn_id
            case ThinkingDelta(turn_id=turn_id) | AnswerDelta(turn_id=turn_id) if turn_id == turn.turn_id:
                if turn.first_delta_at is None:
                    turn.first_delta_at = mono
                    record_seconds(self.stats.ttfd, mono - turn.started_at)
                if isinstance(data, AnswerDelta):
                    turn.answer.append(data.text)
                    if self.cut_after is not None and mono >= self.cut_after:
                        self.cut_after, self.cut_due = None, True
            case AskUser(turn_id=turn_id, ask_id=ask_id, options=options) if turn_id == turn.turn_id:
                self.stats.asks_answered += 1
                self.session.answer(ask_id, options[0] if options else "yes")
            case TurnCompleted(turn_id=turn_id, reason=reason, final_answer=final) if turn_id == turn.turn_id:
                stats = self.stats
                stats.reasons[str(reason)] += 1
                # What the user read must be the answer the turn ended with (docs/design.md#guarantees):
                # a delta lost, doubled or altered on the way shows here even when the seqs look right.
                if reason in COMPLETED_REASONS and "".join(turn.answer) != final:
                    stats.garbled_turns += 1
                if reason in COMPLETED_REASONS:
                    stats.turns_completed += 1
                else:
                    stats.turns_failed += 1
                stats.bucket(stats.turns_per_s, mono - self.started_at)
                record_seconds(stats.turn_time, mono - turn.started_at)
                self.turn = None
                self._next_turn(mono)

    # -- what the user does ---------------------------------------------------------------------------

    def _next_turn(self, mono: float) -> None:
        if self.finished:
            return
        if mono >= self.send_until:
            self.verifying = True
            self.session.check_head()  # finished once every event up to it arrived (or the run ends)
            return
        self.turn = _Turn(self.session.user_message(self.message), mono)
        self.stats.turns_started += 1

    def _on_head(self, head: int) -> None:
        self.head = head
        if self.session.last_seq >= head:
            self.finished = self.verified = True
