"""The gateway over a real socket (docs/wire-protocol.md): every frame type, every client-reachable error code,
the close codes, ownership, slow consumers, drain, and the HTTP endpoints.

Run against `tests/fake_backend.py`, an in-memory Backend: these are the gateway's edge tests,
not conversation tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import jwt
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

import gateway.server as server_module
from actors.hosting.backend import AckStatus, Answer, Cancel, Command, Opened, SetMode, Steer, UserMessage
from actors.identity import Owner
from actors.store.base import StoreUnavailable
from gateway.metrics import StoreMetrics
from gateway.server import GatewayServer, store_down_text, store_health
from gateway.session import FORBIDDEN_MESSAGE, Session
from gateway.settings import BindRefused, Settings
from protocol.frames import CloseCode, ConversationPage, ErrorCode
from tests.fake_backend import BOOM, REPLACED, FakeBackend
from tests.gateway_harness import running
from tests.kit import PROTO, TIMEOUT, Client, client, http_get

SECRET = "test-secret-for-hs256-at-least-32-bytes!"


def token(sub: str = "alice", tenant: str = "acme", exp_in: float | None = 3600, **claims: object) -> str:
    payload: dict[str, object] = {"sub": sub, "tenant": tenant, "iat": int(time.time()), **claims}
    if exp_in is not None:
        payload["exp"] = int(time.time() + exp_in)
    return jwt.encode(payload, SECRET, algorithm="HS256")


async def closed_code(client: Client) -> int | None:
    """Read until the server closes the connection; the close code it sent."""
    with pytest.raises(ConnectionClosed) as info:
        while True:
            await client.recv()
    return info.value.rcvd.code if info.value.rcvd else None


# -- every frame type and its reply ------------------------------------------------------------


async def test_ping_gets_pong() -> None:
    async with running() as h, h.client() as c:
        assert await c.request(type="ping", id="p1") == {"type": "pong", "id": "p1"}


async def test_open_creates_then_reopens_a_conversation() -> None:
    async with running() as h, h.client() as c:
        ack = await c.request(type="open", id="o1", agent="demo", mode="agent")
        assert ack["type"] == "ack" and ack["status"] == "accepted" and ack["id"] == "o1"
        assert ack["last_seq"] == 0 and len(ack["conversation_id"]) >= 16
        await h.backend.emit(ack["conversation_id"], 3)
        again = await c.request(type="open", conversation_id=ack["conversation_id"])
        assert again["conversation_id"] == ack["conversation_id"] and again["last_seq"] == 3


async def test_open_unknown_agent_is_not_found() -> None:
    async with running() as h, h.client() as c:
        error = await c.request(type="open", id="o1", agent="nobody")
        assert error == {"type": "error", "id": "o1", "code": "not_found", "message": "unknown agent 'nobody'"}


async def test_subscribe_acks_then_replays_after_seq_then_streams_live() -> None:
    async with running() as h, h.client() as c:
        cid = await c.open()
        await h.backend.emit(cid, 5)
        ack = await c.request(type="subscribe", id="s1", conversation_id=cid, after_seq=2)
        assert ack == {"type": "ack", "id": "s1", "status": "accepted", "conversation_id": cid,
                       "last_seq": 5, "after_seq": 2}
        assert c.events == {}  # open does not subscribe, and the ack comes before the stream
        assert [e["seq"] for e in await c.events_until(cid, 5)] == [3, 4, 5]
        await h.backend.emit(cid, 2)
        events = await c.events_until(cid, 7)
        assert [e["seq"] for e in events] == [3, 4, 5, 6, 7]
        assert set(events[0]) == {"type", "conversation_id", "seq", "event", "data", "ts"}


async def test_subscribing_again_restarts_from_the_new_after_seq() -> None:
    async with running() as h, h.client() as c:
        cid = await c.open()
        await h.backend.emit(cid, 4)
        await c.request(type="subscribe", conversation_id=cid)
        await c.events_until(cid, 4)
        c.events.clear()
        await c.request(type="subscribe", conversation_id=cid, after_seq=1)
        assert [e["seq"] for e in await c.events_until(cid, 4)] == [2, 3, 4]


async def test_unsubscribe_stops_the_stream() -> None:
    async with running() as h, h.client() as c:
        a, b = await c.open(), await c.open()
        await c.request(type="subscribe", conversation_id=a)
        await c.request(type="subscribe", conversation_id=b)
        ack = await c.request(type="unsubscribe", id="u1", conversation_id=a)
        assert ack == {"type": "ack", "id": "u1", "status": "accepted", "conversation_id": a}
        await h.backend.emit(a, 3)
        await h.backend.emit(b, 1)
        await c.events_until(b, 1)
        assert c.events.get(a, []) == []
        (session,) = h.server.sessions
        assert not session.watching(a) and session.watching(b)


@pytest.mark.parametrize(
    ("frame_type", "fields", "command"),
    [
        ("user_message", {"text": "hello"}, UserMessage(id="c1", text="hello")),
        ("steer", {"text": "stop that"}, Steer(id="c1", text="stop that")),
        ("answer", {"ask_id": "a1", "answer": "yes"}, Answer(id="c1", ask_id="a1", answer="yes")),
        ("set_mode", {"mode": "ask"}, SetMode(id="c1", mode="ask")),
        ("cancel", {}, Cancel(id="c1")),
    ],
)
async def test_commands_reach_the_backend_and_are_acked(
    frame_type: str, fields: dict[str, str], command: Command
) -> None:
    async with running() as h, h.client() as c:
        cid = await c.open()
        ack = await c.request(type=frame_type, id="c1", conversation_id=cid, **fields)
        assert ack == {"type": "ack", "id": "c1", "status": "accepted", "conversation_id": cid}
        assert h.backend.conversations[cid].commands == [command]


@pytest.mark.parametrize(
    ("frame_type", "fields"),
    [("user_message", {"text": "hello"}), ("steer", {"text": "x"}), ("answer", {"ask_id": "a", "answer": "y"})],
)
async def test_a_repeated_command_is_acked_duplicate(frame_type: str, fields: dict[str, str]) -> None:
    async with running() as h, h.client() as c:
        cid = await c.open()
        first = await c.request(type=frame_type, id="m1", conversation_id=cid, **fields)
        second = await c.request(type=frame_type, id="m1", conversation_id=cid, **fields)
        assert (first["status"], second["status"]) == ("accepted", "duplicate")
        assert len(h.backend.conversations[cid].commands) == 1


async def test_duplicate_holds_across_connections() -> None:
    async with running() as h:
        async with h.client() as c:
            cid = await c.open()
            assert (await c.request(type="user_message", id="m1", conversation_id=cid, text="hi"))["status"] == "accepted"
        async with h.client() as c:
            assert (await c.request(type="user_message", id="m1", conversation_id=cid, text="hi"))["status"] == "duplicate"


async def test_two_connections_on_one_conversation_get_identical_sequences() -> None:
    async with running() as h, h.client() as a, h.client() as b:
        cid = await a.open()
        await b.open(conversation_id=cid)
        await a.request(type="subscribe", conversation_id=cid)
        await h.backend.emit(cid, 10)
        await b.request(type="subscribe", conversation_id=cid)
        await a.request(type="user_message", conversation_id=cid, text="hi")
        await h.backend.emit(cid, 10)
        ea, eb = await a.events_until(cid, 21), await b.events_until(cid, 21)
        assert ea == eb
        assert [e["seq"] for e in ea] == list(range(1, 22))


async def test_a_failed_backend_stream_resumes_without_gap_or_duplicate() -> None:
    async with running() as h, h.client() as c:
        cid = await c.open()
        await c.request(type="subscribe", conversation_id=cid)
        await h.backend.emit(cid, 3)
        await c.events_until(cid, 3)
        h.backend.stream_faults = 2
        await h.backend.emit(cid, 3)
        await c.events_until(cid, 6)
        await h.backend.emit(cid, 3)
        assert [e["seq"] for e in await c.events_until(cid, 9)] == list(range(1, 10))
        assert h.backend.stream_faults == 0 and c.others == []


async def test_a_stream_that_fails_again_after_progress_starts_a_fresh_series(monkeypatch: pytest.MonkeyPatch) -> None:
    # One retry allowed per series: each failure below follows a delivered batch, so none ends it.
    monkeypatch.setattr(Session, "resubscribe_backoff_s", (0.0,))
    async with running() as h, h.client() as c:
        cid = await c.open()
        await c.request(type="subscribe", conversation_id=cid)
        for n in (3, 6, 9):
            h.backend.stream_faults = 1
            await h.backend.emit(cid, 3)
            await c.events_until(cid, n)
        await h.backend.emit(cid, 1)
        assert [e["seq"] for e in await c.events_until(cid, 10)] == list(range(1, 11))
        assert h.backend.stream_faults == 0 and c.others == []


async def test_a_stream_that_keeps_failing_ends_with_internal_and_last_seq(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Session, "resubscribe_backoff_s", (0.0, 0.0))
    async with running() as h, h.client() as c:
        cid = await c.open()
        await h.backend.emit(cid, 2)
        await c.request(type="subscribe", conversation_id=cid)
        await c.events_until(cid, 2)
        h.backend.stream_faults, h.backend.broken = 1, True
        await h.backend.emit(cid, 1)
        error = await c.reply(None)
        assert (error["code"], error["conversation_id"], error["last_seq"]) == ("internal", cid, 3)
        assert "host lost" not in error["message"]
        assert c.seqs(cid) == [1, 2, 3]


# -- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "frame_id", "names"),
    [
        ("{not json", None, "invalid JSON"),
        ('{"type":"teleport","id":"b1"}', "b1", "`$.type`"),
        ('{"type":"user_message","id":"b1","conversation_id":"c"}', "b1", "`text`"),
        ('{"type":"user_message","id":"b1","conversation_id":"c","text":5}', "b1", "`$.text`"),
        ('{"type":"subscribe","id":"b1","conversation_id":"c","after_seq":"x"}', "b1", "`$.after_seq`"),
        ('{"type":"set_mode","id":"b1","conversation_id":"c"}', "b1", "`mode`"),
        ('{"type":"ping","id":"' + "x" * 200 + '"}', None, "`$.id`"),
        ("[]", None, "object"),
    ],
)
async def test_bad_frames_get_bad_request_and_the_connection_stays_open(
    raw: str, frame_id: str | None, names: str
) -> None:
    async with running() as h, h.client() as c:
        await c.ws.send(raw)
        error = await c.reply(frame_id)
        assert error["type"] == "error" and error["code"] == "bad_request"
        assert names in error["message"]
        assert (await c.request(type="ping"))["type"] == "pong"


async def test_binary_frame_is_bad_request() -> None:
    async with running() as h, h.client() as c:
        await c.ws.send(b'{"type":"ping","id":"1"}')
        error = await c.reply(None)
        assert error["code"] == "bad_request" and "binary" in error["message"]
        assert (await c.request(type="ping"))["type"] == "pong"


async def test_ten_bad_frames_in_a_row_close_with_1008() -> None:
    async with running(bad_frames_before_close=10) as h, h.client() as c:
        for _ in range(9):
            await c.ws.send("junk")
            assert (await c.reply(None))["code"] == "bad_request"
        await c.ws.send("junk")
        assert await closed_code(c) == CloseCode.POLICY_VIOLATION


async def test_a_good_frame_resets_the_bad_frame_count() -> None:
    async with running(bad_frames_before_close=3) as h, h.client() as c:
        for _ in range(3):
            await c.ws.send("junk")
            await c.ws.send("junk")
            assert (await c.reply(None))["code"] == "bad_request"
            assert (await c.reply(None))["code"] == "bad_request"
            assert (await c.request(type="ping"))["type"] == "pong"


async def test_a_frame_over_max_frame_bytes_closes_with_1009() -> None:
    async with running(max_frame_bytes=1024) as h, h.client() as c:
        cid = await c.open()
        await c.send(type="user_message", conversation_id=cid, text="x" * 2000)
        assert await closed_code(c) == CloseCode.MESSAGE_TOO_BIG


async def test_rate_limited_frames_are_not_processed() -> None:
    async with running(rate_per_s=0.001, rate_burst=3) as h, h.client() as c:
        cid = await c.open()  # 1 token
        ids = [await c.send(type="user_message", conversation_id=cid, text=f"m{i}") for i in range(4)]
        replies = [await c.reply(i) for i in ids]
        assert [r["type"] for r in replies] == ["ack", "ack", "error", "error"]
        assert {r.get("code") for r in replies[2:]} == {"rate_limited"}
        assert [m.id for m in h.backend.conversations[cid].commands] == ids[:2]


async def test_unexpected_backend_failure_is_internal_without_internals() -> None:
    async with running() as h, h.client() as c:
        cid = await c.open()
        error = await c.request(type="user_message", id="x1", conversation_id=cid, text=BOOM)
        assert error["type"] == "error" and error["code"] == "internal" and error["id"] == "x1"
        assert "secret" not in error["message"] and "sqlite" not in error["message"]
        assert (await c.request(type="ping"))["type"] == "pong"


# -- ownership -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame_type", "fields"),
    [
        ("open", {}),
        ("subscribe", {"after_seq": 0}),
        ("unsubscribe", {}),
        ("user_message", {"text": "hi"}),
        ("steer", {"text": "hi"}),
        ("answer", {"ask_id": "a", "answer": "y"}),
        ("set_mode", {"mode": "ask"}),
        ("cancel", {}),
    ],
)
async def test_another_tenant_is_forbidden_whether_or_not_the_conversation_exists(
    frame_type: str, fields: dict[str, object]
) -> None:
    async with running(auth_secret=SECRET) as h:
        async with h.client(token("alice", "acme")) as owner:
            cid = await owner.open()
        async with h.client(token("alice", "other-tenant")) as intruder:
            existing = await intruder.request(type=frame_type, id="f", conversation_id=cid, **fields)
            missing = await intruder.request(type=frame_type, id="f", conversation_id="no-such-id", **fields)
        assert existing["code"] == missing["code"] == "forbidden"
        assert existing["message"] == missing["message"] == FORBIDDEN_MESSAGE
        assert h.backend.conversations[cid].commands == []


async def test_another_user_of_the_same_tenant_is_forbidden() -> None:
    async with running(auth_secret=SECRET) as h:
        async with h.client(token("alice")) as a:
            cid = await a.open()
        async with h.client(token("bob")) as b:
            assert (await b.request(type="subscribe", conversation_id=cid))["code"] == "forbidden"


async def test_the_owner_reconnects_with_a_new_token() -> None:
    async with running(auth_secret=SECRET) as h:
        async with h.client(token("alice")) as a:
            cid = await a.open()
        async with h.client(token("alice")) as a:
            assert (await a.request(type="subscribe", conversation_id=cid))["type"] == "ack"


# -- auth ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad_token",
    [
        None,
        "not-a-jwt",
        jwt.encode({"sub": "alice", "tenant": "acme"}, "another-secret-another-secret-123", algorithm="HS256"),
        token(exp_in=-60),
        jwt.encode({"sub": "alice"}, SECRET, algorithm="HS256"),
        jwt.encode({"tenant": "acme"}, SECRET, algorithm="HS256"),
    ],
    ids=["missing", "garbage", "wrong-secret", "expired", "no-tenant", "no-sub"],
)
async def test_bad_and_expired_tokens_are_refused_with_401(bad_token: str | None) -> None:
    async with running(auth_secret=SECRET) as h:
        with pytest.raises(InvalidStatus) as info:
            async with h.client(bad_token):
                pass
        response = info.value.response
        assert response.status_code == 401
        assert bad_token is None or bad_token.encode() not in response.body


async def test_token_in_query_string_is_accepted() -> None:
    async with running(auth_secret=SECRET) as h, connect(f"{h.url}?token={token()}", subprotocols=PROTO) as ws:
        assert (await Client(ws).request(type="ping"))["type"] == "pong"


async def test_expired_query_token_is_refused() -> None:
    async with running(auth_secret=SECRET) as h:
        with pytest.raises(InvalidStatus) as info:
            async with connect(f"{h.url}?token={token(exp_in=-5)}", subprotocols=PROTO):
                pass
        assert info.value.response.status_code == 401
        assert b"expired" in info.value.response.body


async def test_non_loopback_bind_without_secret_refuses_to_start() -> None:
    backend_started = False

    class Never:
        async def start(self) -> None:
            nonlocal backend_started
            backend_started = True

    server = GatewayServer(Settings(host="0.0.0.0", port=0), Never())  # type: ignore[arg-type]
    with pytest.raises(BindRefused, match="auth secret"):
        await server.start()
    assert not backend_started


# -- limits --------------------------------------------------------------------------------------


async def test_watching_more_than_the_limit_is_overloaded() -> None:
    async with running(max_conversations_per_connection=2) as h, h.client() as c:
        ids = [await c.open() for _ in range(3)]
        assert (await c.request(type="subscribe", conversation_id=ids[0]))["type"] == "ack"
        assert (await c.request(type="subscribe", conversation_id=ids[1]))["type"] == "ack"
        assert (await c.request(type="subscribe", conversation_id=ids[0], after_seq=0))["type"] == "ack"
        error = await c.request(type="subscribe", id="s3", conversation_id=ids[2])
        assert error["code"] == "overloaded" and error["id"] == "s3"
        await c.request(type="unsubscribe", conversation_id=ids[0])
        assert (await c.request(type="subscribe", conversation_id=ids[2]))["type"] == "ack"


async def test_max_connections_closes_with_1013() -> None:
    async with running(max_connections=1) as h, h.client() as first:
        async with h.client() as second:
            assert await closed_code(second) == CloseCode.TRY_AGAIN_LATER
        assert (await first.request(type="ping"))["type"] == "pong"


async def test_a_slow_consumer_is_paused_and_resumes_without_loss_while_a_fast_one_gets_everything() -> None:
    async with running(send_queue_frames=20) as h, h.client() as fast:
        cid = await fast.open()
        await fast.request(type="subscribe", conversation_id=cid)
        # A client whose kernel receive buffer is tiny and whose transport stops reading.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (h.host, h.port))
        before = set(h.server.sessions)
        async with connect(h.url, subprotocols=PROTO, sock=sock, max_queue=4) as ws:
            slow = Client(ws)
            await slow.open(conversation_id=cid)
            await slow.request(type="subscribe", conversation_id=cid)
            (slow_session,) = set(h.server.sessions) - before
            ws.transport.pause_reading()

            last = 0
            while slow_session.subs[cid].active:  # the overflow is the condition, not the time
                last = await h.backend.emit(cid, 10, pad=16 * 1024)
                await fast.events_until(cid, last)
                assert last < 20_000, "the slow client never overflowed"
            last = await h.backend.emit(cid, 30, pad=16)  # the rest, after the pause

            # The fast client got everything, in order, and was never paused.
            assert [e["seq"] for e in await fast.events_until(cid, last)] == list(range(1, last + 1))
            assert fast.others == []

            # The slow one reads on: a contiguous prefix, then slow_consumer naming its end.
            ws.transport.resume_reading()
            error = await slow.reply(None)
            assert error["code"] == ErrorCode.SLOW_CONSUMER and error["conversation_id"] == cid
            got = slow.seqs(cid)
            assert got == list(range(1, error["last_seq"] + 1))
            assert error["last_seq"] < last

            # Re-subscribing from last_seq gets exactly the rest.
            slow.events.clear()
            await slow.request(type="subscribe", conversation_id=cid, after_seq=error["last_seq"])
            rest = await slow.events_until(cid, last)
            assert [e["seq"] for e in rest] == list(range(error["last_seq"] + 1, last + 1))
            await slow.request(type="ping")
            assert slow.seqs(cid) == list(range(error["last_seq"] + 1, last + 1))


async def test_a_pipelining_client_is_not_mistaken_for_a_slow_one() -> None:
    async with running(send_queue_frames=5, max_conversations_per_connection=1, rate_burst=1000) as h, h.client() as c:
        for i in range(300):  # sent back to back: the server reads them from one buffer
            await c.ws.send(json.dumps({"type": "ping", "id": f"p{i}"}))
        for i in range(300):
            assert await c.recv() == {"type": "pong", "id": f"p{i}"}


# -- drain ---------------------------------------------------------------------------------------


async def test_drain_flushes_and_closes_clients_with_1012_and_stops_the_backend() -> None:
    async with running() as h, h.client() as c:
        cid = await c.open()
        await c.request(type="subscribe", conversation_id=cid)
        last = await h.backend.emit(cid, 5)
        await c.events_until(cid, last)
        assert (await http_get(h.host, h.port, "/readyz"))[0] == 200
        drain = asyncio.create_task(h.server.drain())
        assert await closed_code(c) == CloseCode.SERVICE_RESTART
        await asyncio.wait_for(drain, TIMEOUT)
        assert h.backend.stopped
        assert not h.server.ready
        await asyncio.wait_for(h.server.serve_forever(), TIMEOUT)  # returns once drained
        with pytest.raises(OSError):
            async with h.client():
                pass


async def test_a_replaced_configuration_drains_the_gateway_and_never_answers_internal() -> None:
    # docs/design.md#generations: once a newer generation is current, this replica must not serve.
    backend = FakeBackend()
    backend.generation = "fedcba9876"
    server = GatewayServer(Settings(host="127.0.0.1", port=0, backend="local"), backend)
    host, port = await server.start()
    try:
        status, _, body = await http_get(host, port, "/readyz")
        assert (status, body) == (200, b"ready (generation fedcba9876)\n")
        metrics = (await http_get(host, port, "/metrics"))[2].decode()
        assert 'reactgate_config_info{generation="fedcba9876"} 1.0' in metrics
        async with client(f"ws://{host}:{port}/ws") as c:
            cid = await c.open()
            await c.send(type="user_message", conversation_id=cid, text=REPLACED)
            frames = []
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    frames.append(await c.recv())
            assert closed.value.rcvd is not None and closed.value.rcvd.code == CloseCode.SERVICE_RESTART
            assert frames == []   # no `internal`, no ack: the client resumes elsewhere and re-sends it
        await asyncio.wait_for(server.serve_forever(), TIMEOUT)  # drained, as on SIGTERM
        assert not server.ready and backend.stopped
    finally:
        await server.drain()


# -- HTTP on the same port -----------------------------------------------------------------------


async def test_healthz_readyz_metrics_and_index() -> None:
    async with running() as h:
        async with h.client() as c:
            await c.request(type="ping")
            await c.ws.send("junk")
            await c.reply(None)
        status, _, body = await http_get(h.host, h.port, "/healthz")
        assert (status, body) == (200, b"ok\n")
        status, _, _ = await http_get(h.host, h.port, "/readyz")
        assert status == 200
        status, headers, body = await http_get(h.host, h.port, "/metrics")
        assert status == 200 and headers["content-type"].startswith("text/plain")
        text = body.decode()
        assert 'reactgate_frames_in_total{type="ping"} 1.0' in text
        assert 'reactgate_errors_total{code="bad_request"} 1.0' in text
        assert "reactgate_connections " in text and "reactgate_send_queue_depth " in text
        assert "reactgate_delivery_latency_seconds_bucket" in text
        status, headers, body = await http_get(h.host, h.port, "/")
        assert status == 200 and headers["content-type"].startswith("text/html") and b"reactgate" in body
        assert (await http_get(h.host, h.port, "/nope"))[0] == 404
        assert (await http_get(h.host, h.port, "/static/../server.py"))[0] == 404


async def test_the_console_its_assets_and_nothing_else_are_served_over_http() -> None:
    async with running() as h:
        index = await http_get(h.host, h.port, "/")
        assert await http_get(h.host, h.port, "/index.html") == index
        status, headers, body = await http_get(h.host, h.port, "/static/console.js")
        assert status == 200 and "javascript" in headers["content-type"] and body
        assert (await http_get(h.host, h.port, "/static/missing.js"))[::2] == (404, b"not found\n")
        assert (await http_get(h.host, h.port, "/static/"))[::2] == (404, b"not found\n")
        assert (await http_get(h.host, h.port, "/healthz?probe=1"))[::2] == (200, b"ok\n")  # the query is not the path
        assert (await http_get(h.host, h.port, "/ws/"))[::2] == (404, b"not found: the WebSocket endpoint is /ws\n")


async def test_other_paths_and_subprotocols_are_refused_at_the_handshake() -> None:
    async with running() as h:
        with pytest.raises(InvalidStatus) as info:
            async with connect(f"ws://{h.host}:{h.port}/other", subprotocols=PROTO):
                pass
        assert info.value.response.status_code == 404
        with pytest.raises(InvalidStatus) as info:
            async with connect(h.url):
                pass
        assert info.value.response.status_code == 400 and b"missing subprotocol" in info.value.response.body
        with pytest.raises(InvalidStatus) as info:
            async with connect(h.url, subprotocols=["reactgate.v0"]):  # type: ignore[list-item]
                pass
        assert info.value.response.status_code == 400 and b"reactgate.v1" in info.value.response.body


async def test_error_frames_are_json_objects_with_code_and_message() -> None:
    async with running() as h, h.client() as c:
        await c.ws.send("{")
        raw = await asyncio.wait_for(c.ws.recv(), TIMEOUT)
        assert isinstance(raw, str)
        assert set(json.loads(raw)) == {"type", "code", "message"}


async def test_connections_are_not_logged_at_info(caplog: pytest.LogCaptureFixture) -> None:
    # 9,000 idle clients once meant 18,000 INFO lines; per-connection lines are DEBUG, counts are metrics.
    caplog.set_level(logging.INFO)
    async with running() as h:
        for _ in range(3):
            async with h.client() as c:
                await c.request(type="ping")
        _, _, body = await http_get(h.host, h.port, "/metrics")
        assert "reactgate_connections_opened_total 3.0" in body.decode()
    assert not [r for r in caplog.records if r.levelno >= logging.INFO and "connection" in r.getMessage()]
    caplog.clear()
    caplog.set_level(logging.DEBUG)
    async with running() as h, h.client() as c:
        await c.request(type="ping")
    assert any(r.getMessage() == "connection open" for r in caplog.records)  # still there, at DEBUG


# -- the JSON endpoints behind the handshake's auth (docs/wire-protocol.md#16-agents-and-the-conversation-list) --


@pytest.mark.parametrize("path", ["/agents", "/v1/conversations"])
@pytest.mark.parametrize("bad_token", [None, "not-a-jwt", token(exp_in=-60)], ids=["missing", "garbage", "expired"])
async def test_the_json_endpoints_refuse_what_the_handshake_refuses_with_401(path: str, bad_token: str | None) -> None:
    async with running(auth_secret=SECRET) as h:
        headers = {"Authorization": f"Bearer {bad_token}"} if bad_token else {}
        status, _, body = await http_get(h.host, h.port, path, headers=headers)
        assert status == 401 and body.startswith(b"unauthorized: ")
        assert bad_token is None or bad_token.encode() not in body


async def test_the_json_endpoints_answer_a_bearer_or_a_query_token() -> None:
    async with running(auth_secret=SECRET) as h:
        by_header = await http_get(h.host, h.port, "/agents", headers={"Authorization": f"Bearer {token()}"})
        by_query = await http_get(h.host, h.port, f"/agents?token={token()}")
        assert by_header[0] == by_query[0] == 200 and by_header[2] == by_query[2]
        assert json.loads(by_header[2]) == {"default": "demo", "agents": [{"name": "demo", "description": ""}]}
        assert by_header[1]["content-type"] == "application/json" and "access-control-allow-origin" not in by_header[1]


async def test_an_allowed_origin_may_read_the_answer_and_any_other_is_refused_with_403() -> None:
    async with running(auth_secret=SECRET, allowed_origins="https://app.example") as h:
        headers = {"Authorization": f"Bearer {token()}"}
        status, got, _ = await http_get(h.host, h.port, "/agents", headers={**headers, "Origin": "https://app.example"})
        assert (status, got["access-control-allow-origin"], got["vary"]) == (200, "https://app.example", "Origin")
        status, _, body = await http_get(h.host, h.port, "/v1/conversations",
                                         headers={**headers, "Origin": "https://evil.example"})
        assert (status, body) == (403, b"forbidden: origin not allowed\n")


async def test_the_conversation_list_over_http_is_the_callers_own_a_page_at_a_time() -> None:
    async with running(auth_secret=SECRET) as h:
        async with h.client(token("alice")) as alice, h.client(token("bob")) as bob:
            mine = sorted([await alice.open() for _ in range(3)], reverse=True)
            await bob.open()
        headers = {"Authorization": f"Bearer {token('alice')}"}
        status, _, body = await http_get(h.host, h.port, "/v1/conversations?limit=2", headers=headers)
        first = json.loads(body)
        assert status == 200 and [c["conversation_id"] for c in first["conversations"]] == mine[:2]
        _, _, body = await http_get(h.host, h.port, f"/v1/conversations?limit=2&before={first['next_before']}",
                                    headers=headers)
        assert json.loads(body) == {"conversations": [{**first["conversations"][0], "conversation_id": mine[2]}]}


@pytest.mark.parametrize(("query", "reason"), [
    ("limit=0", b"bad request: limit must be an integer from 1 to 100\n"),
    ("limit=101", b"bad request: limit must be an integer from 1 to 100\n"),
    ("limit=two", b"bad request: limit must be an integer from 1 to 100\n"),
    ("before=forged", b"bad request: before: not a cursor of this server (pass a page's next_before)\n"),
])
async def test_a_bad_query_is_400_saying_why(query: str, reason: bytes) -> None:
    async with running() as h:
        assert (await http_get(h.host, h.port, f"/v1/conversations?{query}"))[::2] == (400, reason)


# -- a store outage (docs/wire-protocol.md#5-error-codes, #12-http-endpoints-on-the-same-port) -------


@dataclass(frozen=True)
class Health:
    """The shape of a backend's `store_health()` (gateway/server.py StoreHealth)."""

    ok: bool
    since: float | None = None
    cause: str | None = None


