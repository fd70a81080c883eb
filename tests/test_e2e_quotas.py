"""Quotas end to end (docs/design.md#quotas): a real gateway on loopback, on the local and the Ray
backend, with small limits. Each quota trips at its limit with `quota_exceeded` (quota, scope, and
`resets_at` for a windowed one), the connection stays open, another tenant is unaffected; the
counters survive a restart and show in /metrics.

Every test uses tenants of its own, so the module's one set of limits (the Ray hosts are started
once, with one configuration) never makes two tests share a counter. Ray is real: one local
instance for the module, shut down at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from actors.conversation import Runtime
from actors.hosting.local import LocalBackend
from actors.llm.scripts import register_script
from actors.llm.stream import stream_model
from actors.profile import AgentProfile, parse_profile
from actors.ray.backend import RayBackend
from actors.store import store_from_url
from actors.tools.demo import demo_registry
from actors.tools.durable import DurableTools
from actors.tools.executor import LocalToolExecutor
from gateway.app import AgentSetup, ray_config
from gateway.limits import quota_limits
from gateway.server import GatewayServer
from gateway.settings import Settings
from tests.e2e import local_ray
from tests.kit import Client, client, http_get
from tests.roundkit import action, call, complete, thinking

pytestmark = pytest.mark.ray
SECRET = "quota-tests-secret-for-hs256-at-least-32-bytes"
CHEAP = {"prompt_tokens": 1, "completion_tokens": 1}
SCRIPTS: dict[str, dict[str, Any]] = {
    "quick": {"loop": True, "rounds": [{"text": thinking("Hi.") + action(complete("Hello.")), "usage": CHEAP}]},
    "ask": {"loop": True, "rounds": [
        {"text": thinking("Asking.") + action(call("react.ask_user", question="Which city?", options=["Paris", "Rome"])),
         "usage": CHEAP},
        {"text": thinking("Done.") + action(complete("Paris it is.")), "usage": CHEAP},
    ]},
    "costly": {"loop": True, "rounds": [{"text": thinking("Hi.") + action(complete("Costly.")),
                                          "usage": {"prompt_tokens": 400, "completion_tokens": 200}}]},
    "tools": {"loop": True, "rounds": [
        *[{"text": thinking("Checking.") + action(call("demo.weather", city="Paris")), "usage": CHEAP}] * 3,
        {"text": thinking("Answering.") + action(complete("Rainy.")), "usage": CHEAP},
    ]},
}
TOOLS = {"quick": [], "ask": ["react.ask_user"], "costly": [], "tools": ["demo.weather"]}
# What the hosts enforce, for the whole module: small, so that each quota trips in a few frames.
QUOTA_SETTINGS: dict[str, int] = {
    "quota_open_conversations_per_user": 2, "quota_open_conversations_per_tenant": 4,
    "quota_concurrent_turns_per_user": 1, "quota_concurrent_turns_per_tenant": 2,
    "quota_turns_per_minute_per_user": 3, "quota_turns_per_minute_per_tenant": 5,
    "quota_tokens_per_day_per_user": 500, "quota_tokens_per_day_per_tenant": 100_000,
    "quota_tool_calls_per_turn": 2,
}


def _profile(name: str) -> AgentProfile:
    return parse_profile({
        "name": name, "model": f"scripted/quota-{name}", "states": ["default"],
        "policies": {"flush_interval_ms": 10}, "tools": [{"id": t} for t in TOOLS[name]],
    }, known_tools=demo_registry())


PROFILES = {name: _profile(name) for name in SCRIPTS}


def token(sub: str, tenant: str) -> str:
    now = int(time.time())
    return jwt.encode({"sub": sub, "tenant": tenant, "iat": now, "exp": now + 600}, SECRET, algorithm="HS256")


def tenant(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("quota-scripts")
    files = {}
    for name, script in SCRIPTS.items():
        path = root / f"{name}.json"
        path.write_text(json.dumps(script))
        files[f"quota-{name}"] = str(path)
        register_script(f"quota-{name}", path)
    return files


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("quota-store")


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    with local_ray() as ray:
        yield ray


def _settings(store_url: str, **gateway: Any) -> Settings:
    return Settings(host="127.0.0.1", port=0, store=store_url, auth_secret=SecretStr(SECRET),
                    quota_metrics_interval_s=0.05, **{**QUOTA_SETTINGS, **gateway})


def _backend(kind: str, settings: Settings, scripts: dict[str, str]) -> Any:
    registry = demo_registry()
    if kind == "ray":
        config = dataclasses.replace(ray_config(settings, AgentSetup(PROFILES["quick"], registry, None)),
                                     profiles=PROFILES, scripts=scripts)
        return RayBackend(config, default_agent="quick")
    store = store_from_url(settings.store)
    runtime = Runtime(registry=registry, tools=DurableTools(LocalToolExecutor(registry), store),
                      stream_model=stream_model, quotas=quota_limits(settings))
    return LocalBackend(store, runtime, PROFILES, default_agent="quick")


@dataclasses.dataclass
class Served:
    server: GatewayServer
    port: int

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    def client(self, sub: str, tenant: str) -> contextlib.AbstractAsyncContextManager[Client]:
        return client(self.url, token(sub, tenant))


Serve = Callable[..., contextlib.AbstractAsyncContextManager[Served]]


@pytest.fixture(params=["local", "ray"])
def serve(request: pytest.FixtureRequest, scripts: dict[str, str], store_dir: Path) -> Serve:
    """`async with serve(**gateway_settings) as s`: a gateway on the module's store for this backend."""
    kind: str = request.param
    if kind == "ray":
        request.getfixturevalue("ray_cluster")
    store_url = f"sqlite:///{store_dir / f'{kind}.sqlite3'}"

    @contextlib.asynccontextmanager
    async def run(**gateway: Any) -> AsyncIterator[Served]:
        settings = _settings(store_url, **gateway)
        server = GatewayServer(settings, _backend(kind, settings, scripts))
        _, port = await server.start()
        try:
            yield Served(server, port)
        finally:
            await server.drain()

    return run


