"""gateway/session.py with a socket that never drains: the exact slow-consumer semantics."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from actors.identity import Owner
from gateway.limits import session_limits
from gateway.metrics import GatewayMetrics
from gateway.session import CONTROL_HEADROOM, Session
from gateway.settings import Settings
from protocol.frames import CloseCode, ErrorCode, Pong
from tests.fake_backend import FakeBackend
from tests.kit import wait_until

OWNER = Owner(tenant="acme", sub="alice")


class StuckSink:
    """A socket whose peer stopped reading: the first send never completes until `unblock`."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.closed: tuple[int, str] | None = None
        self.unblocked = asyncio.Event()

    async def send(self, message: bytes, *, text: bool | None = None) -> None:
        assert text is True  # every frame is a text frame
        self.sent.append(json.loads(message))
        await self.unblocked.wait()

    def send_now(self, message: bytes) -> bool:
        return False   # nothing drains: every frame waits in the queue

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.closed = (code, reason)


@pytest.fixture
async def stuck() -> AsyncIterator[tuple[Session, StuckSink, FakeBackend]]:
    sink, backend = StuckSink(), FakeBackend()
    limits = session_limits(Settings(send_queue_frames=5, max_conversations_per_connection=2))
    session = Session(sink, OWNER, backend, limits, GatewayMetrics())
    yield session, sink, backend
    await session.aclose()


async def test_overflow_pauses_and_reports_the_last_seq_handed_to_the_socket(
    stuck: tuple[Session, StuckSink, FakeBackend],
) -> None:
    session, sink, backend = stuck
    cid = (await backend.open(OWNER, None, None, None)).conversation_id
    await backend.emit(cid, 30)
    session.watch(cid, after_seq=0)
    await wait_until(lambda: not session.subs[cid].active)
    # event 1 is stuck in the socket; 2..6 were queued then dropped by the pause
    assert [f["seq"] for f in sink.sent] == [1]
    sink.unblocked.set()
    await wait_until(lambda: len(sink.sent) == 2)
    assert sink.sent[1] == {
        "type": "error", "code": ErrorCode.SLOW_CONSUMER, "message": sink.sent[1]["message"],
        "conversation_id": cid, "last_seq": 1,
    }


async def test_overflow_pauses_every_subscription_of_the_connection(
    stuck: tuple[Session, StuckSink, FakeBackend],
) -> None:
    session, sink, backend = stuck
    quiet = (await backend.open(OWNER, None, None, None)).conversation_id
    busy = (await backend.open(OWNER, None, None, None)).conversation_id
    await backend.emit(quiet, 2)
    session.watch(quiet, after_seq=0)
    await wait_until(lambda: session.subs[quiet].enqueued == 2)
    await backend.emit(busy, 30)
    session.watch(busy, after_seq=0)
    await wait_until(lambda: not session.subs[busy].active and not session.subs[quiet].active)
    sink.unblocked.set()
    await wait_until(lambda: sum(f["type"] == "error" for f in sink.sent) == 2)
    paused = {f["conversation_id"]: f["last_seq"] for f in sink.sent if f["type"] == "error"}
    assert paused == {quiet: 1, busy: 0}  # quiet's event 1 was in the socket, its event 2 dropped
    assert session.watching(quiet) and session.watching(busy)  # paused, still counted as watched


async def test_resubscribing_purges_the_old_subscriptions_queued_events(
    stuck: tuple[Session, StuckSink, FakeBackend],
) -> None:
    session, sink, backend = stuck
    cid = (await backend.open(OWNER, None, None, None)).conversation_id
    await backend.emit(cid, 4)
    session.watch(cid, after_seq=0)
    await wait_until(lambda: session.subs[cid].enqueued == 4)
    session.watch(cid, after_seq=2)
    await wait_until(lambda: session.subs[cid].enqueued == 4)
    sink.unblocked.set()
    await wait_until(lambda: len(sink.sent) == 3)
    assert [f["seq"] for f in sink.sent] == [1, 3, 4]  # 1 was already in the socket; 2..4 of the old one dropped


async def test_a_client_that_never_reads_control_frames_is_closed_with_1008(
    stuck: tuple[Session, StuckSink, FakeBackend],
) -> None:
    session, sink, _ = stuck
    bound = session.max_events + session.max_watched + CONTROL_HEADROOM
    for i in range(bound + 10):
        session.send(Pong(id=str(i)))
        if session.closing:
            break
    assert i == bound
    await wait_until(lambda: sink.closed is not None)
    assert sink.closed is not None and sink.closed[0] == CloseCode.POLICY_VIOLATION


async def test_unwatch_stops_the_backend_stream(stuck: tuple[Session, StuckSink, FakeBackend]) -> None:
    session, _, backend = stuck
    cid = (await backend.open(OWNER, None, None, None)).conversation_id
    session.watch(cid, after_seq=0)
    await wait_until(lambda: backend.subscribers == 1)
    session.unwatch(cid)
    await wait_until(lambda: backend.subscribers == 0)
    assert not session.watching(cid)


