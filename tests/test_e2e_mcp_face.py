"""The MCP face over a real gateway (docs/design.md#mcp-face), with the official `mcp` Python SDK's
streamable-HTTP `ClientSession`, on the local and the Ray backend, with tokens.

Each test opens MCP sessions on `/mcp` of a real `reactgate` gateway on loopback, and, where the
owner of the bound conversation has a part (an approval, the budget question, watching), a real
`/ws` client of the same owner. What the tests assert is what a client sees (the tool list, the
call's result or tool error, notifications) and what the conversation's log holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import MCPError

from actors.agent import Agent, load_agent
from actors.conversation import ConversationState
from actors.store.base import Store
from actors.store.sqlite import SqliteStore
from gateway.app import AgentSetup
from gateway.limits import quota_limits
from gateway.settings import Settings
from tests.e2e import (
    REPO,
    SECRET,
    LocalServer,
    RayHosting,
    ServeProcess,
    local_server,
    ray_hosting,
    ray_server,
    read_log,
    serving,
    store_url,
    token,
    weather_then_answer,
)
from tests.kit import TIMEOUT, client
from tests.mcpkit import PROFILE, big_profile, conversation_of, face_profile, mcp_session, mcp_url

SCRIPT = weather_then_answer()
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}}
EXECUTE = {"reactgate_access": "execute"}
BACKENDS = ["local", pytest.param("ray", marks=pytest.mark.ray)]


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayHosting]:
    with ray_hosting(tmp_path_factory.mktemp("mcp-ray"), {"face": SCRIPT, "big": SCRIPT},
                     profiles={"face": face_profile(), "big": big_profile()}) as hosting:
        yield hosting


@pytest.fixture(params=["local", pytest.param("ray", marks=pytest.mark.ray)])
async def gw(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LocalServer]:
    server: contextlib.AbstractAsyncContextManager[LocalServer]
    if request.param == "ray":
        server = ray_server(request.getfixturevalue("ray_cluster"), auth_secret=SECRET)
    else:
        server = local_server(tmp_path / "s.sqlite3", SCRIPT, profile=face_profile(), others=((big_profile(), SCRIPT),),
                              auth_secret=SECRET)
    async with server as s:
        yield s


def ray_variant(request: pytest.FixtureRequest, default_agent: str | None = None, **config: Any) -> RayHosting:
    """The module's Ray (`ray_cluster`: one `ray.init` per process) serving its RayConfig with `config`
    replaced: another generation, whose hosts and tool pool the first gateway of it starts; the next
    gateway of the module's own configuration makes that one current again (docs/design.md#generations)."""
    hosting: RayHosting = request.getfixturevalue("ray_cluster")
    return RayHosting(dataclasses.replace(hosting.config, **config), default_agent or hosting.default_agent)


def agent_server(agent: Agent, store_path: Path, **settings: Any) -> contextlib.AbstractAsyncContextManager[LocalServer]:
    """`local_server`'s gateway, serving `agent` (its profile and its tools) instead of the demo agent."""
    config = Settings(host="127.0.0.1", port=0, backend="local", store=store_url(store_path), **settings)
    return serving(config, AgentSetup(agent.profile, agent.registry, None))


def names(listed: types.ListToolsResult) -> set[str]:
    return {t.name for t in listed.tools}


def leaves(group: BaseException) -> list[BaseException]:
    """The exceptions an SDK client's task groups wrapped."""
    if isinstance(group, BaseExceptionGroup):
        return [leaf for e in group.exceptions for leaf in leaves(e)]
    return [group]


def text_of(result: types.CallToolResult) -> dict[str, Any]:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return dict(json.loads(block.text))


# -- initialize and tools/list -------------------------------------------------------------------------------


async def test_initialize_and_tools_list_in_observe_and_execute(gw: LocalServer) -> None:
    url = mcp_url(gw.url)
    async with mcp_session(url, token("alice")) as (observe, init):
        assert (init.meta or {})["reactgate/access"] == "observe" and "ask mode" in (init.instructions or "")
        assert init.capabilities.tools is not None and init.capabilities.tools.list_changed
        seen = names(await observe.list_tools())
    async with mcp_session(url, token("alice", **EXECUTE)) as (execute, init):
        assert (init.meta or {})["reactgate/access"] == "execute"
        full = await execute.list_tools()
    async with mcp_session(url, token("alice", **EXECUTE), query="?access=observe") as (lowered, init):
        assert (init.meta or {})["reactgate/access"] == "observe"   # a client may lower its mode, never raise it
        assert names(await lowered.list_tools()) == seen

    available = {"demo.weather", "demo.search", "demo.clock", "demo.sleep", "demo.focus_project", "react.ask_user"}
    assert seen == available                                       # no write tool in observe
    assert names(full) == available | {"demo.write_note"}          # render: only when focused; eval: needs a code channel
    note = next(t for t in full.tools if t.name == "demo.write_note")
    assert note.input_schema["properties"]["text"]["type"] == "string"
    assert (note.meta or {})["reactgate/policy"]["route"] == "write" and note.annotations and not note.annotations.read_only_hint


