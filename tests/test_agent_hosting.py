"""Your own tools under the same governance on both backends (docs/design.md#your-own-agent): a tool
module written here and a real MCP server (the mcp SDK's MCPServer over stdio, in the temp dir), no
mocks of either, loaded by `load_agent` as `serve` loads them.

On Ray, the registry travels to the ConversationHosts and the tool pool as its sources; each process
imports the module and holds its own MCP session, which is what these tests exercise there.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


from actors.agent import Agent, load_agent
from actors.conversation import Runtime
from actors.hosting.backend import UserMessage
from actors.hosting.local import LocalBackend
from actors.identity import Caller, Owner
from actors.llm.scripts import register_script
from actors.llm.stream import stream_model
from actors.ray.backend import RayBackend
from actors.ray.config import RayConfig
from actors.store import store_from_url
from actors.tools.durable import DurableTools
from actors.tools.executor import LocalToolExecutor
from actors.tools.mcp import sessions
from protocol.events import Event
from protocol.notices import NoticeCode
from tests.e2e import local_ray
from tests.roundkit import action, call, thinking
from tests.test_tools_mcp import HttpServer, ended, running, server_main

pytestmark = pytest.mark.ray
OWNER = Owner(tenant="acme", sub="alice")
TIMEOUT = 90.0

TOOLS = '''
from actors.tools import tool, ToolContext


@tool(trait="exploration", description="Look up an order by id.")
async def lookup_order(order_id: str, ctx: ToolContext) -> dict:
    return {"order_id": order_id, "status": "shipped"}


@tool(trait="exploitation", safety="write", description="Cancel an order.")
def cancel_order(order_id: str) -> dict:
    return {"cancelled": order_id}


@tool(trait="neutral", description="Who is asking.")
def whoami(ctx: ToolContext) -> dict:
    caller = ctx.caller
    return {"caller": None if caller is None else {"tenant": caller.tenant, "sub": caller.sub, "claims": caller.claims},
            "context": sorted(vars(ctx)) if hasattr(ctx, "__dict__") else sorted(ctx.__dataclass_fields__)}
'''

NOTES_SERVER = '''
import os, pathlib, sys
import anyio
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("notes")
NOTES = {"a": "remember the milk"}


@server.tool()
def read_note(key: str) -> str:
    """Read the note stored under key."""
    return NOTES.get(key, "")


@server.tool()
def write_note(key: str, text: str) -> dict:
    """Store a note."""
    NOTES[key] = text
    return {"stored": True}


@server.tool()
async def slow(seconds: float) -> str:
    """Wait, then answer."""
    pathlib.Path(os.environ["NOTES_STARTED"]).touch()
    await anyio.sleep(seconds)
    return "done"


@server.tool()
def pid() -> int:
    """This server's process id."""
    return os.getpid()


@server.tool()
def whoami(ctx: Context) -> dict:
    """Who is asking, as the request's _meta says."""
    meta = ctx.request_context.meta or {}
    return {"caller": dict(meta).get("reactgate/caller")}
