"""The soak (bench/soak.py) and the leak it found first: the tool pool's per-conversation maps.

The unit tests show the pool holds the conversations in use, not every conversation it ever served
(docs/design.md#tool-pool, #passivation): a conversation passivated or deleted is forgotten (its host
says so), one no batch named for a while is swept, and a forgotten conversation's next batch picks its
durable counter and workspace up again. The slow test runs the soak itself in its short mode.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from actors.catalog import ToolCall, Trait
from actors.store import Store, open_store
from actors.tools.demo import demo_registry
from actors.tools.durable import DurableTools
from actors.tools.executor import LocalToolExecutor
from actors.tools.pool import ToolPool
from actors.tools.registry import Params, Tool, ToolContext, ToolRegistry

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 10.0


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await open_store(f"sqlite:///{tmp_path}/soak.sqlite3")
    yield opened
    await opened.close()


def search(call_id: str) -> ToolCall:
    return ToolCall(call_id, "demo.search", {"query": "paris"})


def note(call_id: str, text: str) -> ToolCall:
    return ToolCall(call_id, "demo.write_note", {"text": text})


def empty(held: dict[str, int]) -> bool:
    return all(size == 0 for size in held.values())


# -- the tool pool's maps stay bounded ---------------------------------------------------------------


async def test_the_pools_maps_hold_only_the_conversations_in_use(store: Store) -> None:
    """Many conversations come (a batch with an exploration call and a note), go (passivated or
    deleted: their host tells the pool to forget them), and the pool is left holding nothing."""
    pool = ToolPool(store, demo_registry())
    peak = 0
    for i in range(300):
        cid = f"c_{i}"
        found = await pool.execute_batch(cid, "t1", [search(f"t1.1.{i}")], exploration_cap=5, timeout_s=5)
        noted = await pool.execute_batch(cid, "t1", [note(f"t1.2.{i}", "n")], exploration_cap=5, timeout_s=5)
        assert found[0].ok and noted[0].ok
        peak = max(peak, max(pool.held().values()))
        pool.forget(cid)
    assert peak == 1                 # one conversation in use at a time
    assert empty(pool.held()), pool.held()
    assert pool.stats()["executed"] == {}


async def test_a_forgotten_conversation_resumes_its_durable_counter_and_workspace(store: Store) -> None:
    pool = ToolPool(store, demo_registry())
    await pool.execute_batch("c_a", "t1", [search("t1.1.0")], exploration_cap=2, timeout_s=5)
    await pool.execute_batch("c_a", "t1", [note("t1.2.0", "first")], exploration_cap=2, timeout_s=5)
    pool.forget("c_a")                               # passivated
    assert empty(pool.held())
    # Re-activated (on any host): its next batch loads the counter and the workspace from the store.
    second, refused = await pool.execute_batch("c_a", "t2", [search("t2.1.0"), search("t2.1.1")],
                                               exploration_cap=2, timeout_s=5)
    assert second.ok and refused.error == "EXPLORATION_BUDGET_REACHED"   # 1 before + 1 now = the cap
    state = await pool.workspace("c_a")
    assert state == {"exploration": 2, "workspace": {"notes": ["first"]}}
    # The snapshot versions went on from the stored one: a new pool (a restarted actor) sees the latest.
    pool.forget("c_a")
    await pool.reset_exploration("c_a")
    pool.forget("c_a")
    assert (await ToolPool(store, demo_registry()).workspace("c_a"))["exploration"] == 0


@dataclass
class GatedTool:
    runs: int = 0
    started: asyncio.Event = field(default_factory=asyncio.Event)
    gate: asyncio.Event = field(default_factory=asyncio.Event)

    async def handler(self, params: Params, ctx: ToolContext) -> dict[str, Any]:
        self.runs += 1
        ctx.workspace["runs"] = self.runs
        self.started.set()
        await self.gate.wait()
        return {"run": self.runs}

    def registry(self) -> ToolRegistry:
        return ToolRegistry([Tool("test.gated", Params, self.handler, Trait.NEUTRAL)])


async def test_a_forget_during_a_batch_waits_for_it_to_end(store: Store) -> None:
    """A delete on the host while the pool still runs the conversation's batch: the batch keeps what
    it loaded, saves its result durably, and only then is the conversation dropped."""
    tool = GatedTool()
    pool = ToolPool(store, tool.registry())
    running = asyncio.create_task(pool.execute_batch("c_a", "t1", [ToolCall("t1.1.0", "test.gated", {})],
                                                     exploration_cap=5, timeout_s=5))
    await asyncio.wait_for(tool.started.wait(), TIMEOUT)
    pool.forget("c_a")
    assert pool.held()["busy"] == 1 and pool.held()["workspaces"] == 1   # still in use
    tool.gate.set()
    [done] = await asyncio.wait_for(running, TIMEOUT)
    assert done.ok
    assert empty(pool.held()), pool.held()
    assert (await ToolPool(store, tool.registry()).workspace("c_a"))["workspace"] == {"runs": 1}


async def test_conversations_no_batch_named_for_idle_forget_s_are_swept(store: Store) -> None:
    """A host that died while its conversations were idle never passivates them: the pool drops them
    itself once no batch named them for `idle_forget_s`."""
    now = [1_000.0]
    pool = ToolPool(store, demo_registry(), idle_forget_s=60.0, monotonic=lambda: now[0])
    for i in range(50):
        await pool.execute_batch(f"c_{i}", "t1", [search(f"t1.1.{i}")], exploration_cap=5, timeout_s=5)
    assert pool.held()["exploration counters"] == 50
    now[0] += 61.0
    await pool.execute_batch("c_new", "t1", [search("t1.1.x")], exploration_cap=5, timeout_s=5)
    assert pool.held()["exploration counters"] == 1 and pool.held()["versions"] == 1
    assert (await pool.workspace("c_7"))["exploration"] == 1   # swept, not lost: loaded again


async def test_the_local_backends_durable_tools_forget_their_execution_counts(store: Store) -> None:
    """The local backend's executor (in-process, state in the conversation's snapshot) is forgotten by
    the host core on passivation and deletion; the count of calls run went with it only now."""
    tools = DurableTools(LocalToolExecutor(demo_registry()), store)
    for i in range(100):
        await tools.execute_batch(f"c_{i}", "t1", [note(f"t1.1.{i}", "n")], exploration_cap=5, timeout_s=5)
        tools.forget(f"c_{i}")
    assert tools.executed == {}


class _Method:
    def __init__(self, error: Exception | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.error = error

    def remote(self, *args: Any) -> Any:
        self.calls.append(args)

        async def answer() -> None:
            if self.error is not None:
                raise self.error

        return answer()


class _Pool:
    def __init__(self, error: Exception | None = None) -> None:
        self.forget = _Method(error)


async def test_the_ray_client_tells_the_pool_and_never_fails_the_host() -> None:
    from ray.exceptions import RayActorError

    from actors.ray.tool_pool import ToolPoolClient

    for error in (None, RayActorError()):
        pool = _Pool(error)
        client = ToolPoolClient(pool)
        client.forget("c_a")
        assert pool.forget.calls == [("c_a",)]   # sent at once, in order with the host's later batches
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert not client._forgetting


# -- a host's outboxes forget a deleted conversation's watch ------------------------------------------


class _Listeners:
    """`HostCore.listen` as the outboxes see it: listeners per conversation, and a deleted one's end."""

    def __init__(self) -> None:
        self.by_conversation: dict[str, list[Any]] = {}
        self.deleted: dict[str, Any] = {}

    def listen(self, conversation_id: str, listener: Any) -> Any:
        if conversation_id in self.deleted:
            listener([self.deleted[conversation_id]])
            return lambda: None
        listeners = self.by_conversation.setdefault(conversation_id, [])
        listeners.append(listener)

        def unsubscribe() -> None:
            if listener in listeners:
                listeners.remove(listener)
            if not listeners:
                self.by_conversation.pop(conversation_id, None)

        return unsubscribe

    def delete(self, conversation_id: str) -> None:
        from protocol.events import ConversationDeleted, Event

        final = Event.of(conversation_id, 3, ConversationDeleted(last_seq=2), 0.0)
        self.deleted[conversation_id] = final
        for listener in list(self.by_conversation.pop(conversation_id, ())):
            listener([final])