async def refused(c: Client, quota: str, scope: str, **frame: Any) -> dict[str, Any]:
    """Send `frame`; its reply must be `quota_exceeded` for (quota, scope); the connection stays open."""
    reply = await c.request(**frame)
    assert (reply["type"], reply.get("code"), reply.get("quota"), reply.get("scope")) == (
        "error", "quota_exceeded", quota, scope), reply
    assert (await c.request(type="ping"))["type"] == "pong"      # still open
    return reply


async def accepted(c: Client, **frame: Any) -> dict[str, Any]:
    reply = await c.request(**frame)
    assert reply["type"] == "ack", reply
    return reply


async def say(c: Client, cid: str, text: str = "hi") -> dict[str, Any]:
    return await c.request(type="user_message", conversation_id=cid, text=text)


# -- each quota trips at its limit ----------------------------------------------------------------


async def test_open_conversations_trip_per_user_then_per_tenant(serve: Serve) -> None:
    t, other = tenant("open"), tenant("open-other")
    async with serve() as s, s.client("u1", t) as u1, s.client("u2", t) as u2, s.client("u3", t) as u3, \
            s.client("x", other) as x:
        for _ in range(2):
            await u1.open()
        reply = await refused(u1, "open_conversations", "user", type="open")
        assert "resets_at" not in reply       # a gauge: it frees up as conversations go
        for _ in range(2):
            await u2.open()                  # the tenant's 4th
        await refused(u3, "open_conversations", "tenant", type="open")
        for _ in range(2):
            await x.open()                   # another tenant: unaffected