async def test_a_state_transition_sends_list_changed(gw: LocalServer) -> None:
    changed = asyncio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async with mcp_session(mcp_url(gw.url), token("alice", **EXECUTE), on_message=on_message) as (s, _):
        assert "demo.render" not in names(await s.list_tools())
        result = await s.call_tool("demo.focus_project", {"name": "atlas"})
        assert not result.is_error and result.structured_content == {"project": "atlas", "state": "focused"}
        await asyncio.wait_for(changed.wait(), TIMEOUT)
        assert "demo.render" in names(await s.list_tools())


async def test_search_capabilities_on_a_large_catalog(gw: LocalServer) -> None:
    async with mcp_session(mcp_url(gw.url), token("alice", **EXECUTE), query="?agent=big") as (s, init):
        assert names(await s.list_tools()) == {"react.ask_user", "demo.clock", "search_capabilities"}
        found = await s.call_tool("search_capabilities", {"query": "weather for a city"})
        assert not found.is_error
        capabilities = (found.structured_content or {})["capabilities"]
        first = capabilities[0]
        assert (first["id"], first["route"], first["trait"]) == ("demo.weather", "read", "exploration")
        assert len(first["digest"]) == 12 and first["inputSchema"]["required"] == ["city"]
        note = (await s.call_tool("search_capabilities", {"query": "store a note"})).structured_content or {}
        assert [(c["id"], c["route"], c["confirm"]) for c in note["capabilities"]][:1] == [("demo.write_note", "write", True)]
        cid = conversation_of(init)
        assert await gw.log(cid) == []                       # the search ran nothing and logged nothing
        weather = await s.call_tool("demo.weather", {"city": "Paris"})   # found by search, called by its id
        assert weather.structured_content == {"city": "Paris", "condition": "rain", "temp_c": 12}


# -- refusals: the same notice the model would read -------------------------------------------------------------


async def test_a_write_tool_in_observe_is_denied_with_the_ask_mode_notice(gw: LocalServer) -> None:
    async with mcp_session(mcp_url(gw.url), token("alice")) as (s, init):
        denied = await s.call_tool("demo.write_note", {"text": "milk"})
        assert denied.is_error
        assert text_of(denied) == {"code": "ASK_MODE_DENIED", "tool_id": "demo.write_note",
                                   "message": "demo.write_note writes, and the conversation is in ask mode; it was not run"}
        log = [(e.event, getattr(e.data, "error", None)) for e in await gw.log(conversation_of(init))]
        assert log == [("tool.call", None), ("tool.result", "ASK_MODE_DENIED")]


async def test_a_call_the_trait_matrix_forbids_is_denied_with_its_notice(gw: LocalServer) -> None:
    async with mcp_session(mcp_url(gw.url), token("alice", **EXECUTE)) as (s, init), gw.client(token("alice")) as owner:
        cid = conversation_of(init)
        await owner.subscribe(cid)
        await s.call_tool("demo.focus_project", {"name": "atlas"})
        exploring = asyncio.create_task(s.call_tool("demo.sleep", {"seconds": 120}))   # exploration, in flight
        await owner.event(cid, "tool.call", tool_id="demo.sleep")
        denied = await s.call_tool("demo.render", {"source": "report", "format": "pdf"})
        assert denied.is_error
        assert text_of(denied) == {
            "code": "multi_action.incompatible_traits", "tool_id": "demo.render",
            "message": "demo.render (exploitation) cannot share a round with demo.sleep (exploration); it was not run"}
        exploring.cancel()                                     # no exploration in flight any more
        await owner.event(cid, "tool.result", tool_id="demo.sleep")
        rendered = await s.call_tool("demo.render", {"source": "report", "format": "pdf"})
        assert rendered.structured_content == {"artifact": "report.pdf"}
        coded = await s.call_tool("demo.eval", {})             # not offered: it reads a code channel
        assert coded.is_error and text_of(coded)["code"] == "protocol_violation.tool_call_invalid"


