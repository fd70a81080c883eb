"""Resume and fan-out (docs/wire-protocol.md; guarantee 5 of docs/design.md#guarantees): a client that loses its connection in the middle of a
streaming answer reconnects, subscribes with the last seq it saw, and ends up with exactly the
events of a client that never disconnected — seq 1..N, no gap, no duplicate, the same (event, data).
Two connections watching one conversation receive identical sequences, and keep watching across
a passivation (docs/design.md#hosting)."""

from __future__ import annotations

from pathlib import Path

from tests.e2e import as_frames, check_log, comparable, local_server, slow_answer_script
from tests.kit import wait_until


async def test_abrupt_disconnect_mid_answer_then_resubscribe_from_last_seq_loses_and_duplicates_nothing(
    tmp_path: Path,
) -> None:
    script = slow_answer_script(answer_chars=400, delay_ms=10)
    async with local_server(tmp_path / "s.sqlite3", script) as s, s.client() as steady, s.client() as flaky:
        cid = await steady.open()
        await steady.subscribe(cid)
        await flaky.subscribe(cid)
        await flaky.say(cid)
        # a few answer deltas in: the answer is streaming when the TCP connection drops
        await flaky.until(lambda: sum(e["event"] == "answer.delta" for e in flaky.events[cid]) >= 3 or None)
        before = list(flaky.events[cid])
        flaky.abort()

        async with s.client() as back:
            last = before[-1]["seq"]
            ack = await back.subscribe(cid, after_seq=last)
            assert ack["after_seq"] == last
            done = await back.turn_completed(cid)
            after = back.events[cid]
        full = await steady.turn_completed(cid)
        assert full["seq"] == done["seq"]

        union = before + after
        assert [e["seq"] for e in union] == list(range(1, done["seq"] + 1))  # no gap, no duplicate
        assert comparable(union) == comparable(steady.events[cid])             # identical to a steady client
        assert comparable(union) == comparable(as_frames(await s.log(cid)))    # and to the durable log
        assert done["data"]["reason"] == "complete"
        check_log(union)


async def test_two_connections_watching_one_conversation_receive_identical_sequences(tmp_path: Path) -> None:
    script = slow_answer_script(answer_chars=160, delay_ms=5)
    async with local_server(tmp_path / "s.sqlite3", script) as s, s.client() as first, s.client() as second:
        cid = await first.open()
        await first.subscribe(cid)
        await first.say(cid, id="m1")
        await first.event(cid, "answer.delta")
        await second.subscribe(cid)  # mid-turn: replay from the store, then live
        await first.turn_completed(cid)
        await second.turn_completed(cid)
        await second.say(cid, id="m2")  # a turn started from the other connection
        await first.turn_completed(cid, "t2")
        await second.turn_completed(cid, "t2")
        assert first.events[cid] == second.events[cid]  # frame for frame, ts included
        check_log(first.events[cid])


async def test_a_passivated_conversation_reactivates_on_the_next_frame_and_its_watcher_misses_nothing(
    tmp_path: Path,
) -> None:
    async with local_server(tmp_path / "s.sqlite3", idle_ttl_s=0.2) as s, s.client() as c:
        cid = await c.open()
        await c.subscribe(cid)
        await c.say(cid, id="m1")
        await c.turn_completed(cid)
        await wait_until(lambda: cid not in s.backend.host.active_ids)  # idle: snapshotted and dropped
        await c.say(cid, id="m2")
        done = await c.turn_completed(cid, "t2")
        assert (done["data"]["reason"], done["data"]["finish_ok"]) == ("complete", True)
        assert comparable(c.events[cid]) == comparable(as_frames(await s.log(cid)))
        check_log(c.events[cid])
