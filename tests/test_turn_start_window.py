"""A host dies between a turn's start and its turn-start checkpoint: the turn is not lost
(docs/design.md#recovery, #host-death).

The window: the message left the queue, `turn.started` was appended, and the turn waits on the tool
pool to reset its exploration counter (on Ray, a call to another actor) before its turn-start
checkpoint. A command's checkpoint taken in that window (its ack waits for one) used to record the
state with the message neither queued nor running — so the host-death hand-over found nothing in
flight, and re-activation found the conversation idle: `turn.started`, then nothing, for good (seen
as stuck turns in `bench/soak.py --backend ray --host-kill-every 30`).

The local backend over a real SQLite store; the first host is left hanging in the window, as a
killed process would be (never closed, so it saves nothing more), and a second host on the same
store takes over.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from actors.conversation import ConversationState, Runtime
from actors.hosting.backend import UserMessage
from actors.hosting.local import LocalBackend
from actors.identity import Owner
from actors.llm.scripts import parse_script, register_script
from actors.llm.stream import stream_model
from actors.profile import parse_profile
from actors.store.sqlite import SqliteStore
from actors.tools.demo import demo_registry
from actors.tools.durable import DurableTools
from actors.tools.executor import LocalToolExecutor
from tests.roundkit import action, call, thinking
from tests.watchkit import Watch, contiguous

OWNER = Owner(tenant="acme", sub="alice")
ANSWER = "It is raining in Paris, twelve degrees."
register_script("start-window", parse_script({"loop": True, "rounds": [
    {"text": thinking("Checking.") + action(call("demo.weather", city="Paris"))},
    {"text": thinking("Answering.") + action({"action": "complete", "final_answer": ANSWER})},
]}))
PROFILE = parse_profile({"name": "window", "model": "scripted/start-window", "states": ["default"],
                         "tools": [{"id": "demo.weather"}]}, known_tools=demo_registry())


class HeldReset(DurableTools):
    """The tool pool, with its exploration reset held until `release` (a slow remote pool)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.reached = asyncio.Event()
        self.release = asyncio.Event()

    async def reset_exploration(self, conversation_id: str) -> None:
        self.reached.set()
        await self.release.wait()
        await super().reset_exploration(conversation_id)


def _backend(store: SqliteStore, tools: DurableTools) -> LocalBackend:
    runtime = Runtime(registry=demo_registry(), tools=tools, stream_model=stream_model)  # type: ignore[arg-type]
    return LocalBackend(store, runtime, {"window": PROFILE}, default_agent="window")  # type: ignore[arg-type]


async def test_a_host_lost_before_the_turn_start_checkpoint_leaves_the_turn_to_be_resumed(tmp_path: Path) -> None:
    registry = demo_registry()
    first_store = SqliteStore(tmp_path / "window.db")
    held = HeldReset(LocalToolExecutor(registry), first_store)
    first = _backend(first_store, held)
    await first.start()
    try:
        cid = (await first.open(OWNER, None, "window", None)).conversation_id
        assert await first.command(OWNER, cid, UserMessage("m1", "weather?")) == "accepted"
        await asyncio.wait_for(held.reached.wait(), 30)
        # A command in the window: its ack waits for a durable checkpoint of the state as it is now.
        assert await first.command(OWNER, cid, UserMessage("m2", "and tomorrow?")) == "accepted"

        # The first host is gone from here on (hung in the window). Another host, same store:
        second_store = SqliteStore(tmp_path / "window.db")
        second = _backend(second_store, DurableTools(LocalToolExecutor(registry), second_store))
        await second.start()
        try:
            snapshot = await second_store.load_snapshot(cid)
            assert snapshot is not None
            state = ConversationState.decode(snapshot[1])
            assert state.current is not None and state.current.message_id == "m1"  # m1's turn, running
            assert [m.message_id for m in state.queue] == ["m2"]
            assert await second.host.in_flight([cid]) == [cid]  # the hand-over sees work in flight
            watch = Watch(second, cid, owner=OWNER)
            await second.open(OWNER, cid, None, None)          # re-activation resumes it
            await watch.until_event("turn.completed", count=2, timeout=30)
            await watch.stop()
            assert contiguous(watch.events)
            started = [e.data.user_message_id for e in watch.events if e.event == "turn.started"]  # type: ignore[union-attr]
            assert started == ["m1", "m2"]                     # each message's turn once, in order
            assert [c.final_answer for c in watch.completed()] == [ANSWER, ANSWER]
        finally:
            await second.stop()
    finally:
        held.release.set()
        await first.stop()
