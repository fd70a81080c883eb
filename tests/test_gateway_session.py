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