class OutageBackend(FakeBackend):
    """The fake backend with a store that `fail()` takes down and `recover()` brings back: its
    health and counters as a backend reports them, and every open and command refused meanwhile."""

    def __init__(self) -> None:
        super().__init__()
        self.outage: StoreUnavailable | None = None
        self.since: float | None = None
        self.counters: dict[str, Any] = {"retried_batches": 0}

    def fail(self, cause: str = "failover", retry_after_ms: int = 1000, since: float | None = None) -> None:
        self.outage = StoreUnavailable(cause, retry_after_ms)
        self.since = time.time() if since is None else since

    def recover(self) -> None:
        self.outage = self.since = None

    def store_health(self) -> Health:
        if self.outage is None:
            return Health(ok=True)
        return Health(ok=False, since=self.since, cause=self.outage.cause)

    def store_counters(self) -> dict[str, Any]:
        return dict(self.counters)

    async def open(self, owner: Owner, conversation_id: str | None, agent: str | None, mode: str | None,
                   create_missing: bool = False) -> Opened:
        if self.outage is not None:
            raise self.outage
        return await super().open(owner, conversation_id, agent, mode)

    async def command(self, owner: Owner, conversation_id: str, command: Command) -> AckStatus:
        if self.outage is not None:
            raise self.outage
        return await super().command(owner, conversation_id, command)

    async def list_conversations(self, owner: Owner, limit: int, before: str | None) -> ConversationPage:
        if self.outage is not None:
            raise self.outage
        return await super().list_conversations(owner, limit, before)


