"""The event log: seq assignment, delta coalescing, and the write-ahead rule (docs/design.md#event-log)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from actors.eventlog import EventLog
from actors.store.base import RoundOutput
from protocol.events import (
    AnswerDelta,
    EndReason,
    Event,
    RoundCompleted,
    StreamedState,
    ThinkingDelta,
    TurnCompleted,
    TurnStarted,
)

LONG_MS = 60_000  # a window no test waits out: only a flush or another event closes a delta
STARTED = TurnStarted(turn_id="t1", user_message_id="m1")
COMPLETED = TurnCompleted(turn_id="t1", reason=EndReason.COMPLETE, final_answer="", used_tools=True, finish_ok=True)
ROUND = RoundCompleted(turn_id="t1", round=1, streamed_state=StreamedState(False, "", []), accepted=[], denied=[],
                       notices=[])


def delta(text: str, kind: type[AnswerDelta | ThinkingDelta] = AnswerDelta, round_: int = 1) -> AnswerDelta | ThinkingDelta:
    return kind(turn_id="t1", round=round_, text=text)


class Published:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.changed = asyncio.Event()

    def __call__(self, batch: Sequence[Event]) -> None:
        self.events.extend(batch)
        self.changed.set()

    async def until(self, count: int) -> None:
        async def wait() -> None:
            while len(self.events) < count:
                self.changed.clear()
                await self.changed.wait()
        await asyncio.wait_for(wait(), 5)

    def shape(self) -> list[tuple[int, str, object]]:
        return [(e.seq, e.event, getattr(e.data, "text", None)) for e in self.events]


async def test_no_event_is_published_before_the_store_made_it_durable() -> None:
    release, persisting = asyncio.Event(), asyncio.Event()
    persisted: list[int] = []

    async def persist(batch: Sequence[Event], outputs: Sequence[RoundOutput]) -> None:
        persisting.set()
        await release.wait()
        persisted.extend(e.seq for e in batch)

    log = EventLog("c", flush_interval_ms=0, persist=persist)
    published = Published()
    log.subscribe(published)
    log.emit(STARTED)
    await asyncio.wait_for(persisting.wait(), 5)  # the batch is at the store, which holds it
    assert published.events == [] and log.durable_seq == 0
    release.set()
    await published.until(1)
    assert persisted == [1] and log.durable_seq == 1
    await log.close()


async def test_a_round_output_is_persisted_with_its_round_completed_and_never_published() -> None:
    persisted: list[tuple[list[str], list[RoundOutput]]] = []

    async def persist(batch: Sequence[Event], outputs: Sequence[RoundOutput]) -> None:
        persisted.append(([e.event for e in batch], list(outputs)))

    log = EventLog("c", flush_interval_ms=LONG_MS, persist=persist)
    published = Published()
    log.subscribe(published)
    log.emit(STARTED)
    await log.flush()
    log.emit(delta("a"))
    log.emit(delta("b"))                          # held open by the window
    output = RoundOutput(turn_id="t1", round=1, raw="<channel:thinking>x</channel:thinking>")
    log.attach(output)
    log.emit(ROUND)
    await log.flush()
    assert persisted == [(["turn.started"], []), (["answer.delta", "answer.delta", "round.completed"], [output])]
    assert [e.event for e in published.events] == ["turn.started", "answer.delta", "answer.delta", "round.completed"]
    await log.close()


async def _failing_persist(batch: Sequence[Event], outputs: Sequence[RoundOutput]) -> None:
    raise OSError("disk full")


async def test_a_discarded_log_publishes_nothing_more_and_keeps_nothing_it_had_not_made_durable() -> None:
    # docs/design.md#deletion: an append under way may still commit (the delete removes it), unseen.
    release, held = asyncio.Event(), asyncio.Event()
    persisted: list[int] = []

    async def persist(batch: Sequence[Event], outputs: Sequence[RoundOutput]) -> None:
        if batch[0].seq > 1:
            held.set()
            await release.wait()
        persisted.extend(e.seq for e in batch)

    log = EventLog("c", flush_interval_ms=LONG_MS, persist=persist)
    published = Published()
    log.subscribe(published)
    log.emit(STARTED)
    await log.flush()
    log.emit(delta("a"))                          # persisting, held by the store
    log.emit(delta("b"))                          # held open by the window
    await asyncio.wait_for(held.wait(), 5)        # a's batch is at the store
    assert await log.discard() == 1               # the last seq any listener got
    release.set()
    log.emit(COMPLETED)                           # what a cancelled turn may still emit: ignored
    log.attach(RoundOutput(turn_id="t1", round=1, raw="x"))
    await log.flush()
    assert [e.seq for e in published.events] == [1] and persisted == [1]


async def test_a_failed_persist_publishes_nothing_and_stops_the_log() -> None:
    log = EventLog("c", flush_interval_ms=0, persist=_failing_persist)
    published = Published()
    log.subscribe(published)
    log.emit(STARTED)
    with pytest.raises(RuntimeError):
        await log.flush()
    assert published.events == []
    with pytest.raises(RuntimeError):
        log.emit(COMPLETED)


async def test_seqs_continue_the_durable_log_by_one() -> None:
    log = EventLog("c", last_seq=41, flush_interval_ms=0)
    published = Published()
    log.subscribe(published)
    for data in (STARTED, ROUND, COMPLETED):
        log.emit(data)
    await log.flush()
    assert [e.seq for e in published.events] == [42, 43, 44]
    await log.close()


async def test_the_first_delta_of_a_lane_goes_at_once_and_later_ones_coalesce() -> None:
    log = EventLog("c", flush_interval_ms=LONG_MS)
    published = Published()
    log.subscribe(published)
    for text in ("It ", "is ", "raining"):
        log.emit(delta(text))
    await published.until(1)                      # time to first token: not held for the window
    assert published.shape() == [(1, "answer.delta", "It ")]
    await log.flush()
    assert published.shape() == [(1, "answer.delta", "It "), (2, "answer.delta", "is raining")]
    await log.close()


async def test_any_other_event_closes_the_open_delta_first_so_order_holds() -> None:
    log = EventLog("c", flush_interval_ms=LONG_MS)
    published = Published()
    log.subscribe(published)
    log.emit(delta("a", ThinkingDelta))
    log.emit(delta("b", ThinkingDelta))
    log.emit(delta("c", ThinkingDelta))
    log.emit(delta("X"))                        # another lane: the open thinking delta closes first
    log.emit(ROUND)
    await log.flush()
    assert published.shape() == [
        (1, "thinking.delta", "a"), (2, "thinking.delta", "bc"), (3, "answer.delta", "X"), (4, "round.completed", None),
    ]
    await log.close()


async def test_an_open_delta_is_published_when_its_window_ends() -> None:
    log = EventLog("c", flush_interval_ms=20)
    published = Published()
    log.subscribe(published)
    log.emit(delta("a"))
    log.emit(delta("b"))
    await published.until(2)                      # nobody flushes: the window alone releases it
    assert published.shape() == [(1, "answer.delta", "a"), (2, "answer.delta", "b")]
    await log.close()


async def test_a_zero_window_sends_every_delta_as_its_own_event() -> None:
    log = EventLog("c", flush_interval_ms=0)
    published = Published()
    log.subscribe(published)
    for text in "abc":
        log.emit(delta(text))
    await log.flush()
    assert [e.data.text for e in published.events]  # type: ignore[union-attr] == ["a", "b", "c"]
    await log.close()


async def test_coalesced_deltas_keep_their_kind_turn_and_round_and_the_first_ts() -> None:
    times = iter([100.0, 101.0, 102.0, 103.0])
    log = EventLog("c", flush_interval_ms=LONG_MS, clock=lambda: next(times))
    published = Published()
    log.subscribe(published)
    for text in ("a", "b", "c"):
        log.emit(delta(text, ThinkingDelta, round_=2))
    await log.flush()
    first, merged = published.events
    assert merged.data == ThinkingDelta(turn_id="t1", round=2, text="bc")
    assert (first.ts, merged.ts) == (100.0, 101.0)   # a merged event is as old as its oldest part
    await log.close()