async def test_concurrent_turns_trip_while_a_turn_runs_and_free_up_when_it_ends(serve: Serve) -> None:
    t, other = tenant("busy"), tenant("busy-other")
    async with serve() as s, s.client("u1", t) as u1, s.client("u2", t) as u2, s.client("u3", t) as u3, \
            s.client("x", other) as x:
        c1, c2 = await u1.open(agent="ask"), await u1.open(agent="quick")
        await u1.subscribe(c1)
        await accepted(u1, type="user_message", conversation_id=c1, text="where?")
        ask = await u1.event(c1, "ask_user")                   # the turn waits for an answer: still running
        reply = await refused(u1, "concurrent_turns", "user", type="user_message", conversation_id=c2, text="hi")
        assert "resets_at" not in reply
        c3 = await u2.open(agent="ask")
        await u2.subscribe(c3)
        await accepted(u2, type="user_message", conversation_id=c3, text="where?")
        await u2.event(c3, "ask_user")                         # the tenant's 2nd running turn
        c4 = await u3.open(agent="quick")
        await refused(u3, "concurrent_turns", "tenant", type="user_message", conversation_id=c4, text="hi")
        cx = await x.open(agent="quick")
        await accepted(x, type="user_message", conversation_id=cx, text="hi")   # another tenant: unaffected
        await accepted(u1, type="answer", conversation_id=c1, ask_id=ask["data"]["ask_id"], answer="Paris")
        await u1.turn_completed(c1)
        # The slot went back before turn.completed was stored: the next turn may start at once.
        await accepted(u1, type="user_message", conversation_id=c2, text="hi again")


