"""Hosting: the same scenarios on the local and the Ray backend, then Ray's faults
(docs/design.md#hosting, #recovery).

Ray is real here: one local instance for the module (2 CPUs, no dashboard), shut down at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray
from ray.exceptions import ActorUnavailableError

from actors import heap
from actors.conversation import Runtime
from actors.hosting.backend import Answer, SetMode, UserMessage
from actors.hosting.local import LocalBackend
from actors.identity import Owner
from actors.llm.scripts import register_script
from actors.llm.stream import stream_model
from actors.profile import AgentProfile, parse_profile
from actors.ray.backend import RayBackend
from actors.ray.config import RayConfig
from actors.ray.names import NAMESPACE, dedicated_host, tool_pool
from actors.store import store_from_url
from actors.tools.demo import demo_registry
from actors.tools.durable import DurableTools
from actors.tools.executor import LocalToolExecutor
from gateway.settings import Settings
from protocol.events import Event
from tests.e2e import local_ray
from tests.roundkit import action, call, thinking
from tests.watchkit import Watch, contiguous

pytestmark = pytest.mark.ray
OWNER = Owner(tenant="acme", sub="alice")
TIMEOUT = 90.0


LONG_ANSWER = "It is raining in Paris, 12 degrees. " * 8
SCRIPTS: dict[str, dict[str, Any]] = {
    # a tool, then a slowly streaming answer: time to cut it in the middle
    "weather": {"loop": True, "rounds": [
        {"text": thinking("Checking.") + action(call("demo.weather", city="Paris"))},
        {"text": thinking("Answering.") + action({"action": "complete", "final_answer": LONG_ANSWER}),
         "chunk_chars": 4, "delay_ms": 15},
    ]},
    # a write with a visible side effect next to a slow neutral tool: time to cut the tool wait
    "note": {"loop": True, "rounds": [
        {"text": thinking("Noting.") + action(call("demo.write_note", text="remember")) +
         action(call("demo.sleep", seconds=2.5))},
        {"text": thinking("Done.") + action({"action": "complete", "final_answer": "Noted."})},
    ]},
    # an exploration call, then a slow batch the tool pool will die in
    "pool": {"loop": True, "rounds": [
        {"text": thinking("Searching.") + action(call("demo.search", query="paris"))},
        {"text": thinking("Waiting.") + action(call("demo.sleep", seconds=30))},
        {"text": thinking("Done.") + action({"action": "complete", "final_answer": "Finished anyway."})},
    ]},
    "ask": {"loop": True, "rounds": [
        {"text": thinking("Asking.") + action(call("react.ask_user", question="Which city?", options=["Paris", "Rome"]))},
        {"text": thinking("Done.") + action({"action": "complete", "final_answer": "Paris it is."})},
    ]},
}


# -- answers cut mid-stream (docs/design.md#continuation): the same on both backends ----------------
CUT_ANSWER = "It is raining in Paris, 12 degrees. Take an umbrella and a light jacket."
CUT_FULL = thinking("Answering.") + action({"action": "complete", "final_answer": CUT_ANSWER})
CUT_HEAD, CUT_REST = CUT_FULL[:CUT_FULL.index("umbrella")], CUT_FULL[CUT_FULL.index("umbrella"):]
CUT_SEEN = CUT_ANSWER[:CUT_ANSWER.index("umbrella")]       # the answer chars streamed before the cut
WEATHER = {"text": thinking("Checking.") + action(call("demo.weather", city="Paris"))}
BROKEN_TAIL = (thinking("Answering.") + '<channel:action>{"action": "complete", "final_answer": "'
               + CUT_ANSWER + '", }</channel:action>')
SCRIPTS.update({
    "cut-error": {"rounds": [WEATHER, {"text": CUT_HEAD, "error": "server_error"}, {"text": CUT_REST}]},
    "cut-fallback": {"rounds": [WEATHER, {"text": CUT_HEAD, "error": "unavailable"}]},
    # the fallback model: the conversation's call index counts every call, so its answer is call 2
    "cut-fallback-b": {"rounds": [{"error": "bad_request"}, {"error": "bad_request"}, {"text": CUT_REST}]},
    "cut-idle": {"rounds": [WEATHER, {"deltas": [CUT_HEAD, "never sent"], "hang_after": 1}, {"text": CUT_REST}]},
    "cut-restart": {"rounds": [WEATHER, {"text": CUT_HEAD, "error": "server_error"}, {"text": CUT_FULL}]},
    "cut-budget": {"rounds": [WEATHER, {"text": CUT_HEAD, "error": "server_error"}, {"text": CUT_REST}]},
    "cut-tail": {"rounds": [WEATHER, {"text": BROKEN_TAIL}]},
})
# agent → (what its profile adds, reason, final answer, partial)
CUT_CASES: dict[str, tuple[dict[str, Any], str, str, bool]] = {
    "cut-error": ({}, "complete", CUT_ANSWER, False),
    "cut-fallback": ({"fallbacks": ["scripted/hosting-cut-fallback-b"]}, "complete", CUT_ANSWER, False),
    "cut-idle": ({"policies": {"stream_idle_timeout_s": 1.0}}, "complete", CUT_ANSWER, False),
    "cut-restart": ({}, "salvaged", CUT_SEEN, True),
    "cut-budget": ({"policies": {"auto_continue_max": 0}}, "salvaged", CUT_SEEN, True),
    "cut-tail": ({}, "salvaged", CUT_ANSWER, False),
}


def _profile(name: str, extra: dict[str, Any] | None = None) -> AgentProfile:
    tools = ["demo.search", "demo.weather", "demo.write_note", "demo.sleep", "react.ask_user"]
    extra = extra or {}
    return parse_profile({
        "name": name, "model": f"scripted/hosting-{name}", "states": ["default"],
        "policies": {"flush_interval_ms": 10, **extra.get("policies", {})},
        "fallbacks": extra.get("fallbacks", []),
        "tools": [{"id": t} for t in tools],
    }, known_tools=demo_registry())


PROFILES = {name: _profile(name, CUT_CASES[name][0] if name in CUT_CASES else None)
            for name in SCRIPTS if name != "cut-fallback-b"}
# the ask agent again, each conversation in its own Ray actor
PROFILES["solo"] = PROFILES["ask"].model_copy(update={"name": "solo", "placement": "dedicated"})


@pytest.fixture(scope="module")
def script_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("scripts")
    files = {}
    for name, script in SCRIPTS.items():
        path = root / f"{name}.json"
        path.write_text(json.dumps(script))
        files[f"hosting-{name}"] = str(path)
        register_script(f"hosting-{name}", path)
    return files


@pytest.fixture(scope="module")
def store_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('store') / 'hosting.sqlite3'}"


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    with local_ray() as ray:
        yield ray


async def _ray_backend(store_url: str, script_files: dict[str, str]) -> RayBackend:
    config = RayConfig(store_url=store_url, registry=demo_registry(), profiles=PROFILES, scripts=script_files,
                       idle_ttl_s=600, hosts=2)
    backend = RayBackend(config, default_agent="weather")
    await backend.start()
    return backend


@pytest.fixture(params=["local", "ray"])
async def backend(request: pytest.FixtureRequest, store_url: str, script_files: dict[str, str]) -> AsyncIterator[Any]:
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")
        b: Any = await _ray_backend(store_url, script_files)
    else:
        store = store_from_url(store_url.replace("hosting.sqlite3", "hosting-local.sqlite3"))
        registry = demo_registry()
        runtime = Runtime(registry=registry, tools=DurableTools(LocalToolExecutor(registry), store),
                          stream_model=stream_model)
        b = LocalBackend(store, runtime, PROFILES, default_agent="weather")
        await b.start()
    yield b
    await b.stop()


async def _open(backend: Any, agent: str) -> str:
    return (await backend.open(OWNER, None, agent, None)).conversation_id


async def _inspect(backend: Any, cid: str) -> dict[str, Any]:
    if isinstance(backend, RayBackend):
        _, handle = await backend._host_for(cid)
        return dict(await handle.inspect.remote(cid))
    return dict(await backend.host.inspect(cid))


async def _passivate(backend: Any, cid: str) -> bool:
    if isinstance(backend, RayBackend):
        _, handle = await backend._host_for(cid)
        return bool(await handle.passivate.remote(cid))
    return bool(await backend.host.passivate(cid))


# -- the same scenarios on both backends ------------------------------------------------------------


async def _one_turn(backend: Any, agent: str) -> tuple[list[Event], Any, str]:
    """A new conversation's first turn, watched whole: its events (seqs checked contiguous), its
    `turn.completed` data and the answer text that streamed."""
    cid = await _open(backend, agent)
    watch = Watch(backend, cid, owner=OWNER)
    assert await backend.command(OWNER, cid, UserMessage("m1", "weather?")) == "accepted"
    await watch.until_event("turn.completed")
    await watch.stop()
    assert contiguous(watch.events)
    [done] = [e.data for e in watch.events if e.event == "turn.completed"]
    return watch.events, done, "".join(e.data.text for e in watch.events if e.event == "answer.delta")


async def test_turn_streams_to_completion_with_contiguous_seqs(backend: Any) -> None:
    _, done, streamed = await _one_turn(backend, "weather")
    assert done.reason == "complete" and done.final_answer == LONG_ANSWER
    assert streamed == LONG_ANSWER


@pytest.mark.parametrize("agent", list(CUT_CASES))
async def test_an_answer_cut_mid_stream_is_continued_or_ends_partial(backend: Any, agent: str) -> None:
    _, reason, final_answer, partial = CUT_CASES[agent]
    events, done, streamed = await _one_turn(backend, agent)
    assert (done.reason, done.final_answer, done.partial) == (reason, final_answer, partial)
    assert streamed == final_answer                       # every character once: nothing repeated, nothing lost
    if agent == "cut-fallback":
        [fallback] = [e for e in events if e.event == "fallback"]
        assert fallback.data.to_model == "scripted/hosting-cut-fallback-b"


async def test_duplicate_user_message_is_acked_duplicate_and_runs_once(backend: Any) -> None:
    cid = await _open(backend, "ask")
    watch = Watch(backend, cid, owner=OWNER)
    assert await backend.command(OWNER, cid, UserMessage("same", "hi")) == "accepted"
    assert await backend.command(OWNER, cid, UserMessage("same", "hi")) == "duplicate"
    await watch.until_event("ask_user")
    ask = next(e for e in watch.events if e.event == "ask_user")
    assert await backend.command(OWNER, cid, Answer("a1", ask.data.ask_id, "Paris")) == "accepted"
    assert await backend.command(OWNER, cid, Answer("a1", ask.data.ask_id, "Paris")) == "duplicate"
    await watch.until_event("turn.completed")
    await watch.stop()
    assert sum(e.event == "turn.started" for e in watch.events) == 1
    result = next(e for e in watch.events if e.event == "tool.result")
    assert result.data.result == {"answer": "Paris"}


async def test_resubscribe_after_last_seen_seq_has_no_gap_and_no_duplicate(backend: Any) -> None:
    cid = await _open(backend, "weather")
    first = Watch(backend, cid, owner=OWNER)
    await backend.command(OWNER, cid, UserMessage("m1", "weather?"))
    await first.until_event("answer.delta")
    await first.stop()
    seen = list(first.events)
    second = Watch(backend, cid, after=seen[-1].seq, owner=OWNER)
    await second.until_event("turn.completed")
    await second.stop()
    union = seen + second.events
    assert contiguous(union)
    assert union[-1].event == "turn.completed"


async def test_back_to_back_resubscriptions_keep_the_live_feed(backend: Any) -> None:
    # A subscription that ends while the next one starts must not unwatch the host under the new one
    # (on Ray an async actor may run the old unwatch after the new watch). Many handoffs mid-stream.
    cid = await _open(backend, "weather")
    watch = Watch(backend, cid, owner=OWNER)
    await backend.command(OWNER, cid, UserMessage("m1", "weather?"))
    await watch.until_event("answer.delta")
    union: list[Event] = []
    for _ in range(12):
        await watch.until(lambda evs: len(evs) >= 1)
        watch.task.cancel()                              # ends now; the next starts in the same tick
        union += watch.events
        watch = Watch(backend, cid, after=union[-1].seq, owner=OWNER)
        if union[-1].event == "turn.completed":
            break
    await watch.until(lambda evs: any(e.event == "turn.completed" for e in union + evs))
    await watch.stop()
    union += watch.events
    assert contiguous(union)
    assert union[-1].event == "turn.completed"


async def test_two_watchers_receive_identical_sequences(backend: Any) -> None:
    cid = await _open(backend, "weather")
    a, b = Watch(backend, cid, owner=OWNER), Watch(backend, cid, owner=OWNER)
    await backend.command(OWNER, cid, UserMessage("m1", "weather?"))
    await a.until_event("turn.completed")
    await b.until_event("turn.completed")
    await a.stop()
    await b.stop()
    assert [(e.seq, e.event, e.data) for e in a.events] == [(e.seq, e.event, e.data) for e in b.events]


async def test_passivated_conversation_reactivates_with_state_intact(backend: Any) -> None:
    cid = await _open(backend, "pool")  # round 0 is an exploration call: the budget counter moves
    watch = Watch(backend, cid, owner=OWNER)
    await backend.command(OWNER, cid, UserMessage("m1", "search"))
    await watch.until_event("tool.call", 2)  # the search ran; the slow second call is out
    await backend.command(OWNER, cid, SetMode("mode", "ask"))
    await backend.command(OWNER, cid, _cancel())
    await watch.until_event("turn.completed")
    await watch.stop()
    before = await _inspect(backend, cid)
    assert before["state"]["mode"] == "ask" and before["state"]["ledger"]
    assert await _passivate(backend, cid)
    after = await _inspect(backend, cid)
    for key in ("timeline", "mode", "agent_state", "ledger", "model_calls", "turns", "queue"):
        assert after["state"][key] == before["state"][key], key
    assert after["last_seq"] == before["last_seq"]


def _cancel() -> Any:
    from actors.hosting.backend import Cancel

    return Cancel("cancel-1")


# -- Ray only -------------------------------------------------------------------------------------------


@pytest.fixture
async def ray_backend(ray_cluster: Any, store_url: str, script_files: dict[str, str]) -> AsyncIterator[RayBackend]:
    backend = await _ray_backend(store_url, script_files)
    yield backend
    await backend.ensure_hosts()  # replace any host a test killed
    await backend.stop()


async def test_directory_spreads_conversations_over_hosts(ray_backend: RayBackend) -> None:
    hosts = set()
    for _ in range(12):
        cid = await _open(ray_backend, "weather")
        await ray_backend.command(OWNER, cid, SetMode(f"m-{cid}", "agent"))
        hosts.add(await ray_backend.host_of(cid))
    assert len(hosts) == 2


def _collector_settings(host: Any) -> tuple[tuple[int, ...], int]:
    return tuple(gc.get_threshold()), gc.get_freeze_count()


async def test_a_host_serving_a_conversation_takes_the_collector_settings_of_a_serving_process(
    ray_backend: RayBackend,
) -> None:
    """actors/heap.py on a ConversationHost, as on the gateway (tests/test_heap.py): once its core has
    started, what it loaded is frozen and young collections are rare. Read inside the actor's process."""
    cid = await _open(ray_backend, "weather")
    await ray_backend.command(OWNER, cid, SetMode(f"m-{cid}", "agent"))   # activates it: the host's core starts
    host = ray.get_actor(await ray_backend.host_of(cid), namespace=NAMESPACE)
    threshold, frozen = await host.__ray_call__.remote(_collector_settings)
    assert threshold == heap.THRESHOLDS and frozen > 0


