"""Several agents behind one gateway, and each caller's own conversation list, over a real server on
loopback, on both backends (docs/design.md#several-agents, docs/design.md#conversation-list,
docs/wire-protocol.md#16-agents-and-the-conversation-list).

The gateway serves the demo agent (the default) and `second`, a profile of its own with another
tool and another script. Auth is on: tokens of two tenants, so that "only the caller's own" is
checked against a real neighbour. On Ray every test of the module shares one store, so each test
takes owners of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from actors.profile import AgentProfile, demo_profile, parse_profile
from actors.tools.demo import demo_registry
from gateway.server import GatewayServer
from gateway.settings import Settings
from protocol.frames import ConversationEntry, encode_cursor
from tests.e2e import (
    LocalServer,
    RayHosting,
    action,
    call,
    complete,
    local_server,
    ray_hosting,
    ray_server,
    script,
    text_round,
    thinking,
    token,
)
from tests.kit import TIMEOUT, Client, http_get

SECRET = "agents-e2e-secret-for-hs256-32-bytes!"
DEMO_ANSWER = "It rains in Paris, 12 °C."
SECOND_ANSWER = "It is noon, says the second agent."
DEMO_SCRIPT = script(
    text_round(thinking("Checking the weather."), action(call("demo.weather", city="Paris"))),
    text_round(thinking("Answering."), action(complete(DEMO_ANSWER))),
    loop=True,
)
SECOND_SCRIPT = script(
    text_round(thinking("Checking the time."), action(call("demo.clock"))),
    text_round(thinking("Answering."), action(complete(SECOND_ANSWER))),
    loop=True,
)
NOT_SERVED = "unknown agent 'second': this conversation's agent is not served here"


def second_profile() -> AgentProfile:
    return parse_profile({"name": "second", "model": "scripted/none", "instructions": "You tell the time.\nBriefly.",
                          "policies": {"flush_interval_ms": 5}, "tools": [{"id": "demo.clock"}]},
                         known_tools=demo_registry())


def demo() -> AgentProfile:
    return demo_profile(known_tools=demo_registry())


@pytest.fixture(scope="module")
def hosting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayHosting]:
    with ray_hosting(tmp_path_factory.mktemp("ray"), {"demo": DEMO_SCRIPT, "second": SECOND_SCRIPT},
                     profiles={"second": second_profile()}) as hosting:
        yield hosting


@pytest.fixture(params=["local", pytest.param("ray", marks=pytest.mark.ray)])
async def server(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LocalServer]:
    if request.param == "local":
        async with local_server(tmp_path / "agents.sqlite3", DEMO_SCRIPT, others=[(second_profile(), SECOND_SCRIPT)],
                                auth_secret=SECRET) as s:
            yield s
        return
    async with ray_server(request.getfixturevalue("hosting"), auth_secret=SECRET) as s:
        yield s


def owner(tenant: str) -> str:
    """A token for a user of a tenant of this test's own (on Ray the store is the module's)."""
    return token(f"user-{uuid.uuid4().hex[:8]}", tenant=f"{tenant}-{uuid.uuid4().hex[:8]}", secret=SECRET)


async def get(server: LocalServer, path: str, bearer: str | None = None, **headers: str) -> tuple[int, dict[str, str], Any]:
    """GET on the gateway's port; the body parsed when it is JSON."""
    if bearer is not None:
        headers["Authorization"] = f"Bearer {bearer}"
    status, got, body = await http_get(server.host, server.port, path, headers=headers)
    return status, got, json.loads(body) if got.get("content-type") == "application/json" else body.decode()


async def turn(c: Client, cid: str, text: str, turn_id: str = "t1") -> list[dict[str, Any]]:
    """Send `text` and read until that turn completed; the conversation's events so far."""
    assert (await c.say(cid, text))["type"] == "ack"
    await c.turn_completed(cid, turn_id)
    return c.events[cid]


def used_tools(events: list[dict[str, Any]]) -> list[str]:
    return [e["data"]["tool_id"] for e in events if e["event"] == "tool.result"]


def answers(events: list[dict[str, Any]]) -> list[str]:
    return [e["data"]["final_answer"] for e in events if e["event"] == "turn.completed"]


async def pages(c: Client, limit: int) -> list[list[dict[str, Any]]]:
    """Every page of the caller's list, following `next_before` to the end."""
    found, before = [], None
    while True:
        reply = await c.request(type="list", limit=limit, **({"before": before} if before else {}))
        assert reply["type"] == "conversations", reply
        found.append(reply["conversations"])
        before = reply.get("next_before")
        if before is None:
            return found


async def passivate(server: LocalServer, cid: str) -> None:
    """Drop the conversation from memory as an idle host does: the next frame re-activates it."""
    backend: Any = server.backend
    if hasattr(backend, "host"):
        assert await backend.host.passivate(cid)
        return
    import ray

    from actors.ray.names import NAMESPACE

    host = ray.get_actor(await backend.host_of(cid), namespace=NAMESPACE)
    assert await host.passivate.remote(cid)