class AsyncHealthBackend(OutageBackend):
    """A backend whose store lives elsewhere (Ray): its health is a coroutine."""

    async def store_health(self) -> Health:  # type: ignore[override]
        await asyncio.sleep(0)
        return super().store_health()


@contextlib.asynccontextmanager
async def serving(backend: FakeBackend) -> AsyncIterator[tuple[str, int, GatewayServer]]:
    server = GatewayServer(Settings(host="127.0.0.1", port=0, backend="local"), backend)
    host, port = await server.start()
    try:
        yield host, port, server
    finally:
        await server.drain()


def metric(text: str, name: str) -> float | None:
    """A sample's value in Prometheus text, or None when there is no such sample."""
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, flags=re.MULTILINE)
    return None if found is None else float(found.group(1))


@pytest.mark.parametrize("backend_type", [OutageBackend, AsyncHealthBackend])
async def test_readyz_is_503_naming_the_cause_while_the_store_is_down_and_open_sockets_stay(
    backend_type: type[OutageBackend],
) -> None:
    backend = backend_type()
    async with serving(backend) as (host, port, _), client(f"ws://{host}:{port}/ws") as c:
        assert (await http_get(host, port, "/readyz"))[::2] == (200, b"ready (generation local)\n")
        backend.fail("failover", since=time.time() - 12.5)
        status, _, body = await http_get(host, port, "/readyz")
        assert status == 503
        assert re.fullmatch(rb"not ready: store unavailable since 12\.[5-9]s: failover\n", body), body
        assert (await c.request(type="ping"))["type"] == "pong"  # the WebSocket is kept
        backend.recover()
        assert (await http_get(host, port, "/readyz"))[0] == 200