async def test_single_activation_under_concurrent_first_messages_from_two_gateways(
    ray_backend: RayBackend, store_url: str, script_files: dict[str, str]
) -> None:
    other = await _ray_backend(store_url, script_files)
    try:
        cid = await _open(ray_backend, "ask")
        results = await asyncio.gather(
            ray_backend.command(OWNER, cid, UserMessage("from-a", "one")),
            other.command(OWNER, cid, UserMessage("from-b", "two")),
        )
        assert results == ["accepted", "accepted"]
        active_on = []
        for name in await ray_backend.hosts():
            stats = await ray.get_actor(name, namespace=NAMESPACE).stats.remote()
            if cid in stats["active_ids"]:
                active_on.append(name)
        assert len(active_on) == 1
        state = await _inspect(ray_backend, cid)
        assert state["state"]["turns"] + len(state["state"]["queue"]) == 2  # both messages, one writer
    finally:
        await other.stop()


async def test_host_killed_mid_stream_client_resumes_with_one_final_answer(ray_backend: RayBackend) -> None:
    cid = await _open(ray_backend, "weather")
    watch = Watch(ray_backend, cid, owner=OWNER)
    await ray_backend.command(OWNER, cid, UserMessage("m1", "weather?"))
    await watch.until_event("answer.delta", 3)
    ray.kill(ray.get_actor(await ray_backend.host_of(cid), namespace=NAMESPACE))
    await watch.until_event("turn.completed")
    await watch.stop()
    assert contiguous(watch.events)
    [done] = [e for e in watch.events if e.event == "turn.completed"]
    streamed = "".join(e.data.text for e in watch.events if e.event == "answer.delta")
    assert done.data.final_answer == streamed  # salvaged or completed: exactly what the user saw
    store_events = await ray_backend.store.read_events(cid, 0, 10_000)
    assert [(e.seq, e.event) for e in store_events] == [(e.seq, e.event) for e in watch.events]


