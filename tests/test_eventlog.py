"""The event log: seq assignment, delta coalescing, and the write-ahead rule (docs/design.md#event-log)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from actors.eventlog import EVENTLOG_STATS, EventLog, EventLogStopped
from actors.store.base import RoundOutput, SeqConflict, StoreUnavailable
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


async def test_a_delta_after_a_quiet_interval_goes_at_once() -> None:
    """A stream slower than the window is never held: a lane makes at most one event per interval,
    and a delta that comes when the lane made none within it is final at once (docs/design.md#event-log)."""
    now = [0.0]
    log = EventLog("c", flush_interval_ms=LONG_MS, monotonic=lambda: now[0])
    published = Published()
    log.subscribe(published)
    log.emit(delta("a"))
    now[0] = LONG_MS / 1000           # one interval after the lane's last event
    log.emit(delta("b"))
    await published.until(2)          # no flush, and a LONG_MS window would have held it
    now[0] += LONG_MS / 1000 / 2      # within the interval: held, and merged with what follows
    log.emit(delta("c"))
    log.emit(delta("d"))
    log.emit(delta("X", ThinkingDelta))   # another lane: goes at once, after the open delta
    await published.until(4)
    assert published.shape() == [(1, "answer.delta", "a"), (2, "answer.delta", "b"), (3, "answer.delta", "cd"),
                                 (4, "thinking.delta", "X")]
    await log.close()


async def test_a_window_ends_one_interval_after_the_lanes_last_event() -> None:
    """The wait is what is left of the interval since the lane's last event, not a whole interval
    from the held delta: the timer is asked for the rest."""
    now = [0.0]
    log = EventLog("c", flush_interval_ms=LONG_MS, monotonic=lambda: now[0])
    published = Published()
    log.subscribe(published)
    log.emit(delta("a"))
    now[0] = LONG_MS / 1000 - 0.01    # 10 ms of the window left
    log.emit(delta("b"))
    await published.until(2)          # released by its timer within the 5 s `until` allows, not 60 s
    assert published.shape() == [(1, "answer.delta", "a"), (2, "answer.delta", "b")]
    await log.close()


async def test_a_zero_window_sends_every_delta_as_its_own_event() -> None:
    log = EventLog("c", flush_interval_ms=0)
    published = Published()
    log.subscribe(published)
    for text in "abc":
        log.emit(delta(text))
    await log.flush()
    assert [getattr(e.data, "text", None) for e in published.events] == ["a", "b", "c"]
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


# -- store outages: a pause, not a death (docs/design.md#store-outage) ---------------------------------


class FlakyStore:
    """An append-only log behind `persist` that is unavailable for its next `down` appends, and that
    commits its next `lose_answers` appends but raises as if the answer was lost with the connection.
    Its seq check is the real store's: an append must start at last_seq + 1 (SeqConflict)."""

    def __init__(self, *, down: int = 0, lose_answers: int = 0, cause: str = "connection lost") -> None:
        self.events: list[Event] = []
        self.outputs: list[RoundOutput] = []
        self.down = down
        self.lose_answers = lose_answers
        self.cause = cause
        self.calls = 0
        self.failing = asyncio.Event()   # set at each refused try

    async def persist(self, batch: Sequence[Event], outputs: Sequence[RoundOutput]) -> None:
        self.calls += 1
        if self.down:
            self.down -= 1
            self.failing.set()
            raise StoreUnavailable(self.cause)
        last = self.events[-1].seq if self.events else 0
        if batch[0].seq != last + 1:
            raise SeqConflict("c", batch[0].seq, last)
        self.events.extend(batch)
        self.outputs.extend(outputs)
        if self.lose_answers:
            self.lose_answers -= 1
            raise StoreUnavailable("connection lost")

    async def read_back(self, after: int, limit: int) -> list[Event]:
        return [e for e in self.events if after < e.seq <= after + limit]


def flaky_log(store: FlakyStore, **kwargs: object) -> EventLog:
    return EventLog("c", flush_interval_ms=0, persist=store.persist, read_back=store.read_back, **kwargs)  # type: ignore[arg-type]


async def test_an_outage_holds_every_event_back_then_publishes_them_all_in_order() -> None:
    store = FlakyStore(down=4)                    # 50 + 100 + 200 + 400 ms of waiting
    log = flaky_log(store)
    published = Published()
    log.subscribe(published)
    log.emit(STARTED)
    await asyncio.wait_for(store.failing.wait(), 5)
    assert log.in_outage
    refused = log.unavailable()
    assert refused is not None and refused.cause == "connection lost" and refused.retry_after_ms >= 50
    for text in ("It ", "is ", "raining"):        # the turn goes on: emit never raises, nothing is published
        log.emit(delta(text))
    log.emit(COMPLETED)
    assert published.events == [] and log.durable_seq == 0 and log.last_seq == 5
    await log.flush()                             # waits through the outage
    assert not log.in_outage and log.unavailable() is None
    assert [e.seq for e in published.events] == [1, 2, 3, 4, 5] == [e.seq for e in store.events]
    assert [e.event for e in published.events] == ["turn.started", *["answer.delta"] * 3, "turn.completed"]
    assert store.calls == 4 + 2                   # the first batch 5 times, then the backlog at once
    await log.close()


async def test_a_round_output_waits_with_its_round_through_an_outage_and_is_written_once() -> None:
    store = FlakyStore(down=2)
    log = flaky_log(store)
    log.emit(STARTED)
    output = RoundOutput(turn_id="t1", round=1, raw="<channel:thinking>x</channel:thinking>")
    log.attach(output)
    log.emit(ROUND)
    await log.flush()
    assert store.outputs == [output] and [e.event for e in store.events] == ["turn.started", "round.completed"]


async def test_a_retried_batch_that_had_committed_is_recognised_not_written_twice() -> None:
    # The commit went through, the answer was lost with the connection: the retry meets SeqConflict,
    # reads the store back, and finds this very batch there.
    store = FlakyStore(lose_answers=1)
    log = flaky_log(store)
    published = Published()
    log.subscribe(published)
    recognised = EVENTLOG_STATS.recognised_commits
    log.emit(STARTED)
    output = RoundOutput(turn_id="t1", round=1, raw="raw")
    log.attach(output)
    log.emit(ROUND)
    await log.flush()
    log.emit(COMPLETED)
    await log.flush()
    assert [e.seq for e in store.events] == [1, 2, 3] and store.outputs == [output]
    assert [e.seq for e in published.events] == [1, 2, 3]        # each published once
    assert EVENTLOG_STATS.recognised_commits == recognised + 1
    await log.close()


async def test_a_retry_that_finds_another_writers_events_is_a_real_conflict() -> None:
    store = FlakyStore(down=1)
    log = flaky_log(store)
    published = Published()
    log.subscribe(published)
    log.emit(STARTED)
    await asyncio.wait_for(store.failing.wait(), 5)
    store.events.append(Event.of("c", 1, TurnStarted(turn_id="t9", user_message_id="other"), 1.0))  # another activation
    with pytest.raises(EventLogStopped) as stopped:
        await log.flush()
    assert isinstance(stopped.value.__cause__, SeqConflict) and not log.gave_up
    assert published.events == []
    with pytest.raises(RuntimeError):             # as before: a log that failed for good says so
        log.emit(COMPLETED)


async def test_a_seq_conflict_on_a_first_try_is_not_taken_for_a_lost_answer() -> None:
    store = FlakyStore()
    store.events.append(Event.of("c", 1, STARTED, 1.0))
    log = flaky_log(store)                        # believes the log is empty: a stale activation
    log.emit(STARTED)
    with pytest.raises(EventLogStopped):
        await log.flush()


async def test_past_the_ceiling_the_log_gives_up_and_its_host_is_told() -> None:
    store = FlakyStore(down=1_000, cause="disk full")
    told: list[StoreUnavailable] = []
    log = flaky_log(store, store_outage_s=0.3, on_give_up=told.append)
    published = Published()
    log.subscribe(published)
    given_up = EVENTLOG_STATS.logs_given_up
    log.emit(STARTED)
    log.emit(delta("a"))
    with pytest.raises(EventLogStopped) as stopped:
        await asyncio.wait_for(log.flush(), 5)
    assert log.gave_up and not log.in_outage
    assert [exc.cause for exc in told] == ["disk full"] and stopped.value.__cause__ is told[0]
    assert EVENTLOG_STATS.logs_given_up == given_up + 1
    refused = log.unavailable()
    assert refused is not None and refused.cause == "disk full"
    log.emit(COMPLETED)                           # the conversation is being deactivated: ignored
    log.attach(RoundOutput(turn_id="t1", round=1, raw="x"))
    store.down = 0
    await asyncio.sleep(0.1)
    assert published.events == [] and store.events == []


async def test_an_abandoned_log_stops_waiting_for_the_store_at_once() -> None:
    store = FlakyStore(down=1_000)
    log = flaky_log(store)
    log.emit(STARTED)
    await asyncio.wait_for(store.failing.wait(), 5)
    await asyncio.wait_for(log.abandon(), 1)      # no wait for the next try, let alone the ceiling
    calls = store.calls
    log.emit(COMPLETED)
    await asyncio.sleep(0.2)
    assert store.calls == calls and not log.gave_up