# -- the exploration budget -----------------------------------------------------------------------------------


async def test_the_exploration_budget_stops_a_client_that_keeps_exploring(gw: LocalServer) -> None:
    async with mcp_session(mcp_url(gw.url), token("alice", **EXECUTE)) as (s, init), gw.client(token("alice")) as owner:
        cid = conversation_of(init)
        await owner.subscribe(cid)
        for city in ("Paris", "Tokyo", "Paris"):               # the cap is 3
            assert not (await s.call_tool("demo.weather", {"city": city})).is_error
        over = await s.call_tool("demo.weather", {"city": "Tokyo"})
        assert over.is_error and text_of(over) == {"error": "EXPLORATION_BUDGET_REACHED", "cap": 3}
        again = await s.call_tool("demo.search", {"query": "rain"})
        assert again.is_error and text_of(again)["code"] == "exploration_budget.confirmation_required"

        # The budget question goes to the conversation's owner, who stops the exploration.
        question = asyncio.create_task(s.call_tool("react.ask_user", {
            "question": "[[EXPLORATION_BUDGET]] keep exploring?", "options": ["Continue exploring", "Stop for now"]}))
        asked = await owner.event(cid, "ask_user")
        assert asked["data"]["client"] == {"face": "mcp", "name": "pytest-agent"}
        await owner.request(type="answer", conversation_id=cid, ask_id=asked["data"]["ask_id"], answer="Stop for now")
        assert (await question).structured_content == {"answer": "Stop for now"}

        stopped = await s.call_tool("demo.weather", {"city": "Paris"})
        assert stopped.is_error and text_of(stopped)["code"] == "tool_unavailable"
        assert "stopped exploration" in text_of(stopped)["message"]
        assert not names(await s.list_tools()) & {"demo.weather", "demo.search", "demo.sleep"}


# -- execute confirmation ---------------------------------------------------------------------------------------


async def test_a_confirm_tool_approved_and_denied_through_elicitation(gw: LocalServer) -> None:
    answers = ["Approve", "Deny", "Approve"]
    asked: list[str] = []

    async def elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"decision": answers[len(asked) - 1]})

    async with mcp_session(mcp_url(gw.url), token("alice", **EXECUTE), elicit=elicit) as (s, init):
        first = await s.call_tool("demo.write_note", {"text": "milk"})
        denied = await s.call_tool("demo.write_note", {"text": "eggs"})
        second = await s.call_tool("demo.write_note", {"text": "bread"})
        log = await gw.log(conversation_of(init))
    # The note count is the side-effect counter: the approved calls ran once each, the denied one never.
    assert first.structured_content == {"stored": True, "count": 1}
    assert denied.is_error and text_of(denied)["error"] == "denied_by_user" and text_of(denied)["decision"] == "denied"
    assert second.structured_content == {"stored": True, "count": 2}
    assert len(asked) == 3 and asked[0].startswith("Run demo.write_note?")
    decisions = [e.data.decision for e in log if e.event == "trace"]  # type: ignore[union-attr]
    assert decisions == ["approved", "denied", "approved"]
    assert not any(e.event == "ask_user" for e in log)      # the client's user decided: the owner was not asked


async def test_without_elicitation_the_owner_approves_on_ws(gw: LocalServer) -> None:
    async with mcp_session(mcp_url(gw.url), token("alice", **EXECUTE)) as (s, init), gw.client(token("alice")) as owner:
        cid = conversation_of(init)
        await owner.subscribe(cid)
        call = asyncio.create_task(s.call_tool("demo.write_note", {"text": "milk"}))
        asked = await owner.event(cid, "ask_user", kind="approval")
        assert (asked["data"]["tool_id"], asked["data"]["params"]) == ("demo.write_note", {"text": "milk"})
        assert not call.done()                                 # it waits for the owner's yes
        await owner.request(type="answer", conversation_id=cid, ask_id=asked["data"]["ask_id"], answer="Approve")
        assert (await call).structured_content == {"stored": True, "count": 1}