async def test_host_killed_mid_tool_call_runs_the_tool_exactly_once(ray_backend: RayBackend) -> None:
    cid = await _open(ray_backend, "note")
    pool = ray.get_actor(tool_pool(ray_backend.config.generation), namespace=NAMESPACE)
    watch = Watch(ray_backend, cid, owner=OWNER)
    await ray_backend.command(OWNER, cid, UserMessage("m1", "note it"))
    await watch.until_event("tool.call", 2)
    await _until(lambda: pool.stats.remote(), lambda s: s["inflight"] > 0)
    ray.kill(ray.get_actor(await ray_backend.host_of(cid), namespace=NAMESPACE))
    await watch.until_event("turn.completed")
    await watch.stop()
    assert contiguous(watch.events)
    workspace = await pool.workspace.remote(cid)
    assert len(workspace["workspace"]["notes"]) == 1        # the side effect happened once
    assert (await pool.stats.remote())["executed"][cid] == 2  # write_note and sleep, never re-run
    results = [e for e in watch.events if e.event == "tool.result"]
    assert sorted(e.data.tool_id for e in results) == ["demo.sleep", "demo.write_note"]
    assert all(e.data.ok for e in results)


async def test_tool_pool_killed_in_flight_calls_get_error_observations_and_counters_survive(
    ray_backend: RayBackend,
) -> None:
    cid = await _open(ray_backend, "pool")
    pool = ray.get_actor(tool_pool(ray_backend.config.generation), namespace=NAMESPACE)
    watch = Watch(ray_backend, cid, owner=OWNER)
    await ray_backend.command(OWNER, cid, UserMessage("m1", "go"))
    await watch.until_event("tool.call", 2)
    await _until(lambda: pool.stats.remote(), lambda s: s["inflight"] > 0)
    ray.kill(pool, no_restart=False)
    await watch.until_event("turn.completed")
    await watch.stop()
    results = [e for e in watch.events if e.event == "tool.result"]
    assert results[0].data.ok and results[0].data.tool_id == "demo.search"
    assert results[1].data.error == "tool_pool_unavailable"
    done = next(e for e in watch.events if e.event == "turn.completed")
    assert done.data.reason == "complete"
    restarted = ray.get_actor(tool_pool(ray_backend.config.generation), namespace=NAMESPACE)
    # The turn may end (its observation is the failure) before Ray has finished the restart.
    workspace = await _until_available(lambda: restarted.workspace.remote(cid))
    assert workspace["exploration"] == 1  # durable across the restart


