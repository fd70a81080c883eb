"""A tool call whose result is durable is never executed again (docs/design.md#recovery)."""

from __future__ import annotations

from pathlib import Path

from actors.catalog import ToolCall
from actors.store import open_store
from actors.tools.demo import demo_registry
from actors.tools.durable import DurableTools
from actors.tools.executor import LocalToolExecutor


async def test_a_resubmitted_call_is_answered_from_the_store_not_run_again(tmp_path: Path) -> None:
    store = await open_store(f"sqlite:///{tmp_path}/d.sqlite3")
    executor = LocalToolExecutor(demo_registry())
    tools = DurableTools(executor, store)
    calls = [ToolCall("t1.1.0", "demo.write_note", {"text": "once"}), ToolCall("t1.1.1", "demo.clock", {})]
    try:
        first = await tools.execute_batch("c", "t1", calls, exploration_cap=7, timeout_s=5)
        # A fresh process after a crash: new executor, same store, the same call ids re-submitted.
        again = await DurableTools(LocalToolExecutor(demo_registry()), store).execute_batch(
            "c", "t1", calls, exploration_cap=7, timeout_s=5
        )
    finally:
        await store.close()
    assert [o.payload() for o in again] == [o.payload() for o in first]
    assert tools.executed == {"c": 2}
    assert executor.export_conversation("c")["workspace"]["notes"] == ["once"]


async def test_only_the_calls_without_a_durable_result_run(tmp_path: Path) -> None:
    store = await open_store(f"sqlite:///{tmp_path}/d.sqlite3")
    tools = DurableTools(LocalToolExecutor(demo_registry()), store)
    done = ToolCall("t1.1.0", "demo.write_note", {"text": "a"})
    try:
        await tools.execute_batch("c", "t1", [done], exploration_cap=7, timeout_s=5)
        await tools.execute_batch(
            "c", "t1", [done, ToolCall("t1.1.1", "demo.write_note", {"text": "b"})], exploration_cap=7, timeout_s=5
        )
    finally:
        await store.close()
    assert tools.executed == {"c": 2}
