"""Configuration generations (docs/design.md#generations): hosts serve the configuration of the
gateway that makes it current; a gateway with another one starts its own hosts, the old ones drain
and exit, and a gateway whose configuration was replaced is refused — never `internal`.

The cluster is a real local Ray (2 CPUs, no dashboard) for the module.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray

from actors.hosting.backend import ConfigurationReplaced, UserMessage
from actors.identity import Owner
from actors.profile import AgentProfile, parse_profile
from actors.ray.backend import RayBackend
from actors.ray.config import RayConfig
from actors.ray.generation import differences
from actors.ray.names import NAMESPACE, generation_of, sharded_host, tool_pool
from actors.tools.demo import demo_registry
from tests.e2e import local_ray
from tests.roundkit import action, call, thinking
from tests.watchkit import Watch, contiguous

OWNER = Owner(tenant="acme", sub="alice")
TIMEOUT = 90.0
ANSWER_A = "The old profile answers: it is raining in Paris. " * 3
ANSWER_B = "The new profile answers: take an umbrella."


def _script(answer: str, delay_ms: int = 0) -> dict[str, Any]:
    return {"loop": True, "rounds": [
        {"text": thinking("Checking.") + action(call("demo.weather", city="Paris"))},
        {"text": thinking("Answering.") + action({"action": "complete", "final_answer": answer}),
         "chunk_chars": 4, "delay_ms": delay_ms},
    ]}


def _profile(script: str) -> AgentProfile:
    return parse_profile({
        "name": "agent", "model": f"scripted/{script}", "states": ["default"],
        "policies": {"flush_interval_ms": 10}, "tools": [{"id": "demo.weather"}],
    }, known_tools=demo_registry())


def _config(store_url: str, script: str, scripts: dict[str, str]) -> RayConfig:
    return RayConfig(store_url=store_url, registry=demo_registry(), profiles={"agent": _profile(script)},
                     scripts=scripts, hosts=1)


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("scripts")
    files = {}
    for name, script in {"gen-a": _script(ANSWER_A, delay_ms=40), "gen-b": _script(ANSWER_B)}.items():
        path = root / f"{name}.json"
        path.write_text(json.dumps(script))
        files[name] = str(path)
    return files


# -- the generation itself: a content hash ---------------------------------------------------------------


def test_the_generation_is_the_same_in_every_process_and_changes_with_what_hosts_serve(
    scripts: dict[str, str], tmp_path: Path,
) -> None:
    base = _config("sqlite:///a.sqlite3", "gen-a", scripts)
    code = (
        "from tests.test_generations import _config; import json, sys; "
        "print(_config('sqlite:///a.sqlite3', 'gen-a', json.loads(sys.argv[1])).generation)"
    )
    other = subprocess.run([sys.executable, "-c", code, json.dumps(scripts)], capture_output=True, text=True,
                           check=True, cwd=Path(__file__).parent.parent, timeout=120)
    assert other.stdout.strip() == base.generation   # another process computes the same name

    store = _config("sqlite:///b.sqlite3", "gen-a", scripts)
    profile = _config("sqlite:///a.sqlite3", "gen-b", scripts)
    edited = tmp_path / "gen-a.json"
    edited.write_text(json.dumps(_script(ANSWER_A + " Edited.")))
    script = _config("sqlite:///a.sqlite3", "gen-a", {**scripts, "gen-a": str(edited)})
    assert len({base.generation, store.generation, profile.generation, script.generation}) == 4
    assert differences(store.sections, base.sections) == ["store"]
    assert differences(profile.sections, base.sections) == ["profile agent"]
    assert differences(script.sections, base.sections) == ["script gen-a"]
    shape = RayConfig(store_url="sqlite:///a.sqlite3", registry=demo_registry(),
                      profiles={"agent": _profile("gen-a")}, scripts=scripts, hosts=4, local_cpus=8)
    assert shape.generation == base.generation        # the cluster's shape is not what hosts serve
    assert "a.sqlite3" not in repr(base.sections)     # digests only: a DSN may carry a password


def test_host_names_carry_their_generation() -> None:
    assert generation_of(sharded_host("0123abcdef", 1)) == "0123abcdef"
    assert generation_of("reactgate-conv-0123abcdef-c-1-2") == "0123abcdef"
    assert generation_of("reactgate-directory") is None


# -- on a real cluster ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    with local_ray() as ray:
        yield ray


async def _started(config: RayConfig) -> RayBackend:
    backend = RayBackend(config, default_agent="agent")
    await backend.start()
    return backend


async def _until(check: Callable[[], Awaitable[bool]], timeout: float = TIMEOUT) -> None:
    async def loop() -> None:
        while not await check():
            await asyncio.sleep(0.05)
    await asyncio.wait_for(loop(), timeout)


def _actor_exists(name: str) -> bool:
    try:
        ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return False
    return True


async def _gone(name: str) -> bool:
    return not _actor_exists(name)


def answers(watch: Watch) -> list[str]:
    return [done.final_answer for done in watch.completed()]


@pytest.mark.ray
async def test_a_gateway_with_another_store_starts_its_own_generation_and_a_rollback_returns_to_the_first(
    ray_cluster: Any, scripts: dict[str, str], tmp_path: Path,
) -> None:
    config_a = _config(f"sqlite:///{tmp_path / 'a.sqlite3'}", "gen-b", scripts)
    config_b = _config(f"sqlite:///{tmp_path / 'b.sqlite3'}", "gen-b", scripts)
    first = await _started(config_a)
    replaced: list[ConfigurationReplaced] = []
    first.on_replaced = replaced.append
    second = None
    try:
        old = await first.open(OWNER, None, "agent", None)
        watch = Watch(first, old.conversation_id, owner=OWNER)
        assert await first.command(OWNER, old.conversation_id, UserMessage("m1", "weather?")) == "accepted"
        await watch.until_event("turn.completed")
        await watch.stop()

        second = await _started(config_b)   # the same cluster, another store: a new generation
        new = await second.open(OWNER, None, "agent", None)
        watch = Watch(second, new.conversation_id, owner=OWNER)
        assert await second.command(OWNER, new.conversation_id, UserMessage("m1", "weather?")) == "accepted"
        await watch.until_event("turn.completed")
        await watch.stop()
        assert answers(watch) == [ANSWER_B] and contiguous(watch.events)
        assert await second.store.last_seq(new.conversation_id) == watch.events[-1].seq

        # The first generation's host drained (it held an idle conversation) and exited, and its tool pool went.
        await _until(lambda: _gone(sharded_host(config_a.generation, 0)))
        await _until(lambda: _gone(tool_pool(config_a.generation)))
        assert _actor_exists(sharded_host(config_b.generation, 0))

        # The replaced gateway stops serving: a clear refusal, never a frame failing as `internal`.
        with pytest.raises(ConfigurationReplaced):
            await first.command(OWNER, old.conversation_id, UserMessage("m2", "again?"))
        assert [r.current for r in replaced] == [config_b.generation]

        # A rollback: a gateway bringing the first configuration back makes it current again.
        replaced_second: list[ConfigurationReplaced] = []
        second.on_replaced = replaced_second.append
        rollback = await _started(config_a)
        try:
            again = await rollback.open(OWNER, old.conversation_id, None, None)
            watch = Watch(rollback, again.conversation_id, again.last_seq, owner=OWNER)
            assert await rollback.command(OWNER, old.conversation_id, UserMessage("m3", "and now?")) == "accepted"
            await watch.until_event("turn.completed")
            await watch.stop()
            assert answers(watch) == [ANSWER_B] and contiguous(watch.events, again.last_seq + 1)
            with pytest.raises(ConfigurationReplaced, match=r"differs in: store") as refused:
                await second.command(OWNER, new.conversation_id, UserMessage("m2", "again?"))
            assert config_a.generation in str(refused.value) and "sqlite" not in str(refused.value)
            assert [r.current for r in replaced_second] == [config_a.generation]
            await _until(lambda: _gone(sharded_host(config_b.generation, 0)))
        finally:
            await rollback.stop()
    finally:
        await first.stop()
        if second is not None:
            await second.stop()


@pytest.mark.ray
async def test_a_changed_profile_reaches_existing_conversations_and_the_turn_in_flight_finishes_where_it_runs(
    ray_cluster: Any, scripts: dict[str, str], tmp_path: Path,
) -> None:
    store_url = f"sqlite:///{tmp_path / 'shared.sqlite3'}"
    config_v1 = _config(store_url, "gen-a", scripts)
    config_v2 = _config(store_url, "gen-b", scripts)
    v1 = await _started(config_v1)
    v2 = None
    try:
        cid = (await v1.open(OWNER, None, "agent", None)).conversation_id
        early = Watch(v1, cid, owner=OWNER)
        assert await v1.command(OWNER, cid, UserMessage("m1", "weather?")) == "accepted"
        await early.until_event("answer.delta")   # the old profile's answer is streaming (40 ms a chunk)
        old_host = await v1.holder(cid)
        assert generation_of(old_host) == config_v1.generation

        v2 = await _started(config_v2)           # the profile changed, the store did not
        late = Watch(v2, cid, owner=OWNER)                     # a client of the new gateway, mid-turn
        await late.until_event("turn.completed")
        assert answers(late) == [ANSWER_A]       # finished where it ran, under the profile it started with
        assert contiguous(late.events)
        streamed = "".join(e.data.text for e in late.events if e.event == "answer.delta")
        assert streamed == ANSWER_A               # every character once

        # The old host passivates the conversation once its turn is over, and exits.
        await _until(lambda: _gone(old_host))
        assert await v2.command(OWNER, cid, UserMessage("m2", "and now?")) == "accepted"
        await late.until_event("turn.completed", 2)
        assert answers(late) == [ANSWER_A, ANSWER_B]   # the next turn runs under the new profile
        assert contiguous(late.events)
        holder = await v2.holder(cid)
        assert generation_of(holder) == config_v2.generation
        stored = await v2.store.read_events(cid, 0, 10_000)
        assert [(e.seq, e.event) for e in stored] == [(e.seq, e.event) for e in late.events]
        await early.stop()
        await late.stop()
    finally:
        await v1.stop()
        if v2 is not None:
            await v2.stop()