async def _until_available(call: Callable[[], Any], timeout: float = 30.0) -> Any:
    """The answer of an actor that may still be restarting (a condition, bounded: no fixed sleep)."""
    async def attempt() -> Any:
        while True:
            try:
                return await call()
            except ActorUnavailableError:
                await asyncio.sleep(0.05)
    return await asyncio.wait_for(attempt(), timeout)


async def _until(probe: Callable[[], Any], predicate: Callable[[Any], bool], timeout: float = 30.0) -> None:
    async def wait() -> None:
        while not predicate(await probe()):
            await asyncio.sleep(0.02)
    await asyncio.wait_for(wait(), timeout)


async def test_client_reconnects_to_another_gateway_and_resumes(
    ray_backend: RayBackend, store_url: str, script_files: dict[str, str], tmp_path: Path
) -> None:
    from websockets.asyncio.client import connect

    from gateway.server import GatewayServer

    other = await _ray_backend(store_url, script_files)
    a = GatewayServer(Settings(port=0, store=store_url), ray_backend)
    b = GatewayServer(Settings(port=0, store=store_url), other)
    (_, port_a), (_, port_b) = await a.start(), await b.start()
    seen: list[dict[str, Any]] = []
    try:
        async with connect(f"ws://127.0.0.1:{port_a}/ws", subprotocols=["reactgate.v1"]) as ws:
            await ws.send(json.dumps({"type": "open", "id": "o1", "agent": "weather"}))
            cid = json.loads(await ws.recv())["conversation_id"]
            await ws.send(json.dumps({"type": "subscribe", "id": "s1", "conversation_id": cid}))
            await ws.send(json.dumps({"type": "user_message", "id": "u1", "conversation_id": cid, "text": "hi"}))
            while sum(f.get("event") == "answer.delta" for f in seen) < 2:
                frame = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))
                if frame["type"] == "event":
                    seen.append(frame)
        async with connect(f"ws://127.0.0.1:{port_b}/ws", subprotocols=["reactgate.v1"]) as ws:
            await ws.send(json.dumps({"type": "subscribe", "id": "s2", "conversation_id": cid,
                                      "after_seq": seen[-1]["seq"]}))
            while seen[-1].get("event") != "turn.completed":
                frame = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))
                if frame["type"] == "event":
                    seen.append(frame)
    finally:
        await b.drain()
        await a.drain()
    assert [f["seq"] for f in seen] == list(range(1, len(seen) + 1))
    assert seen[-1]["data"]["final_answer"] == LONG_ANSWER