async def test_a_call_sent_again_with_its_call_id_runs_once(gw: LocalServer) -> None:
    asked: list[str] = []

    async def elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"decision": "Approve"})

    key = {"reactgate/call_id": "note-1"}
    url = mcp_url(gw.url)
    async with mcp_session(url, token("alice", **EXECUTE), elicit=elicit) as (s, init):
        cid = conversation_of(init)
        first = await s.call_tool("demo.write_note", {"text": "milk"}, meta=key)
        again = await s.call_tool("demo.write_note", {"text": "milk"}, meta=key)
    async with mcp_session(url, token("alice", **EXECUTE), query=f"?conversation_id={cid}", elicit=elicit) as (s, _):
        later = await s.call_tool("demo.write_note", {"text": "milk"}, meta=key)     # a new session: a retry
        other = await s.call_tool("demo.write_note", {"text": "eggs"})
    assert first.structured_content == again.structured_content == later.structured_content == {"stored": True, "count": 1}
    assert other.structured_content == {"stored": True, "count": 2}      # the note counter: "milk" was stored once
    assert len(asked) == 2
    assert [e.data.tool_id for e in await gw.log(cid) if e.event == "tool.call"] == ["demo.write_note"] * 2  # type: ignore[union-attr]


# -- the log: every external call, attributed, seen by the conversation's subscribers ------------------------------


async def test_a_ws_subscriber_of_the_bound_conversation_sees_every_external_call(gw: LocalServer) -> None:
    async with gw.client(token("alice")) as owner:
        cid = await owner.open()
        await owner.subscribe(cid)
        async with mcp_session(mcp_url(gw.url), token("alice", **EXECUTE), query=f"?conversation_id={cid}",
                               name="cursor") as (s, init):
            assert conversation_of(init) == cid
            await s.call_tool("demo.weather", {"city": "Paris"})
            await s.call_tool("demo.weather", {"city": "Atlantis"})       # the tool fails: an error observation
            await s.call_tool("demo.render", {"source": "x", "format": "pdf"})   # refused: not in this state
        await owner.until(lambda: len([e for e in owner.events.get(cid, []) if e["event"] == "tool.result"]) == 3 or None)
    events = owner.events[cid]
    calls = [e["data"] for e in events if e["event"] == "tool.call"]
    results = [e["data"] for e in events if e["event"] == "tool.result"]
    assert [c["tool_id"] for c in calls] == ["demo.weather", "demo.weather", "demo.render"]
    assert [c["call_id"] for c in calls] == [r["call_id"] for r in results]
    assert [(r["ok"], r.get("error")) for r in results] == [(True, None), (False, "tool_error"), (False, "tool_unavailable")]
    assert all(e["data"]["client"] == {"face": "mcp", "name": "cursor"} for e in events)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert [e["seq"] for e in events] == [e.seq for e in await gw.log(cid)]   # the same log, durable


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_agents_own_mcp_servers_tools_are_offered_under_the_same_rules(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path,
) -> None:
    """The agent of docs/examples/notes.toml, whose tools are an MCP server of its own: the face offers
    them with the same governance, on both backends. On Ray the agent's registry travels in the
    RayConfig (its MCP tools rebuilt from their sources in the tool pool, which runs the server) and
    is served by a generation of its own on the module's Ray."""
    agent = await load_agent(REPO / "docs" / "examples" / "notes.toml")
    server: contextlib.AbstractAsyncContextManager[LocalServer]
    if backend == "ray":
        hosting = ray_variant(request, agent.profile.name, registry=agent.registry,
                              profiles={agent.profile.name: agent.profile}, scripts={})
        server = ray_server(hosting, auth_secret=SECRET)
    else:
        server = agent_server(agent, tmp_path / "s.sqlite3", auth_secret=SECRET)
    async with server as gw:
        url = mcp_url(gw.url)
        async with mcp_session(url, token("alice", **EXECUTE)) as (s, init):
            assert {"notes.read_note", "notes.list_notes", "notes.write_note", "notes.delete_note"} <= names(
                await s.list_tools())
            written = await s.call_tool("notes.write_note", {"key": "shopping", "text": "milk"})
            assert written.structured_content == {"key": "shopping", "replaced": False, "count": 1}
            read = await s.call_tool("notes.read_note", {"key": "shopping"})
            assert read.structured_content == {"key": "shopping", "text": "milk"}
            log = await gw.log(conversation_of(init))
            assert [(e.event, e.data.tool_id) for e in log] == [  # type: ignore[union-attr]
                ("tool.call", "notes.write_note"), ("tool.result", "notes.write_note"),
                ("tool.call", "notes.read_note"), ("tool.result", "notes.read_note")]
        async with mcp_session(url, token("alice")) as (s, _):   # the profile's default: observe
            assert "notes.write_note" not in names(await s.list_tools())
            denied = await s.call_tool("notes.delete_note", {"key": "shopping"})
            assert denied.is_error and text_of(denied)["code"] == "ASK_MODE_DENIED"


