"""`user_message`, `steer` and `answer` are idempotent by (conversation_id, id), durably (docs/wire-protocol.md):
a repeat — on the same connection, after a reconnect, after a server restart — is acked
`duplicate` and does nothing. "Nothing" is shown by the next message: it starts turn t2, and the
durable log holds exactly one turn per distinct message id."""

from __future__ import annotations

from pathlib import Path

from protocol.events import Event
from tests.e2e import (
    action,
    as_frames,
    call,
    check_log,
    comparable,
    complete,
    local_server,
    script,
    slow_answer_script,
    text_round,
    thinking,
    weather_then_answer,
)


def started_by(log: list[Event]) -> list[str]:
    return [e.data.user_message_id for e in log if e.event == "turn.started"]


async def test_the_same_user_message_id_twice_runs_one_turn_and_the_second_ack_is_duplicate(tmp_path: Path) -> None:
    async with local_server(tmp_path / "s.sqlite3", slow_answer_script(delay_ms=2)) as s, s.client() as c:
        cid = await c.open()
        await c.subscribe(cid)
        first = await c.say(cid, "weather?", id="m1")
        second = await c.say(cid, "weather?", id="m1")  # while the turn runs
        assert (first["status"], second["status"]) == ("accepted", "duplicate")
        assert second == {"type": "ack", "id": "m1", "status": "duplicate", "conversation_id": cid}
        await c.turn_completed(cid, "t1")
        third = await c.say(cid, "weather?", id="m1")  # and once it ended
        assert third["status"] == "duplicate"
        await c.say(cid, "and tomorrow?", id="m2")
        await c.turn_completed(cid, "t2")
        log = await s.log(cid)
        assert started_by(log) == ["m1", "m2"]
        assert comparable(c.events[cid]) == comparable(as_frames(log))
        check_log(c.events[cid])


async def test_a_user_message_repeated_after_a_reconnect_is_a_duplicate(tmp_path: Path) -> None:
    async with local_server(tmp_path / "s.sqlite3", slow_answer_script(delay_ms=2)) as s:
        async with s.client() as c:
            cid = await c.open()
            assert (await c.say(cid, id="m1"))["status"] == "accepted"
            c.abort()  # the ack was read, but the client cannot know that its retry is unnecessary
        async with s.client() as c:
            await c.request(type="open", conversation_id=cid)
            assert (await c.say(cid, id="m1"))["status"] == "duplicate"
            await c.subscribe(cid)
            await c.turn_completed(cid, "t1")
            await c.say(cid, id="m2")
            await c.turn_completed(cid, "t2")
            assert started_by(await s.log(cid)) == ["m1", "m2"]
            check_log(c.events[cid])


async def test_idempotency_keys_survive_a_server_restart_on_the_same_store(tmp_path: Path) -> None:
    store = tmp_path / "s.sqlite3"
    async with local_server(store, weather_then_answer()) as s, s.client() as c:
        cid = await c.open()
        await c.subscribe(cid)
        await c.say(cid, id="m1")
        await c.turn_completed(cid)
    async with local_server(store, weather_then_answer()) as s, s.client() as c:
        assert (await c.say(cid, id="m1"))["status"] == "duplicate"
        await c.subscribe(cid)
        await c.say(cid, id="m2")
        await c.turn_completed(cid, "t2")
        assert started_by(await s.log(cid)) == ["m1", "m2"]
        check_log(c.events[cid])


async def test_a_repeated_answer_is_a_duplicate(tmp_path: Path) -> None:
    asking = script(
        text_round(thinking("Asking."), action(call("react.ask_user", question="Which city?"))),
        text_round(thinking("Thanks."), action(complete("Rome, then."))),
    )
    async with local_server(tmp_path / "s.sqlite3", asking) as s, s.client() as c:
        cid = await c.open()
        await c.subscribe(cid)
        await c.say(cid)
        ask_id = (await c.event(cid, "ask_user"))["data"]["ask_id"]
        frame = {"type": "answer", "id": "a1", "conversation_id": cid, "ask_id": ask_id, "answer": "Rome"}
        assert (await c.request(**frame))["status"] == "accepted"
        assert (await c.request(**frame))["status"] == "duplicate"
        await c.turn_completed(cid)
        results = [e for e in c.events[cid] if e["event"] == "tool.result"]
        assert [r["data"]["result"] for r in results] == [{"answer": "Rome"}]