async def test_a_command_during_an_outage_is_unavailable_then_the_same_id_is_acked() -> None:
    backend = OutageBackend()
    async with serving(backend) as (host, port, _), client(f"ws://{host}:{port}/ws") as c:
        cid = await c.open()
        backend.fail("failover", retry_after_ms=1500)
        refused = await c.request(type="user_message", id="m1", conversation_id=cid, text="hi")
        assert refused == {"type": "error", "code": "unavailable", "id": "m1", "conversation_id": cid,
                           "retry_after_ms": 1500, "message": "store unavailable: failover; frame not "
                           "processed, send it again (same id) after 1500 ms"}
        assert backend.conversations[cid].commands == []
        backend.recover()
        acked = await c.request(type="user_message", id="m1", conversation_id=cid, text="hi")
        assert acked == {"type": "ack", "id": "m1", "status": "accepted", "conversation_id": cid}
        metrics = (await http_get(host, port, "/metrics"))[2].decode()
        assert metric(metrics, 'reactgate_errors_total{code="unavailable"}') == 1.0
        assert metric(metrics, 'reactgate_errors_total{code="internal"}') is None


async def test_the_conversation_list_over_http_is_503_with_retry_after_during_an_outage() -> None:
    backend = OutageBackend()
    async with serving(backend) as (host, port, _):
        backend.fail("disk full", retry_after_ms=2500)
        status, headers, body = await http_get(host, port, "/v1/conversations")
        assert (status, headers["retry-after"]) == (503, "3")
        assert body == b"store unavailable: disk full; retry after 2500 ms\n"