# -- refusals at initialize, like /ws --------------------------------------------------------------------------------


async def test_a_foreign_token_or_a_foreign_conversation_is_refused_at_initialize(gw: LocalServer) -> None:
    url = mcp_url(gw.url)
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    async with mcp_session(url, token("alice")) as (_, init):
        cid = conversation_of(init)
    async with httpx2.AsyncClient(timeout=30) as http:
        wrong_key = await http.post(url, json=initialize, headers={
            **headers, "Authorization": f"Bearer {token('alice', secret='another-secret-of-at-least-32-bytes!!')}"})
        assert (wrong_key.status_code, wrong_key.text) == (401, "unauthorized: invalid token\n")
        missing = await http.post(url, json=initialize, headers=headers)
        assert missing.status_code == 401 and missing.text.startswith("unauthorized: missing token")
        foreign = await http.post(url + f"?conversation_id={cid}", json=initialize,
                                  headers={**headers, "Authorization": f"Bearer {token('bob')}"})
        assert foreign.status_code == 403
        assert foreign.json() == {"type": "error", "code": "forbidden", "message": "forbidden: no such conversation for this caller",
                                  "id": foreign.json()["id"], "conversation_id": cid}   # /ws's error frame, as is
        unknown = await http.post(url + "?conversation_id=c_AAAAAAAAAAAAAAAAAAAAAA", json=initialize,
                                  headers={**headers, "Authorization": f"Bearer {token('bob')}"})
        assert (unknown.status_code, unknown.json()["message"]) == (403, foreign.json()["message"])  # exists or not: the same
    with pytest.raises(ExceptionGroup) as refused:            # the SDK client gets no session either
        async with mcp_session(url, token("bob"), query=f"?conversation_id={cid}"):
            pass
    assert [type(e) for e in leaves(refused.value)] == [MCPError]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_new_conversation_at_initialize_counts_against_the_open_conversations_quota(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path,
) -> None:
    """The quota `open` checks on /ws (docs/design.md#quotas) refuses a session that would open one more:
    429 and /ws's quota_exceeded frame, on both backends. On Ray the limit is the RayConfig's (as
    gateway/app.py's `ray_config` builds it from the settings), with a store of its own, as the local
    gateway's: a generation of its own on the module's Ray."""
    limits: dict[str, Any] = {"quota_open_conversations_per_user": 1}
    server: contextlib.AbstractAsyncContextManager[LocalServer]
    if backend == "ray":
        hosting = ray_variant(request, quotas=quota_limits(Settings(**limits)),
                              store_url=store_url(tmp_path / "ray.sqlite3"))
        server = ray_server(hosting, auth_secret=SECRET, **limits)
    else:
        server = local_server(tmp_path / "s.sqlite3", SCRIPT, profile=face_profile(), auth_secret=SECRET, **limits)
    async with server as gw:
        url = mcp_url(gw.url)
        async with mcp_session(url, token("alice")) as (_, init):
            cid = conversation_of(init)
        async with httpx2.AsyncClient(timeout=30) as http:
            refused = await http.post(url, json=INITIALIZE, headers={**MCP_HEADERS, "Authorization": f"Bearer {token('alice')}"})
        assert refused.status_code == 429
        assert (refused.json()["code"], refused.json()["quota"], refused.json()["scope"]) == (
            "quota_exceeded", "open_conversations", "user")
        async with mcp_session(url, token("alice"), query=f"?conversation_id={cid}") as (_, again):   # its own: fine
            assert conversation_of(again) == cid


