"""Ownership and authentication on a server configured with a JWT secret (docs/wire-protocol.md#authentication).

Only the owner (`sub` + `tenant`) may open, watch or write to a conversation; anyone else gets
`forbidden` with the very same reply whether or not the conversation exists, so the reply leaks
nothing. Bad or expired tokens never get a WebSocket. Without a secret, the server refuses to
bind anything but loopback. Every case runs on both backends: ownership is checked by the hosting
layer, which is a different program on each (tests/e2e.py `ray_server`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from gateway.session import FORBIDDEN_MESSAGE
from tests.e2e import (
    SECRET,
    LocalServer,
    RayHosting,
    check_log,
    local_server,
    ray_hosting,
    ray_server,
    run_serve,
    store_url,
    token,
    weather_then_answer,
)
from tests.kit import PROTO

GHOST = "c_" + "q" * 22


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayHosting]:
    with ray_hosting(tmp_path_factory.mktemp("ray"), {"demo": weather_then_answer()}) as hosting:
        yield hosting


@pytest.fixture(params=["local", pytest.param("ray", marks=pytest.mark.ray)])
async def server(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LocalServer]:
    if request.param == "ray":
        async with ray_server(request.getfixturevalue("ray_cluster"), auth_secret=SECRET) as s:
            yield s
    else:
        async with local_server(tmp_path / "s.sqlite3", auth_secret=SECRET) as s:
            yield s


def frames(conversation_id: str) -> list[dict[str, Any]]:
    """One of each frame that names a conversation, with fixed ids."""
    return [
        {"type": "open", "id": "1", "conversation_id": conversation_id},
        {"type": "subscribe", "id": "2", "conversation_id": conversation_id},
        {"type": "unsubscribe", "id": "3", "conversation_id": conversation_id},
        {"type": "user_message", "id": "4", "conversation_id": conversation_id, "text": "hi"},
        {"type": "steer", "id": "5", "conversation_id": conversation_id, "text": "hi"},
        {"type": "answer", "id": "6", "conversation_id": conversation_id, "ask_id": "a", "answer": "b"},
        {"type": "set_mode", "id": "7", "conversation_id": conversation_id, "mode": "ask"},
        {"type": "cancel", "id": "8", "conversation_id": conversation_id},
    ]


@pytest.mark.parametrize(("sub", "tenant"), [("mallory", "evil"), ("alice", "evil"), ("bob", "acme")])
async def test_another_owner_gets_forbidden_for_every_frame_whether_or_not_the_conversation_exists(
    server: LocalServer, sub: str, tenant: str
) -> None:
    async with server.client(token("alice", "acme")) as alice, server.client(token(sub, tenant)) as other:
        cid = await alice.open()
        await alice.subscribe(cid)
        raw: dict[str, list[str]] = {}
        for target in (cid, GHOST):
            replies = []
            for frame in frames(target):
                await other.ws.send(json.dumps(frame))
                replies.append(str(await other.ws.recv()))
            raw[target] = [r.replace(target, "<cid>") for r in replies]
        # byte for byte the same, but for the conversation id the caller sent
        assert raw[cid] == raw[GHOST]
        assert raw[cid][0] == ('{"type":"error","code":"forbidden","message":"' + FORBIDDEN_MESSAGE
                               + '","id":"1","conversation_id":"<cid>"}')
        assert all('"code":"forbidden"' in r for r in raw[cid])
        # and nothing reached alice's conversation: her own next message starts turn t1
        await alice.say(cid, id="m1")
        done = await alice.turn_completed(cid)
        assert [e["event"] for e in alice.events[cid]].count("turn.started") == 1
        assert done["data"]["reason"] == "complete"
        check_log(alice.events[cid])


async def test_the_owner_reconnecting_with_a_fresh_token_may_open_and_watch(server: LocalServer) -> None:
    first, fresh = token("alice", "acme", exp_in=600), token("alice", "acme", exp_in=1200)
    assert first != fresh                             # another token; the owner is its sub + tenant
    async with server.client(first) as alice:
        cid = await alice.open()
        said = await alice.say(cid, id="m1")
        assert said["type"] == "ack", said
    async with server.client(fresh) as again:
        reopened = await again.request(type="open", conversation_id=cid)
        assert (reopened["type"], reopened["conversation_id"]) == ("ack", cid), reopened
        watched = await again.request(type="subscribe", conversation_id=cid, after_seq=0)
        assert watched["type"] == "ack", watched
        done = await again.turn_completed(cid)
    events = again.events[cid]
    assert (events[0]["event"], events[0]["data"]["message_id"]) == ("user.message", "m1")  # her words, from seq 1
    assert (events[1]["event"], events[1]["data"]["user_message_id"]) == ("turn.started", "m1")  # then her turn
    assert done["data"]["reason"] == "complete"
    check_log(events)


@pytest.mark.parametrize(
    "bearer",
    [
        None,
        token(secret="not-the-server-secret-but-as-long-as-it"),
        token(exp_in=-60),
        token(exp=None),
        "not.a.jwt",
    ],
    ids=["missing", "bad_signature", "expired", "without_exp", "garbage"],
)
async def test_a_bad_or_expired_token_is_refused_at_the_handshake(server: LocalServer, bearer: str | None) -> None:
    with pytest.raises(InvalidStatus) as refused:
        async with server.client(bearer):
            pass
    assert refused.value.response.status_code == 401
    assert b"unauthorized" in refused.value.response.body
    assert SECRET.encode() not in refused.value.response.body


async def test_a_token_in_the_query_string_is_accepted(server: LocalServer) -> None:
    async with connect(f"{server.url}?token={token()}", subprotocols=PROTO) as ws:
        await ws.send('{"type":"ping","id":"p"}')
        assert await ws.recv() == '{"type":"pong","id":"p"}'


@pytest.mark.slow
def test_binding_a_non_loopback_address_without_a_secret_refuses_to_start(tmp_path: Path) -> None:
    store = tmp_path / "data" / "s.sqlite3"
    result = run_serve("--host", "0.0.0.0", "--port", "0", "--backend", "local", "--store", store_url(store))
    assert result.returncode == 2, result
    assert "refusing to bind '0.0.0.0' without an auth secret" in result.stderr
    assert not store.parent.exists()  # refused before touching anything