async def test_dedicated_placement_runs_one_named_actor_per_conversation(
    ray_cluster: Any, store_url: str, script_files: dict[str, str]
) -> None:
    backend = await _ray_backend(store_url, script_files)
    generation = backend.config.generation
    try:
        first, second = await _open(backend, "solo"), await _open(backend, "solo")
        for cid in (first, second):
            await backend.command(OWNER, cid, SetMode(f"m-{cid}", "agent"))
        hosts = {await backend.host_of(first), await backend.host_of(second)}
        assert hosts == {dedicated_host(generation, first), dedicated_host(generation, second)}
        for cid in (first, second):
            stats = await ray.get_actor(dedicated_host(generation, cid), namespace=NAMESPACE).stats.remote()
            assert stats["active_ids"] == [cid]
        watch = Watch(backend, first, owner=OWNER)
        await backend.command(OWNER, first, UserMessage("m1", "hi"))
        await watch.until_event("ask_user")
        ask = next(e for e in watch.events if e.event == "ask_user")
        await backend.command(OWNER, first, Answer("a1", ask.data.ask_id, "Rome"))
        await watch.until_event("turn.completed")
        await watch.stop()
        assert contiguous(watch.events)
        assert await _passivate(backend, second)  # a passivated dedicated host's process goes away

        def gone() -> bool:
            try:
                ray.get_actor(dedicated_host(generation, second), namespace=NAMESPACE)
            except ValueError:
                return True
            return False

        await _until(lambda: _async_value(gone()), bool)
        assert dedicated_host(generation, first) not in await backend.hosts()
    finally:
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(dedicated_host(generation, first), namespace=NAMESPACE))
        await backend.stop()