async def test_the_origin_rules_are_those_of_ws(gw: LocalServer) -> None:
    url = mcp_url(gw.url)
    own = f"http://{gw.host}:{gw.port}"                    # the gateway's own pages may connect; others may not
    async with httpx2.AsyncClient(timeout=30) as http:
        preflight = await http.options(url, headers={"Origin": own, "Access-Control-Request-Method": "POST"})
        assert preflight.status_code == 204 and preflight.headers["access-control-allow-origin"] == own
        assert "mcp-session-id" in preflight.headers["access-control-allow-headers"]
        foreign = await http.options(url, headers={"Origin": "https://evil.example"})
        assert (foreign.status_code, foreign.text) == (403, "forbidden: origin not allowed\n")
        page = {**MCP_HEADERS, "Authorization": f"Bearer {token('alice')}"}
        refused = await http.post(url, json=INITIALIZE, headers={**page, "Origin": "https://evil.example"})
        assert (refused.status_code, refused.text) == (403, "forbidden: origin not allowed\n")
        opened = await http.post(url, json=INITIALIZE, headers={**page, "Origin": own})
        assert opened.status_code == 200 and opened.headers["mcp-session-id"]
        assert "mcp-session-id" in opened.headers["access-control-expose-headers"]


async def test_another_callers_token_cannot_use_a_session(gw: LocalServer) -> None:
    url = mcp_url(gw.url)
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}}
    async with httpx2.AsyncClient(timeout=30) as http:
        opened = await http.post(url, json=initialize, headers={**headers, "Authorization": f"Bearer {token('alice')}"})
        session_id = opened.headers["mcp-session-id"]
        listed = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
        probe = await http.post(url, json=listed, headers={
            **headers, "Authorization": f"Bearer {token('bob')}", "mcp-session-id": session_id,
            "mcp-protocol-version": "2025-06-18"})
        assert (probe.status_code, probe.text) == (404, "Session not found\n")


# -- a crash --------------------------------------------------------------------------------------------------------


async def test_a_call_a_crash_cut_gets_its_result_when_the_conversation_comes_back(tmp_path: Path) -> None:
    """`reactgate serve` is SIGKILLed while an external call runs; a new process on the same store
    activates the conversation, and the call observes `round_interrupted`: every tool.call keeps its one
    tool.result (docs/design.md#mcp-face). The client sending the call again, by its own call id, gets
    that observation: the tool does not run a second time — nor when the retry comes after the
    conversation was passivated and activated again from its snapshot alone. Local backend: the Ray
    host's death is the next test's."""
    (tmp_path / "face.toml").write_text(PROFILE.format(name="face", face="", timeout_s=30))
    (tmp_path / "script.json").write_text(json.dumps(SCRIPT))
    args = ["--agent", str(tmp_path / "face.toml"), "--script", str(tmp_path / "script.json")]
    env = {"REACTGATE_AUTH_SECRET": SECRET}
    first = ServeProcess(tmp_path / "store.sqlite3", tmp_path / "first.log", args=args, env=env)
    second = ServeProcess(tmp_path / "store.sqlite3", tmp_path / "second.log", args=args, env=env)
    bound: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def long_call() -> None:
        async with mcp_session(mcp_url(first.url), token("alice", **EXECUTE)) as (s, init):
            bound.set_result(conversation_of(init))
            await s.call_tool("demo.sleep", {"seconds": 600}, meta=key)

    key = {"reactgate/call_id": "sleep-1"}
    calling: asyncio.Task[None] | None = None
    try:
        await first.start()
        calling = asyncio.create_task(long_call())
        cid = await asyncio.wait_for(bound, TIMEOUT)
        async with client(first.url, token("alice")) as owner:
            await owner.subscribe(cid)
            started = await owner.event(cid, "tool.call", tool_id="demo.sleep")
            first.signal(signal.SIGKILL)
            await first.wait()
            await owner.closed()
    finally:
        first.stop()
        if calling is not None:
            calling.cancel()
            with contextlib.suppress(BaseException):
                await calling
    try:
        await second.start()
        async with client(second.url, token("alice")) as owner:
            await owner.subscribe(cid)
            result = await owner.event(cid, "tool.result", call_id=started["data"]["call_id"])
            assert (result["data"]["ok"], result["data"]["error"]) == (False, "round_interrupted")
            assert result["data"]["client"] == {"face": "mcp", "name": "pytest-agent"}
            assert [e["data"]["call_id"] for e in owner.events[cid] if e["event"] == "tool.result"] == [
                started["data"]["call_id"]]                   # once
            async with mcp_session(mcp_url(second.url), token("alice", **EXECUTE),
                                   query=f"?conversation_id={cid}") as (s, _):
                again = await s.call_tool("demo.sleep", {"seconds": 600}, meta=key)   # the client's retry
                assert again.is_error and text_of(again)["error"] == "round_interrupted"
                assert not (await s.call_tool("demo.clock", {})).is_error   # logged after anything the retry logged
            await owner.event(cid, "tool.result", tool_id="demo.clock")
            assert [(e["event"], e["data"]["tool_id"]) for e in owner.events[cid] if e["event"].startswith("tool.")] == [
                ("tool.call", "demo.sleep"), ("tool.result", "demo.sleep"),       # the sleep ran once
                ("tool.call", "demo.clock"), ("tool.result", "demo.clock")]
        second.signal(signal.SIGTERM)            # passivated: the next activation has only the snapshot
        assert await second.wait() == 0
        await second.start()
        async with mcp_session(mcp_url(second.url), token("alice", **EXECUTE),
                               query=f"?conversation_id={cid}") as (s, _):
            late = await asyncio.wait_for(s.call_tool("demo.sleep", {"seconds": 600}, meta=key), TIMEOUT)  # activations later
            assert late.is_error and text_of(late)["error"] == "round_interrupted"
        log = [e for e in await read_log(tmp_path / "store.sqlite3", cid) if e.event.startswith("tool.")]
        assert [(e.event, e.data.tool_id) for e in log] == [  # type: ignore[union-attr]
            ("tool.call", "demo.sleep"), ("tool.result", "demo.sleep"),           # still once: nothing ran
            ("tool.call", "demo.clock"), ("tool.result", "demo.clock")]

        # The conversation forgets the cut, as it does once 256 later calls were cut: the retry is a call
        # like any, and the `round_interrupted` recovery recorded as its durable result answers it.
        second.signal(signal.SIGTERM)
        assert await second.wait() == 0
        async with SqliteStore(str(tmp_path / "store.sqlite3")) as store:
            await forget_cut_calls(store, cid)
        await second.start()
        async with mcp_session(mcp_url(second.url), token("alice", **EXECUTE),
                               query=f"?conversation_id={cid}") as (s, _):
            forgotten = await asyncio.wait_for(s.call_tool("demo.sleep", {"seconds": 600}, meta=key), TIMEOUT)
            assert forgotten.is_error and text_of(forgotten)["error"] == "round_interrupted"   # not a 600 s sleep
        log = [e for e in await read_log(tmp_path / "store.sqlite3", cid) if e.event.startswith("tool.")]
        assert [(e.event, e.data.tool_id, getattr(e.data, "error", None)) for e in log][4:] == [
            ("tool.call", "demo.sleep", None), ("tool.result", "demo.sleep", "round_interrupted")]
    finally:
        second.stop()