# -- direct writes (docs/design.md#direct-writes) ----------------------------------------------------


class GatedSink:
    """A socket that answers `send_now` as told (True: written; an empty `answers` says True), and
    whose `send` waits for `gate`. `sent` holds (how, frame) in the order they reached it."""

    def __init__(self, answers: list[bool] | None = None) -> None:
        self.answers = answers or []
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def send(self, message: bytes, *, text: bool | None = None) -> None:
        await self.gate.wait()
        self.sent.append(("send", json.loads(message)))

    def send_now(self, message: bytes) -> bool:
        if self.answers and not self.answers.pop(0):
            return False
        self.sent.append(("now", json.loads(message)))
        return True

    async def close(self, code: int = 1000, reason: str = "") -> None:
        pass


async def gated(sink: GatedSink) -> tuple[Session, FakeBackend, str]:
    backend = FakeBackend()
    limits = session_limits(Settings(send_queue_frames=50, max_conversations_per_connection=2))
    session = Session(sink, OWNER, backend, limits, GatewayMetrics())
    return session, backend, (await backend.open(OWNER, None, None, None)).conversation_id


def seqs(sink: GatedSink, how: str | None = None) -> list[int]:
    return [frame["seq"] for way, frame in sink.sent if "seq" in frame and how in (None, way)]


async def test_events_go_straight_to_a_socket_that_keeps_up_and_never_overtake_a_queued_one() -> None:
    sink = GatedSink([True, True, True, False])   # the socket falls behind at event 4, then keeps up again
    session, backend, cid = await gated(sink)
    try:
        await backend.emit(cid, 8)
        session.watch(cid, after_seq=0)
        await wait_until(lambda: len(seqs(sink)) == 8)
        assert seqs(sink) == [1, 2, 3, 4, 5, 6, 7, 8]
        # 4 waited in the queue, and so did 5..8 behind it, though the socket would have taken them
        assert seqs(sink, "now") == [1, 2, 3] and seqs(sink, "send") == [4, 5, 6, 7, 8]
        await session.flushed()
        await backend.emit(cid, 2)   # the queue is empty again: straight to the socket
        await wait_until(lambda: len(seqs(sink)) == 10)
        assert seqs(sink, "now") == [1, 2, 3, 9, 10]
        assert session.subs[cid].delivered == 10
        assert session.metrics.events_sent._value.get() == 10
    finally:
        await session.aclose()


async def test_events_wait_behind_a_frame_the_writer_is_still_sending() -> None:
    sink = GatedSink()
    sink.gate.clear()   # the writer's send of the pong does not return yet
    session, backend, cid = await gated(sink)
    try:
        session.send(Pong(id="p"))
        await wait_until(lambda: not session.queue_depth)   # the writer took it: the queue is empty, the socket busy
        await backend.emit(cid, 3)
        session.watch(cid, after_seq=0)
        await wait_until(lambda: session.subs[cid].enqueued == 3)
        assert sink.sent == []   # not written ahead of the pong
        sink.gate.set()
        await wait_until(lambda: len(sink.sent) == 4)
        assert [(way, frame.get("seq", frame["type"])) for way, frame in sink.sent] == [
            ("send", "pong"), ("send", 1), ("send", 2), ("send", 3)]
    finally:
        await session.aclose()


async def test_websocket_sink_writes_at_once_only_while_the_socket_keeps_up() -> None:
    """websockets' connection: `send_now` writes while the transport's buffer is empty; a client
    that stops reading fills it, and `send_now` then declines, having lost nothing; a closed
    connection declines too."""
    from websockets.asyncio.client import connect
    from websockets.asyncio.server import ServerConnection, serve

    from gateway.session import WebSocketSink

    sinks: asyncio.Queue[WebSocketSink] = asyncio.Queue()

    async def handler(ws: ServerConnection) -> None:
        await sinks.put(WebSocketSink(ws))
        await ws.wait_closed()

    frame = b'{"i":%d,"pad":"' + b"x" * (1 << 20) + b'"}'
    async with serve(handler, "127.0.0.1", 0, compression=None, max_size=None) as server:
        port = server.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None, max_queue=1) as client:
            sink = await sinks.get()
            assert sink.send_now(b'{"i":-1}')
            assert await client.recv() == '{"i":-1}'
            written = 0
            while written < 512 and sink.send_now(frame.replace(b"%d", str(written).encode())):
                written += 1
            assert 0 < written < 512   # the client reads nothing: the buffer filled, and send_now said so
            received = [json.loads(await client.recv())["i"] for _ in range(written)]
            assert received == list(range(written))
        await sink.ws.wait_closed()
        assert not sink.send_now(b'{"i":0}')
