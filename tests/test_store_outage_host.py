"""A store outage on a host: a pause, not a death (docs/design.md#store-outage).

The local backend over a real SQLite store, behind a switch that makes every call of the store raise
StoreUnavailable while it is down — what the stores raise for a lost connection, a failover or a
full disk (their own classification is tested in tests/test_store_contract.py). A turn streams
through a short outage; a command meanwhile is refused with a retryable error; a command whose
idempotency key the outage left uncertain is neither lost nor applied twice; past store_outage_s
the conversation is deactivated and, once the store is back, recovers and finishes its answer.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from actors.conversation import Runtime
from actors.hosting.backend import SetMode, UserMessage
from actors.hosting.local import LocalBackend
from actors.identity import Owner
from actors.llm.scripts import parse_script, register_script
from actors.llm.stream import stream_model
from actors.profile import parse_profile
from actors.store.base import StoreUnavailable
from actors.store.sqlite import SqliteStore
from actors.tools.demo import demo_registry
from actors.tools.durable import DurableTools
from actors.tools.executor import LocalToolExecutor
from protocol.events import Event
from tests.roundkit import action, call, thinking
from tests.watchkit import Watch, contiguous

OWNER = Owner(tenant="acme", sub="alice")
ANSWER = "It is raining in Paris, twelve degrees; take an umbrella and a light jacket. " * 3
register_script("outage-answer", parse_script({"loop": True, "continues": True, "rounds": [
    {"text": thinking("Checking.") + action(call("demo.weather", city="Paris"))},
    {"text": thinking("Answering.") + action({"action": "complete", "final_answer": ANSWER}),
     "chunk_chars": 3, "delay_ms": 12},
]}))
PROFILE = parse_profile({"name": "outage", "model": "scripted/outage-answer", "states": ["default"],
                         "policies": {"flush_interval_ms": 10}, "tools": [{"id": "demo.weather"}]},
                        known_tools=demo_registry())


class SwitchedStore:
    """A real store, but while `down` every call raises StoreUnavailable, as a store does during an
    outage. `lose_answers` names calls that commit once, then raise as if the answer was lost."""

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner
        self.down = False
        self.down_for: set[str] = set()      # only these calls refused, while not `down`
        self.lose_answers: set[str] = set()
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.inner, name)
        if name in ("open", "close") or not inspect.iscoroutinefunction(found):
            return found

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.down or name in self.down_for:
                self.refused += 1
                raise StoreUnavailable("failover", 250)
            value = await found(*args, **kwargs)
            if name in self.lose_answers:
                self.lose_answers.discard(name)
                raise StoreUnavailable("connection lost")
            return value

        return call


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[tuple[LocalBackend, SwitchedStore]]:
    store = SwitchedStore(SqliteStore(tmp_path / "outage.db"))
    registry = demo_registry()
    runtime = Runtime(registry=registry, tools=DurableTools(LocalToolExecutor(registry), store),  # type: ignore[arg-type]
                      stream_model=stream_model)
    backend = LocalBackend(store, runtime, {"outage": PROFILE}, default_agent="outage")  # type: ignore[arg-type]
    await backend.start()
    yield backend, store
    store.down = False
    await backend.stop()


def answer_of(events: list[Event]) -> str:
    return "".join(e.data.text for e in events if e.event == "answer.delta")  # type: ignore[union-attr]


async def until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


async def send_as_a_client(backend: LocalBackend, cid: str, command: UserMessage) -> str:
    """The same command again after each `unavailable`'s retry_after_ms, as both clients do."""
    async with asyncio.timeout(30):
        while True:
            try:
                return str(await backend.command(OWNER, cid, command))
            except StoreUnavailable as exc:
                await asyncio.sleep(exc.retry_after_ms / 1000)