async def test_metrics_show_the_store_up_then_down_then_up_and_count_the_outage_seconds() -> None:
    backend = OutageBackend()
    async with serving(backend) as (host, port, _):
        text = (await http_get(host, port, "/metrics"))[2].decode()
        assert metric(text, "reactgate_store_up") == 1.0
        assert metric(text, "reactgate_store_outage_seconds_total") == 0.0
        assert metric(text, "reactgate_store_retried_batches_total") == 0.0
        backend.fail()
        assert (await http_get(host, port, "/readyz"))[0] == 503  # a look: down from here
        await asyncio.sleep(0.3)
        backend.counters["retried_batches"] = 4  # the store retried batches meanwhile
        text = (await http_get(host, port, "/metrics"))[2].decode()
        assert metric(text, "reactgate_store_up") == 0.0
        down = metric(text, "reactgate_store_outage_seconds_total")
        assert down is not None and down >= 0.3
        assert metric(text, "reactgate_store_retried_batches_total") == 4.0
        backend.recover()
        text = (await http_get(host, port, "/metrics"))[2].decode()
        assert metric(text, "reactgate_store_up") == 1.0
        after = metric(text, "reactgate_store_outage_seconds_total")
        await asyncio.sleep(0.1)
        text = (await http_get(host, port, "/metrics"))[2].decode()
        assert after is not None and after >= down
        assert metric(text, "reactgate_store_outage_seconds_total") == after  # up: no more seconds


