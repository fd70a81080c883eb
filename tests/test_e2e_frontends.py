"""The frontends' endpoints at the gateway's edge (docs/frontends.md), on the local and the Ray
backend: one port splits the WebSocket from the HTTP exchanges (gateway/front.py), and a refusal on
`/api/chat` or `/agui` is the one `/ws` gives — a missing token, a foreign conversation, a bad body —
with nothing created. The flows themselves are read by the official packages (tests/js/).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from actors.hosting.owners import chat_conversation_id
from actors.identity import Owner
from tests.e2e import SECRET, LocalServer, RayHosting, local_server, ray_hosting, ray_server, token
from tests.kit import TIMEOUT

Serve = Callable[..., contextlib.AbstractAsyncContextManager[LocalServer]]
_stores = itertools.count(1)
_users = itertools.count(1)


@pytest.fixture
def alice() -> Owner:
    """A user of this test only: the Ray backend's store is shared by the module's tests."""
    return Owner(tenant="acme", sub=f"alice-{next(_users)}")


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayHosting]:
    from tests.e2e import weather_then_answer

    with ray_hosting(tmp_path_factory.mktemp("ray"), {"demo": weather_then_answer()}) as hosting:
        yield hosting


@pytest.fixture(params=["local", pytest.param("ray", marks=pytest.mark.ray)])
def serve(request: pytest.FixtureRequest, tmp_path: Path) -> Serve:
    if request.param == "ray":
        hosting: RayHosting = request.getfixturevalue("ray_cluster")
        return lambda **settings: ray_server(hosting, **settings)
    return lambda **settings: local_server(tmp_path / f"s{next(_stores)}.sqlite3", **settings)


def chat_body(chat_id: str, text: str = "weather in Paris?", message_id: str = "m1") -> dict[str, Any]:
    """What the AI SDK's DefaultChatTransport posts for a new user message."""
    return {"id": chat_id, "trigger": "submit-message", "messageId": None,
            "messages": [{"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}]}


def run_body(thread_id: str, run_id: str = "r1", text: str = "weather in Paris?") -> dict[str, Any]:
    """An AG-UI RunAgentInput with one new user message."""
    return {"threadId": thread_id, "runId": run_id, "state": {}, "tools": [], "context": [],
            "forwardedProps": {}, "messages": [{"id": "u1", "role": "user", "content": text}]}


async def post(server: LocalServer, path: str, body: bytes | dict[str, Any], bearer: str | None = None,
               **headers: str) -> tuple[int, bytes, dict[str, str]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    sent = {"Content-Type": "application/json", **headers}
    if bearer:
        sent["Authorization"] = f"Bearer {bearer}"
    async with aiohttp.ClientSession() as http, http.post(
        f"http://127.0.0.1:{server.port}{path}", data=data, headers=sent,
        timeout=aiohttp.ClientTimeout(total=TIMEOUT),
    ) as response:
        return response.status, await response.read(), dict(response.headers)


async def listed(server: LocalServer, owner: Owner) -> list[str]:
    page = await server.backend.list_conversations(owner, 50, None)
    return [c.conversation_id for c in page.conversations]


ENDPOINTS = [("/api/chat", chat_body), ("/agui", run_body)]


@pytest.mark.parametrize(("path", "body"), ENDPOINTS, ids=["aisdk", "agui"])
async def test_a_missing_or_bad_token_is_the_handshakes_401(serve: Serve, path: str, body: Any, alice: Owner) -> None:
    async with serve(auth_secret=SECRET) as server:
        for bearer in (None, "garbage"):
            status, text, _ = await post(server, path, body("chat-1"), bearer)
            assert status == 401 and text.startswith(b"unauthorized: ")
        assert await listed(server, alice) == []


@pytest.mark.parametrize(("path", "body"), ENDPOINTS, ids=["aisdk", "agui"])
async def test_a_foreign_conversation_is_the_same_forbidden_as_on_ws(
    serve: Serve, path: str, body: Any, alice: Owner,
) -> None:
    async with serve(auth_secret=SECRET) as server:
        async with server.client(token(sub="bob")) as bob:
            theirs = await bob.open()
            ws_refusal = await bob.request(type="subscribe", conversation_id=theirs)  # bob's own: accepted
            assert ws_refusal["type"] == "ack"
        async with server.client(token(alice.sub)) as her:
            on_ws = await her.request(type="subscribe", conversation_id=theirs)
        status, text, headers = await post(server, path, body(theirs), token(alice.sub))
        assert status == 403 and headers["Content-Type"] == "application/json"
        frame = json.loads(text)
        assert (frame["type"], frame["code"], frame["message"]) == ("error", "forbidden", on_ws["message"])
        assert await listed(server, alice) == []


@pytest.mark.parametrize(("path", "body"), ENDPOINTS, ids=["aisdk", "agui"])
async def test_a_bad_body_is_bad_request_naming_what_is_wrong_and_creates_nothing(
    serve: Serve, path: str, body: Any, alice: Owner,
) -> None:
    good = body("chat-1")
    bad = [b"", b"not json", b"[]", json.dumps({**good, "messages": "x"}).encode()]
    async with serve(auth_secret=SECRET) as server:
        for each in bad:
            status, text, _ = await post(server, path, each, token(alice.sub))
            frame = json.loads(text)
            assert status == 400 and (frame["type"], frame["code"]) == ("error", "bad_request"), text
            assert frame["message"]
        assert await listed(server, alice) == []


@pytest.mark.parametrize(("path", "body"), ENDPOINTS, ids=["aisdk", "agui"])
async def test_two_callers_same_chat_id_get_two_conversations(
    serve: Serve, path: str, body: Any, alice: Owner,
) -> None:
    """A browser-made chat id names the caller's own conversation (docs/frontends.md#chat-ids)."""
    bob = Owner(tenant="acme", sub=f"bob-{next(_users)}")
    async with serve(auth_secret=SECRET) as server:
        for who in (alice, bob):
            status, text, headers = await post(server, path, body("chat-1"), token(who.sub))
            assert status == 200, text
            assert headers["Content-Type"].startswith("text/event-stream")
        assert await listed(server, alice) == [chat_conversation_id(alice, "chat-1")]
        assert await listed(server, bob) == [chat_conversation_id(bob, "chat-1")]


async def test_one_port_keeps_the_websocket_and_the_get_routes(serve: Serve) -> None:
    async with serve() as server:
        async with server.client() as c:
            assert (await c.request(type="ping"))["type"] == "pong"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{server.port}/healthz") as response:
                assert response.status == 200
            async with http.post(f"http://127.0.0.1:{server.port}/healthz", data=b"x") as response:
                assert response.status == 404  # a body websockets cannot read: answered here
            async with http.get(f"http://127.0.0.1:{server.port}/api/chat") as response:
                assert response.status == 404


async def test_a_body_over_the_frame_limit_is_refused_before_reading_it(serve: Serve, alice: Owner) -> None:
    async with serve(max_frame_bytes=4096, auth_secret=SECRET) as server:
        status, text, _ = await post(server, "/api/chat", b"x" * 5000, token(alice.sub))
        assert status == 413 and b"4096" in text
        assert await listed(server, alice) == []


async def test_a_silent_socket_does_not_hold_the_port(serve: Serve) -> None:
    """A connection that sent half a head is held back from both sides; others are served meanwhile."""
    async with serve() as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /api/chat HTTP/1.1\r\nHost: x\r\n")
        async with server.client() as c:
            assert (await c.request(type="ping"))["type"] == "pong"
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
        del reader


@pytest.mark.parametrize(("path", "body"), ENDPOINTS, ids=["aisdk", "agui"])
async def test_a_deleted_chat_is_never_created_again(serve: Serve, path: str, body: Any, alice: Owner) -> None:
    """A chat id names one conversation for good: once deleted, its id is nobody's (docs/design.md#deletion)."""
    async with serve(auth_secret=SECRET) as server:
        status, _, headers = await post(server, path, body("gone"), token(alice.sub))
        cid = headers["X-Reactgate-Conversation-Id"]
        assert status == 200 and cid == chat_conversation_id(alice, "gone")
        async with server.client(token(alice.sub)) as her:
            deleted = await her.request(type="delete", conversation_id=cid)
            assert (deleted["type"], deleted["status"]) == ("ack", "accepted")
        status, text, _ = await post(server, path, body("gone"), token(alice.sub))
        assert status == 403 and json.loads(text)["code"] == "forbidden"
        assert await listed(server, alice) == []
