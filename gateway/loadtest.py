"""`reactgate loadtest` — many simulated users against one gateway on this machine (SPEC §9).

Each simulated user is one WebSocket connection holding one conversation: it opens a new
conversation, subscribes, and sends `user_message` turns back to back (answering any `ask_user`
with its first option) until the duration is over; then it lets its last turn finish and checks
that it saw every event up to the conversation's head.

What it measures, and why it can be trusted:

- **Correctness (SPEC guarantee 5).** `SeqTracker` classifies every event by its `seq`. A resume
  subscribes with `after_seq` = the highest seq seen, so the server owes exactly the events after
  it: any seq seen twice is a *duplicate* (never an expected replay overlap), a seq below the
  highest seen that fills an earlier gap is *out of order*, and a gap never filled — or a head
  the stream never reached at the end — is *lost*. All three must be 0, and every turn must
  complete, or the command exits 1.
- **Time to first delta** per turn: from the first send of the `user_message` (a re-send after a
  reconnect keeps the same id *and* the original start time, so an outage counts against it) to
  the first `thinking.delta`/`answer.delta` of that turn.
- **Delivery latency** per event: client receive time − the event's `ts` (same machine, same
  clock). `ts` is when the event was made — for coalesced deltas, when the lane's first delta of
  the batch arrived — so it includes coalescing (`flush_interval_ms`), the durable write, and the
  send queue. Events replayed after a reconnect (seq ≤ the head the subscribe ack reported) go to
  a separate *resume* histogram: they waited through the outage by design.
- **`--reconnect-rate P`**: each user drops its connection abruptly (`transport.abort()`, no close
  frame) as a Poisson process of rate P per second — the time to the next drop is exponential with
  mean 1/P s, drawn afresh after each reconnect. It then reconnects at once, re-opens, subscribes
  after its last seen seq, and re-sends every unacked command with the same id (the server acks a
  repeat `duplicate`, SPEC §6 Idempotency).

Load goes only to a loopback address literal (127.0.0.0/8 or ::1): this is a tool to measure a
gateway on this machine, never one to aim at somebody else's. Every loop is bounded: users stop
starting turns at `--duration`, everything still running is cancelled `--drain-timeout` seconds
later.

`SimUser` (one user's protocol logic) and `SeqTracker` are plain classes with no socket, clock or
event loop; `LoadRunner` is the asyncio shell that moves frames between them and real sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import html
import ipaddress
import math
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import msgspec
from hdrh.histogram import HdrHistogram
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.typing import Subprotocol

from protocol.events import Event, payload_builtins
from protocol.frames import (
    SUBPROTOCOL,
    Ack,
    AnswerFrame,
    ErrorCode,
    ErrorFrame,
    Open,
    Pong,
    Subscribe,
    UserMessageFrame,
    decode_server_frame,
)

DEFAULT_URL: Final = "ws://127.0.0.1:8765/ws"
DEFAULT_MESSAGE: Final = "What is the weather in Paris?"
DELTA_EVENTS: Final = frozenset({"thinking.delta", "answer.delta"})
# A turn that ended with one of these reasons delivered an answer; any other reason is a failed turn.
COMPLETED_REASONS: Final = frozenset({"complete", "exit", "salvaged"})
# Errors after which this user cannot go on (its conversation is not ours, or cannot be opened).
FATAL_ERRORS: Final = frozenset({ErrorCode.FORBIDDEN, ErrorCode.NOT_FOUND, ErrorCode.UNAUTHORIZED})
# Errors that end a subscription server-side; resuming after our last seen seq loses nothing.
RESUBSCRIBE_ERRORS: Final = frozenset({ErrorCode.SLOW_CONSUMER, ErrorCode.INTERNAL})
RATE_LIMIT_RETRY_S: Final = 0.5
RECONNECT_PAUSE_S: Final = (0.0, 0.05, 0.2, 0.5, 1.0)   # after the n-th failed connect in a row
CONNECT_TIMEOUT_S: Final = 10.0
TICK_S: Final = 0.25
# Latencies are recorded in µs, from 1 µs to 1 h, with 3 significant digits.
HIST_HIGHEST_US: Final = 3_600_000_000
HIST_DIGITS: Final = 3
# A jump in seq larger than this is not remembered seq by seq (it could never be filled anyway).
MAX_TRACKED_GAP: Final = 100_000
PRINTED_PERCENTILES: Final = (50.0, 95.0, 99.0)
EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2


# ---------------------------------------------------------------------------------------------
# Where load may go.


class NotLoopback(ValueError):
    """The URL names a host that is not a loopback address literal."""


def require_loopback(url: str) -> str:
    """Return `url` if it is a ws:// or wss:// URL whose host is a loopback IP literal, else raise.

    Names (even `localhost`) are refused rather than resolved: what a name resolves to is not
    ours to check, and a load test aimed at the wrong machine is a denial of service.
    """
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError as exc:
        raise NotLoopback(f"not a valid URL {url!r}: {exc}") from None
    if parts.scheme not in ("ws", "wss"):
        raise NotLoopback(f"the URL must start with ws:// or wss://, got {url!r}")
    host = parts.hostname or ""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise NotLoopback(
            f"refusing to send load to {host or '(no host)'!r}: the load tester only targets a loopback "
            "address literal on this machine (127.0.0.1 or [::1]); names such as 'localhost' are not resolved"
        )
    return url


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


@dataclass(frozen=True)
class Summary:
    """Percentiles of one histogram, in milliseconds."""

    count: int
    p50: float
    p95: float
    p99: float
    max: float
    mean: float


def summarize(hist: HdrHistogram) -> Summary:
    if hist.get_total_count() == 0:
        return Summary(0, math.nan, math.nan, math.nan, math.nan, math.nan)
    at = [hist.get_value_at_percentile(p) / 1000 for p in PRINTED_PERCENTILES]
    return Summary(hist.get_total_count(), at[0], at[1], at[2], hist.get_max_value() / 1000,
                   hist.get_mean_value() / 1000)


# The classic HdrHistogram plot: x = log10(1 / (1 - q)), so 90 %, 99 %, 99.9 % … are equally spaced.
CURVE_PERCENTILES: Final = (0.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 97.5, 99.0, 99.5, 99.9, 99.95, 99.99)
CURVE_X_MAX: Final = 5.0  # where the max is drawn (the 99.999th percentile's position)


def percentile_curve(hist: HdrHistogram) -> list[tuple[float, float]]:
    """(x, ms) points: x = log10(1/(1-q)) for each percentile, then the max at CURVE_X_MAX."""
    if hist.get_total_count() == 0:
        return []
    points = [(math.log10(100.0 / (100.0 - p)), hist.get_value_at_percentile(p) / 1000) for p in CURVE_PERCENTILES]
    points.append((CURVE_X_MAX, hist.get_max_value() / 1000))
    return points


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
# One simulated user, without I/O.


Frame = Open | Subscribe | UserMessageFrame | AnswerFrame


def new_frame_id() -> str:
    return uuid.uuid4().hex


@dataclass
class _Pending:
    """An unacked command: re-sent with the same id on the next connection."""

    frame: UserMessageFrame | AnswerFrame
    sent: bool = False
    times_sent: int = 0
    retry_at: float | None = None   # rate limited: send again at this time


@dataclass
class _Turn:
    message_id: str
    started_at: float                     # monotonic, first send of the user_message
    turn_id: str | None = None
    first_delta_at: float | None = None


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
        self.new_id = new_id
        self.tracker = SeqTracker()
        self.conversation_id: str | None = None
        self.ready = False
        self.turn: _Turn | None = None
        self.pending: dict[str, _Pending] = {}
        self.verifying = False            # past the deadline, last turn over: waiting for the head
        self.head: int | None = None      # the conversation's head reported while verifying
        self.finished = False
        self.fatal: str | None = None
        self.replay_until = 0             # seqs ≤ this on this connection are a resume's backlog
        self._open_id: str | None = None
        self._subscribe_id: str | None = None
        self._verify_id: str | None = None

    # -- connection lifecycle ---------------------------------------------------------------------

    def connected(self) -> list[Frame]:
        self.ready = False
        self._open_id = self.new_id()
        return [Open(id=self._open_id, conversation_id=self.conversation_id)]

    def disconnected(self) -> None:
        self.ready = False
        self._open_id = self._subscribe_id = None
        for pending in self.pending.values():
            pending.sent = False

    def abandon(self) -> None:
        """The run is over for this user (hard deadline): settle what can be settled."""
        if self.verifying and self.head is not None:
            self.tracker.settle(self.head)

    # -- frames from the gateway ------------------------------------------------------------------

    def receive(self, raw: str | bytes, mono: float, wall: float) -> list[Frame]:
        try:
            frame = decode_server_frame(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.stats.errors["client.unreadable_frame"] += 1
            return []
        match frame:
            case Event():
                return self._on_event(frame, mono, wall)
            case Ack():
                return self._on_ack(frame, mono)
            case ErrorFrame():
                return self._on_error(frame, mono)
            case Pong():
                return []
        return []  # pragma: no cover - decode_server_frame returns only the types above

    def due(self, mono: float) -> list[Frame]:
        """Commands whose rate-limit pause is over."""
        if not self.ready:
            return []
        out: list[Frame] = []
        for pending in self.pending.values():
            if pending.retry_at is not None and mono >= pending.retry_at:
                pending.retry_at = None
                out.append(self._send(pending))
        return out

    def _on_ack(self, ack: Ack, mono: float) -> list[Frame]:
        if ack.id == self._open_id:
            return self._on_opened(ack, mono)
        if ack.id == self._subscribe_id:
            self.replay_until = ack.last_seq or 0
            return []
        if ack.id == self._verify_id:
            return self._on_head(ack.last_seq or 0)
        pending = self.pending.pop(ack.id, None)
        if pending is not None and ack.status == "duplicate" and pending.times_sent > 1:
            self.stats.duplicate_acks += 1
        return []

    def _on_opened(self, ack: Ack, mono: float) -> list[Frame]:
        if ack.conversation_id is None or (
            self.conversation_id is not None and ack.conversation_id != self.conversation_id
        ):
            return self._fail(f"open acked with conversation {ack.conversation_id!r}")
        self.conversation_id = ack.conversation_id
        self.ready = True
        self._subscribe_id = self.new_id()
        out: list[Frame] = [
            Subscribe(id=self._subscribe_id, conversation_id=self.conversation_id, after_seq=self.tracker.last)
        ]
        for pending in self.pending.values():
            if pending.retry_at is None:
                if pending.times_sent > 0:
                    self.stats.resent += 1
                out.append(self._send(pending))
        if self.verifying:
            out += self._on_head(ack.last_seq or 0)    # a reconnect while verifying: a fresh head
        elif self.turn is None:
            out += self._next_turn(mono)
        return out

    def _on_error(self, error: ErrorFrame, mono: float) -> list[Frame]:
        self.stats.errors[str(error.code)] += 1
        if error.id is not None and error.id in (self._open_id, self._verify_id):
            return self._fail(f"open refused: {error.code}: {error.message}")
        if error.code in FATAL_ERRORS:
            return self._fail(f"{error.code}: {error.message}")
        if error.code in RESUBSCRIBE_ERRORS and self.ready and self.conversation_id is not None:
            self._subscribe_id = self.new_id()
            return [Subscribe(id=self._subscribe_id, conversation_id=self.conversation_id,
                              after_seq=self.tracker.last)]
        if error.id is not None and error.id in self.pending:
            if error.code is ErrorCode.RATE_LIMITED:
                self.pending[error.id].retry_at = mono + RATE_LIMIT_RETRY_S
            else:  # the server will never act on it: the turn it belongs to cannot complete
                del self.pending[error.id]
        return []

    def _fail(self, reason: str) -> list[Frame]:
        self.fatal = reason
        self.finished = True
        return []

    # -- events -------------------------------------------------------------------------------------

    def _on_event(self, frame: Event, mono: float, wall: float) -> list[Frame]:
        if frame.conversation_id != self.conversation_id:
            self.stats.errors["client.foreign_event"] += 1
            return []
        if self.tracker.observe(frame.seq) is Seen.DUPLICATE:
            return []
        stats = self.stats
        stats.events += 1
        stats.bucket(stats.events_per_s, mono - self.started_at)
        hist = stats.resume_delivery if frame.seq <= self.replay_until else stats.delivery
        record_seconds(hist, wall - frame.ts)
        out = self._on_turn_event(frame.event, payload_builtins(frame.data), mono)
        if self.verifying and self.head is not None and self.tracker.last >= self.head:
            self.finished = True
        return out

    def _on_turn_event(self, name: str, data: dict[str, Any], mono: float) -> list[Frame]:
        turn = self.turn
        if turn is None:
            return []
        turn_id = data.get("turn_id")
        if name == "turn.started":
            if data.get("user_message_id") == turn.message_id:
                turn.turn_id = str(turn_id)
            return []
        if turn.turn_id is None or turn_id != turn.turn_id:
            return []
        if name in DELTA_EVENTS:
            if turn.first_delta_at is None:
                turn.first_delta_at = mono
                record_seconds(self.stats.ttfd, mono - turn.started_at)
            return []
        if name == "ask_user":
            options = data.get("options") or []
            answer = str(options[0]) if options else "yes"
            self.stats.asks_answered += 1
            return self._command(AnswerFrame(id=self.new_id(), conversation_id=self._cid(),
                                             ask_id=str(data.get("ask_id", "")), answer=answer))
        if name == "turn.completed":
            reason = str(data.get("reason", ""))
            stats = self.stats
            stats.reasons[reason] += 1
            if reason in COMPLETED_REASONS:
                stats.turns_completed += 1
            else:
                stats.turns_failed += 1
            stats.bucket(stats.turns_per_s, mono - self.started_at)
            record_seconds(stats.turn_time, mono - turn.started_at)
            self.turn = None
            return self._next_turn(mono)
        return []

    # -- what the user sends --------------------------------------------------------------------

    def _next_turn(self, mono: float) -> list[Frame]:
        if self.finished:
            return []
        if mono >= self.send_until:
            return self._verify()
        message_id = self.new_id()
        self.turn = _Turn(message_id, mono)
        self.stats.turns_started += 1
        return self._command(UserMessageFrame(id=message_id, conversation_id=self._cid(), text=self.message))

    def _verify(self) -> list[Frame]:
        """Ask for the head; finished once every event up to it arrived (or the run ends)."""
        self.verifying = True
        if not self.ready:
            return []  # the next open ack carries the head
        self._verify_id = self.new_id()
        return [Open(id=self._verify_id, conversation_id=self._cid())]

    def _on_head(self, head: int) -> list[Frame]:
        self.head = head
        if self.tracker.last >= head:
            self.finished = True
        return []

    def _command(self, frame: UserMessageFrame | AnswerFrame) -> list[Frame]:
        pending = _Pending(frame)
        self.pending[frame.id] = pending
        return [self._send(pending)] if self.ready else []

    def _send(self, pending: _Pending) -> Frame:
        pending.sent = True
        pending.times_sent += 1
        return pending.frame

    def _cid(self) -> str:
        assert self.conversation_id is not None
        return self.conversation_id


# ---------------------------------------------------------------------------------------------
# The asyncio shell.


@dataclass(frozen=True)
class LoadConfig:
    url: str = DEFAULT_URL
    conversations: int = 10
    duration_s: float = 10.0
    reconnect_rate: float = 0.0      # abrupt drops per second per user (Poisson)
    drain_timeout_s: float = 30.0    # after the duration: time for the last turns to end
    token: str | None = None
    message: str = DEFAULT_MESSAGE
    script: Path | None = None
    report: Path | None = None
    seed: int | None = None

    def check(self) -> None:
        require_loopback(self.url)
        if self.conversations < 1:
            raise ValueError("--conversations must be at least 1")
        if not self.duration_s > 0 or not math.isfinite(self.duration_s):
            raise ValueError("--duration must be a positive number of seconds")
        if self.reconnect_rate < 0 or not math.isfinite(self.reconnect_rate):
            raise ValueError("--reconnect-rate must be ≥ 0 (drops per second per conversation)")
        if self.drain_timeout_s < 0 or not math.isfinite(self.drain_timeout_s):
            raise ValueError("--drain-timeout must be ≥ 0")


@dataclass
class Result:
    config: LoadConfig
    stats: Stats
    users: list[SimUser]
    elapsed_s: float
    script_info: ScriptInfo | None = None

    @property
    def lost(self) -> int:
        return sum(u.tracker.lost for u in self.users)

    @property
    def duplicated(self) -> int:
        return sum(u.tracker.duplicated for u in self.users)

    @property
    def out_of_order(self) -> int:
        return sum(u.tracker.out_of_order for u in self.users)

    @property
    def incomplete_turns(self) -> int:
        return self.stats.turns_started - self.stats.turns_ended

    @property
    def fatal(self) -> list[str]:
        return [u.fatal for u in self.users if u.fatal]

    def failures(self) -> list[str]:
        """Why the run failed; empty when it passed."""
        out = []
        for name, n in (("lost", self.lost), ("duplicated", self.duplicated), ("out_of_order", self.out_of_order),
                        ("incomplete_turns", self.incomplete_turns), ("failed_turns", self.stats.turns_failed)):
            if n:
                out.append(f"{name}={n}")
        if self.stats.turns_ended == 0:
            out.append("no turn completed")
        if self.fatal:
            out.append(f"{len(self.fatal)} user(s) stopped: {self.fatal[0]}")
        return out


class LoadRunner:
    def __init__(self, config: LoadConfig, progress: Progress | None = None) -> None:
        self.config = config
        self.stats = Stats()
        self.rng = random.Random(config.seed)
        self.progress = progress
        self.users: list[SimUser] = []
        self._sockets: dict[int, ClientConnection] = {}
        self._dropping: set[int] = set()   # users whose connection we are aborting on purpose

    async def run(self) -> Result:
        cfg = self.config
        start = time.monotonic()
        send_until = start + cfg.duration_s
        hard_deadline = send_until + cfg.drain_timeout_s
        self.users = [
            SimUser(self.stats, send_until=send_until, started_at=start, message=cfg.message)
            for _ in range(cfg.conversations)
        ]
        tasks = [asyncio.create_task(self._drive(i, send_until, hard_deadline)) for i in range(len(self.users))]
        ticker = asyncio.create_task(self._tick(start, send_until, hard_deadline))
        try:
            await asyncio.wait(tasks, timeout=max(0.0, hard_deadline - time.monotonic()))
        finally:
            for task in (*tasks, ticker):
                task.cancel()
            await asyncio.gather(*tasks, ticker, return_exceptions=True)
        for user in self.users:
            if not user.finished:
                user.abandon()
        elapsed = time.monotonic() - start
        self._show(elapsed, start, send_until, final=True)
        return Result(cfg, self.stats, self.users, elapsed)

    async def _drive(self, index: int, send_until: float, hard_deadline: float) -> None:
        """One user's connection loop: connect, play, and on a drop reconnect at once."""
        user = self.users[index]
        headers = {"Authorization": f"Bearer {self.config.token}"} if self.config.token else None
        failures, last_failure = 0, ""
        while not user.finished and time.monotonic() < hard_deadline:
            if user.conversation_id is None and failures and time.monotonic() >= send_until:
                user.fatal = f"never connected: {last_failure}"  # nothing to drain: do not wait
                user.finished = True
                return
            dropper: asyncio.Task[None] | None = None
            try:
                async with connect(
                    self.config.url, subprotocols=[Subprotocol(SUBPROTOCOL)], additional_headers=headers,
                    open_timeout=CONNECT_TIMEOUT_S, max_size=None, compression=None,
                ) as ws:
                    failures = 0
                    self._sockets[index] = ws
                    if self.config.reconnect_rate > 0:
                        dropper = asyncio.create_task(self._drop_later(index, ws))
                    await self._send(ws, user.connected())
                    async for raw in ws:
                        await self._send(ws, user.receive(raw, time.monotonic(), time.time()))
                        if user.finished:
                            break
                    if user.finished:
                        await ws.close()
                        return
                    self.stats.errors["client.closed_by_server"] += 1
            except InvalidStatus as exc:
                status = exc.response.status_code
                self.stats.errors[f"client.http_{status}"] += 1
                if status in (400, 401, 403, 404):
                    user.fatal = f"handshake refused with HTTP {status}"
                    user.finished = True
                    return
                failures, last_failure = failures + 1, f"HTTP {status}"

            except InvalidURI as exc:
                user.fatal = str(exc)
                user.finished = True
                return
            except ConnectionClosed:
                if index not in self._dropping:
                    self.stats.errors["client.connection_lost"] += 1
            except (OSError, InvalidHandshake, TimeoutError) as exc:
                self.stats.errors["client.connect_failed"] += 1
                failures, last_failure = failures + 1, str(exc) or type(exc).__name__
            finally:
                if dropper is not None:
                    dropper.cancel()
                self._sockets.pop(index, None)
                self._dropping.discard(index)
                user.disconnected()
            if failures:
                pause = RECONNECT_PAUSE_S[min(failures, len(RECONNECT_PAUSE_S) - 1)]
                await asyncio.sleep(min(pause, max(0.0, hard_deadline - time.monotonic())))

    async def _drop_later(self, index: int, ws: ClientConnection) -> None:
        await asyncio.sleep(self.rng.expovariate(self.config.reconnect_rate))
        if self.users[index].finished:
            return
        self._dropping.add(index)
        self.stats.reconnects += 1
        ws.transport.abort()  # no close frame: what a crashed client or a cut network looks like

    @staticmethod
    async def _send(ws: ClientConnection, frames: Sequence[Frame]) -> None:
        for frame in frames:
            await ws.send(msgspec.json.encode(frame).decode())

    async def _tick(self, start: float, send_until: float, hard_deadline: float) -> None:
        """Progress display and rate-limit retries, until the hard deadline."""
        while (now := time.monotonic()) < hard_deadline:
            for index, ws in list(self._sockets.items()):
                frames = self.users[index].due(now)
                if frames:
                    with contextlib.suppress(ConnectionClosed):
                        await self._send(ws, frames)
            self._show(now - start, start, send_until)
            await asyncio.sleep(TICK_S)

    def _show(self, elapsed: float, start: float, send_until: float, *, final: bool = False) -> None:
        if self.progress is None or not self.progress.task_ids:
            return
        stats, duration = self.stats, self.config.duration_s
        series = stats.events_per_s
        last_full = int(elapsed) - 1   # the last whole second
        eps = series[last_full] if 0 <= last_full < len(series) else 0
        if final:
            eps = round(stats.events / elapsed) if elapsed > 0 else 0
        phase = "done" if final else ("sending" if elapsed < duration else "draining")
        self.progress.update(
            self.progress.task_ids[0], completed=min(elapsed, duration), phase=phase,
            clock=f"{elapsed:5.1f}/{duration:.0f} s", turns=stats.turns_ended, eps=eps,
            users=sum(not u.finished for u in self.users),
        )
        self.progress.refresh()


