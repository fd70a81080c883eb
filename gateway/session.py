"""One WebSocket connection's state: who it is, what it watches, and what it still has to send.

Everything the connection sends goes through one bounded queue drained by one writer task, the
only code that ever awaits this client's socket. Subscription tasks never await the socket:
they append to the queue or, when it is full, pause. That is how one slow client never delays
another, nor the backend's shared event path (docs/wire-protocol.md#11-limits-slow-consumers-drain).
An event that finds the queue empty, the writer idle and the socket keeping up is written at once,
without a wait (`Sink.send_now`): the order is the queue's, as nothing is ahead of it
(docs/design.md#direct-writes).

On overflow every subscription of the connection pauses: its task is cancelled, its queued
events are dropped, and the client gets one `slow_consumer` error per paused conversation with
`last_seq`, the last seq handed to its socket *before* that error frame. Re-subscribing with
`after_seq = last_seq` therefore loses nothing and duplicates nothing (docs/design.md#guarantees).

Control frames (ack, error, pong) are also bounded, with headroom above the event bound: a
client that keeps sending but never reads is closed with 1008 once even that headroom is gone.

An export (docs/wire-protocol.md#export) goes through the same queue, from a task of its own that
fills at most half of the event bound and then waits for the writer to drain it: the export is
paced by this client's socket, never drops a frame, and leaves room for the live subscriptions, so
it cannot make them overflow.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from enum import Enum
from typing import Protocol

from opentelemetry.context import Context
from websockets.asyncio.server import ServerConnection, broadcast
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from actors.hosting.backend import Backend, Export, Forbidden
from actors.identity import Caller, Owner
from actors.store.base import StoreUnavailable
from gateway.limits import BadFrameCounter, SessionLimits, TokenBucket
from gateway.metrics import GatewayMetrics
from gateway.overload import Overload
from protocol.events import ConversationDeleted, Event
from protocol.frames import (
    CloseCode,
    ErrorCode,
    ErrorFrame,
    ExportCompleted,
    ServerFrame,
    encode_event,
    encode_frame,
)

log = logging.getLogger("reactgate.gateway.session")

FORBIDDEN_MESSAGE = "forbidden: no such conversation for this caller"  # same whether or not it exists
SLOW_CONSUMER_MESSAGE = (
    "send queue full: subscription paused; subscribe again with after_seq = last_seq to resume"
)
# A failed backend stream is re-opened after these pauses before the client is told.
RESUBSCRIBE_BACKOFF_S = (0.05, 0.25, 1.0)
# Control frames may exceed the event bound by this much before the connection is closed.
CONTROL_HEADROOM = 64


class Sink(Protocol):
    """What the session needs from a WebSocket connection."""

    async def send(self, message: bytes, *, text: bool | None = None) -> None: ...

    def send_now(self, message: bytes) -> bool:
        """Write a text frame at once if that needs no wait; False: nothing was written."""
        ...

    async def close(self, code: int = 1000, reason: str = "") -> None: ...


class WebSocketSink:
    """A websockets connection as the session's sink.

    `send_now` is websockets' own synchronous write (`broadcast`: the frame goes to the transport,
    which writes it to the socket or buffers it) for the case where `send` would not wait either:
    the connection is open and nothing waits in the transport's buffer. A client reading slower than
    we write leaves bytes there; its frames then queue, and the writer's `send` waits for the drain
    (docs/design.md#direct-writes). It saves a writer wake-up and `send`'s context per event."""

    __slots__ = ("ws",)

    def __init__(self, ws: ServerConnection) -> None:
        self.ws = ws

    async def send(self, message: bytes, *, text: bool | None = None) -> None:
        await self.ws.send(message, text=text)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self.ws.close(code, reason)

    def send_now(self, message: bytes) -> bool:
        ws = self.ws
        if ws.state is not State.OPEN or ws.transport.get_write_buffer_size():
            return False
        try:
            broadcast((ws,), message, text=True, raise_exceptions=True)
        except Exception:   # the transport failed: the writer's `send` meets the closed connection
            return False
        return True


class _Kind(Enum):
    CONTROL = 1
    EVENT = 2
    PAUSED = 3  # a slow_consumer error, encoded when written so it carries the delivered seq
    EXPORT = 4  # an event frame of an export: kept when subscriptions pause


class _Out:
    __slots__ = ("kind", "payload", "seq", "sub", "ts")

    def __init__(
        self, kind: _Kind, payload: bytes = b"", sub: _Subscription | None = None, seq: int = 0, ts: float = 0.0
    ) -> None:
        self.kind = kind
        self.payload = payload
        self.sub = sub
        self.seq = seq
        self.ts = ts


class _Subscription:
    """One watched conversation. Replaced (never reused) when the client subscribes again."""

    __slots__ = ("active", "conversation_id", "delivered", "enqueued", "since", "task")

    def __init__(self, conversation_id: str, after_seq: int) -> None:
        self.conversation_id = conversation_id
        self.since = time.time()    # events made before are history (a replay), not live (gateway/overload.py)
        self.enqueued = after_seq   # only seq > this may be queued: no duplicate within a subscription
        self.delivered = after_seq  # last seq handed to the socket: what slow_consumer reports
        self.active = True
        self.task: asyncio.Task[None] | None = None


class Session:
    resubscribe_backoff_s: tuple[float, ...] = RESUBSCRIBE_BACKOFF_S

    def __init__(
        self,
        sink: Sink,
        owner: Owner,
        backend: Backend,
        limits: SessionLimits,
        metrics: GatewayMetrics,
        *,
        expires_at: float | None = None,
        trace_parent: Context | None = None,
        caller: Caller | None = None,
        overload: Overload | None = None,
    ) -> None:
        self.sink = sink
        self.overload = overload  # told how late every live event reaches this session (docs/design.md#overload)
        self.trace_parent = trace_parent  # the upgrade's W3C trace: its commands' spans join it (docs/design.md#tracing)
        self.owner = owner
        self.caller = caller or Caller.of(owner)  # what the tools of its turns know of who calls
        self.backend = backend
        self.metrics = metrics
        self.max_events = limits.send_queue_frames
        self.max_frames = limits.send_queue_frames + limits.max_conversations_per_connection + CONTROL_HEADROOM
        self.max_watched = limits.max_conversations_per_connection
        self.bucket = TokenBucket(limits.rate_per_s, limits.rate_burst)
        self.bad_frames = BadFrameCounter(limits.bad_frames_before_close)
        self.subs: dict[str, _Subscription] = {}
        self._queue: deque[_Out] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False
        self._close_task: asyncio.Task[None] | None = None
        self._exports: set[asyncio.Task[None]] = set()
        self._writer = asyncio.create_task(self._write(), name="reactgate-session-writer")
        # The token authorizes the connection until its `exp`, not for as long as the socket lives:
        # a revoked user is out within max_token_ttl_s (README.md#security). The client reconnects
        # with a fresh token and resumes after its last seq (docs/wire-protocol.md#6-close-codes).
        self._expiry: asyncio.TimerHandle | None = None
        if expires_at is not None:
            self._expiry = asyncio.get_running_loop().call_later(max(0.0, expires_at - time.time()), self._expire)

    # -- queue --------------------------------------------------------------------------------

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    def send(self, frame: ServerFrame) -> None:
        """Queue a control frame (ack, error, pong). Never awaits the socket."""
        if self._closing:
            return
        if isinstance(frame, ErrorFrame):
            self.metrics.errors.labels(frame.code.value).inc()
            if frame.quota is not None:  # a quota refusal, also by tenant, quota and scope (docs/design.md#quotas)
                self.metrics.quota_refused.labels(self.owner.tenant, frame.quota, frame.scope).inc()
        if len(self._queue) >= self.max_frames:
            self.close_soon(CloseCode.POLICY_VIOLATION, "slow consumer: send queue full")
            return
        self._queue.append(_Out(_Kind.CONTROL, encode_frame(frame)))
        self._wake.set()

    def error(
        self,
        code: ErrorCode,
        message: str,
        id: str | None = None,
        conversation_id: str | None = None,
    ) -> None:
        self.send(ErrorFrame(code=code, message=message, id=id, conversation_id=conversation_id))

    async def _write(self) -> None:
        """The only coroutine that awaits this client's socket."""
        queue, sink, metrics = self._queue, self.sink, self.metrics
        try:
            while True:
                if not queue:
                    self._idle.set()
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                self._idle.clear()
                item = queue.popleft()
                if item.kind is _Kind.EVENT:
                    assert item.sub is not None
                    item.sub.delivered = item.seq  # popped in order: everything before is on the wire
                    await sink.send(item.payload, text=True)
                    metrics.events_sent.inc()
                    metrics.delivery_latency.observe(max(0.0, time.time() - item.ts))
                elif item.kind is _Kind.PAUSED:
                    assert item.sub is not None
                    frame = ErrorFrame(
                        code=ErrorCode.SLOW_CONSUMER,
                        message=SLOW_CONSUMER_MESSAGE,
                        conversation_id=item.sub.conversation_id,
                        last_seq=item.sub.delivered,
                    )
                    await sink.send(encode_frame(frame), text=True)
                elif item.kind is _Kind.EXPORT:
                    await sink.send(item.payload, text=True)
                    metrics.events_sent.inc()
                else:
                    await sink.send(item.payload, text=True)
        except ConnectionClosed:
            pass
        except Exception:
            log.exception("session writer failed")
            self.close_soon(CloseCode.INTERNAL_ERROR, "internal error")
        finally:
            self._idle.set()

    def _purge(self, sub: _Subscription) -> None:
        """Drop a replaced or paused subscription's queued frames."""
        if any(item.sub is sub for item in self._queue):
            self._filter_queue(lambda item: item.sub is not sub)

    def _filter_queue(self, keep: Callable[[_Out], bool]) -> None:
        # in place: the writer holds this deque
        kept = [item for item in self._queue if keep(item)]
        self._queue.clear()
        self._queue.extend(kept)

    # -- subscriptions ------------------------------------------------------------------------

    def watching(self, conversation_id: str) -> bool:
        return conversation_id in self.subs

    def can_watch(self, conversation_id: str) -> bool:
        return conversation_id in self.subs or len(self.subs) < self.max_watched

    def watch(self, conversation_id: str, after_seq: int) -> None:
        """Start (or restart from `after_seq`) streaming a conversation the caller owns."""
        self.unwatch(conversation_id)
        sub = _Subscription(conversation_id, after_seq)
        self.subs[conversation_id] = sub
        sub.task = asyncio.create_task(self._pump(sub), name=f"reactgate-sub-{conversation_id}")

    def unwatch(self, conversation_id: str) -> None:
        sub = self.subs.pop(conversation_id, None)
        if sub is None:
            return
        self._stop(sub)
        self._purge(sub)

    def _stop(self, sub: _Subscription) -> None:
        sub.active = False
        if sub.task is not None and sub.task is not asyncio.current_task():
            sub.task.cancel()

    async def _pump(self, sub: _Subscription) -> None:
        """Stream one subscription into the queue. A failed backend stream is re-opened from the
        last queued seq (no gap, no duplicate); after RESUBSCRIBE_BACKOFF_S is exhausted the client
        gets `internal` — `unavailable` when the store is away (docs/design.md#store-outage) — with
        `last_seq`, and resumes itself."""
        failures = 0
        try:
            while sub.active and not self._closing:
                stream: AsyncIterator[list[Event]] | None = None
                opened_at = sub.enqueued
                try:
                    # Live batches that follow on come straight to `_take`; the rest through the stream.
                    stream = self.backend.subscribe(self.owner, sub.conversation_id, sub.enqueued,
                                                    lambda batch: self._take(sub, batch))
                    async for batch in stream:
                        if not await self._offer(sub, batch):
                            return
                        if batch and isinstance(batch[-1].data, ConversationDeleted):
                            # Its last event is queued; there is nothing left to watch (docs/design.md#deletion).
                            if self.subs.get(sub.conversation_id) is sub:
                                del self.subs[sub.conversation_id]
                            return
                    return  # the backend ended the stream: it is stopping
                except Forbidden:
                    self._end(sub, ErrorCode.FORBIDDEN, FORBIDDEN_MESSAGE)
                    return
                except Exception as exc:
                    if sub.enqueued > opened_at:
                        failures = 0  # progress since the last (re)open: a fresh series
                    failures += 1
                    if failures > len(self.resubscribe_backoff_s):
                        if isinstance(exc, StoreUnavailable):  # a pause: the client resubscribes later
                            log.warning("subscription to %s ended: %s", sub.conversation_id, exc)
                            self._end(sub, ErrorCode.UNAVAILABLE, f"store unavailable: {exc.cause}; subscribe "
                                      "again with after_seq = last_seq to resume", sub.enqueued, exc.retry_after_ms)
                            return
                        log.exception("subscription to %s failed; giving up", sub.conversation_id)
                        self._end(sub, ErrorCode.INTERNAL, "internal error: subscription ended; "
                                  "subscribe again with after_seq = last_seq to resume", sub.enqueued)
                        return
                    log.warning("subscription to %s failed; re-subscribing after seq %d",
                                sub.conversation_id, sub.enqueued, exc_info=True)
                    await asyncio.sleep(self.resubscribe_backoff_s[failures - 1])
                finally:
                    aclose = getattr(stream, "aclose", None)
                    if aclose is not None:
                        with contextlib.suppress(Exception):
                            await aclose()
        finally:
            sub.active = False

    def _end(self, sub: _Subscription, code: ErrorCode, message: str, last_seq: int | None = None,
             retry_after_ms: int | None = None) -> None:
        """A subscription the backend ended: stop watching it and say why (after its queued events)."""
        if self.subs.get(sub.conversation_id) is sub:
            del self.subs[sub.conversation_id]
            self.send(ErrorFrame(code=code, message=message, conversation_id=sub.conversation_id,
                                 last_seq=last_seq, retry_after_ms=retry_after_ms))

    async def _offer(self, sub: _Subscription, batch: list[Event]) -> bool:
        """Queue a batch; False when the subscription must stop (replaced, paused, closing).

        When the queue is full it yields to the event loop once, so the writer can hand what the
        socket accepts without blocking; if there is still no room the client is slow: overflow.
        It never waits for the socket itself.
        """
        queue, start, n = self._queue, 0, len(batch)
        overload, now = self.overload, time.time()
        while start < n:
            if not sub.active or self._closing:
                return False
            room = self.max_events - len(queue)
            if room <= 0:
                self._wake.set()
                await asyncio.sleep(0)
                if not sub.active or self._closing:
                    return False
                if len(queue) >= self.max_events:
                    self._overflow()
                    return False
                continue
            if self._queue_events(sub, batch[start : start + room], overload, now):
                self._wake.set()
            start += room
        return True

    def _take(self, sub: _Subscription, batch: list[Event]) -> bool:
        """A live batch handed over as it is published (actors/hosting/subscription.py, `direct`):
        written or queued now if all of it fits, else declined, and it comes through the stream to `_offer`."""
        if not sub.active or self._closing or len(batch) > self.max_events - len(self._queue):
            return False
        if self._queue_events(sub, batch, self.overload, time.time()):
            self._wake.set()
        return True

    def _queue_events(self, sub: _Subscription, events: list[Event], overload: Overload | None, now: float) -> bool:
        """Queue `events` for the writer — or write each at once while nothing is queued or being
        written and the socket keeps up (`Sink.send_now`). Whether the writer has frames to send."""
        queue, idle, metrics = self._queue, self._idle, self.metrics
        for event in events:
            if event.seq > sub.enqueued:  # else already queued or delivered by this subscription
                payload = encode_event(event)
                sub.enqueued = event.seq
                if overload is not None and event.ts >= sub.since:  # live, not a replay of history
                    overload.arrived(now - event.ts)
                # The writer sets `idle` only with the queue empty and no send under way: nothing is ahead.
                if not queue and idle.is_set() and self.sink.send_now(payload):
                    sub.delivered = event.seq
                    metrics.events_sent.inc()
                    metrics.delivery_latency.observe(max(0.0, now - event.ts))
                else:
                    queue.append(_Out(_Kind.EVENT, payload, sub, event.seq, event.ts))
        return bool(queue)

    def _overflow(self) -> None:
        """Pause every subscription of this connection; tell the client where each stopped."""
        self.metrics.slow_consumers.inc()
        paused = [sub for sub in self.subs.values() if sub.active]
        for sub in paused:
            self._stop(sub)
        self._filter_queue(lambda item: item.kind is not _Kind.EVENT)
        for sub in paused:
            self._queue.append(_Out(_Kind.PAUSED, sub=sub))
            self.metrics.errors.labels(ErrorCode.SLOW_CONSUMER.value).inc()
        self._wake.set()

    def pause_all(self) -> None:
        """Stop producing events (drain): what is queued still goes out."""
        for sub in self.subs.values():
            self._stop(sub)
        for task in self._exports:
            task.cancel()

    # -- exports ------------------------------------------------------------------------------

    def export(self, frame_id: str, conversation_id: str, export: Export) -> None:
        """Send an export, acked already: its events, then `export.completed` (docs/wire-protocol.md#export)."""
        task = asyncio.create_task(self._export(frame_id, conversation_id, export), name="reactgate-export")
        self._exports.add(task)
        task.add_done_callback(self._exports.discard)

    async def _export(self, frame_id: str, conversation_id: str, export: Export) -> None:
        sent = 0
        room = max(1, self.max_events // 2)
        try:
            async for page in export.pages:
                for event in page:
                    while len(self._queue) >= room:  # paced by this client's socket: wait for the writer
                        if self._closing or self._writer.done():
                            return
                        self._wake.set()
                        if self._idle.is_set():
                            await asyncio.sleep(0)  # stale: the writer has not woken up yet
                        else:
                            await self._idle.wait()
                    if self._closing:
                        return
                    self._queue.append(_Out(_Kind.EXPORT, encode_event(event)))
                    sent += 1
                self._wake.set()
        except Exception:
            log.exception("export of %s failed", conversation_id)
            self.error(ErrorCode.INTERNAL, "internal error: export ended; export again with the same id",
                       frame_id, conversation_id)
            return
        finally:
            aclose = getattr(export.pages, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
        self.send(ExportCompleted(id=frame_id, conversation_id=conversation_id, events=sent,
                                  last_seq=export.last_seq))

    # -- lifecycle ----------------------------------------------------------------------------

    async def flushed(self) -> None:
        """Wait until everything queued has been handed to the socket."""
        while (self._queue or not self._idle.is_set()) and not self._writer.done():
            await self._idle.wait()
            if self._queue:
                await asyncio.sleep(0)  # the writer has not woken up yet

    def close_soon(self, code: int, reason: str) -> None:
        """Close the connection from a path that must not await (e.g. a full queue)."""
        if self._closing:
            return
        self._closing = True
        self.pause_all()
        self._close_task = asyncio.create_task(self._close(code, reason))

    async def _close(self, code: int, reason: str) -> None:
        with contextlib.suppress(ConnectionClosed):
            await self.sink.close(code, reason)

    def _expire(self) -> None:
        self.metrics.errors.labels("token_expired").inc()
        self.close_soon(CloseCode.TOKEN_EXPIRED, "token expired")

    async def aclose(self) -> None:
        """Release everything this connection holds. Idempotent."""
        self._closing = True
        if self._expiry is not None:
            self._expiry.cancel()
        tasks = [sub.task for sub in self.subs.values() if sub.task is not None]
        for sub in self.subs.values():
            self._stop(sub)
        for task in self._exports:
            task.cancel()
        tasks += self._exports
        self.subs.clear()
        self._writer.cancel()
        tasks.append(self._writer)
        await asyncio.gather(*tasks, return_exceptions=True)
        self._queue.clear()
