"""Slow consumers (docs/wire-protocol.md): a client that stops reading gets `slow_consumer` with the last seq
delivered to it, while a fast client on the same conversation receives the whole turn; the slow
one re-subscribes from that seq — as often as it is told to — and loses nothing, duplicates nothing.
Events written at once while the socket kept up (docs/design.md#direct-writes) count as delivered.
On both backends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.profile import demo_profile
from actors.tools.demo import demo_registry
from tests.e2e import (
    LocalServer,
    RayHosting,
    action,
    call,
    check_log,
    complete,
    local_server,
    ray_hosting,
    ray_server,
    script,
    text_round,
    thinking,
)
from tests.kit import Client

QUEUE_FRAMES = 20
# ~100 answer.delta events of 2 KiB (no coalescing), then round.completed and turn.completed
# carrying the whole 200 KiB answer: far more than the stalled client's buffers hold.
ANSWER = "abcdefghij" * 20_000
BIG_ANSWER = script(
    text_round(thinking("Checking."), action(call("demo.weather", city="Paris"))),
    text_round(thinking("Answering at length."), action(complete(ANSWER)), chunk_chars=2000),
)


NO_COALESCING = {"flush_interval_ms": 0}


@pytest.fixture(scope="module")
def hosting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayHosting]:
    demo = demo_profile(known_tools=demo_registry())
    profile = demo.model_copy(update={"policies": demo.policies.model_copy(update=NO_COALESCING)})
    with ray_hosting(tmp_path_factory.mktemp("ray"), {"big": BIG_ANSWER}, profiles={"big": profile}) as hosting:
        yield hosting


@pytest.fixture(params=["local", pytest.param("ray", marks=pytest.mark.ray)])
async def server(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LocalServer]:
    if request.param == "local":
        async with local_server(tmp_path / "s.sqlite3", BIG_ANSWER, policies=NO_COALESCING,
                                send_queue_frames=QUEUE_FRAMES) as s:
            yield s
        return
    async with ray_server(request.getfixturevalue("hosting"), send_queue_frames=QUEUE_FRAMES) as s:
        yield s


async def resume_until_completed(c: Client, conversation_id: str) -> list[dict[str, Any]]:
    """Read; on each slow_consumer re-subscribe from its last_seq; stop at turn.completed."""
    pauses = []

    def next_step() -> dict[str, Any] | None:
        for i, frame in enumerate(c.others):
            if frame.get("code") == "slow_consumer":
                return c.others.pop(i)
        done = [e for e in c.events.get(conversation_id, ()) if e["event"] == "turn.completed"]
        return done[0] if done else None

    while (step := await c.until(next_step))["type"] == "error":
        assert step["conversation_id"] == conversation_id
        # everything up to last_seq was delivered before the error, nothing after it
        assert step["last_seq"] == c.last_seq(conversation_id)
        pauses.append(step)
        await c.subscribe(conversation_id, after_seq=step["last_seq"])
    return pauses


async def test_a_client_that_stops_reading_gets_slow_consumer_and_resubscribes_without_loss(server: LocalServer) -> None:
    async with server.client() as fast, server.stalling_client() as slow:
        cid = await fast.open()
        await fast.subscribe(cid)
        await slow.subscribe(cid)
        await fast.say(cid)
        # the slow client reads nothing meanwhile; the fast one gets the whole turn
        done = await fast.turn_completed(cid)
        assert done["data"]["final_answer"] == ANSWER
        check_log(fast.events[cid])

        pauses = await resume_until_completed(slow, cid)
        assert pauses, "the stalled client was never paused"
        assert pauses[0]["message"].startswith("send queue full")
        assert 0 < pauses[0]["last_seq"] < done["seq"]
        assert slow.events[cid] == fast.events[cid]  # 1..N, no gap, no duplicate, identical frames
        assert (await fast.request(type="ping"))["type"] == "pong"
