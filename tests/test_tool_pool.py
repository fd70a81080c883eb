"""The tool pool's logic without Ray (docs/design.md#tool-pool): durable exploration counters and
workspace, re-submitted batches joining the calls in flight, durable results never run again.

A "new pool on the same store" is what a ToolPool actor restarted by Ray is; a batch submitted
twice while its first run is still going is what a host that crashed mid-batch and was replaced
does. The Ray client's own promise (a dead pool still yields one observation per call) is checked
with a stand-in actor handle.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from actors.catalog import Observation, ToolCall, Trait
from actors.store import Store, open_store
from actors.tools.demo import demo_registry
from actors.tools.durable import encode_result
from actors.tools.pool import ToolPool
from actors.tools.registry import Params, Tool, ToolContext, ToolRegistry

CID = "c_pool"
TIMEOUT = 10.0


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await open_store(f"sqlite:///{tmp_path}/pool.sqlite3")
    yield opened
    await opened.close()


class NoParams(Params):
    pass


@dataclass
class GatedTool:
    """A tool that counts its runs and finishes only when the test opens the gate."""

    runs: int = 0
    started: asyncio.Event = field(default_factory=asyncio.Event)
    gate: asyncio.Event = field(default_factory=asyncio.Event)

    async def handler(self, params: NoParams, ctx: ToolContext) -> dict[str, Any]:
        self.runs += 1
        self.started.set()
        await self.gate.wait()
        return {"run": self.runs}

    def registry(self) -> ToolRegistry:
        return ToolRegistry([Tool("test.gated", NoParams, self.handler, Trait.NEUTRAL)])


async def until(condition: Callable[[], bool]) -> None:
    async def wait() -> None:
        while not condition():
            await asyncio.sleep(0.005)
    await asyncio.wait_for(wait(), TIMEOUT)


def search(call_id: str) -> ToolCall:
    return ToolCall(call_id, "demo.search", {"query": "paris"})


async def gated_batch(pool: ToolPool, tool: GatedTool, calls: list[ToolCall], turn_id: str = "t1") -> asyncio.Task[list[Observation]]:
    """A batch running on `pool` whose gated tool has started: it waits for the gate."""
    batch = asyncio.create_task(pool.execute_batch(CID, turn_id, calls, exploration_cap=5, timeout_s=60))
    await asyncio.wait_for(tool.started.wait(), TIMEOUT)
    return batch


# -- durable counters -----------------------------------------------------------------------------


async def test_exploration_counter_and_workspace_survive_a_new_pool_on_the_same_store(store: Store) -> None:
    first = ToolPool(store, demo_registry())
    [found] = await first.execute_batch(CID, "t1", [search("t1.1.0")], exploration_cap=2, timeout_s=5)
    await first.execute_batch(CID, "t1", [ToolCall("t1.2.0", "demo.write_note", {"text": "kept"})],
                              exploration_cap=2, timeout_s=5)
    assert found.ok

    restarted = ToolPool(store, demo_registry())
    state = await restarted.workspace(CID)
    assert state["exploration"] == 1
    assert state["workspace"]["notes"] == ["kept"]
    second, refused = await restarted.execute_batch(
        CID, "t2", [search("t2.1.0"), search("t2.1.1")], exploration_cap=2, timeout_s=5)
    assert second.ok                                        # the second of two allowed
    assert refused.error == "EXPLORATION_BUDGET_REACHED"    # the cap counts the first pool's call


async def test_a_reset_counter_is_durable_too(store: Store) -> None:
    pool = ToolPool(store, demo_registry())
    await pool.execute_batch(CID, "t1", [search("t1.1.0")], exploration_cap=5, timeout_s=5)
    await pool.reset_exploration(CID)
    assert (await ToolPool(store, demo_registry()).workspace(CID))["exploration"] == 0


async def test_counters_are_per_conversation(store: Store) -> None:
    pool = ToolPool(store, demo_registry())
    await pool.execute_batch("c_a", "t1", [search("t1.1.0")], exploration_cap=5, timeout_s=5)
    restarted = ToolPool(store, demo_registry())
    assert (await restarted.workspace("c_a"))["exploration"] == 1
    assert (await restarted.workspace("c_b"))["exploration"] == 0


# -- joining calls in flight ----------------------------------------------------------------------


async def test_a_resubmitted_batch_joins_the_calls_in_flight_and_each_runs_once(store: Store) -> None:
    tool = GatedTool()
    pool = ToolPool(store, tool.registry())
    calls = [ToolCall("t1.1.0", "test.gated", {})]
    first = await gated_batch(pool, tool, calls)
    # The host crashed; its replacement re-submits the same batch while the first run is still going.
    again = asyncio.create_task(pool.execute_batch(CID, "t1", calls, exploration_cap=5, timeout_s=5))
    await until(lambda: pool.stats()["joined"] == 1)
    assert pool.stats()["inflight"] == 1
    tool.gate.set()
    a, b = await asyncio.wait_for(asyncio.gather(first, again), TIMEOUT)
    assert tool.runs == 1
    assert a == b == [Observation("t1.1.0", "test.gated", ok=True, result={"run": 1}, duration_ms=a[0].duration_ms)]
    assert pool.stats() == {"executed": {CID: 1}, "joined": 1, "inflight": 0, "cut": 0}


async def test_a_partly_overlapping_batch_runs_only_its_new_calls(store: Store) -> None:
    tool = GatedTool()
    pool = ToolPool(store, tool.registry())
    running = ToolCall("t1.1.0", "test.gated", {})
    first = await gated_batch(pool, tool, [running])
    again = asyncio.create_task(pool.execute_batch(
        CID, "t1", [running, ToolCall("t1.1.1", "test.gated", {})], exploration_cap=5, timeout_s=5))
    await until(lambda: pool.stats()["joined"] == 1 and tool.runs == 2)
    tool.gate.set()
    [only], [joined, new] = await asyncio.wait_for(asyncio.gather(first, again), TIMEOUT)
    assert tool.runs == 2
    assert joined == only and new.call_id == "t1.1.1"
    assert pool.stats()["executed"] == {CID: 2}


# -- external calls a host crash cut (docs/design.md#mcp-face) ------------------------------------


async def test_cutting_a_call_cancels_the_batch_its_dead_host_left_running(store: Store) -> None:
    tool = GatedTool()
    pool = ToolPool(store, tool.registry())
    orphan = await gated_batch(pool, tool, [ToolCall("mcp.1", "test.gated", {})], "mcp-s")
    await pool.cut(CID, ["mcp.1"])
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(orphan, TIMEOUT)
    assert (pool.stats()["cut"], pool.stats()["inflight"], tool.runs) == (1, 0, 1)
    assert await store.tool_result(CID, "mcp.1") is None   # a cut run records nothing: the activation did


async def test_only_a_batch_whose_every_call_is_cut_is_cancelled(store: Store) -> None:
    tool = GatedTool()
    pool = ToolPool(store, tool.registry())
    both = [ToolCall("t1.1.0", "test.gated", {}), ToolCall("t1.1.1", "test.gated", {})]
    batch = asyncio.create_task(pool.execute_batch(CID, "t1", both, exploration_cap=5, timeout_s=60))
    await until(lambda: tool.runs == 2)
    await pool.cut(CID, ["t1.1.0"])
    await pool.cut("c_other", ["t1.1.1"])                # another conversation's call of that id
    tool.gate.set()
    assert [o.ok for o in await asyncio.wait_for(batch, TIMEOUT)] == [True, True]
    assert pool.stats()["cut"] == 0


async def test_a_retry_of_a_call_whose_result_is_recorded_gets_it_rather_than_join_the_run(store: Store) -> None:
    """The activation recorded `round_interrupted` for the cut call, and the pool missed its `cut` (or
    the retry came first): the retry gets the record at once, not the run's result minutes later."""
    tool = GatedTool()
    pool = ToolPool(store, tool.registry())
    call = ToolCall("mcp.1", "test.gated", {})
    orphan = await gated_batch(pool, tool, [call], "mcp-s")
    interrupted = Observation("mcp.1", "test.gated", ok=False, error="round_interrupted")
    assert await store.record_tool_result(CID, "mcp.1", encode_result(interrupted))
    [again] = await asyncio.wait_for(pool.execute_batch(CID, "mcp-s", [call], exploration_cap=5, timeout_s=60), TIMEOUT)
    assert again == interrupted and pool.stats()["joined"] == 0
    tool.gate.set()
    [late] = await asyncio.wait_for(orphan, TIMEOUT)       # the run ends: its result loses to the record
    assert late == interrupted and tool.runs == 1
    assert pool.stats()["inflight"] == 0