# ---------------------------------------------------------------------------------------------
# --script: what the server is expected to play (the load tester cannot choose the server's model).


@dataclass(frozen=True)
class ScriptInfo:
    path: str
    rounds: int
    loop: bool
    chunks_per_round: tuple[int, ...]

    @property
    def chunks_per_pass(self) -> int:
        return sum(self.chunks_per_round)


def load_script_info(path: Path) -> ScriptInfo:
    from actors.llm.scripts import load_script  # pydantic only; raises ScriptError naming the field

    script = load_script(path)
    return ScriptInfo(str(path), len(script.rounds), script.loop, tuple(len(r.chunks) for r in script.rounds))


# ---------------------------------------------------------------------------------------------
# Output: the terminal summary and the HTML report.


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


LATENCIES: Final = (
    ("time to first delta", "ttfd"),
    ("delivery (live)", "delivery"),
    ("delivery (resumed backlog)", "resume_delivery"),
    ("turn (message → completed)", "turn_time"),
)


def latency_rows(stats: Stats) -> list[tuple[str, Summary]]:
    return [(label, summarize(getattr(stats, name))) for label, name in LATENCIES]


def counts_line(result: Result) -> str:
    """One plain line a script can parse."""
    s = result.stats
    return (
        f"lost={result.lost} duplicated={result.duplicated} out_of_order={result.out_of_order} "
        f"turns={s.turns_ended} completed_turns={s.turns_completed} failed_turns={s.turns_failed} "
        f"incomplete_turns={result.incomplete_turns} events={s.events} reconnects={s.reconnects}"
    )


