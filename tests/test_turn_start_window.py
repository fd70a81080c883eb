"""A host dies between a turn's start and its turn-start checkpoint: the turn is not lost
(docs/design.md#recovery, #host-death).

The window: the message left the queue, `turn.started` was appended, and the turn waits on the tool
pool to reset its exploration counter (on Ray, a call to another actor) before its turn-start
checkpoint. A command's checkpoint taken in that window (its ack waits for one) used to record the
state with the message neither queued nor running — so the host-death hand-over found nothing in
flight, and re-activation found the conversation idle: `turn.started`, then nothing, for good (seen
as stuck turns in `bench/soak.py --backend ray --host-kill-every 30`).

And the window before any checkpoint holds the message: its host applied it (the key remembered,
`user.message` and `turn.started` durable) and died. Its resend, the gateway's own retry on the new
host, was acked `duplicate` and no turn ever ran; now recovery queues it again from the log. And
earlier still: the key remembered, the `user.message` never durable — the resend is applied, not
acked `duplicate`.

The local backend over a real SQLite store; the first host is left hanging in the window, as a
killed process would be (never closed, so it saves nothing more), and a second host on the same
store takes over.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from actors.conversation import ConversationState, Runtime
from actors.hosting.backend import UserMessage
from actors.hosting.local import LocalBackend
from actors.identity import Owner
from actors.llm.scripts import parse_script, register_script
from actors.llm.stream import stream_model
from actors.profile import parse_profile
from actors.store.base import RoundOutput
from actors.store.sqlite import SqliteStore
from actors.tools.demo import demo_registry
from actors.tools.durable import DurableTools
from actors.tools.executor import LocalToolExecutor
from protocol.events import Event
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


class DiesAtTurnStart(SqliteStore):
    """The first host's store: the host dies once its `turn.started` is durable, before any checkpoint
    holds the message. Nothing it writes after that finishes — no snapshot, and no event either: a
    host that went on appending its round would be a second writer beside its successor (on a loaded
    machine it did, and the successor's append met `SeqConflict`)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.never = asyncio.Event()
        self.dead = False

    async def append_events(self, conversation_id: str, events: Sequence[Event],
                            outputs: Sequence[RoundOutput] = ()) -> None:
        if self.dead:
            await self.never.wait()
            return
        await super().append_events(conversation_id, events, outputs)
        self.dead = any(e.event == "turn.started" for e in events)

    async def save_snapshot(self, key: str, seq: int, data: bytes) -> None:
        await self.never.wait()


async def test_a_message_only_the_log_holds_is_queued_again_and_its_resend_is_a_duplicate(tmp_path: Path) -> None:
    """The host applied the message (its key remembered, `user.message` and `turn.started` durable) and
    died before a checkpoint held it. Re-activated elsewhere, the message runs once; the client's resend
    — the gateway's own retry on the new host, or the client's — is acked `duplicate`, and nothing is lost."""
    registry = demo_registry()
    first_store = DiesAtTurnStart(tmp_path / "window.db")
    first = _backend(first_store, DurableTools(LocalToolExecutor(registry), first_store))
    await first.start()
    second_store = SqliteStore(tmp_path / "window.db")
    second = _backend(second_store, DurableTools(LocalToolExecutor(registry), second_store))
    try:
        cid = (await first.open(OWNER, None, "window", None)).conversation_id
        sent = asyncio.ensure_future(first.command(OWNER, cid, UserMessage("m1", "weather?")))  # never acked: the host "dies"
        await second.start()
        async with asyncio.timeout(30):
            while not any(e.event == "turn.started" for e in await second_store.read_events(cid, 0)):
                await asyncio.sleep(0.02)
        # The first host is gone from here on; the second activates the conversation from the store.
        assert await second.host.in_flight([cid]) == [cid]  # the hand-over resumes it, watched or not
        watch = Watch(second, cid, owner=OWNER)
        await second.open(OWNER, cid, None, None)
        await watch.until_event("turn.completed", timeout=30)
        assert first_store.dead                              # the first host wrote nothing after turn.started
        assert await second.command(OWNER, cid, UserMessage("m1", "weather?")) == "duplicate"
        await watch.stop()
        log = await second_store.read_events(cid, 0)
        assert contiguous(log)
        assert [e.event for e in log].count("user.message") == 1
        assert [e.data.user_message_id for e in log if e.event == "turn.started"] == ["m1"]  # type: ignore[union-attr]
        assert [e.data.final_answer for e in log if e.event == "turn.completed"] == [ANSWER]  # type: ignore[union-attr]
    finally:
        sent.cancel()
        await second.stop()
        first_store.never.set()
        await first.stop()


class NoEvents(SqliteStore):
    """A store that remembers keys but never finishes an append: the host dies before the message's
    `user.message` is durable."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.never = asyncio.Event()
        self.remembered = asyncio.Event()

    async def remember_key(self, *args: Any, **kwargs: Any) -> bool:
        found = await super().remember_key(*args, **kwargs)
        self.remembered.set()
        return found

    async def append_events(self, *args: Any, **kwargs: Any) -> Any:
        await self.never.wait()


async def test_a_message_whose_key_outlived_its_host_is_applied_when_sent_again(tmp_path: Path) -> None:
    """The key is remembered in the store, the message is nowhere else: its host died before logging
    it. Sent again to the new host, it is no duplicate: it is applied, and runs once."""
    registry = demo_registry()
    first_store = NoEvents(tmp_path / "window.db")
    first = _backend(first_store, DurableTools(LocalToolExecutor(registry), first_store))
    await first.start()
    second_store = SqliteStore(tmp_path / "window.db")
    second = _backend(second_store, DurableTools(LocalToolExecutor(registry), second_store))
    try:
        cid = (await first.open(OWNER, None, "window", None)).conversation_id
        sent = asyncio.ensure_future(first.command(OWNER, cid, UserMessage("m1", "weather?")))  # never acked
        await asyncio.wait_for(first_store.remembered.wait(), 30)
        await second.start()
        watch = Watch(second, cid, owner=OWNER)
        assert await second.command(OWNER, cid, UserMessage("m1", "weather?")) == "accepted"
        await watch.until_event("turn.completed", timeout=30)
        assert await second.command(OWNER, cid, UserMessage("m1", "weather?")) == "duplicate"  # now a repeat
        await watch.stop()
        log = await second_store.read_events(cid, 0)
        assert contiguous(log)
        assert [e.event for e in log].count("user.message") == 1
        assert [e.data.final_answer for e in log if e.event == "turn.completed"] == [ANSWER]  # type: ignore[union-attr]
    finally:
        sent.cancel()
        await second.stop()
        first_store.never.set()
        await first.stop()