async def test_idle_conversation_is_passivated_after_ttl_and_reactivates_on_next_frame(
    store_url: str, script_files: dict[str, str]
) -> None:
    store = store_from_url(store_url.replace("hosting.sqlite3", "hosting-ttl.sqlite3"))
    registry = demo_registry()
    runtime = Runtime(registry=registry, tools=DurableTools(LocalToolExecutor(registry), store),
                      stream_model=stream_model)
    backend = LocalBackend(store, runtime, PROFILES, default_agent="weather", idle_ttl_s=0.2)
    await backend.start()
    try:
        cid = await _open(backend, "weather")
        await backend.command(OWNER, cid, SetMode("m1", "ask"))
        assert cid in backend.host.active_ids
        await _until(lambda: _async_value(backend.host.active_ids), lambda ids: cid not in ids, timeout=10)
        state = await _inspect(backend, cid)  # the next frame re-activates it from the store
        assert state["state"]["mode"] == "ask" and cid in backend.host.active_ids
    finally:
        await backend.stop()


async def _async_value(value: Any) -> Any:
    return value


async def test_an_answer_to_no_waiting_question_is_refused(backend: Any) -> None:
    from actors.hosting.backend import UnknownAsk

    cid = await _open(backend, "weather")
    with pytest.raises(UnknownAsk):
        await backend.command(OWNER, cid, Answer("stale", "t9.9.0", "Paris"))