def summary_rows(result: Result) -> list[tuple[str, str]]:
    """Throughput and outcome rows, shared by the terminal summary and the HTML report."""
    stats, elapsed = result.stats, result.elapsed_s

    def rate(n: int) -> str:
        return f"{n / elapsed:.1f}" if elapsed > 0 else "-"

    return [
        ("turns ended", str(stats.turns_ended)),
        ("turns/s", rate(stats.turns_ended)),
        ("events", str(stats.events)),
        ("events/s", rate(stats.events)),
        ("reconnects (injected)", str(stats.reconnects)),
        ("commands re-sent / acked duplicate", f"{stats.resent} / {stats.duplicate_acks}"),
        ("asks answered", str(stats.asks_answered)),
        ("turn reasons", ", ".join(f"{k}={v}" for k, v in sorted(stats.reasons.items())) or "-"),
        ("errors", ", ".join(f"{k}={v}" for k, v in sorted(stats.errors.items())) or "none"),
    ]


def print_summary(result: Result, console: Console) -> None:
    stats, elapsed = result.stats, result.elapsed_s
    latency = Table(title="latency (ms)", title_justify="left")
    for column in ("", "count", "p50", "p95", "p99", "max"):
        latency.add_column(column, justify="left" if not column else "right")
    for label, s in latency_rows(stats):
        latency.add_row(label, str(s.count), _ms(s.p50), _ms(s.p95), _ms(s.p99), _ms(s.max))
    console.print(latency)

    totals = Table(title="throughput and correctness", title_justify="left", show_header=False)
    totals.add_column(justify="left")
    totals.add_column(justify="right")

    rows = [("conversations", str(result.config.conversations)), ("elapsed (s)", f"{elapsed:.2f}"),
            *summary_rows(result)]
    for label, value in rows:
        totals.add_row(label, value)
    for label, n in (("lost", result.lost), ("duplicated", result.duplicated),
                     ("out of order", result.out_of_order), ("incomplete turns", result.incomplete_turns),
                     ("failed turns", stats.turns_failed)):
        totals.add_row(label, f"[{'green' if n == 0 else 'bold red'}]{n}[/]")
    console.print(totals)
    if result.script_info is not None:
        info = result.script_info
        console.print(f"script {info.path}: {info.rounds} rounds, chunks per round {list(info.chunks_per_round)}, "
                      f"{info.chunks_per_pass} per pass (what the server plays if started with this script)",
                      markup=False)
    console.print(counts_line(result), markup=False, highlight=False, soft_wrap=True)
    failures = result.failures()
    if failures:
        console.print(f"FAIL: {'; '.join(failures)}", style="bold red", markup=False)
    else:
        console.print("PASS", style="bold green")