''' + server_main("server")   # stdio, or over streamable HTTP on a loopback port (of either era)


def _round(*parts: str) -> dict[str, Any]:
    return {"text": thinking("Working.") + "".join(parts)}


def _complete(answer: str) -> dict[str, Any]:
    return _round(action({"action": "complete", "final_answer": answer}))


LOOKUP = action(call("acme.lookup_order", order_id="A1"))
SCRIPTS: dict[str, list[dict[str, Any]]] = {
    # a user tool and an MCP tool in one round (exploration + exploration), then the answer
    "both": [_round(LOOKUP, action(call("notes.read_note", key="a"))), _complete("A1 shipped; milk.")],
    # ask mode: the write tools of both kinds are refused; a safe one then runs
    "ask": [_round(action(call("acme.cancel_order", order_id="A1")), action(call("notes.write_note", key="b", text="x"))),
            _round(LOOKUP), _complete("A1 shipped.")],
    # exploration (ours) + exploitation (MCP) in one round: the trait matrix refuses the pair
    "pair": [_round(LOOKUP, action(call("notes.write_note", key="b", text="x"))), _complete("A1 shipped.")],
    # the MCP server dies under a call, is restarted, and the next turn uses it again
    "kill": [_round(action(call("notes.pid"))), _round(action(call("notes.slow", seconds=60))), _complete("Lost it."),
             _round(action(call("notes.pid"))), _complete("Back.")],
    # the MCP server dies while no call runs; the next turn's call starts it again
    "idle": [_round(action(call("notes.pid"))), _complete("Here."), _round(action(call("notes.pid"))), _complete("Still here.")],
    # a slow MCP tool is cut by its server's call_timeout_s
    "slow": [_round(action(call("slowpoke.slow", seconds=60))), _complete("Too slow.")],
    # the same server over streamable HTTP, next to a user tool
    "http": [_round(LOOKUP, action(call("web.read_note", key="a"))), _complete("A1 shipped; milk, over HTTP.")],
    # a server of MCP's handshake era restarts between turns: the next call finds it on a new session
    "oldweb": [_round(action(call("oldweb.pid"))), _complete("Here."), _round(action(call("oldweb.pid"))),
               _complete("Still here.")],
    # a user tool and an MCP tool read who is calling (docs/design.md#your-tools)
    "who": [_round(action(call("acme.whoami")), action(call("notes.whoami"))), _complete("I know who you are.")],
}


def _profile(name: str, tmp: Path, url: str, old_url: str) -> str:
    started = tmp / "started"
    return textwrap.dedent(f'''
        name = "{name}"
        model = "scripted/agent-{name}"
        [policies]
        flush_interval_ms = 10

        [[tools]]
        id = "acme.lookup_order"
        impl = "hosting_tools:lookup_order"

        [[tools]]
        id = "acme.cancel_order"
        impl = "hosting_tools:cancel_order"

        [[tools]]
        id = "acme.whoami"
        impl = "hosting_tools:whoami"

        [[mcp_servers]]
        name = "notes"
        command = [{json.dumps(sys.executable)}, "notes_server.py"]
        env = {{ NOTES_STARTED = {json.dumps(str(started))} }}
        [mcp_servers.tools]
        read_note = {{ trait = "exploration" }}
        write_note = {{ trait = "exploitation", safety = "write" }}
        slow = {{ trait = "neutral" }}
        pid = {{ trait = "neutral" }}
        whoami = {{ trait = "neutral" }}

        [[mcp_servers]]
        name = "slowpoke"
        command = [{json.dumps(sys.executable)}, "notes_server.py"]
        env = {{ NOTES_STARTED = {json.dumps(str(tmp / "slowpoke-started"))} }}
        call_timeout_s = 1
        [mcp_servers.tools]
        slow = {{ trait = "neutral" }}

        [[mcp_servers]]
        name = "web"
        url = "{url}"
        [mcp_servers.tools]
        read_note = {{ trait = "exploration" }}

        [[mcp_servers]]
        name = "oldweb"
        url = "{old_url}"
        [mcp_servers.tools]
        pid = {{ trait = "exploration" }}
    ''')


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("agent")
    (root / "hosting_tools.py").write_text(TOOLS)
    (root / "notes_server.py").write_text(NOTES_SERVER)
    web = HttpServer(root / "notes_server.py", root / "web-started", root / "web.log")
    web.start()
    oldweb = HttpServer(root / "notes_server.py", root / "oldweb-started", root / "oldweb.log", era="handshake-era")
    oldweb.start()
    loaded: dict[str, Agent] = {}
    scripts = {}
    for name, rounds in SCRIPTS.items():
        (root / f"{name}.toml").write_text(_profile(name, root, web.url, oldweb.url))
        script = root / f"{name}.json"
        script.write_text(json.dumps({"rounds": rounds}))
        register_script(f"agent-{name}", script)
        scripts[f"agent-{name}"] = str(script)
        loaded[name] = asyncio.run(load_agent(root / f"{name}.toml"))
    yield {"root": root, "agents": loaded, "scripts": scripts, "oldweb": oldweb}
    web.stop()
    oldweb.stop()


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    with local_ray() as ray:
        yield ray


@pytest.fixture(params=["local", "ray"])
async def backend(request: pytest.FixtureRequest, agents: dict[str, Any]) -> AsyncIterator[Any]:
    root: Path = agents["root"]
    loaded: dict[str, Agent] = agents["agents"]
    registry = loaded["both"].registry           # every agent here has the same tools
    profiles = {name: agent.profile for name, agent in loaded.items()}
    store_url = f"sqlite:///{root / f'{request.param}.sqlite3'}"
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")
        config = RayConfig(store_url=store_url, registry=registry, profiles=profiles, scripts=agents["scripts"],
                           idle_ttl_s=600, hosts=1)
        b: Any = RayBackend(config, default_agent="both")
    else:
        store = store_from_url(store_url)
        runtime = Runtime(registry=registry, tools=DurableTools(LocalToolExecutor(registry), store),
                          stream_model=stream_model)
        b = LocalBackend(store, runtime, profiles, default_agent="both")
    await b.start()
    yield b
    await b.stop()


async def _turn(backend: Any, cid: str, text: str, events: list[Event], turns: int, caller: Caller | None = None) -> None:
    """Send `text`, then collect every event until the conversation has `turns` completed turns."""
    assert await backend.command(OWNER, cid, UserMessage(f"{cid}-{turns}", text, caller=caller)) == "accepted"

    async def collect() -> None:
        async for batch in backend.subscribe(OWNER, cid, events[-1].seq if events else 0):
            events.extend(batch)
            if sum(e.event == "turn.completed" for e in events) >= turns:
                return
    await asyncio.wait_for(collect(), TIMEOUT)


def _named(events: list[Event], name: str) -> list[Any]:
    return [e.data for e in events if e.event == name]


async def _run(backend: Any, agent: str, mode: str | None = None) -> list[Event]:
    cid = (await backend.open(OWNER, None, agent, mode)).conversation_id
    events: list[Event] = []
    await _turn(backend, cid, "Where is order A1?", events, 1)
    return events


async def test_a_turn_calls_a_user_tool_and_an_mcp_tool_and_completes_with_their_observations(backend: Any) -> None:
    events = await _run(backend, "both")
    results = {r.tool_id: r for r in _named(events, "tool.result")}
    assert results["acme.lookup_order"].ok and results["acme.lookup_order"].result["status"] == "shipped"
    assert results["notes.read_note"].ok and "remember the milk" in json.dumps(results["notes.read_note"].result)
    [done] = _named(events, "turn.completed")
    assert (done.reason, done.final_answer) == ("complete", "A1 shipped; milk.")


async def test_an_mcp_server_over_streamable_http_serves_its_tool_next_to_a_user_tool(backend: Any) -> None:
    events = await _run(backend, "http")
    results = {r.tool_id: r for r in _named(events, "tool.result")}
    assert results["acme.lookup_order"].ok
    assert results["web.read_note"].ok and "remember the milk" in json.dumps(results["web.read_note"].result)
    assert _named(events, "turn.completed")[0].final_answer == "A1 shipped; milk, over HTTP."


async def test_ask_mode_hides_the_write_tools_of_both_kinds(backend: Any) -> None:
    events = await _run(backend, "ask", mode="ask")
    first = _named(events, "round.completed")[0]
    assert {(d.tool_id, d.code) for d in first.denied} == {
        ("acme.cancel_order", NoticeCode.ASK_MODE_DENIED), ("notes.write_note", NoticeCode.ASK_MODE_DENIED)}
    assert {r.tool_id for r in _named(events, "tool.result")} == {"acme.lookup_order"}   # nothing written ran
    assert _named(events, "turn.completed")[0].reason == "complete"


async def test_exploration_and_exploitation_across_a_user_tool_and_an_mcp_tool_are_not_batched(backend: Any) -> None:
    events = await _run(backend, "pair")
    first = _named(events, "round.completed")[0]
    assert [(d.tool_id, d.code) for d in first.denied] == [("notes.write_note", NoticeCode.INCOMPATIBLE_TRAITS)]
    assert [a.tool_id for a in first.accepted] == ["acme.lookup_order"]
    assert {r.tool_id for r in _named(events, "tool.result")} == {"acme.lookup_order"}


async def test_an_mcp_server_killed_mid_call_gives_a_failed_observation_and_is_back_next_turn(
    backend: Any, agents: dict[str, Any]
) -> None:
    started: Path = agents["root"] / "started"
    started.unlink(missing_ok=True)
    cid = (await backend.open(OWNER, None, "kill", None)).conversation_id
    events: list[Event] = []
    killed: list[int] = []

    async def kill_when_slow_runs() -> None:
        # Polled, not driven by events: while the call hangs no event comes.
        pids = [r.result["result"] for r in _named(events, "tool.result") if r.tool_id == "notes.pid" and r.ok]
        if pids and not killed and started.exists():   # the server is inside the slow call
            os.kill(pids[0], signal.SIGKILL)
            killed.append(pids[0])

    task = asyncio.get_running_loop().create_task(_poll_until(kill_when_slow_runs, lambda: bool(killed)))
    try:
        await _turn(backend, cid, "Check the notes.", events, 1)
    finally:
        task.cancel()
    assert killed
    slow = [r for r in _named(events, "tool.result") if r.tool_id == "notes.slow"]
    assert len(slow) == 1 and not slow[0].ok and "notes" in json.dumps(slow[0].detail or {}) + str(slow[0].error)
    assert _named(events, "turn.completed")[0].final_answer == "Lost it."

    await _turn(backend, cid, "Again?", events, 2)
    pids = [r.result["result"] for r in _named(events, "tool.result") if r.tool_id == "notes.pid" and r.ok]
    assert len(pids) == 2 and pids[1] != killed[0], _named(events, "tool.result")   # a new server process answered
    assert _named(events, "turn.completed")[1].final_answer == "Back."


async def test_an_mcp_server_that_died_between_turns_is_started_again_by_the_next_call(backend: Any) -> None:
    # Nothing was in flight, so no observation may fail: the next call gets a new server's answer.
    cid = (await backend.open(OWNER, None, "idle", None)).conversation_id
    events: list[Event] = []
    await _turn(backend, cid, "Who answers?", events, 1)
    [first] = [r.result["result"] for r in _named(events, "tool.result") if r.tool_id == "notes.pid" and r.ok]
    os.kill(first, signal.SIGKILL)
    await _gone_for_its_pool(backend, first)
    await _turn(backend, cid, "And now?", events, 2)
    results = [r for r in _named(events, "tool.result") if r.tool_id == "notes.pid"]
    assert [r.ok for r in results] == [True, True], results
    assert results[1].result["result"] != first and running(results[1].result["result"])
    assert _named(events, "turn.completed")[1].final_answer == "Still here."


async def test_an_http_mcp_server_of_the_handshake_era_restarted_between_turns_answers_the_next_call(
    backend: Any, agents: dict[str, Any]
) -> None:
    # It lost the session with its restart and answers the next call's request with HTTP 404, having
    # run nothing: the call goes again on a new session, and no observation fails.
    cid = (await backend.open(OWNER, None, "oldweb", None)).conversation_id
    events: list[Event] = []
    await _turn(backend, cid, "Who answers?", events, 1)
    oldweb: HttpServer = agents["oldweb"]
    oldweb.stop()
    oldweb.start()
    await _turn(backend, cid, "And now?", events, 2)
    results = [r for r in _named(events, "tool.result") if r.tool_id == "oldweb.pid"]
    assert [r.ok for r in results] == [True, True], results
    assert results[1].result["result"] != results[0].result["result"] and running(results[1].result["result"])
    assert _named(events, "turn.completed")[1].final_answer == "Still here."


async def _gone_for_its_pool(backend: Any, pid: int) -> None:
    """Until the killed server `pid` is dead between calls: reaped, so every thread of it has exited
    and its pipe to the pool has ended — a zombie's other threads may still hold it — and, on the
    local backend, whose pool runs on this loop, until that pool has read the end."""
    while Path(f"/proc/{pid}").exists() or (isinstance(backend, LocalBackend) and not ended(sessions(), "notes")):
        await asyncio.sleep(0.02)


async def test_a_slow_mcp_tool_is_cut_by_call_timeout_s(backend: Any) -> None:
    events = await _run(backend, "slow")
    [result] = _named(events, "tool.result")
    assert result.tool_id == "slowpoke.slow" and not result.ok
    assert "1 s" in json.dumps(result.detail or {}) + str(result.error)
    assert _named(events, "turn.completed")[0].final_answer == "Too slow."


async def _poll_until(step: Callable[[], Awaitable[None]], done: Callable[[], bool]) -> None:
    """The kill must not wait for the next event batch (none comes while the call hangs)."""
    while not done():
        await step()
        await asyncio.sleep(0.02)


async def test_a_user_tool_and_an_mcp_tool_know_who_calls_and_never_see_the_token(backend: Any) -> None:
    caller = Caller("acme", "alice", {"roles": ["buyer"]})
    cid = (await backend.open(OWNER, None, "who", None)).conversation_id
    events: list[Event] = []
    await _turn(backend, cid, "Who am I?", events, 1, caller=caller)
    results = {r.tool_id: r.result for r in _named(events, "tool.result")}
    expected = {"tenant": "acme", "sub": "alice", "claims": {"roles": ["buyer"]}}
    assert results["acme.whoami"]["caller"] == expected
    assert results["notes.whoami"]["caller"] == expected          # in the MCP request's _meta
    assert not any("token" in field for field in results["acme.whoami"]["context"])


async def test_tools_read_the_tenant_sub_and_named_claims_of_the_token_over_a_real_gateway(backend: Any) -> None:
    """From the WebSocket's token to the tool: REACTGATE_TOOL_CLAIMS names what passes; the rest
    of the token, and the token itself, never reach a tool."""
    from gateway.server import GatewayServer
    from gateway.settings import Settings
    from tests.e2e import token
    from tests.kit import client

    secret = "caller-test-secret-for-hs256-32bytes!"
    settings = Settings(host="127.0.0.1", port=0, backend="local", auth_secret=secret, tool_claims=("roles",))
    server = GatewayServer(settings, _Unstopped(backend))
    host, port = await server.start()
    try:
        jwt_token = token("alice", tenant="acme", secret=secret, roles=["buyer"], email="alice@acme.example")
        async with client(f"ws://{host}:{port}/ws", bearer=jwt_token) as c:
            cid = await c.open(agent="who")
            await c.subscribe(cid)
            await c.say(cid, "Who am I?", id="m1")
            await c.turn_completed(cid)
            results = {e["data"]["tool_id"]: e["data"]["result"] for e in c.events[cid] if e["event"] == "tool.result"}
    finally:
        await server.drain()
    expected = {"tenant": "acme", "sub": "alice", "claims": {"roles": ["buyer"]}}
    assert results["acme.whoami"]["caller"] == results["notes.whoami"]["caller"] == expected
    assert jwt_token not in json.dumps(results) and "alice@acme.example" not in json.dumps(results)


class _Unstopped:
    """The fixture's backend behind a gateway that must not stop it (the fixture does)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