# -- several agents ---------------------------------------------------------------------------------------------------


async def test_get_agents_lists_both_agents_with_their_descriptions_and_the_default(server: LocalServer) -> None:
    bearer = owner("acme")
    status, headers, body = await get(server, "/agents", bearer)
    assert (status, headers["content-type"]) == (200, "application/json")
    assert body == {"default": "demo", "agents": [
        {"name": "demo", "description": demo().summary},
        {"name": "second", "description": "You tell the time."},   # the first line of its instructions
    ]}
    assert (await get(server, f"/agents?token={bearer}"))[2] == body   # as the console sends it


async def test_get_agents_needs_what_the_websocket_needs(server: LocalServer) -> None:
    status, _, body = await get(server, "/agents")
    assert (status, body) == (401, "unauthorized: missing token: send `Authorization: Bearer <JWT>` or `?token=<JWT>`\n")
    assert (await get(server, "/agents", "not-a-jwt"))[:1] == (401,)
    status, _, body = await get(server, "/agents", owner("acme"), Origin="https://evil.example")
    assert (status, body) == (403, "forbidden: origin not allowed\n")


async def test_open_runs_the_default_agent_and_open_second_runs_the_second_profile_also_after_passivation(
    server: LocalServer,
) -> None:
    async with server.client(owner("acme")) as c:
        default, second = await c.open(), await c.open(agent="second")
        for cid in (default, second):
            await c.subscribe(cid)
        assert (used_tools(await turn(c, default, "weather?")), answers(c.events[default])) == (
            ["demo.weather"], [DEMO_ANSWER])
        assert (used_tools(await turn(c, second, "time?")), answers(c.events[second])) == (
            ["demo.clock"], [SECOND_ANSWER])
        await passivate(server, second)   # re-activated by the next command: still the second agent
        events = await turn(c, second, "and now?", "t2")
        assert (used_tools(events), answers(events)) == (["demo.clock", "demo.clock"], [SECOND_ANSWER] * 2)
        listed = {e["conversation_id"]: e["agent"] for page in await pages(c, 10) for e in page}
        assert listed == {default: "demo", second: "second"}


async def test_open_with_an_agent_not_served_is_not_found_naming_it(server: LocalServer) -> None:
    async with server.client(owner("acme")) as c:
        error = await c.request(type="open", id="o1", agent="nobody")
        assert error == {"type": "error", "id": "o1", "code": "not_found", "message": "unknown agent 'nobody'"}


# -- the conversation list --------------------------------------------------------------------------------------------


async def test_the_list_pages_through_each_callers_own_conversations_newest_first(server: LocalServer) -> None:
    alice, bob = owner("tenant-a"), owner("tenant-b")
    async with server.client(alice) as a, server.client(bob) as b:
        mine = [await a.open(agent="second" if i % 3 == 0 else None) for i in range(7)]
        theirs = [await b.open() for _ in range(3)]
        alices = await pages(a, 3)
        assert [len(page) for page in alices] == [3, 3, 1]
        assert [e["conversation_id"] for page in alices for e in page] == mine[::-1]   # no gap, no duplicate
        assert [e["conversation_id"] for page in await pages(b, 3) for e in page] == theirs[::-1]
        over_http = []
        before = ""
        while True:
            status, _, body = await get(server, f"/v1/conversations?limit=3{before}", alice)
            assert status == 200, body
            over_http.append(body["conversations"])
            if "next_before" not in body:
                break
            before = f"&before={quote(body['next_before'])}"
        assert over_http == alices                     # the same entries, the same cursors


async def test_a_forged_cursor_shows_nothing_of_another_owner(server: LocalServer) -> None:
    alice, bob = owner("tenant-a"), owner("tenant-b")
    async with server.client(alice) as a, server.client(bob) as b:
        mine = [await a.open() for _ in range(2)]
        theirs = [await b.open() for _ in range(2)]
        [[bobs_newest, _]] = await pages(b, 5)
        forged = [encode_cursor(ConversationEntry(**bobs_newest)),           # a position among bob's
                  encode_cursor(ConversationEntry(**{**bobs_newest, "last_active_at": 1e300}))]  # before everything
        for before in forged:
            reply = await a.request(type="list", limit=5, before=before)
            assert [e["conversation_id"] for e in reply["conversations"]] == mine[::-1]
            status, _, body = await get(server, f"/v1/conversations?before={quote(before)}", alice)
            assert status == 200 and {e["conversation_id"] for e in body["conversations"]} <= set(mine)
        assert not set(theirs) & {e["conversation_id"] for page in await pages(a, 1) for e in page}
        error = await a.request(type="list", id="l9", limit=5, before="not-a-cursor")
        assert error == {"type": "error", "id": "l9", "code": "bad_request",
                         "message": "before: not a cursor of this server (pass a page's next_before)"}
        assert (await get(server, "/v1/conversations?before=not-a-cursor", alice))[:1] == (400,)
        assert (await get(server, "/v1/conversations?limit=0", alice))[::2] == (
            400, "bad request: limit must be an integer from 1 to 100\n")
        assert (await get(server, "/v1/conversations"))[0] == 401