# -- durable results ------------------------------------------------------------------------------


async def test_a_durable_result_is_never_executed_again_even_by_a_new_pool(store: Store) -> None:
    tool = GatedTool()
    tool.gate.set()
    calls = [ToolCall("t1.1.0", "test.gated", {})]
    first = await ToolPool(store, tool.registry()).execute_batch(CID, "t1", calls, exploration_cap=5, timeout_s=5)
    restarted = ToolPool(store, tool.registry())
    again = await restarted.execute_batch(CID, "t1", calls, exploration_cap=5, timeout_s=5)
    assert tool.runs == 1
    assert again == first
    assert restarted.stats()["executed"] == {}   # answered from the store: nothing ran


async def test_stats_count_executions_per_conversation(store: Store) -> None:
    pool = ToolPool(store, demo_registry())
    note = ToolCall("t1.1.0", "demo.write_note", {"text": "n"})
    await pool.execute_batch("c_a", "t1", [note, ToolCall("t1.1.1", "demo.clock", {})],
                             exploration_cap=5, timeout_s=5)
    await pool.execute_batch("c_a", "t1", [note], exploration_cap=5, timeout_s=5)  # durable: not run
    await pool.execute_batch("c_b", "t1", [note], exploration_cap=5, timeout_s=5)
    assert pool.stats() == {"executed": {"c_a": 2, "c_b": 1}, "joined": 0, "inflight": 0, "cut": 0}
    assert (await pool.workspace("c_a"))["workspace"]["notes"] == ["n"]