async def test_a_turn_streams_through_an_outage_and_commands_meanwhile_are_refused_retryably(
    setup: tuple[LocalBackend, SwitchedStore],
) -> None:
    backend, store = setup
    cid = (await backend.open(OWNER, None, "outage", None)).conversation_id
    watch = Watch(backend, cid, owner=OWNER)
    assert await backend.command(OWNER, cid, UserMessage("m1", "weather?")) == "accepted"
    await watch.until(lambda events: len(answer_of(events)) >= 12)
    store.down = True
    log = backend.host._active[cid].conversation.events
    await until(lambda: log.in_outage)
    durable = log.durable_seq
    with pytest.raises(StoreUnavailable) as refused:       # never `internal`: the frame may be sent again
        await backend.command(OWNER, cid, SetMode(id="mode-1", mode="ask"))  # type: ignore[arg-type]
    assert refused.value.cause == "failover" and refused.value.retry_after_ms >= 50
    assert backend.host.describe()["waiting_for_store"] == 1
    with pytest.raises(StoreUnavailable):                  # what reaches the store now says so, as itself
        await backend.open(OWNER, cid, None, None)
    with pytest.raises(StoreUnavailable):
        await anext(aiter(backend.subscribe(OWNER, cid, 0)))
    await asyncio.sleep(0.4)                               # the model streams on; nothing is published
    assert log.durable_seq == durable and log.last_seq > durable
    assert all(e.seq <= durable for e in watch.events)
    store.down = False
    await watch.until_event("turn.completed")
    await watch.stop()
    assert contiguous(watch.events)
    assert answer_of(watch.events) == ANSWER                # every character once, none lost
    assert watch.completed()[0].reason == "complete"
    stored = await store.inner.read_events(cid, 0)
    assert stored == watch.events


async def test_a_command_whose_key_an_outage_left_uncertain_is_applied_once(
    setup: tuple[LocalBackend, SwitchedStore],
) -> None:
    backend, store = setup
    cid = (await backend.open(OWNER, None, "outage", None)).conversation_id
    watch = Watch(backend, cid, owner=OWNER)
    store.lose_answers.add("remember_key")                # the key was stored; its answer was lost
    with pytest.raises(StoreUnavailable):
        await backend.command(OWNER, cid, UserMessage("m1", "weather?"))
    assert await backend.command(OWNER, cid, UserMessage("m1", "weather?")) == "accepted"   # not "duplicate"
    assert await backend.command(OWNER, cid, UserMessage("m1", "weather?")) == "duplicate"
    await watch.until_event("turn.completed")
    await watch.stop()
    assert sum(e.event == "user.message" for e in watch.events) == 1
    assert sum(e.event == "turn.started" for e in watch.events) == 1


async def test_past_store_outage_s_the_conversation_is_deactivated_then_recovers_its_answer(
    setup: tuple[LocalBackend, SwitchedStore],
) -> None:
    backend, store = setup
    backend.host.store_outage_s = 0.5
    cid = (await backend.open(OWNER, None, "outage", None)).conversation_id
    watch = Watch(backend, cid, owner=OWNER)
    assert await backend.command(OWNER, cid, UserMessage("m1", "weather?")) == "accepted"
    await watch.until(lambda events: len(answer_of(events)) >= 12)
    store.down = True
    await until(lambda: cid not in backend.host.active_ids)  # the log gave up: no conversation on a dead log
    with pytest.raises(StoreUnavailable):                    # a command now tries to activate it: the store is down
        await backend.command(OWNER, cid, UserMessage("m2", "and tomorrow?"))
    await asyncio.sleep(0.3)
    store.down = False                                       # activated again by the host: watched, and busy
    await watch.until_event("turn.completed")
    await watch.stop()
    assert cid in backend.host.active_ids
    assert contiguous(watch.events)
    assert answer_of(watch.events) == ANSWER                  # the cut answer is continued, nothing repeated
    assert sum(e.event == "turn.started" for e in watch.events) == 1
    assert await store.inner.read_events(cid, 0) == watch.events


async def test_a_command_whose_checkpoint_an_outage_holds_up_is_refused_at_once_and_acked_when_sent_again(
    setup: tuple[LocalBackend, SwitchedStore],
) -> None:
    backend, store = setup
    cid = (await backend.open(OWNER, None, "outage", None)).conversation_id
    watch = Watch(backend, cid, owner=OWNER)
    store.down_for = {"save_snapshot"}                     # the log writes; checkpoints cannot
    async with asyncio.timeout(5):                         # refused at once, not after store_outage_s
        with pytest.raises(StoreUnavailable):
            await backend.command(OWNER, cid, UserMessage("m1", "weather?"))
        with pytest.raises(StoreUnavailable):              # sent again meanwhile: still refused
            await backend.command(OWNER, cid, UserMessage("m1", "weather?"))
    store.down_for = set()
    # Applied the first time, durable once the checkpoint's next try went through: acked as a repeat
    # of one that went through, by a client sending it again after each retry_after_ms.
    assert await send_as_a_client(backend, cid, UserMessage("m1", "weather?")) == "duplicate"
    await watch.until_event("turn.completed")
    await watch.stop()
    assert sum(e.event == "user.message" for e in watch.events) == 1
    assert sum(e.event == "turn.started" for e in watch.events) == 1
    assert contiguous(watch.events) and answer_of(watch.events) == ANSWER
