"""Slow consumers (docs/wire-protocol.md): a client that stops reading gets `slow_consumer` with the last seq
delivered to it, while a fast client on the same conversation receives the whole turn; the slow
one re-subscribes from that seq — as often as it is told to — and loses nothing, duplicates nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.e2e import action, call, check_log, complete, local_server, script, text_round, thinking
from tests.kit import Client

QUEUE_FRAMES = 20
# ~100 answer.delta events of 2 KiB (no coalescing), then round.completed and turn.completed
# carrying the whole 200 KiB answer: far more than the stalled client's buffers hold.
ANSWER = "abcdefghij" * 20_000
BIG_ANSWER = script(
    text_round(thinking("Checking."), action(call("demo.weather", city="Paris"))),
    text_round(thinking("Answering at length."), action(complete(ANSWER)), chunk_chars=2000),
)


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


async def test_a_client_that_stops_reading_gets_slow_consumer_and_resubscribes_without_loss(tmp_path: Path) -> None:
    server = local_server(tmp_path / "s.sqlite3", BIG_ANSWER, policies={"flush_interval_ms": 0},
                          send_queue_frames=QUEUE_FRAMES)
    async with server as s, s.client() as fast, s.stalling_client() as slow:
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