async def test_the_outboxes_drop_a_deleted_conversations_watch() -> None:
    """The gateway that deleted a conversation may never unwatch it (it forgets its route first): the
    host's outbox ends the watch itself with the conversation's last event, and delivers that event."""
    from actors.ray.outbox import Outboxes

    host, outboxes = _Listeners(), Outboxes()
    for i in range(200):
        outboxes.watch("gw", f"c_{i}", host.listen)
        host.delete(f"c_{i}")
    outboxes.watch("gw", "c_0", host.listen)          # a late watch of one deleted before
    assert outboxes._boxes["gw"].watches == {}
    assert host.by_conversation == {}
    batch = await outboxes.poll("gw", 0.1)
    assert len(batch) == 201 and {getattr(e, "event", None) for e in batch} == {"conversation.deleted"}


# -- the soak itself, short --------------------------------------------------------------------------


@pytest.mark.slow
def test_the_soak_runs_short_and_passes(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACTGATE_")}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak.py"), "--quick", "--keep", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=170, stdin=subprocess.DEVNULL,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert "slope / 1,000 served" in done.stdout, out[-6000:]
    assert "verdict: PASS" in done.stdout, out[-6000:]
    assert "lost 0, duplicated 0, out of order 0" in done.stdout, out[-6000:]