async def forget_cut_calls(store: Store, conversation_id: str) -> None:
    """Empty the snapshot's `interrupted_calls`, the last cut calls a conversation remembers."""
    found = await store.load_snapshot(conversation_id)
    assert found is not None
    seq, data = found
    state = ConversationState.decode(data)
    assert state.interrupted_calls                # what is forgotten here
    state.interrupted_calls = []
    await store.save_snapshot(conversation_id, seq, state.encode())


@pytest.mark.ray
async def test_a_call_whose_ray_host_is_killed_gets_round_interrupted_as_its_reply(ray_cluster: RayHosting) -> None:
    """The Ray side of the crash above: the gateway outlives the host. The host running the call is
    SIGKILLed; the gateway routes the call again, by its call id, to the conversation's next activation,
    whose recovery gave the cut call `round_interrupted` — which is the reply the MCP client gets, and the
    log's one tool.result for its tool.call (docs/design.md#mcp-face). Nothing runs the call again: not
    that activation, nor the next, after its host is killed too, when the client retries by its call id;
    nor one that has forgotten the cut (past its last 256), whose retry the call's durable result answers."""
    import ray

    from actors.ray.names import NAMESPACE, generation_of, tool_pool

    async def kill_host(gw: LocalServer, cid: str) -> None:
        host = ray.get_actor(await gw.backend.host_of(cid), namespace=NAMESPACE)  # type: ignore[union-attr]
        os.kill(int((await host.stats.remote())["pid"]), signal.SIGKILL)

    async with ray_server(ray_cluster, auth_secret=SECRET) as gw:
        async with mcp_session(mcp_url(gw.url), token("alice", **EXECUTE)) as (s, init), \
                gw.client(token("alice")) as owner:
            cid = conversation_of(init)
            await owner.subscribe(cid)
            key = {"reactgate/call_id": "sleep-ray-1"}
            calling = asyncio.create_task(s.call_tool("demo.sleep", {"seconds": 600}, meta=key))
            started = await owner.event(cid, "tool.call", tool_id="demo.sleep")
            generation = generation_of(await gw.backend.host_of(cid))   # type: ignore[union-attr]
            assert generation is not None
            pool = ray.get_actor(tool_pool(generation), namespace=NAMESPACE)

            async def running() -> None:   # the sleep has reached the pool, which outlives the host
                while (await pool.stats.remote())["inflight"] != 1:
                    await asyncio.sleep(0.005)

            await asyncio.wait_for(running(), TIMEOUT)
            await kill_host(gw, cid)

            reply = await asyncio.wait_for(calling, TIMEOUT)
            assert reply.is_error and text_of(reply)["error"] == "round_interrupted"
            result = await owner.event(cid, "tool.result", call_id=started["data"]["call_id"])
            assert (result["data"]["ok"], result["data"]["error"]) == (False, "round_interrupted")
            log = await gw.backend.store.read_events(cid, 0, 100)
            assert [(e.event, e.data.call_id) for e in log if e.event in ("tool.call", "tool.result")] == [  # type: ignore[union-attr]
                ("tool.call", started["data"]["call_id"]), ("tool.result", started["data"]["call_id"])]   # once each
            recorded = await gw.backend.store.tool_result(cid, started["data"]["call_id"])   # type: ignore[union-attr]
            assert recorded is not None and json.loads(recorded)["error"] == "round_interrupted"   # its durable result
            stats = await pool.stats.remote()
            assert (stats["cut"], stats["inflight"]) == (1, 0)   # the sleep the dead host sent stopped there
            after = await s.call_tool("demo.clock", {})             # the session goes on, on the new host
            assert not after.is_error

            await kill_host(gw, cid)                   # that host dies too: the next activation has no memory of the cut
            late = await asyncio.wait_for(s.call_tool("demo.sleep", {"seconds": 600}, meta=key), TIMEOUT)  # a retry
            assert late.is_error and text_of(late)["error"] == "round_interrupted"
            log = await gw.backend.store.read_events(cid, 0, 100)
            assert [(e.event, e.data.tool_id) for e in log if e.event.startswith("tool.")] == [  # type: ignore[union-attr]
                ("tool.call", "demo.sleep"), ("tool.result", "demo.sleep"),   # the sleep never ran again
                ("tool.call", "demo.clock"), ("tool.result", "demo.clock")]

        # The conversation forgets the cut, as it does once 256 later calls were cut, and the retry is a call
        # like any: the `round_interrupted` recovery recorded as the call's durable result answers it in the
        # tool pool. Nothing is connected while the host dies and the snapshot is edited, so the activation
        # the retry's session makes is the first to read the edited snapshot.
        await kill_host(gw, cid)
        await forget_cut_calls(gw.backend.store, cid)   # type: ignore[attr-defined]
        async with mcp_session(mcp_url(gw.url), token("alice", **EXECUTE),
                               query=f"?conversation_id={cid}") as (s, _):
            forgotten = await asyncio.wait_for(s.call_tool("demo.sleep", {"seconds": 600}, meta=key), TIMEOUT)
            assert forgotten.is_error and text_of(forgotten)["error"] == "round_interrupted"   # not a 600 s sleep
        log = await gw.backend.store.read_events(cid, 0, 100)   # type: ignore[attr-defined]
        assert [(e.event, e.data.tool_id, getattr(e.data, "error", None)) for e in log if e.event.startswith("tool.")][4:] == [
            ("tool.call", "demo.sleep", None), ("tool.result", "demo.sleep", "round_interrupted")]


# -- cancellation -------------------------------------------------------------------------------------------------


async def test_cancelling_a_long_call_cuts_it(gw: LocalServer) -> None:
    async with mcp_session(mcp_url(gw.url), token("alice", **EXECUTE)) as (s, init), gw.client(token("alice")) as owner:
        cid = conversation_of(init)
        await owner.subscribe(cid)
        long = asyncio.create_task(s.call_tool("demo.sleep", {"seconds": 600}))
        started = await owner.event(cid, "tool.call", tool_id="demo.sleep")
        long.cancel()                                          # the SDK sends notifications/cancelled
        result = await owner.event(cid, "tool.result", call_id=started["data"]["call_id"])
        assert (result["data"]["ok"], result["data"]["error"]) == (False, "cancelled")
        with pytest.raises(asyncio.CancelledError):
            await long
        after = await s.call_tool("demo.clock", {})           # the session goes on
        assert not after.is_error
