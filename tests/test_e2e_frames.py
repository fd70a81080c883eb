"""Every client frame (docs/wire-protocol.md) and its reply, and every error code a client can reach, against a
real server on a loopback port with the real local backend, store and scripted model.

The gateway's edge tests (`test_gateway_*.py`, over a fake backend) cover the edge in depth; here
each frame also has to reach a real conversation and show its effect in the event stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.session import FORBIDDEN_MESSAGE
from protocol.frames import CloseCode
from tests.e2e import (
    LocalServer,
    action,
    call,
    check_log,
    complete,
    local_server,
    script,
    text_round,
    thinking,
    weather_then_answer,
)

LONG_THINKING = "Let me think about this carefully, one step at a time. " * 6
# A first round that streams for a while (thinking first, 4 chars every 20 ms): time to steer or cancel.
SLOW_TOOL_ROUND = text_round(thinking(LONG_THINKING), action(call("demo.search", query="paris")),
                             chunk_chars=4, delay_ms=20)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[LocalServer]:
    async with local_server(tmp_path / "store.sqlite3", weather_then_answer()) as s:
        yield s


# -- every frame type and its reply ---------------------------------------------------------------


async def test_open_creates_a_conversation_and_reopen_reports_its_last_seq(server: LocalServer) -> None:
    async with server.client() as c:
        ack = await c.request(type="open", id="o1")
        assert ack == {"type": "ack", "id": "o1", "status": "accepted",
                       "conversation_id": ack["conversation_id"], "last_seq": 0}
        cid = ack["conversation_id"]
        assert len(cid) >= 22  # 128 random bits, url-safe
        await c.subscribe(cid)
        await c.say(cid)
        await c.turn_completed(cid)
        again = await c.request(type="open", id="o2", conversation_id=cid)
        assert again == {"type": "ack", "id": "o2", "status": "accepted", "conversation_id": cid,
                         "last_seq": c.last_seq(cid)}
        assert again["last_seq"] == len(await server.log(cid))


async def test_subscribe_acks_first_then_replays_after_seq_then_streams_live(server: LocalServer) -> None:
    async with server.client() as writer, server.client() as reader:
        cid = await writer.open()
        await writer.subscribe(cid)
        await writer.say(cid, id="m1")
        first = await writer.turn_completed(cid)
        ack = await reader.request(type="subscribe", id="s1", conversation_id=cid, after_seq=3)
        assert ack == {"type": "ack", "id": "s1", "status": "accepted", "conversation_id": cid,
                       "last_seq": first["seq"], "after_seq": 3}
        assert reader.events == {}  # nothing before the ack, and open alone never subscribes
        await reader.until(lambda: reader.last_seq(cid) == first["seq"] or None)
        await writer.say(cid, id="m2")
        await reader.turn_completed(cid, "t2")
        await writer.turn_completed(cid, "t2")
        assert reader.seqs(cid) == list(range(4, reader.last_seq(cid) + 1))
        assert reader.events[cid] == writer.events[cid][3:]


async def test_unsubscribe_acks_and_stops_the_stream(server: LocalServer) -> None:
    async with server.client() as quitter, server.client() as watcher:
        cid = await watcher.open()
        await quitter.subscribe(cid)
        await watcher.subscribe(cid)
        ack = await quitter.request(type="unsubscribe", id="u1", conversation_id=cid)
        assert ack == {"type": "ack", "id": "u1", "status": "accepted", "conversation_id": cid}
        await watcher.say(cid)
        await watcher.turn_completed(cid)
        assert (await quitter.request(type="ping", id="p"))["type"] == "pong"
        assert quitter.events == {}


async def test_user_message_is_acked_and_runs_one_turn(server: LocalServer) -> None:
    async with server.client() as c:
        cid = await c.open()
        await c.subscribe(cid)
        ack = await c.say(cid, "what is the weather in Paris?", id="m1")
        assert ack == {"type": "ack", "id": "m1", "status": "accepted", "conversation_id": cid}
        done = await c.turn_completed(cid)
        assert done["data"] == {"turn_id": "t1", "reason": "complete", "final_answer": "It rains in Paris, 12 °C.",
                                "used_tools": True, "finish_ok": True}
        said = await c.event(cid, "user.message")
        assert said["seq"] == 1 and said["data"] == {"message_id": "m1", "text": "what is the weather in Paris?"}
        started = await c.event(cid, "turn.started")
        assert started["seq"] == 2 and started["data"] == {"turn_id": "t1", "user_message_id": "m1"}
        result = await c.event(cid, "tool.result")
        assert result["data"]["result"] == {"city": "Paris", "condition": "rain", "temp_c": 12}
        check_log(c.events[cid])


async def test_steer_mid_generation_is_acked_and_the_turn_finalizes(tmp_path: Path) -> None:
    steered = script(SLOW_TOOL_ROUND, text_round(thinking("Stopping."), action(complete("Stopped as asked."))))
    async with local_server(tmp_path / "s.sqlite3", steered) as s, s.client() as c:
        cid = await c.open()
        await c.subscribe(cid)
        await c.say(cid)
        await c.event(cid, "thinking.delta")
        ack = await c.request(type="steer", id="st1", conversation_id=cid, text="stop and answer now")
        assert ack == {"type": "ack", "id": "st1", "status": "accepted", "conversation_id": cid}
        done = await c.turn_completed(cid)
        assert (done["data"]["reason"], done["data"]["final_answer"]) == ("complete", "Stopped as asked.")
        cut = await c.event(cid, "round.completed", round=1)
        assert cut["data"]["steered"] is True
        assert [e["event"] for e in c.events[cid]].count("tool.call") == 0  # the cut call never ran
        check_log(c.events[cid])


async def test_answer_to_ask_user_is_acked_and_becomes_the_observation(tmp_path: Path) -> None:
    asking = script(
        text_round(thinking("I need to ask."), action(call("react.ask_user", question="Which city?",
                                                           options=["Paris", "Rome"]))),
        text_round(thinking("Rome it is."), action(complete("You chose Rome."))),
    )
    async with local_server(tmp_path / "s.sqlite3", asking) as s, s.client() as c:
        cid = await c.open()
        await c.subscribe(cid)
        await c.say(cid)
        ask = await c.event(cid, "ask_user")
        assert (ask["data"]["question"], ask["data"]["options"]) == ("Which city?", ["Paris", "Rome"])
        ack = await c.request(type="answer", id="a1", conversation_id=cid, ask_id=ask["data"]["ask_id"], answer="Rome")
        assert ack == {"type": "ack", "id": "a1", "status": "accepted", "conversation_id": cid}
        result = await c.event(cid, "tool.result", call_id=ask["data"]["ask_id"])
        assert (result["data"]["ok"], result["data"]["result"]) == (True, {"answer": "Rome"})
        done = await c.turn_completed(cid)
        assert (done["data"]["reason"], done["data"]["final_answer"], done["data"]["finish_ok"]) == (
            "complete", "You chose Rome.", True)


async def test_set_mode_ask_is_acked_and_denies_write_tools(tmp_path: Path) -> None:
    writing = script(
        text_round(thinking("Focusing."), action(call("demo.focus_project", name="notes"))),
        text_round(thinking("Writing."), action(call("demo.write_note", text="hello"))),
        text_round(thinking("Done."), action(complete("I could not write in ask mode."))),
    )
    async with local_server(tmp_path / "s.sqlite3", writing) as s, s.client() as c:
        cid = await c.open()
        ack = await c.request(type="set_mode", id="sm1", conversation_id=cid, mode="ask")
        assert ack == {"type": "ack", "id": "sm1", "status": "accepted", "conversation_id": cid}
        await c.subscribe(cid)
        await c.say(cid)
        await c.turn_completed(cid)
        denied = await c.event(cid, "round.completed", round=2)
        assert [n["code"] for n in denied["data"]["notices"]] == ["ASK_MODE_DENIED"]
        assert [e["data"]["tool_id"] for e in c.events[cid] if e["event"] == "tool.result"] == ["demo.focus_project"]
        back = await c.request(type="set_mode", id="sm2", conversation_id=cid, mode="agent")
        assert back["status"] == "accepted"


async def test_cancel_is_acked_and_ends_the_running_turn_as_cancelled(tmp_path: Path) -> None:
    async with local_server(tmp_path / "s.sqlite3", script(SLOW_TOOL_ROUND)) as s, s.client() as c:
        cid = await c.open()
        await c.subscribe(cid)
        await c.say(cid)
        await c.event(cid, "thinking.delta")
        ack = await c.request(type="cancel", id="x1", conversation_id=cid)
        assert ack == {"type": "ack", "id": "x1", "status": "accepted", "conversation_id": cid}
        done = await c.turn_completed(cid)
        assert (done["data"]["reason"], done["data"]["finish_ok"]) == ("cancelled", False)
        check_log(c.events[cid])


async def test_ping_gets_pong(server: LocalServer) -> None:
    async with server.client() as c:
        assert await c.request(type="ping", id="p1") == {"type": "pong", "id": "p1"}


# -- every error code a client can reach ------------------------------------------------------------


async def test_bad_frames_get_bad_request_and_the_connection_stays_open(server: LocalServer) -> None:
    async with server.client() as c:
        cid = await c.open()
        await c.ws.send("{not json")
        assert (await c.error("bad_request"))["message"].startswith("invalid JSON")
        missing = await c.request(type="user_message", id="b1", conversation_id=cid)
        assert (missing["type"], missing["code"]) == ("error", "bad_request") and "text" in missing["message"]
        await c.ws.send(b"\x00binary")
        assert (await c.error("bad_request"))["message"].startswith("binary frames")
        assert (await c.request(type="ping", id="p"))["type"] == "pong"
        assert await server.backend.store.last_seq(cid) == 0  # nothing reached the conversation


async def test_ten_bad_frames_in_a_row_close_1008(server: LocalServer) -> None:
    async with server.client() as c:
        for _ in range(10):
            await c.ws.send("[]")
        closed = await c.closed()
        assert closed.rcvd is not None and closed.rcvd.code == CloseCode.POLICY_VIOLATION


async def test_a_conversation_nobody_owns_is_forbidden_for_every_frame(server: LocalServer) -> None:
    ghost = "c_" + "x" * 22
    frames = [
        {"type": "open", "conversation_id": ghost},
        {"type": "subscribe", "conversation_id": ghost},
        {"type": "unsubscribe", "conversation_id": ghost},
        {"type": "user_message", "conversation_id": ghost, "text": "hi"},
        {"type": "steer", "conversation_id": ghost, "text": "hi"},
        {"type": "answer", "conversation_id": ghost, "ask_id": "a", "answer": "b"},
        {"type": "set_mode", "conversation_id": ghost, "mode": "ask"},
        {"type": "cancel", "conversation_id": ghost},
    ]
    async with server.client() as c:
        for i, frame in enumerate(frames):
            error = await c.request(id=f"g{i}", **frame)
            assert error == {"type": "error", "id": f"g{i}", "code": "forbidden", "message": FORBIDDEN_MESSAGE,
                             "conversation_id": ghost}, frame
    assert await server.backend.store.conversation_owner(ghost) is None  # nothing was created


async def test_open_with_an_unknown_agent_is_not_found(server: LocalServer) -> None:
    async with server.client() as c:
        error = await c.request(type="open", id="o1", agent="nobody")
        assert error == {"type": "error", "id": "o1", "code": "not_found", "message": "unknown agent 'nobody'"}
        assert (await c.request(type="open", id="o2", agent="demo"))["type"] == "ack"


async def test_frames_beyond_the_token_bucket_are_rate_limited(tmp_path: Path) -> None:
    async with local_server(tmp_path / "s.sqlite3", rate_per_s=0.001, rate_burst=3) as s, s.client() as c:
        for i in range(5):
            await c.send(type="ping", id=f"p{i}")
        replies = [await c.reply(f"p{i}") for i in range(5)]
        assert [r["type"] for r in replies] == ["pong", "pong", "pong", "error", "error"]
        assert {r.get("code") for r in replies[3:]} == {"rate_limited"}


async def test_a_frame_over_max_frame_bytes_closes_1009(tmp_path: Path) -> None:
    async with local_server(tmp_path / "s.sqlite3", max_frame_bytes=1024) as s, s.client() as c:
        cid = await c.open()
        await c.send(type="user_message", conversation_id=cid, text="x" * 2048)
        closed = await c.closed()
        assert closed.rcvd is not None and closed.rcvd.code == CloseCode.MESSAGE_TOO_BIG
        assert await s.backend.store.last_seq(cid) == 0


async def test_watching_more_conversations_than_allowed_is_overloaded(tmp_path: Path) -> None:
    async with local_server(tmp_path / "s.sqlite3", max_conversations_per_connection=1) as s, s.client() as c:
        first, second = await c.open(), await c.open()
        await c.subscribe(first)
        error = await c.request(type="subscribe", id="s2", conversation_id=second)
        assert (error["type"], error["code"], error["conversation_id"]) == ("error", "overloaded", second)
        await c.request(type="unsubscribe", conversation_id=first)
        await c.subscribe(second)


async def test_connections_beyond_max_connections_are_closed_1013(tmp_path: Path) -> None:
    async with local_server(tmp_path / "s.sqlite3", max_connections=1) as s, s.client() as first:
        assert (await first.request(type="ping"))["type"] == "pong"
        async with s.client() as second:
            closed = await second.closed()
            assert closed.rcvd is not None and closed.rcvd.code == CloseCode.TRY_AGAIN_LATER
        assert (await first.request(type="ping"))["type"] == "pong"