async def test_a_backend_without_a_store_health_has_no_store_metrics_and_a_plain_readyz() -> None:
    async with running() as h:
        assert not hasattr(h.backend, "store_health")
        assert (await http_get(h.host, h.port, "/readyz"))[0] == 200
        text = (await http_get(h.host, h.port, "/metrics"))[2].decode()
        assert "reactgate_store_" not in text


async def test_the_store_is_watched_without_any_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "STORE_POLL_S", 0.02)
    backend = OutageBackend()
    backend.fail()
    async with serving(backend) as (_, _, server):
        await asyncio.sleep(0.2)
        assert server.metrics.store.up is False and server.metrics.store.outage_s > 0.1


@pytest.mark.parametrize(("counters", "shown"), [
    ({"retried_batches": 3, "retries_total": 7}, {"retried_batches": 3.0, "retries": 7.0}),
    ({"Bad-Name": 1, "up": 1, "nan": float("nan"), "flag": True, "text": "9", "ok": 2}, {"ok": 2.0}),
])  # fmt: skip
def test_store_counters_that_are_no_metric_are_skipped(counters: dict[str, Any], shown: dict[str, float]) -> None:
    store = StoreMetrics()
    store.set_counters(counters)
    assert store.counters == shown


async def test_a_store_health_that_raises_or_hangs_tells_nothing_and_one_that_raises_an_outage_is_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server_module, "STORE_ASK_TIMEOUT_S", 0.05)

    class Raises:
        def store_health(self) -> Health:
            raise RuntimeError("bug")

    class Hangs:
        async def store_health(self) -> Health:
            await asyncio.sleep(10)
            raise AssertionError

    class Down:
        def store_health(self) -> Health:
            raise StoreUnavailable("restart")

    assert await store_health(Raises()) is None
    assert await store_health(Hangs()) is None
    assert await store_health(object()) is None
    down = await store_health(Down())
    assert down is not None and (down.ok, down.cause) == (False, "restart")
    assert store_down_text(Health(ok=False, since=100.0, cause="fail\nover"), 112.34) == \
        "store unavailable since 12.3s: fail over"
    assert store_down_text(Health(ok=False), 0.0) == "store unavailable: unknown cause"
