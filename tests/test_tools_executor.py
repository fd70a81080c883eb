"""LocalToolExecutor: every call gets exactly one observation (docs/design.md#observations, #exploration-budget, #tool-pool)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from actors.catalog import ASK_USER_TOOL, Observation, ToolCall, Trait
from actors.tools.demo import demo_registry, demo_tools, fixed_clock
from actors.tools.executor import LocalToolExecutor
from actors.tools.registry import Params, Tool, ToolContext, ToolRegistry

CAP = 7
TIMEOUT_S = 5.0


class Probe:
    """An instrumented tool body: counts concurrent entries and holds them until released."""

    def __init__(self, target: int) -> None:
        self.active = 0
        self.peak = 0
        self.target = target
        self.reached = asyncio.Event()
        self.release = asyncio.Event()

    async def handler(self, params: Params, ctx: ToolContext) -> dict[str, Any]:
        self.active += 1
        self.peak = max(self.peak, self.active)
        if self.active >= self.target:
            self.reached.set()
        try:
            await self.release.wait()
        finally:
            self.active -= 1
        return {"ok": True}


def registry_with(*extra: Tool[Any]) -> ToolRegistry:
    return ToolRegistry([*demo_tools(), *extra])


def executor(registry: ToolRegistry | None = None, **kwargs: Any) -> LocalToolExecutor:
    return LocalToolExecutor(registry or demo_registry(), clock=fixed_clock(), **kwargs)


def call(tool_id: str, params: dict[str, Any] | None = None, *, n: int = 0, code: str | None = None) -> ToolCall:
    return ToolCall(f"call-{n}", tool_id, params or {}, code)


async def run(ex: LocalToolExecutor, *calls: ToolCall, conv: str = "conv", **kwargs: Any) -> list[Observation]:
    kwargs.setdefault("exploration_cap", CAP)
    kwargs.setdefault("timeout_s", TIMEOUT_S)
    return await ex.execute_batch(conv, "turn", list(calls), **kwargs)


def search(n: int = 0) -> ToolCall:
    return call("demo.search", {"query": "paris weather"}, n=n)


# --- one observation per call --------------------------------------------------------------


async def test_every_call_gets_one_observation_in_call_order() -> None:
    calls = [
        call("demo.clock", n=0),
        call("demo.nope", n=1),
        call("demo.fail", {"message": "x"}, n=2),
        call("demo.render", {"source": "r"}, n=3),
    ]
    observations = await run(executor(), *calls)
    assert [o.call_id for o in observations] == [c.call_id for c in calls]
    assert [o.ok for o in observations] == [True, False, False, False]


async def test_success_observation_carries_result() -> None:
    [obs] = await run(executor(), call("demo.weather", {"city": "Paris"}))
    assert obs.ok and obs.payload() == {"city": "Paris", "condition": "rain", "temp_c": 12}


async def test_injected_clock_reaches_the_tool() -> None:
    [obs] = await run(executor(), call("demo.clock"))
    assert obs.payload() == {"now": "2026-01-01T00:00:00Z"}


async def test_unknown_tool_becomes_unknown_tool_observation() -> None:
    [obs] = await run(executor(), call("demo.nope"))
    assert obs.error == "unknown_tool"


async def test_tool_outside_the_given_catalog_is_unknown() -> None:
    ex = executor()
    catalog = demo_registry().catalog().restricted_to(["demo.clock"])
    [obs] = await run(ex, call("demo.render", {"source": "a", "format": "pdf"}), catalog=catalog)
    assert obs.error == "unknown_tool"


async def test_invalid_params_observation_names_field_without_echoing_value() -> None:
    secret = "docx-SECRET-VALUE"
    [obs] = await run(executor(), call("demo.render", {"source": "a", "format": secret}))
    assert obs.error == "invalid_params"
    assert obs.detail["violations"][0].startswith("format:")
    assert secret not in json.dumps(obs.payload())


async def test_timeout_becomes_timeout_observation() -> None:
    [obs] = await run(executor(), call("demo.sleep", {"seconds": 60}), timeout_s=0.01)
    assert obs.payload() == {"error": "timeout", "timeout_s": 0.01}


async def test_exception_becomes_tool_error_observation() -> None:
    [obs] = await run(executor(), call("demo.fail", {"message": "boom"}))
    assert obs.payload() == {"error": "tool_error", "message": "boom", "exception": "RuntimeError"}


async def test_tool_error_message_is_truncated() -> None:
    [obs] = await run(executor(), call("demo.fail", {"message": "x" * 1000}))
    assert len(obs.detail["message"]) == 500


async def test_handlers_own_timeout_error_is_a_tool_error_not_a_timeout() -> None:
    async def raises_timeout(params: Params, ctx: ToolContext) -> dict[str, Any]:
        raise TimeoutError("upstream timed out")

    ex = executor(registry_with(Tool("t.own_timeout", Params, raises_timeout, Trait.NEUTRAL)))
    [obs] = await run(ex, call("t.own_timeout"))
    assert obs.error == "tool_error" and obs.detail["exception"] == "TimeoutError"


async def test_non_dict_result_becomes_tool_error() -> None:
    async def returns_list(params: Params, ctx: ToolContext) -> Any:
        return [1, 2]

    ex = executor(registry_with(Tool("t.list", Params, returns_list, Trait.NEUTRAL)))
    [obs] = await run(ex, call("t.list"))
    assert obs.error == "tool_error" and obs.detail["exception"] == "TypeError"


async def test_ask_user_reaching_the_executor_is_an_error_observation() -> None:
    [obs] = await run(executor(), call(ASK_USER_TOOL, {"question": "Go on?"}))
    assert obs.error == "tool_error"


async def test_duration_is_measured() -> None:
    [obs] = await run(executor(), call("demo.sleep", {"seconds": 0.02}))
    assert obs.ok and obs.duration_ms >= 20


# --- ui commands ---------------------------------------------------------------------------


async def test_ui_commands_move_from_result_to_observation() -> None:
    [obs] = await run(executor(), call("demo.open_tab", {"name": "docs"}))
    assert obs.ui_commands == ({"command": "open_tab", "args": {"name": "docs"}},)
    assert "ui_commands" not in obs.payload()


async def test_malformed_ui_commands_become_tool_error() -> None:
    async def bad_ui(params: Params, ctx: ToolContext) -> dict[str, Any]:
        return {"ui_commands": ["open_tab"]}

    ex = executor(registry_with(Tool("t.bad_ui", Params, bad_ui, Trait.NEUTRAL)))
    [obs] = await run(ex, call("t.bad_ui"))
    assert obs.error == "tool_error"


# --- exploration budget (docs/design.md#exploration-budget) --------------------------------------------------------


async def test_exploration_over_cap_is_not_executed_and_not_counted() -> None:
    ex = executor()
    for n in range(CAP):
        [obs] = await run(ex, search(n))
        assert obs.ok
    [eighth] = await run(ex, search(CAP))
    assert eighth.payload() == {"error": "EXPLORATION_BUDGET_REACHED", "cap": CAP}
    assert ex.exploration_count("conv") == CAP


async def test_exploration_cap_applies_within_one_batch() -> None:
    ex = executor()
    observations = await run(ex, search(0), search(1), search(2), exploration_cap=2)
    assert [o.error for o in observations] == [None, None, "EXPLORATION_BUDGET_REACHED"]


async def test_non_exploration_calls_do_not_count() -> None:
    ex = executor()
    await run(ex, call("demo.clock"), call("demo.render", {"source": "a", "format": "pdf"}))
    assert ex.exploration_count("conv") == 0


async def test_refused_exploration_call_does_not_count() -> None:
    ex = executor()
    await run(ex, call("demo.search", {"q": "typo"}))
    assert ex.exploration_count("conv") == 0


async def test_exploration_counters_are_per_conversation() -> None:
    ex = executor()
    await run(ex, search(), conv="a")
    assert (ex.exploration_count("a"), ex.exploration_count("b")) == (1, 0)


async def test_reset_exploration_lets_exploration_run_again() -> None:
    ex = executor()
    await run(ex, search(0), exploration_cap=1)
    await ex.reset_exploration("conv")
    assert ex.exploration_count("conv") == 0
    [obs] = await run(ex, search(1), exploration_cap=1)
    assert obs.ok


async def test_profile_trait_override_decides_what_counts() -> None:
    ex = executor()
    catalog = demo_registry().catalog().with_overrides(traits={"demo.clock": Trait.EXPLORATION})
    await run(ex, call("demo.clock"), catalog=catalog)
    assert ex.exploration_count("conv") == 1


# --- batch trait re-check (docs/design.md#gates, defense in depth) ------------------------------------


async def test_exploitation_after_exploration_in_one_batch_is_refused_and_not_run() -> None:
    ex = executor()
    observations = await run(ex, search(0), call("demo.write_note", {"text": "n"}, n=1))
    assert observations[0].ok
    assert observations[1].error == "incompatible_batch"
    assert ex.export_conversation("conv")["workspace"] == {}


async def test_exploration_after_exploitation_in_one_batch_runs() -> None:
    observations = await run(executor(), call("demo.render", {"source": "a", "format": "pdf"}), search(1))
    assert all(o.ok for o in observations)


async def test_unknown_trait_refuses_any_other_call_after_it() -> None:
    catalog = demo_registry().catalog().with_overrides(traits={"demo.clock": Trait.UNKNOWN})
    observations = await run(executor(), call("demo.clock", n=0), call("demo.open_tab", {"name": "a"}, n=1),
                             catalog=catalog)
    assert [o.error for o in observations] == [None, "incompatible_batch"]


async def test_unknown_trait_after_another_call_is_refused() -> None:
    catalog = demo_registry().catalog().with_overrides(traits={"demo.clock": Trait.UNKNOWN})
    observations = await run(executor(), call("demo.open_tab", {"name": "a"}, n=0), call("demo.clock", n=1),
                             catalog=catalog)
    assert [o.error for o in observations] == [None, "incompatible_batch"]


async def test_unknown_trait_alone_runs() -> None:
    catalog = demo_registry().catalog().with_overrides(traits={"demo.clock": Trait.UNKNOWN})
    [obs] = await run(executor(), call("demo.clock"), catalog=catalog)
    assert obs.ok


async def test_incompatible_exploration_call_does_not_count() -> None:
    catalog = demo_registry().catalog().with_overrides(traits={"demo.clock": Trait.UNKNOWN})
    ex = executor()
    await run(ex, call("demo.clock", n=0), search(1), catalog=catalog)
    assert ex.exploration_count("conv") == 0


# --- concurrency caps ----------------------------------------------------------------------


def probe_registry(probe: Probe) -> ToolRegistry:
    return registry_with(Tool("t.probe", Params, probe.handler, Trait.NEUTRAL))


async def test_per_conversation_concurrency_is_capped() -> None:
    # Without the cap all six calls would enter in the loop pass that lets the probe reach 2.
    probe = Probe(target=2)
    ex = executor(probe_registry(probe), max_concurrency_per_conversation=2)
    batch = asyncio.create_task(run(ex, *[call("t.probe", n=n) for n in range(6)]))
    await probe.reached.wait()
    probe.release.set()
    observations = await batch
    assert probe.peak == 2 and all(o.ok for o in observations)


async def test_global_concurrency_is_capped_across_conversations() -> None:
    probe = Probe(target=3)
    ex = executor(probe_registry(probe), max_concurrency_per_conversation=4, max_concurrency_global=3)
    batches = [
        asyncio.create_task(run(ex, *[call("t.probe", n=n) for n in range(4)], conv=conv))
        for conv in ("a", "b")
    ]
    await probe.reached.wait()
    probe.release.set()
    results = await asyncio.gather(*batches)
    assert probe.peak == 3 and all(o.ok for obs in results for o in obs)


async def test_conversations_do_not_share_a_per_conversation_cap() -> None:
    probe = Probe(target=4)
    ex = executor(probe_registry(probe), max_concurrency_per_conversation=2)
    batches = [
        asyncio.create_task(run(ex, *[call("t.probe", n=n) for n in range(2)], conv=conv))
        for conv in ("a", "b")
    ]
    await probe.reached.wait()
    probe.release.set()
    await asyncio.gather(*batches)
    assert probe.peak == 4


# --- cancellation (steer, docs/design.md#steer) -------------------------------------------------------


async def test_cancellation_propagates_out_of_execute_batch() -> None:
    probe = Probe(target=1)
    ex = executor(probe_registry(probe))
    batch = asyncio.create_task(run(ex, call("t.probe")))
    await probe.reached.wait()
    batch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await batch
    assert probe.active == 0


async def test_cancelled_batch_frees_its_concurrency_slots() -> None:
    probe = Probe(target=1)
    ex = executor(probe_registry(probe), max_concurrency_per_conversation=1, max_concurrency_global=1)
    batch = asyncio.create_task(run(ex, call("t.probe")))
    await probe.reached.wait()
    batch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await batch
    [obs] = await run(ex, call("demo.clock"))
    assert obs.ok


# --- workspaces and state ------------------------------------------------------------------


async def test_workspace_is_per_conversation() -> None:
    ex = executor()
    await run(ex, call("demo.write_note", {"text": "a1"}), conv="a")
    [obs] = await run(ex, call("demo.write_note", {"text": "b1"}), conv="b")
    assert obs.payload() == {"stored": True, "count": 1}


async def test_state_round_trips_through_json() -> None:
    ex = executor()
    await run(ex, search(), conv="a")
    await run(ex, call("demo.write_note", {"text": "kept"}), conv="a")
    state = json.loads(json.dumps(ex.export_conversation("a")))

    restored = executor()
    restored.import_conversation("a", state)
    assert restored.exploration_count("a") == 1
    [obs] = await run(restored, call("demo.write_note", {"text": "more"}), conv="a")
    assert obs.payload() == {"stored": True, "count": 2}


async def test_exported_state_is_a_copy() -> None:
    ex = executor()
    await run(ex, call("demo.write_note", {"text": "x"}))
    ex.export_conversation("conv")["workspace"]["notes"].append("tampered")
    assert ex.export_conversation("conv")["workspace"] == {"notes": ["x"]}