# -- SVG ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Series:
    name: str
    color: str
    points: Sequence[tuple[float, float]]


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 × 10ⁿ that is ≥ value (axis maxima that read well)."""
    if not value > 0 or not math.isfinite(value):
        return 1.0
    scale = 10.0 ** math.floor(math.log10(value))
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        if step * scale >= value * (1 - 1e-12):  # float noise must not push 100 to 200
            return step * scale
    return 10.0 * scale  # pragma: no cover


def svg_chart(
    title: str,
    series: Sequence[Series],
    *,
    x_max: float,
    x_ticks: Sequence[tuple[float, str]],
    x_label: str,
    y_label: str,
    markers: Sequence[tuple[float, str]] = (),
    width: int = 640,
    height: int = 300,
) -> str:
    """A line chart as an inline SVG string (no scripts, no external resources)."""
    left, right, top, bottom = 64, 16, 34, 48
    pw, ph = width - left - right, height - top - bottom
    y_max = nice_ceiling(max((y for s in series for _, y in s.points), default=0.0))
    x_max = x_max if x_max > 0 else 1.0

    def px(x: float) -> float:
        return left + pw * min(max(x / x_max, 0.0), 1.0)

    def py(y: float) -> float:
        return top + ph * (1.0 - min(max(y / y_max, 0.0), 1.0))

    esc = html.escape
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="{esc(title)}" font-family="sans-serif" font-size="11">',
        f'<text x="{left}" y="18" font-size="13" font-weight="bold">{esc(title)}</text>',
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#ccc"/>',
    ]
    for i in range(6):
        y = y_max * i / 5
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{py(y):.1f}" y2="{py(y):.1f}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:g}</text>')
    for x, label in x_ticks:
        out.append(f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{top}" y2="{top + ph}" stroke="#eee"/>')
        out.append(f'<text x="{px(x):.1f}" y="{top + ph + 15}" text-anchor="middle">{esc(label)}</text>')
    for x, label in markers:
        out.append(f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{top}" y2="{top + ph}" stroke="#999" '
                   'stroke-dasharray="4 3"/>')
        out.append(f'<text x="{px(x) - 4:.1f}" y="{top + ph - 6}" text-anchor="end" fill="#666">'
                   f'{esc(label)}</text>')
    out.append(f'<text x="{left + pw / 2:.1f}" y="{height - 8}" text-anchor="middle">{esc(x_label)}</text>')
    out.append(f'<text transform="translate(14 {top + ph / 2:.1f}) rotate(-90)" text-anchor="middle">'
               f'{esc(y_label)}</text>')
    for n, s in enumerate(series):
        if s.points:
            coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
            out.append(f'<polyline fill="none" stroke="{s.color}" stroke-width="2" points="{coords}"/>')
            out.extend(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{s.color}"/>'
                       for x, y in s.points)
        ly = top + 14 + 14 * n
        out.append(f'<rect x="{left + pw - 150}" y="{ly - 8}" width="10" height="10" fill="{s.color}"/>')
        out.append(f'<text x="{left + pw - 135}" y="{ly + 1}">{esc(s.name)}</text>')
    if not any(s.points for s in series):
        out.append(f'<text x="{left + pw / 2:.1f}" y="{top + ph / 2:.1f}" text-anchor="middle" fill="#999">'
                   'no samples</text>')
    out.append("</svg>")
    return "\n".join(out)


PERCENTILE_TICKS: Final = ((0.0, "0%"), (1.0, "90%"), (2.0, "99%"), (3.0, "99.9%"), (4.0, "99.99%"),
                           (5.0, "max"))


def percentile_chart(title: str, series: Sequence[tuple[str, str, HdrHistogram]]) -> str:
    return svg_chart(
        title, [Series(name, color, percentile_curve(h)) for name, color, h in series],
        x_max=CURVE_X_MAX, x_ticks=PERCENTILE_TICKS, x_label="percentile", y_label="ms",
    )


def timeline_chart(title: str, name: str, color: str, buckets: Sequence[int], duration_s: float) -> str:
    points = [(i + 0.5, float(n)) for i, n in enumerate(buckets)]
    x_max = max(float(len(buckets)), duration_s, 1.0)
    step = max(1, math.ceil(x_max / 10))
    ticks = [(float(t), str(t)) for t in range(0, int(x_max) + 1, step)]
    return svg_chart(title, [Series(name, color, points)], x_max=x_max, x_ticks=ticks,
                     x_label="seconds since start", y_label="per second",
                     markers=[(duration_s, "end of --duration")])


def render_html(result: Result) -> str:
    stats, cfg, elapsed = result.stats, result.config, result.elapsed_s
    esc = html.escape
    failures = result.failures()
    verdict = (f'<p class="fail">FAIL: {esc("; ".join(failures))}</p>' if failures
               else '<p class="pass">PASS: no event lost, duplicated or out of order; every turn completed</p>')

    def table(rows: Sequence[tuple[str, str]], cls: str = "") -> str:
        body = "".join(f"<tr><th>{esc(k)}</th><td{cls}>{esc(v)}</td></tr>" for k, v in rows)
        return f"<table>{body}</table>"

    summary = table([
        ("url", cfg.url),
        ("conversations", str(cfg.conversations)),
        ("duration (s)", f"{cfg.duration_s:g}"),
        ("reconnect rate (drops/s per conversation)", f"{cfg.reconnect_rate:g}"),
        ("elapsed, with drain (s)", f"{elapsed:.2f}"),
        *summary_rows(result),
    ])
    correctness_rows = [("lost", result.lost), ("duplicated", result.duplicated),
                        ("out of order", result.out_of_order), ("incomplete turns", result.incomplete_turns),
                        ("failed turns", stats.turns_failed)]
    correctness = "<table>" + "".join(
        f'<tr><th>{esc(k)}</th><td class="{"ok" if n == 0 else "bad"}">{n}</td></tr>' for k, n in correctness_rows
    ) + "</table>"
    lat_rows = "".join(
        f"<tr><th>{esc(label)}</th><td>{s.count}</td><td>{_ms(s.p50)}</td><td>{_ms(s.p95)}</td>"
        f"<td>{_ms(s.p99)}</td><td>{_ms(s.max)}</td><td>{_ms(s.mean)}</td></tr>"
        for label, s in latency_rows(stats)
    )
    latency = ("<table><tr><th></th><th>count</th><th>p50</th><th>p95</th><th>p99</th><th>max</th>"
               f"<th>mean</th></tr>{lat_rows}</table>")
    if result.script_info is not None:
        info = result.script_info
        script = (f"<p>Script <code>{esc(info.path)}</code>: {info.rounds} round(s){' (loops)' if info.loop else ''}, "
                  f"chunks per round {list(info.chunks_per_round)}, {info.chunks_per_pass} chunks per pass. "
                  "This is what the server streams if it was started with <code>reactgate serve --script</code> "
                  "on this file; the load tester cannot choose the server's model.</p>")
    else:
        script = ("<p>No <code>--script</code> given: the server played whatever model it was started with "
                  "(the demo agent's built-in script with no flags).</p>")
    charts = [
        percentile_chart("time to first delta, by percentile", [("TTFD", "#1f77b4", stats.ttfd)]),
        percentile_chart("delivery latency, by percentile", [
            ("live events", "#2ca02c", stats.delivery), ("resumed backlog", "#ff7f0e", stats.resume_delivery),
        ]),
        timeline_chart("events received per second", "events/s", "#9467bd", stats.events_per_s, cfg.duration_s),
        timeline_chart("turns ended per second", "turns/s", "#d62728", stats.turns_per_s, cfg.duration_s),
    ]
    notes = (
        "<p>Time to first delta: from the first send of a turn's user_message to its first thinking or answer "
        "delta (a re-send after a reconnect keeps the original start). Delivery latency: receive time minus the "
        "event's <code>ts</code> (same machine); events replayed after a reconnect are counted apart. A resume "
        "subscribes after the highest seq seen, so any repeat is a duplicate; a seq below the highest seen that "
        "fills a gap is out of order; a gap never filled, or a head never reached at the end, is lost.</p>"
    )
    generated = time.strftime("%Y-%m-%d %H:%M:%S")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>reactgate load test</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; max-width: 90em; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; }}
th, td {{ border: 1px solid #ddd; padding: 4px 10px; text-align: right; }}
th {{ text-align: left; background: #f4f4f4; font-weight: normal; }}
td.ok {{ color: #1a7f37; font-weight: bold; }} td.bad {{ color: #c00; font-weight: bold; }}
.pass {{ color: #1a7f37; font-weight: bold; }} .fail {{ color: #c00; font-weight: bold; }}
.charts svg {{ margin: 0 1em 1em 0; }}
</style></head><body>
<h1>reactgate load test</h1>
<p>{esc(generated)}</p>
{verdict}
<h2>Correctness</h2>
{correctness}
<h2>Summary</h2>
{summary}
<h2>Latency (ms)</h2>
{latency}
<div class="charts">
{"".join(charts)}
</div>
<h2>Script</h2>
{script}
<h2>How to read this</h2>
{notes}
</body></html>
"""