async def test_turns_per_minute_trip_per_user_then_per_tenant_with_their_reset(serve: Serve) -> None:
    async with serve() as s:
        for _ in range(3):                    # a minute that ends mid-test starts the scenario over
            t, other = tenant("rate"), tenant("rate-other")
            minute = int(time.time() // 60)
            async with s.client("u1", t) as u1, s.client("u2", t) as u2, s.client("x", other) as x:
                c1, c2, cx = await u1.open(), await u2.open(), await x.open()
                replies = [await say(u1, c1) for _ in range(4)] + [await say(u2, c2) for _ in range(3)]
                others = [await say(x, cx) for _ in range(3)]
            if int(time.time() // 60) != minute:
                continue
            assert [r["type"] for r in replies] == ["ack"] * 3 + ["error"] + ["ack"] * 2 + ["error"]
            assert [(r["quota"], r["scope"]) for r in (replies[3], replies[6])] == [
                ("turns_per_minute", "user"), ("turns_per_minute", "tenant")]
            reset = replies[3]["resets_at"]
            assert reset == replies[6]["resets_at"] and reset.endswith(":00Z")   # the minute's end, UTC
            assert replies[3]["message"].endswith(f"resets at {reset}")
            assert [r["type"] for r in others] == ["ack"] * 3                 # another tenant: unaffected
            return
        pytest.fail("three minute boundaries in a row")


async def test_tokens_per_day_refuse_the_next_turn_once_over(serve: Serve) -> None:
    t, other = tenant("tokens"), tenant("tokens-other")
    async with serve() as s, s.client("u1", t) as u1, s.client("x", other) as x:
        c1, cx = await u1.open(agent="costly"), await x.open(agent="costly")
        await u1.subscribe(c1)
        await accepted(u1, type="user_message", conversation_id=c1, text="hi")
        await u1.turn_completed(c1)           # 600 tokens, as the model reported them: over 500
        reply = await refused(u1, "tokens_per_day", "user", type="user_message", conversation_id=c1, text="more")
        assert reply["resets_at"].endswith("T00:00:00Z")                       # midnight UTC
        await accepted(x, type="user_message", conversation_id=cx, text="hi")  # another tenant: unaffected
        # exactly what the model reported, not an estimate from characters
        assert await _until(s, sample("reactgate_quota_used", tenant=t, quota="tokens_per_day")) == 600


async def test_tool_calls_past_the_turns_limit_get_quota_exceeded_and_the_turn_answers(serve: Serve) -> None:
    async with serve() as s, s.client("u1", tenant("tools")) as u1:
        cid = await u1.open(agent="tools")
        await u1.subscribe(cid)
        await accepted(u1, type="user_message", conversation_id=cid, text="weather?")
        done = await u1.turn_completed(cid)
        results = [e["data"] for e in u1.events[cid] if e["event"] == "tool.result"]
        assert [(r["ok"], r.get("error")) for r in results] == [(True, None), (True, None), (False, "quota_exceeded")]
        assert results[2]["detail"]["quota"] == "tool_calls_per_turn" and results[2]["detail"]["limit"] == 2
        assert (done["data"]["reason"], done["data"]["final_answer"]) == ("complete", "Rainy.")


async def test_connections_trip_per_user_then_per_address_and_close_with_1013(serve: Serve) -> None:
    t, other = tenant("conn"), tenant("conn-other")

    async def turned_away(sub: str, tenant: str, scope: str) -> None:
        async with s.client(sub, tenant) as c:
            frame = await c.recv()
            assert (frame["code"], frame["quota"], frame["scope"]) == ("quota_exceeded", "connections", scope), frame
            assert "id" not in frame and "resets_at" not in frame
            assert (await c.closed()).rcvd.code == 1013

    async with serve(quota_connections_per_user=2, quota_connections_per_ip=3) as s:
        async with s.client("u1", t) as a, s.client("u1", t) as b:
            for c in (a, b):
                assert (await c.request(type="ping"))["type"] == "pong"
            await turned_away("u1", t, "user")
            async with s.client("x", other) as x:                   # another tenant: unaffected by u1's
                assert (await x.request(type="ping"))["type"] == "pong"
                await turned_away("y", other, "ip")                 # the address's 4th
        async with s.client("u1", t) as again:                      # closed ones free up
            assert (await again.request(type="ping"))["type"] == "pong"


# -- durable, and exported ------------------------------------------------------------------------


async def test_the_counters_survive_a_restart(serve: Serve) -> None:
    t = tenant("restart")
    async with serve() as s, s.client("u1", t) as u1:
        c1 = await u1.open(agent="costly")
        await u1.open(agent="quick")
        await u1.subscribe(c1)
        await accepted(u1, type="user_message", conversation_id=c1, text="hi")
        await u1.turn_completed(c1)
    async with serve() as s, s.client("u1", t) as u1:         # a new gateway and backend, the same store
        await refused(u1, "open_conversations", "user", type="open")
        await refused(u1, "tokens_per_day", "user", type="user_message", conversation_id=c1, text="more")


async def test_metrics_show_each_tenants_counters(serve: Serve) -> None:
    t = tenant("metrics")
    async with serve() as s, s.client("u1", t) as u1:
        for _ in range(2):
            await u1.open()
        await refused(u1, "open_conversations", "user", type="open")
        used = await _until(s, sample("reactgate_quota_used", tenant=t, quota="open_conversations"))
        assert used == 2
        refusals = await _until(s, sample("reactgate_quota_refused_total", tenant=t, quota="open_conversations",
                                          scope="user"))
        assert refusals == 1


def sample(name: str, **labels: str) -> Callable[[str], float | None]:
    """The value of one sample of a /metrics page, once it is there."""
    def find(text: str) -> float | None:
        for family in text_string_to_metric_families(text):
            for found in family.samples:
                if found.name == name and all(found.labels.get(k) == v for k, v in labels.items()):
                    return float(found.value)
        return None
    return find


async def _until(s: Served, find: Callable[[str], float | None], timeout: float = 20.0) -> float:
    async def poll() -> float:
        while True:
            status, _, body = await http_get("127.0.0.1", s.port, "/metrics")
            assert status == 200
            found = find(body.decode())
            if found is not None:
                return found
            await asyncio.sleep(0.05)

    return await asyncio.wait_for(poll(), timeout)