# -- the Ray client, with a stand-in actor handle -------------------------------------------------


class _DeadMethod:
    def __init__(self, error: Exception) -> None:
        self.error = error

    async def remote(self, *args: Any, **kwargs: Any) -> Any:
        raise self.error


class _DeadPool:
    def __init__(self, error: Exception) -> None:
        self.execute_batch = self.reset_exploration = _DeadMethod(error)


async def test_the_client_turns_a_dead_pool_into_one_error_observation_per_call() -> None:
    from ray.exceptions import RayActorError

    from actors.ray.tool_pool import ToolPoolClient

    client = ToolPoolClient(_DeadPool(RayActorError()))
    calls = [ToolCall("t1.1.0", "demo.clock", {}), ToolCall("t1.1.1", "demo.sleep", {"seconds": 1})]
    observations = await client.execute_batch(CID, "t1", calls, exploration_cap=5, timeout_s=5)
    assert [(o.call_id, o.ok, o.error) for o in observations] == [
        ("t1.1.0", False, "tool_pool_unavailable"), ("t1.1.1", False, "tool_pool_unavailable")]
    await client.reset_exploration(CID)  # a dead pool never fails the turn


async def test_the_client_leaves_the_snapshot_out_of_the_pools_state() -> None:
    from actors.ray.tool_pool import ToolPoolClient

    client = ToolPoolClient(_DeadPool(RuntimeError("never called")))
    assert client.export_conversation(CID) == {}
    client.import_conversation(CID, {"exploration": 3})  # nothing to restore: the pool has its own copy
    client.forget(CID)
    assert client.export_conversation(CID) == {}