async def test_the_host_prunes_idempotency_keys_older_than_a_day() -> None:
    from actors.hosting.host import HostCore
    from actors.store import IDEMPOTENCY_TTL_S

    class RecordingStore:
        def __init__(self) -> None:
            self.pruned = asyncio.Event()
            self.older_than: float | None = None

        async def prune_keys(self, older_than: float) -> int:
            self.older_than = older_than
            self.pruned.set()
            return 0

    store = RecordingStore()
    core = HostCore(store, None, {}, idle_ttl_s=0.2, clock=lambda: 1_000_000.0)  # type: ignore[arg-type]
    core.start()
    try:
        await asyncio.wait_for(store.pruned.wait(), 10)
    finally:
        await core.close()
    assert store.older_than == 1_000_000.0 - IDEMPOTENCY_TTL_S


# -- configuration: settings in at the edge, a RayConfig to every actor -------------------------------------


def test_the_ray_config_is_built_from_the_gateway_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.app import agent_setup, ray_config

    monkeypatch.setenv("REACTGATE_HOSTS", "3")      # the variable names of before, now settings
    monkeypatch.setenv("REACTGATE_RAY_CPUS", "4")
    monkeypatch.setenv("REACTGATE_RAY_ACTOR_RESOURCE", "reactgate_actors")
    settings = Settings(store="postgresql://reactgate:pw-in-dsn@db:5432/reactgate",
                        ray_address="ray://head:10001", idle_ttl_s=30)
    setup = agent_setup(settings)
    config = ray_config(settings, setup)
    assert (config.hosts, config.local_cpus, config.address, config.idle_ttl_s) == (3, 4, "ray://head:10001", 30)
    assert config.actor_resource == "reactgate_actors"
    assert config.store_url == settings.store and config.registry is setup.registry
    assert list(config.profiles) == [setup.profile.name]
    assert "pw-in-dsn" not in repr(config)          # the DSN travels in it, but never into a log line


def test_the_ray_config_pickles_with_its_tool_handlers_by_reference() -> None:
    import pickle

    from actors.tools.demo import search

    config = RayConfig(store_url="sqlite:///x.sqlite3", registry=demo_registry(), profiles=PROFILES)
    copy = pickle.loads(pickle.dumps(config))
    assert [t.tool_id for t in copy.registry] == [t.tool_id for t in config.registry]
    tool = copy.registry.get("demo.search")
    assert tool is not None and tool.handler is search