# ---------------------------------------------------------------------------------------------
# Entry point.


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.fields[phase]:<8}"),
        BarColumn(),
        TextColumn("{task.fields[clock]}"),
        TextColumn("turns {task.fields[turns]}"),
        TextColumn("events/s {task.fields[eps]}"),
        TextColumn("users {task.fields[users]}"),
        console=console,
        auto_refresh=False,
    )


def run_loadtest(config: LoadConfig) -> int:
    """`reactgate loadtest`: exit 0 when every check passed, 1 when one failed, 2 on bad usage."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    out = Console(highlight=False, soft_wrap=True)
    try:
        config.check()
        script_info = load_script_info(config.script) if config.script else None
    except ValueError as exc:  # NotLoopback, bad numbers, ScriptError (names the file and field)
        err.print(f"reactgate loadtest: {exc}", markup=False)
        return EXIT_USAGE
    token = config.token or os.environ.get("REACTGATE_TOKEN") or None
    config = dataclasses.replace(config, token=token)
    progress = _progress(err)
    progress.add_task("load", total=config.duration_s, phase="sending", clock="", turns=0, eps=0,
                      users=config.conversations)
    runner = LoadRunner(config, progress)
    try:
        with progress:
            result = asyncio.run(runner.run())
    except KeyboardInterrupt:
        return 130
    result.script_info = script_info
    print_summary(result, out)
    if config.report is not None:
        try:
            config.report.write_text(render_html(result), encoding="utf-8")
        except OSError as exc:
            err.print(f"reactgate loadtest: cannot write the report: {exc}", markup=False)
            return EXIT_USAGE
        out.print(f"report: {config.report}", markup=False, highlight=False)
    return EXIT_FAILED if result.failures() else EXIT_OK