async def test_a_listed_conversation_shows_its_title_last_seq_and_when_it_stops_running(server: LocalServer) -> None:
    async with server.client(owner("acme")) as c:
        cid = await c.open()
        await c.subscribe(cid)
        events = await turn(c, cid, "  What's the weather\n in   Paris?  ")
        long = await c.open(agent="second")
        await c.subscribe(long)
        await turn(c, long, "tell me the time " * 10)

        async def listed() -> dict[str, dict[str, Any]]:
            return {e["conversation_id"]: e for page in await pages(c, 10) for e in page}

        entries: dict[str, dict[str, Any]] = {}

        async def settled() -> None:  # `running` turns false shortly after turn.completed, never before it
            while True:
                entries.update(await listed())
                if not any(e["running"] for e in entries.values()):
                    return
                await asyncio.sleep(0.02)

        await asyncio.wait_for(settled(), TIMEOUT)
        first = entries[cid]
        assert (first["title"], first["agent"], first["last_seq"]) == ("What's the weather in Paris?", "demo", len(events))
        assert first["created_at"] <= first["last_active_at"] <= events[-1]["ts"] + 1
        assert len(entries[long]["title"]) == 80 and entries[long]["title"].endswith("…")
        assert list(entries) == [long, cid]     # the newest activity first


async def test_a_deleted_conversation_is_never_listed(server: LocalServer) -> None:
    async with server.client(owner("acme")) as c:
        kept, gone = await c.open(), await c.open()
        assert (await c.request(type="delete", conversation_id=gone))["status"] == "accepted"
        assert [e["conversation_id"] for page in await pages(c, 10) for e in page] == [kept]


# -- an agent removed from the configuration (last: on Ray it replaces the module's generation) ----------------------


@contextlib.asynccontextmanager
async def without_second(server: LocalServer, hosting: RayHosting | None, path: Path) -> AsyncIterator[LocalServer]:
    """The same store behind a gateway whose configuration no longer has the second agent."""
    if hosting is None:
        async with local_server(path, DEMO_SCRIPT, auth_secret=SECRET) as s:
            yield s
        return
    from actors.ray.backend import RayBackend

    config = dataclasses.replace(hosting.config, profiles={"demo": hosting.config.profiles["demo"]}, hosts=1)
    settings = Settings(host="127.0.0.1", port=0, backend="ray", store=config.store_url, auth_secret=SECRET)
    gateway = GatewayServer(settings, RayBackend(config, default_agent="demo"))  # a new generation: it becomes current
    host, port = await gateway.start()
    try:
        yield LocalServer(gateway, gateway.backend, settings, host, port)  # type: ignore[arg-type]
    finally:
        await gateway.drain()


@pytest.mark.parametrize("kind", ["local", pytest.param("ray", marks=pytest.mark.ray)])
async def test_a_conversation_whose_agent_was_removed_answers_not_found_naming_it(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path,
) -> None:
    alice = owner("acme")
    path = tmp_path / "removed.sqlite3"
    hosting: RayHosting | None = request.getfixturevalue("hosting") if kind == "ray" else None
    first = (local_server(path, DEMO_SCRIPT, others=[(second_profile(), SECOND_SCRIPT)], auth_secret=SECRET)
             if hosting is None else ray_server(hosting, auth_secret=SECRET))
    async with first as before, before.client(alice) as c:
        cid = await c.open(agent="second")
        kept = await c.open()
        await c.subscribe(cid)
        await turn(c, cid, "time?")
    async with without_second(before, hosting, path) as after, after.client(alice) as c:
        for frame in ({"type": "open", "conversation_id": cid},
                      {"type": "subscribe", "conversation_id": cid},
                      {"type": "user_message", "conversation_id": cid, "text": "still there?"}):
            error = await c.request(id="f", **frame)
            assert error == {"type": "error", "id": "f", "code": "not_found", "message": NOT_SERVED,
                             "conversation_id": cid}, frame
        assert (await c.request(type="open", conversation_id=kept))["type"] == "ack"   # the demo's still serve
        [[*entries]] = await pages(c, 10)
        assert {e["conversation_id"]: e["agent"] for e in entries} == {cid: "second", kept: "demo"}
        assert (await c.request(type="delete", conversation_id=cid))["status"] == "accepted"   # still theirs to delete
