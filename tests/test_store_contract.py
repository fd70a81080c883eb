"""The Store contract (docs/design.md#store; idempotency and resume: docs/wire-protocol.md#10-delivery-idempotency-resume-multiplexing), run against every backend."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import psycopg
import pytest

from actors.eventlog import EVENTLOG_STATS, EventLog, EventLogStopped
from actors.identity import Owner
from actors.store import (
    IDEMPOTENCY_TTL_S,
    ConversationExists,
    RoundOutput,
    SeqConflict,
    Store,
    StoreClosed,
    Tombstoned,
    store_from_url,
)
from actors.store.base import APPEND_INTERVAL_S, StoreHealth, StoreUnavailable
from actors.store.outage import postgres_detail, postgres_outage, sqlite_outage
from actors.store.postgres import PostgresStore
from actors.store.sqlite import SqliteStore
from protocol.events import Event, ThinkingDelta, ToolResult
from protocol.frames import ConversationEntry
from tests.kit import TIMEOUT

StoreFactory = Callable[..., Store]   # keyword arguments: the store's own options

BACKENDS = [
    "sqlite",
    "sqlite-memory",
    pytest.param("postgres", marks=pytest.mark.postgres),
]
DURABLE_BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def _factory(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[StoreFactory, Callable[[], None]]:
    """A function making fresh store objects on one backing database, and its cleanup."""
    backend: str = request.param
    if backend == "sqlite":
        path = tmp_path / "store.db"
        return (lambda **options: SqliteStore(path, **options)), lambda: None
    if backend == "sqlite-memory":
        return (lambda **options: SqliteStore(":memory:", **options)), lambda: None
    dsn: str = request.getfixturevalue("postgres_dsn")
    schema = f"test_store_{uuid.uuid4().hex[:12]}"

    def drop() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    return (lambda **options: PostgresStore(dsn, schema=schema, **options)), drop


@pytest.fixture(params=BACKENDS)
async def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreFactory]:
    factory, cleanup = _factory(request, tmp_path)
    yield factory
    cleanup()


@pytest.fixture(params=DURABLE_BACKENDS)
async def make_durable_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreFactory]:
    factory, cleanup = _factory(request, tmp_path)
    yield factory
    cleanup()


@pytest.fixture
async def store(make_store: StoreFactory) -> AsyncIterator[Store]:
    s = make_store()
    await s.open()
    yield s
    await s.close()


def ev(conversation_id: str, seq: int, text: str = "") -> Event:
    data = ThinkingDelta(turn_id="t1", round=1, text=text)
    return Event.of(conversation_id, seq, data, ts=1700000000.0 + seq)


def evs(conversation_id: str, first: int, last: int) -> list[Event]:
    return [ev(conversation_id, seq, text=f"t{seq}") for seq in range(first, last + 1)]


# -- events -------------------------------------------------------------------------------------


async def test_read_events_returns_appended_events_in_seq_order(store: Store) -> None:
    await store.append_events("c", evs("c", 1, 3))
    await store.append_events("c", evs("c", 4, 4))
    assert await store.read_events("c", 0) == evs("c", 1, 4)


async def test_event_data_round_trips_exactly(store: Store) -> None:
    event = Event.of("c", 1, ToolResult(
        turn_id="t1", call_id="t1.1.0", tool_id="demo.x", ok=True, duration_ms=3,
        result={"temp_c": 12, "nested": [1, 2.5, None, "é€😀"], "text": "</x>\n"},
    ), ts=1712345678.123456)
    await store.append_events("c", [event])
    assert await store.read_events("c", 0) == [event]


async def test_read_events_after_seq_skips_what_the_client_has(store: Store) -> None:
    await store.append_events("c", evs("c", 1, 10))
    assert [e.seq for e in await store.read_events("c", 7)] == [8, 9, 10]
    assert await store.read_events("c", 10) == []


async def test_read_events_limit_pages_through_the_log(store: Store) -> None:
    await store.append_events("c", evs("c", 1, 10))
    first = await store.read_events("c", 0, limit=4)
    second = await store.read_events("c", first[-1].seq, limit=4)
    assert [e.seq for e in first] == [1, 2, 3, 4]
    assert [e.seq for e in second] == [5, 6, 7, 8]


async def test_read_events_with_no_room_returns_nothing(store: Store) -> None:
    await store.append_events("c", evs("c", 1, 3))
    assert await store.read_events("c", 0, limit=0) == []
    assert await store.read_events("c", 0, limit=-1) == []


async def test_read_events_of_one_conversation_only(store: Store) -> None:
    await store.append_events("a", evs("a", 1, 2))
    await store.append_events("b", evs("b", 1, 3))
    assert [e.conversation_id for e in await store.read_events("a", 0)] == ["a", "a"]


async def test_last_seq_is_zero_without_events(store: Store) -> None:
    assert await store.last_seq("nobody") == 0


async def test_last_seq_follows_appends(store: Store) -> None:
    await store.append_events("c", evs("c", 1, 5))
    assert await store.last_seq("c") == 5


async def test_append_of_nothing_is_a_no_op(store: Store) -> None:
    await store.append_events("c", [])
    assert await store.last_seq("c") == 0


async def test_append_with_a_gap_raises_seq_conflict_and_writes_nothing(store: Store) -> None:
    await store.append_events("c", evs("c", 1, 2))
    with pytest.raises(SeqConflict) as info:
        await store.append_events("c", evs("c", 4, 5))
    assert (info.value.seq, info.value.last_seq) == (4, 2)
    assert await store.last_seq("c") == 2
    assert [e.seq for e in await store.read_events("c", 0)] == [1, 2]


async def test_first_append_must_start_at_seq_1(store: Store) -> None:
    with pytest.raises(SeqConflict):
        await store.append_events("c", evs("c", 2, 3))
    assert await store.read_events("c", 0) == []


async def test_append_reusing_a_seq_raises_seq_conflict(store: Store) -> None:
    await store.append_events("c", evs("c", 1, 3))
    with pytest.raises(SeqConflict):
        await store.append_events("c", [ev("c", 3, text="again")])
    with pytest.raises(SeqConflict):
        await store.append_events("c", evs("c", 1, 4))
    assert await store.read_events("c", 0) == evs("c", 1, 3)


async def test_append_of_non_contiguous_events_raises_seq_conflict(store: Store) -> None:
    with pytest.raises(SeqConflict):
        await store.append_events("c", [ev("c", 1), ev("c", 3)])
    assert await store.last_seq("c") == 0


async def test_append_of_another_conversations_event_is_a_programming_error(store: Store) -> None:
    with pytest.raises(ValueError):
        await store.append_events("c", [ev("other", 1)])


async def test_a_conflicting_append_fails_alone_in_its_batch(store: Store) -> None:
    await store.append_events("bad", evs("bad", 1, 1))
    results = await asyncio.gather(
        store.append_events("a", evs("a", 1, 2)),
        store.append_events("bad", evs("bad", 1, 1)),
        store.append_events("b", evs("b", 1, 2)),
        return_exceptions=True,
    )
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], SeqConflict)
    assert await store.last_seq("a") == 2 and await store.last_seq("b") == 2


async def test_a_cancelled_caller_does_not_cancel_its_append_nor_the_writer(store: Store) -> None:
    # The write may still commit after its caller went (the caller re-reads last_seq); the writer
    # skips the caller's cancelled future and goes on committing the rest of the batch and the next.
    first = asyncio.create_task(store.append_events("c", evs("c", 1, 2)))
    second = asyncio.create_task(store.append_events("d", evs("d", 1, 1)))
    await asyncio.sleep(0)                               # both queued with the writer
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await second
    await store.append_events("d", evs("d", 2, 2))
    assert await store.last_seq("c") in (0, 2) and await store.last_seq("d") == 2
    await store.append_events("c", evs("c", await store.last_seq("c") + 1, 3))    # re-read, then go on
    assert [e.seq for e in await store.read_events("c", 0)][-1] == 3


async def test_appends_queued_by_one_writer_commit_in_order(store: Store) -> None:
    # The single writer may pipeline appends without awaiting each one; FIFO keeps them valid.
    await asyncio.gather(*(store.append_events("c", evs("c", s, s)) for s in range(1, 21)))
    assert [e.seq for e in await store.read_events("c", 0)] == list(range(1, 21))


async def test_concurrent_appends_of_50_conversations_land_contiguous_in_batches(store: Store) -> None:
    conversations = [f"conv-{i}" for i in range(50)]

    async def writer(cid: str) -> int:
        seq = 0
        for round_ in range(10):
            n = 1 + (round_ % 3)
            await store.append_events(cid, evs(cid, seq + 1, seq + n))
            seq += n
        return seq

    lasts = await asyncio.gather(*(writer(cid) for cid in conversations))
    for cid, last in zip(conversations, lasts, strict=True):
        assert [e.seq for e in await store.read_events(cid, 0)] == list(range(1, last + 1))
        assert await store.last_seq(cid) == last
    assert store.stats.appends == 500
    assert store.stats.events == sum(lasts)
    assert store.stats.commits < store.stats.appends / 5, store.stats   # group commit batched
    assert store.stats.largest_batch > 1


async def test_appends_alone_wait_for_the_append_interval_and_any_other_write_commits_them_at_once(
    make_store: StoreFactory,
) -> None:
    """docs/design.md#store: appends queued within `append_interval_s` of the last commit's start wait
    to share the next commit; a write someone waits on (here a snapshot) commits at once, and takes
    them along. So does closing the store."""
    store = make_store(append_interval_s=600.0)
    await store.open()
    try:
        await asyncio.wait_for(store.append_events("a", evs("a", 1, 1)), TIMEOUT)   # no commit before it: at once
        waiting = asyncio.create_task(store.append_events("b", evs("b", 1, 1)))
        done, _ = await asyncio.wait({waiting}, timeout=0.2)
        assert not done and store.stats.commits == 1              # it waits for the interval (600 s)
        await asyncio.wait_for(store.save_snapshot("a", 1, b"s"), TIMEOUT)
        await asyncio.wait_for(waiting, TIMEOUT)                   # committed with the snapshot
        assert store.stats.commits == 2 and await store.last_seq("b") == 1
        last = asyncio.create_task(store.append_events("b", evs("b", 2, 2)))
        await asyncio.sleep(0)                                     # one step: it is queued
    finally:
        await asyncio.wait_for(store.close(), TIMEOUT)            # closing commits what waits
    await asyncio.wait_for(last, TIMEOUT)
    assert store.stats.commits == 3


async def test_racing_activations_cannot_both_append_a_seq(make_durable_store: StoreFactory) -> None:
    first, second = make_durable_store(), make_durable_store()
    await first.open()
    await second.open()
    try:
        await first.append_events("c", evs("c", 1, 1))
        results = await asyncio.gather(
            first.append_events("c", [ev("c", 2, text="first")]),
            second.append_events("c", [ev("c", 2, text="second")]),
            return_exceptions=True,
        )
        assert sorted(type(r).__name__ for r in results) == ["NoneType", "SeqConflict"]
        assert [e.seq for e in await second.read_events("c", 0)] == [1, 2]
    finally:
        await first.close()
        await second.close()


async def test_racing_activations_cannot_both_start_a_log(make_durable_store: StoreFactory) -> None:
    first, second = make_durable_store(), make_durable_store()
    await first.open()
    await second.open()
    try:
        results = await asyncio.gather(
            first.append_events("c", [ev("c", 1, text="first")]),
            second.append_events("c", [ev("c", 1, text="second")]),
            second.append_events("other", evs("other", 1, 2)),      # shares the loser's batch
            return_exceptions=True,
        )
        assert sorted(type(r).__name__ for r in results[:2]) == ["NoneType", "SeqConflict"]
        assert results[2] is None
        assert [e.seq for e in await first.read_events("c", 0)] == [1]
        assert await first.last_seq("other") == 2
    finally:
        await first.close()
        await second.close()


# -- conversations ------------------------------------------------------------------------------


async def test_conversation_owner_round_trips(store: Store) -> None:
    await store.create_conversation("c", Owner(tenant="acme", sub="alice"), "demo", 1700000000.0)
    assert await store.conversation_owner("c") == (Owner(tenant="acme", sub="alice"), "demo")


async def test_conversation_owner_of_unknown_conversation_is_none(store: Store) -> None:
    assert await store.conversation_owner("nope") is None


async def test_creating_the_same_conversation_again_is_a_no_op(store: Store) -> None:
    owner = Owner(tenant="acme", sub="alice")
    await store.create_conversation("c", owner, "demo", 1.0)
    await store.create_conversation("c", owner, "demo", 2.0)
    assert await store.conversation_owner("c") == (owner, "demo")


async def test_creating_a_conversation_id_owned_by_another_raises(store: Store) -> None:
    await store.create_conversation("c", Owner(tenant="acme", sub="alice"), "demo", 1.0)
    with pytest.raises(ConversationExists):
        await store.create_conversation("c", Owner(tenant="acme", sub="mallory"), "demo", 2.0)
    assert await store.conversation_owner("c") == (Owner(tenant="acme", sub="alice"), "demo")


# -- snapshots ----------------------------------------------------------------------------------


async def test_load_snapshot_without_one_is_none(store: Store) -> None:
    assert await store.load_snapshot("c") is None


async def test_latest_snapshot_wins(store: Store) -> None:
    await store.save_snapshot("c", 5, b"state@5")
    await store.save_snapshot("c", 9, b"state@9\x00binary")
    assert await store.load_snapshot("c") == (9, b"state@9\x00binary")


async def test_snapshot_saved_late_with_an_older_seq_is_ignored(store: Store) -> None:
    await store.save_snapshot("c", 9, b"new")
    await store.save_snapshot("c", 5, b"stale")
    assert await store.load_snapshot("c") == (9, b"new")


async def test_snapshot_at_the_same_seq_is_replaced(store: Store) -> None:
    await store.save_snapshot("c", 9, b"first")
    await store.save_snapshot("c", 9, b"second")
    assert await store.load_snapshot("c") == (9, b"second")


# -- idempotency keys ---------------------------------------------------------------------------


async def test_remember_key_is_true_once_then_false(store: Store) -> None:
    assert await store.remember_key("c", "msg-1", 100.0) is True
    assert await store.remember_key("c", "msg-1", 101.0) is False


async def test_idempotency_keys_are_per_conversation(store: Store) -> None:
    assert await store.remember_key("a", "msg-1", 100.0) is True
    assert await store.remember_key("b", "msg-1", 100.0) is True


async def test_concurrent_remember_key_of_one_key_admits_exactly_one(store: Store) -> None:
    results = await asyncio.gather(*(store.remember_key("c", "dup", 100.0) for _ in range(20)))
    assert results.count(True) == 1


async def test_concurrent_remember_key_across_two_store_objects_admits_exactly_one(
    make_durable_store: StoreFactory,
) -> None:
    stores = [make_durable_store(), make_durable_store()]
    for s in stores:
        await s.open()
    try:
        results = await asyncio.gather(*(stores[i % 2].remember_key("c", "dup", 100.0) for i in range(20)))
        assert results.count(True) == 1
    finally:
        for s in stores:
            await s.close()


async def test_prune_keys_forgets_only_older_keys(store: Store) -> None:
    now = 1_000_000.0
    await store.remember_key("c", "old", now - IDEMPOTENCY_TTL_S - 1)
    await store.remember_key("c", "recent", now - 60)
    assert await store.prune_keys(now - IDEMPOTENCY_TTL_S) == 1
    assert await store.remember_key("c", "old", now) is True
    assert await store.remember_key("c", "recent", now) is False


# -- tool results -------------------------------------------------------------------------------


async def test_tool_result_unknown_call_is_none(store: Store) -> None:
    assert await store.tool_result("c", "call-1") is None


async def test_tool_result_first_write_wins(store: Store) -> None:
    assert await store.record_tool_result("c", "call-1", b'{"ok":true}') is True
    assert await store.record_tool_result("c", "call-1", b'{"ok":false}') is False
    assert await store.tool_result("c", "call-1") == b'{"ok":true}'


async def test_tool_results_are_per_conversation(store: Store) -> None:
    await store.record_tool_result("a", "call-1", b"A")
    await store.record_tool_result("b", "call-1", b"B")
    assert (await store.tool_result("a", "call-1"), await store.tool_result("b", "call-1")) == (b"A", b"B")


# -- round outputs (docs/design.md#replay) ------------------------------------------------------


def output(turn_id: str = "t1", round_no: int = 1, raw: str = "<channel:thinking>x</channel:thinking>") -> RoundOutput:
    return RoundOutput(turn_id=turn_id, round=round_no, raw=raw, models=("scripted/a", "scripted/b"),
                       mode="ask", agent_state="focused", phase="finalize")


async def test_round_outputs_commit_with_their_append_and_round_trip_exactly(store: Store) -> None:
    raw = '<channel:thinking>é€😀 "quoted" \x00 \ud800</channel:thinking>\n<channel:action>{}</channel:action>'
    await store.append_events("c", evs("c", 1, 3), [output(raw=raw), output(round_no=2)])
    assert await store.round_outputs("c") == [output(raw=raw), output(round_no=2)]


async def test_round_outputs_of_a_conversation_without_any_are_empty(store: Store) -> None:
    await store.append_events("c", evs("c", 1, 2))
    assert await store.round_outputs("c") == []
    assert await store.round_outputs("nobody") == []


async def test_round_outputs_of_a_refused_append_are_not_written(store: Store) -> None:
    await store.append_events("c", evs("c", 1, 2), [output(round_no=1)])
    with pytest.raises(SeqConflict):
        await store.append_events("c", evs("c", 2, 3), [output(round_no=2)])
    assert await store.round_outputs("c") == [output(round_no=1)]


async def test_round_outputs_need_events_to_ride_with(store: Store) -> None:
    await store.append_events("c", [], [output()])
    assert await store.round_outputs("c") == []


async def test_a_round_output_written_again_keeps_the_first(store: Store) -> None:
    await store.append_events("c", evs("c", 1, 1), [output(raw="first")])
    await store.append_events("c", evs("c", 2, 2), [output(raw="second")])
    assert [o.raw for o in await store.round_outputs("c")] == ["first"]


async def test_round_outputs_come_back_in_append_order_not_name_order(store: Store) -> None:
    rounds = [("t9", 1), ("t9", 2), ("t10", 1), ("t11", 1)]
    for seq, (turn_id, round_no) in enumerate(rounds, start=1):
        await store.append_events("c", evs("c", seq, seq), [output(turn_id, round_no)])
    assert [(o.turn_id, o.round) for o in await store.round_outputs("c")] == rounds


async def test_round_outputs_are_per_conversation(store: Store) -> None:
    await store.append_events("a", evs("a", 1, 1), [output(raw="A")])
    await store.append_events("b", evs("b", 1, 1), [output(raw="B")])
    assert [o.raw for o in await store.round_outputs("a")] == ["A"]


async def test_round_outputs_of_a_batch_land_with_their_appends_only(store: Store) -> None:
    await store.append_events("bad", evs("bad", 1, 1))
    results = await asyncio.gather(
        *(store.append_events(f"c{i}", evs(f"c{i}", 1, 2), [output(raw=f"c{i}")]) for i in range(20)),
        store.append_events("bad", evs("bad", 1, 1), [output(raw="refused")]),
        return_exceptions=True,
    )
    assert results[:20] == [None] * 20 and isinstance(results[20], SeqConflict)
    assert [[o.raw for o in await store.round_outputs(f"c{i}")] for i in range(20)] == [[f"c{i}"] for i in range(20)]
    assert await store.round_outputs("bad") == []


def _drop_round_outputs(store: Store) -> None:
    """Make the backing database what a store created before round outputs existed."""
    if isinstance(store, SqliteStore):
        with sqlite3.connect(store.path) as conn:
            conn.execute("DROP TABLE round_outputs")
        return
    assert isinstance(store, PostgresStore) and store.schema is not None
    with psycopg.connect(store.dsn, autocommit=True) as conn:
        conn.execute(f'DROP TABLE "{store.schema}".round_outputs')


async def test_a_database_created_before_round_outputs_gains_them_when_opened(make_durable_store: StoreFactory) -> None:
    s = make_durable_store()
    await s.open()
    await s.append_events("c", evs("c", 1, 3))
    await s.save_snapshot("c", 3, b"snap")
    await s.close()
    _drop_round_outputs(s)

    s = make_durable_store()
    await s.open()
    try:
        assert await s.read_events("c", 0) == evs("c", 1, 3)
        assert await s.load_snapshot("c") == (3, b"snap")
        assert await s.round_outputs("c") == []
        await s.append_events("c", evs("c", 4, 4), [output()])      # the log goes on, outputs with it
        assert await s.round_outputs("c") == [output()]
    finally:
        await s.close()


# -- deletion (docs/design.md#deletion) ----------------------------------------------------------

KEPT_PER_CONVERSATION = ("conversations", "streams", "events", "snapshots", "idempotency_keys", "tool_results",
                         "round_outputs", "tombstones", "conversation_list")
OWNER = Owner(tenant="acme", sub="alice")


def table_rows(store: Store, cid: str) -> dict[str, int]:
    """Rows per table for the conversation, read from the database itself (the pool's snapshot too)."""
    queries = {t: (f"SELECT count(*) FROM {{}}{t} WHERE conversation_id = {{p}}", cid) for t in KEPT_PER_CONVERSATION}
    queries["toolpool snapshot"] = ("SELECT count(*) FROM {}snapshots WHERE conversation_id = {p}", f"toolpool/{cid}")
    if isinstance(store, SqliteStore):
        with sqlite3.connect(store.path) as db:
            return {name: db.execute(q.format("", p="?"), (arg,)).fetchone()[0] for name, (q, arg) in queries.items()}
    assert isinstance(store, PostgresStore) and store.schema is not None
    with psycopg.connect(store.dsn, autocommit=True) as db:
        prefix = f'"{store.schema}".'
        return {name: db.execute(q.format(prefix, p="%s"), (arg,)).fetchone()[0]  # type: ignore[index]
                for name, (q, arg) in queries.items()}


async def fill(s: Store, cid: str) -> None:
    """One row in every table that keeps something of a conversation."""
    await s.create_conversation(cid, OWNER, "demo", 1.0)
    await s.append_events(cid, evs(cid, 1, 3), [output()])
    await s.save_snapshot(cid, 3, b"snap")
    await s.save_snapshot(f"toolpool/{cid}", 1, b"{}")
    await s.remember_key(cid, "m1", 100.0)
    await s.record_tool_result(cid, "t1.1.0", b"result")


async def test_delete_removes_every_row_of_the_conversation_and_leaves_a_tombstone(
    make_durable_store: StoreFactory,
) -> None:
    s = make_durable_store()
    await s.open()
    try:
        await fill(s, "c")
        await fill(s, "other")
        before = table_rows(s, "c")
        assert before == {**dict.fromkeys(before, 1), "events": 3, "tombstones": 0}
        assert await s.delete_conversation("c", "key-1", 50.0) is True
        assert table_rows(s, "c") == {**dict.fromkeys(table_rows(s, "c"), 0), "tombstones": 1}
        assert table_rows(s, "other")["events"] == 3 and table_rows(s, "other")["tombstones"] == 0
        assert await s.tombstone("c") == "key-1" and await s.tombstone("other") is None
        assert await s.conversation_owner("c") is None and await s.last_seq("c") == 0
    finally:
        await s.close()


async def test_every_write_after_a_delete_is_refused_and_writes_nothing(store: Store) -> None:
    await fill(store, "c")
    await store.delete_conversation("c", "key-1", 50.0)
    writes = [
        store.append_events("c", evs("c", 1, 1), [output()]),
        store.save_snapshot("c", 9, b"late"),
        store.save_snapshot("toolpool/c", 9, b"late"),
        store.remember_key("c", "m2", 200.0),
        store.record_tool_result("c", "t2.1.0", b"late"),
    ]
    for write in writes:
        with pytest.raises(Tombstoned):
            await write
    with pytest.raises(ConversationExists):  # a deleted id is never given out again
        await store.create_conversation("c", OWNER, "demo", 2.0)
    assert await store.read_events("c", 0) == [] and await store.load_snapshot("c") is None
    assert await store.load_snapshot("toolpool/c") is None and await store.round_outputs("c") == []
    assert await store.tool_result("c", "t2.1.0") is None


async def test_deleting_again_does_nothing_and_keeps_the_first_request_key(store: Store) -> None:
    await fill(store, "c")
    assert await store.delete_conversation("c", "key-1", 50.0) is True
    assert await store.delete_conversation("c", "key-2", 60.0) is False
    assert await store.tombstone("c") == "key-1"


async def test_writes_submitted_before_a_delete_commit_first_and_are_deleted_with_it(store: Store) -> None:
    await store.create_conversation("c", OWNER, "demo", 1.0)
    # Submitted in this order in one tick, as a conversation's last writes and its delete are.
    results = await asyncio.gather(
        store.append_events("c", evs("c", 1, 2), [output()]),
        store.save_snapshot("c", 2, b"snap"),
        store.remember_key("c", "m1", 100.0),
        store.delete_conversation("c", "key-1", 50.0),
        store.append_events("c", evs("c", 3, 3)),
        return_exceptions=True,
    )
    assert results[:4] == [None, None, True, True] and isinstance(results[4], Tombstoned)
    assert await store.read_events("c", 0) == [] and await store.load_snapshot("c") is None
    assert await store.round_outputs("c") == [] and await store.last_seq("c") == 0


async def test_a_delete_racing_another_processs_writes_leaves_nothing(make_durable_store: StoreFactory) -> None:
    writer, deleter = make_durable_store(), make_durable_store()   # two processes sharing one database
    await writer.open()
    await deleter.open()
    try:
        for i in range(8):
            cid = f"c{i}"
            await writer.create_conversation(cid, OWNER, "demo", 1.0)
            first = 1 + i % 2      # every other time the racing append is the log's first: no streams row yet
            if first > 1:
                await writer.append_events(cid, evs(cid, 1, 1))
            results = await asyncio.gather(
                writer.append_events(cid, evs(cid, first, 4), [output()]),
                writer.save_snapshot(cid, 4, b"snap"),
                deleter.delete_conversation(cid, "key", 50.0),
                writer.record_tool_result(cid, "t1.1.0", b"result"),
                return_exceptions=True,
            )
            assert results[2] is True
            assert all(r in (None, True) or isinstance(r, Tombstoned) for r in results), results
            assert {name: n for name, n in table_rows(deleter, cid).items() if n} == {"tombstones": 1}
    finally:
        await writer.close()
        await deleter.close()


# -- the conversation list (docs/design.md#conversation-list) ------------------------------------

BOB = Owner(tenant="other", sub="bob")


async def created(store: Store, owner: Owner, count: int, start: float = 1000.0) -> list[str]:
    """`count` conversations of `owner`, created one second apart; their ids, oldest first."""
    ids = [f"{owner.sub}-{i:03d}" for i in range(count)]
    for i, cid in enumerate(ids):
        await store.create_conversation(cid, owner, "demo", start + i)
    return ids


async def every_page(store: Store, owner: Owner | None, limit: int) -> list[list[str]]:
    """The ids of each page, following each page's last entry as the next position."""
    pages: list[list[str]] = []
    before = None
    while True:
        rows = await store.list_conversations(owner, limit, before)
        if not rows:
            return pages
        pages.append([row.entry.conversation_id for row in rows])
        before = (rows[-1].entry.last_active_at, rows[-1].entry.conversation_id)


async def test_a_new_conversation_is_listed_with_its_creation_as_its_last_activity(store: Store) -> None:
    await store.create_conversation("c", OWNER, "demo", 1234.5)
    [row] = await store.list_conversations(OWNER, 10)
    assert row.owner == OWNER
    assert row.entry == ConversationEntry(conversation_id="c", agent="demo", created_at=1234.5, last_active_at=1234.5,
                                          last_seq=0, title="", running=False)


async def test_the_list_pages_newest_first_with_no_duplicate_and_no_gap(store: Store) -> None:
    ids = await created(store, OWNER, 11)
    pages = await every_page(store, OWNER, 4)
    assert [len(p) for p in pages] == [4, 4, 3]
    assert [cid for page in pages for cid in page] == ids[::-1]


async def test_equal_activity_times_are_ordered_by_id_and_paged_through_all_the_same(store: Store) -> None:
    for cid in ("a", "b", "c", "d", "e"):
        await store.create_conversation(cid, OWNER, "demo", 50.0)
    pages = await every_page(store, OWNER, 2)
    assert pages == [["e", "d"], ["c", "b"], ["a"]]


async def test_a_list_holds_only_its_owners_conversations_whatever_the_position(store: Store) -> None:
    mine = await created(store, OWNER, 3)
    theirs = await created(store, BOB, 3, start=2000.0)   # newer than all of mine
    assert [cid for page in await every_page(store, OWNER, 2) for cid in page] == mine[::-1]
    assert [cid for page in await every_page(store, BOB, 2) for cid in page] == theirs[::-1]
    # a position taken from the other owner's newest conversation still shows only mine
    newest_of_bob = (await store.list_conversations(BOB, 1))[0].entry
    after = await store.list_conversations(OWNER, 10, (newest_of_bob.last_active_at, newest_of_bob.conversation_id))
    assert [row.entry.conversation_id for row in after] == mine[::-1]
    assert {row.owner for row in after} == {OWNER}


async def test_the_operators_list_holds_every_owners_conversations_newest_first(store: Store) -> None:
    mine = await created(store, OWNER, 3)
    theirs = await created(store, BOB, 2, start=1500.0)
    pages = await every_page(store, None, 2)
    assert [cid for page in pages for cid in page] == theirs[::-1] + mine[::-1]


async def test_activity_moves_a_conversation_to_the_top_and_never_back_in_time(store: Store) -> None:
    first, second = await created(store, OWNER, 2)
    await store.note_activity(first, running=True, at=5000.0)
    assert [r.entry.conversation_id for r in await store.list_conversations(OWNER, 10)] == [first, second]
    await store.note_activity(first, running=False, at=4000.0)   # a late note from an older moment
    await store.note_activity(second, running=False)              # no activity: only the flag
    [top, _] = await store.list_conversations(OWNER, 10)
    assert (top.entry.conversation_id, top.entry.last_active_at, top.entry.running) == (first, 5000.0, False)


async def test_a_title_is_set_once_and_running_follows_each_note(store: Store) -> None:
    [cid] = await created(store, OWNER, 1)
    await store.note_activity(cid, running=True, at=2000.0, title="weather in Paris?")
    assert (await store.list_conversations(OWNER, 1))[0].entry.running is True
    await store.note_activity(cid, running=False, at=2001.0, title="a later message")
    entry = (await store.list_conversations(OWNER, 1))[0].entry
    assert (entry.title, entry.running) == ("weather in Paris?", False)


async def test_a_listed_conversation_shows_its_last_seq(store: Store) -> None:
    await store.create_conversation("c", OWNER, "demo", 1.0)
    await store.append_events("c", evs("c", 1, 7))
    assert (await store.list_conversations(OWNER, 1))[0].entry.last_seq == 7


async def test_a_deleted_conversation_is_never_listed_and_a_note_does_not_bring_it_back(store: Store) -> None:
    kept, gone = await created(store, OWNER, 2)
    assert await store.delete_conversation(gone, "key", 3000.0) is True
    await store.note_activity(gone, running=True, at=4000.0, title="late")
    assert [r.entry.conversation_id for r in await store.list_conversations(OWNER, 10)] == [kept]
    assert [r.entry.conversation_id for r in await store.list_conversations(None, 10)] == [kept]


def _drop_the_list(store: Store) -> None:
    """Make the backing database what a store created before the conversation list existed."""
    if isinstance(store, SqliteStore):
        with sqlite3.connect(store.path) as conn:
            conn.execute("DROP TABLE conversation_list")
        return
    assert isinstance(store, PostgresStore) and store.schema is not None
    with psycopg.connect(store.dsn, autocommit=True) as conn:
        conn.execute(f'DROP TABLE "{store.schema}".conversation_list')


async def test_a_database_created_before_the_list_lists_its_conversations_when_opened(
    make_durable_store: StoreFactory,
) -> None:
    s = make_durable_store()
    await s.open()
    await s.create_conversation("quiet", OWNER, "demo", 10.0)
    await s.create_conversation("talked", OWNER, "demo", 5.0)
    await s.append_events("talked", evs("talked", 1, 2))     # its last event: 1700000002.0
    await s.close()
    _drop_the_list(s)

    s = make_durable_store()
    await s.open()
    try:
        entries = [r.entry for r in await s.list_conversations(OWNER, 10)]
        assert [(e.conversation_id, e.last_active_at, e.last_seq, e.title) for e in entries] == [
            ("talked", 1700000002.0, 2, ""), ("quiet", 10.0, 0, "")]
        await s.create_conversation("new", OWNER, "demo", 1800000000.0)   # and the list goes on
        assert (await s.list_conversations(OWNER, 1))[0].entry.conversation_id == "new"
    finally:
        await s.close()


def _events_without_rowid(path: Path) -> bool:
    with sqlite3.connect(path) as conn:
        (ddl,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'events'").fetchone()
    return "WITHOUT ROWID" in ddl.upper()


async def test_a_new_sqlite_store_keeps_events_in_rowid_order(tmp_path: Path) -> None:
    # actors/store/schema.py: a batch interleaves many conversations' appends; rows in rowid order
    # fill the table's last pages instead of a leaf page each.
    s = SqliteStore(tmp_path / "store.db")
    await s.open()
    await s.close()
    assert not _events_without_rowid(tmp_path / "store.db")


async def test_a_sqlite_store_made_with_events_without_rowid_reads_and_appends_the_same(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with sqlite3.connect(path) as conn:   # the events table as stores made before it was a rowid table
        conn.execute("CREATE TABLE events (conversation_id TEXT NOT NULL, seq INTEGER NOT NULL, event TEXT NOT NULL,"
                     " data BLOB NOT NULL, ts REAL NOT NULL, PRIMARY KEY (conversation_id, seq)) WITHOUT ROWID")
    s = SqliteStore(path)
    await s.open()
    try:
        await s.create_conversation("c", OWNER, "demo", 1.0)
        await s.append_events("c", evs("c", 1, 3))
        with pytest.raises(SeqConflict):
            await s.append_events("c", evs("c", 3, 3))   # a seq is never taken twice
        await s.append_events("c", evs("c", 4, 5))
        assert [e.seq for e in await s.read_events("c", 2, 10)] == [3, 4, 5]
        assert await s.last_seq("c") == 5
    finally:
        await s.close()
    assert _events_without_rowid(path)   # kept as it was made


# -- lifecycle ----------------------------------------------------------------------------------


async def test_reopened_store_has_everything(make_durable_store: StoreFactory) -> None:
    owner = Owner(tenant="acme", sub="alice")
    s = make_durable_store()
    await s.open()
    await s.create_conversation("c", owner, "demo", 1.0)
    await s.append_events("c", evs("c", 1, 3))
    await s.save_snapshot("c", 3, b"snap")
    await s.remember_key("c", "msg-1", 100.0)
    await s.record_tool_result("c", "call-1", b"result")
    await s.append_events("c", evs("c", 4, 4), [output()])
    await s.close()

    s = make_durable_store()
    await s.open()
    try:
        assert await s.conversation_owner("c") == (owner, "demo")
        assert await s.read_events("c", 0) == evs("c", 1, 4)
        assert await s.last_seq("c") == 4
        assert await s.load_snapshot("c") == (3, b"snap")
        assert await s.remember_key("c", "msg-1", 200.0) is False
        assert await s.tool_result("c", "call-1") == b"result"
        assert await s.round_outputs("c") == [output()]
        await s.append_events("c", evs("c", 5, 5))       # the log goes on where it stopped
    finally:
        await s.close()


async def test_close_commits_writes_already_queued(make_durable_store: StoreFactory) -> None:
    s = make_durable_store()
    await s.open()
    appends = [asyncio.create_task(s.append_events(f"c{i}", evs(f"c{i}", 1, 2))) for i in range(10)]
    await asyncio.sleep(0)            # queued, not yet committed
    await s.close()
    await asyncio.gather(*appends)

    s = make_durable_store()
    await s.open()
    try:
        assert [await s.last_seq(f"c{i}") for i in range(10)] == [2] * 10
    finally:
        await s.close()


async def test_writes_to_a_closed_store_raise_store_closed(make_store: StoreFactory) -> None:
    s = make_store()
    await s.open()
    await s.close()
    with pytest.raises(StoreClosed):
        await s.append_events("c", evs("c", 1, 1))
    with pytest.raises(StoreClosed):
        await s.read_events("c", 0)


# -- store outages: a pause, not a death (docs/design.md#store-outage) ---------------------------------


def _sqlite_error(run: Callable[[sqlite3.Connection, sqlite3.Connection], object], path: Path) -> sqlite3.Error:
    """The error sqlite3 itself raises when `run` meets it, on a WAL database at `path`."""
    first = sqlite3.connect(path, isolation_level=None, timeout=0)
    second = sqlite3.connect(path, isolation_level=None, timeout=0)
    first.execute("PRAGMA journal_mode = WAL")
    first.execute("CREATE TABLE IF NOT EXISTS t (x BLOB PRIMARY KEY)")
    try:
        run(first, second)
    except sqlite3.Error as exc:
        return exc
    finally:
        first.close()
        second.close()
    raise AssertionError("no error")


def _full(first: sqlite3.Connection, _: sqlite3.Connection) -> None:
    pages = first.execute("PRAGMA page_count").fetchone()[0]
    first.execute(f"PRAGMA max_page_count = {pages}")  # the file may not grow: as a full disk
    first.execute("INSERT INTO t VALUES (?)", (b"x" * 100_000,))


def _locked(first: sqlite3.Connection, second: sqlite3.Connection) -> None:
    first.execute("BEGIN IMMEDIATE")                  # holds the write lock past the other's timeout
    second.execute("BEGIN IMMEDIATE")


def _duplicate(first: sqlite3.Connection, _: sqlite3.Connection) -> None:
    first.execute("INSERT INTO t VALUES (x'01')")
    first.execute("INSERT INTO t VALUES (x'01')")


def _no_table(first: sqlite3.Connection, _: sqlite3.Connection) -> None:
    first.execute("SELECT * FROM missing")


def test_sqlite_errors_that_are_outages_and_those_that_are_not(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    assert sqlite_outage(_sqlite_error(_full, path)) == "disk full"           # SQLITE_FULL
    assert sqlite_outage(_sqlite_error(_locked, path)) == "database locked"   # SQLITE_BUSY past the timeout
    assert sqlite_outage(_sqlite_error(_duplicate, path)) is None            # a constraint: a bug, not an outage
    assert sqlite_outage(_sqlite_error(_no_table, path)) is None
    io_error = sqlite3.OperationalError("disk I/O error")
    assert sqlite_outage(io_error) == "disk I/O error"                        # by its words, without a code
    io_error.sqlite_errorcode = 10 | 3 << 8                                   # SQLITE_IOERR_WRITE
    assert sqlite_outage(io_error) == "disk I/O error"
    closed = sqlite3.connect(":memory:")
    closed.close()
    with pytest.raises(sqlite3.ProgrammingError) as raised:
        closed.execute("SELECT 1")
    assert sqlite_outage(raised.value) is None                                # our own misuse: a bug
    assert sqlite_outage(OSError("no space")) is None


def test_postgres_errors_that_are_outages_and_those_that_are_not() -> None:
    errors = psycopg.errors
    assert postgres_outage(errors.AdminShutdown("terminating connection")) == "server shutting down"
    assert postgres_outage(errors.CannotConnectNow("starting up")) == "server starting up"
    assert postgres_outage(errors.ReadOnlySqlTransaction("read-only")) == "read-only server (failover)"
    assert postgres_outage(errors.ConnectionFailure("x")) == "connection lost"
    assert postgres_outage(errors.DiskFull("x")) == "server disk full"
    assert postgres_outage(psycopg.OperationalError("connection refused")) == "cannot reach the server"
    assert postgres_outage(psycopg.InterfaceError("the connection is closed")) == "connection lost"
    assert postgres_outage(errors.SerializationFailure("x")) is None           # a conflict, not an outage
    assert postgres_outage(errors.QueryCanceled("x")) is None
    assert postgres_outage(errors.UniqueViolation("x")) is None
    assert postgres_outage(errors.UniqueViolation("x"), broken=True) == "connection lost"
    # What a log line says of it: never the client's message, which may name the host and the user.
    assert postgres_detail(psycopg.OperationalError('connection to server at "db" failed, user "app"')) == "OperationalError"


async def test_a_store_reports_its_health_and_counters(store: Store) -> None:
    assert store.health() == StoreHealth(True)
    counted = store.counters()
    assert {"commits", "outages", "unavailable", "retried_batches", "recognised_commits", "logs_given_up"} <= set(counted)
    assert all(isinstance(value, float) for value in counted.values())


async def test_an_append_retried_after_it_had_committed_is_recognised(store: Store) -> None:
    # The store committed, and the answer was lost (the connection died in between): the log's retry
    # meets SeqConflict, reads the store back, finds its own batch, and writes nothing twice.
    lost = [True]

    async def persist(batch: Sequence[Event], outputs: Sequence[RoundOutput]) -> None:
        await store.append_events("c", batch, outputs)
        if lost.pop() if lost else False:
            raise StoreUnavailable("connection lost")

    log = EventLog("c", flush_interval_ms=0, persist=persist,
                   read_back=lambda after, limit: store.read_events("c", after, limit))
    published: list[Event] = []
    log.subscribe(published.extend)
    log.emit(ThinkingDelta(turn_id="t1", round=1, text="é€😀"))
    log.attach(output())
    log.emit(ToolResult(turn_id="t1", call_id="t1.1.0", tool_id="demo.x", ok=True, duration_ms=3,
                        result={"temp_c": 12.5, "nested": [1, None, "x"]}))
    await log.flush()
    log.emit(ThinkingDelta(turn_id="t1", round=2, text="next"))
    await log.flush()
    stored = await store.read_events("c", 0)
    assert [e.seq for e in stored] == [1, 2, 3] and stored == published
    assert await store.round_outputs("c") == [output()]
    await log.close()


async def test_a_retry_that_meets_another_writers_append_fails(make_durable_store: StoreFactory) -> None:
    s, other = make_durable_store(), make_durable_store()
    await s.open()
    await other.open()
    try:
        down = asyncio.Event()

        async def persist(batch: Sequence[Event], outputs: Sequence[RoundOutput]) -> None:
            if not down.is_set():
                down.set()
                raise StoreUnavailable("connection lost")
            await s.append_events("c", batch, outputs)

        log = EventLog("c", flush_interval_ms=0, persist=persist,
                       read_back=lambda after, limit: s.read_events("c", after, limit))
        log.emit(ThinkingDelta(turn_id="t1", round=1, text="mine"))
        await down.wait()
        await other.append_events("c", evs("c", 1, 1))   # a stale activation elsewhere took seq 1
        with pytest.raises(EventLogStopped) as stopped:
            await log.flush()
        assert isinstance(stopped.value.__cause__, SeqConflict)
        assert await s.read_events("c", 0) == evs("c", 1, 1)
    finally:
        await s.close()
        await other.close()


async def _on_writer(store: SqliteStore, statement: str) -> None:
    assert store._writer is not None
    writer = store._writer
    await store._on_writer(lambda: writer.execute(statement))


async def test_sqlite_full_disk_is_an_outage_and_the_next_write_goes_through(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    s = SqliteStore(tmp_path / "store.db")
    await s.open()
    try:
        await s.append_events("c", evs("c", 1, 1))
        pages = (await s._read(lambda conn: conn.execute("PRAGMA page_count").fetchone()))[0]
        await _on_writer(s, f"PRAGMA max_page_count = {pages}")   # the file may not grow: a full disk
        big = [Event.of("c", seq, ThinkingDelta(turn_id="t1", round=1, text="x" * 50_000), 1.0) for seq in (2, 3)]
        with caplog.at_level(logging.INFO, logger="reactgate.store"), pytest.raises(StoreUnavailable) as raised:
            await s.append_events("c", big)
        assert raised.value.cause == "disk full" and isinstance(raised.value.__cause__, sqlite3.OperationalError)
        health = s.health()
        assert (health.ok, health.cause) == (False, "disk full") and health.since is not None
        assert await s.read_events("c", 0) == evs("c", 1, 1)      # reads go on; nothing of it was written
        assert not s.health().ok                                 # a read does not end a write outage
        with caplog.at_level(logging.INFO, logger="reactgate.store"):
            await s.append_events("c", big)                      # a new write connection: the file may grow again
        assert [e.seq for e in await s.read_events("c", 0)] == [1, 2, 3]
        assert s.health() == StoreHealth(True)
        assert (s.stats.outages, s.stats.reconnects) == (1, 1)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and warnings[0].startswith("the disk is full: database or disk is full")
        assert warnings[0].endswith("the conversation waits until space is freed")
        assert [r.getMessage() for r in caplog.records if r.levelno == logging.INFO][-1].startswith("store available again")
    finally:
        await s.close()


async def test_sqlite_lock_held_too_long_is_an_outage_and_health_recovers_by_itself(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path / "store.db", busy_timeout_ms=50)
    await s.open()
    holder = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")                        # another process holds the write lock
        with pytest.raises(StoreUnavailable) as raised:
            await s.append_events("c", evs("c", 1, 1))
        assert raised.value.cause == "database locked" and not s.health().ok
        holder.execute("ROLLBACK")
        async with asyncio.timeout(10):                          # no other call: the store looks by itself
            while not s.health().ok:
                await asyncio.sleep(0.05)
        await s.append_events("c", evs("c", 1, 1))
        assert await s.last_seq("c") == 1
    finally:
        holder.close()
        await s.close()


@pytest.fixture
async def pg_store(postgres_dsn: str) -> AsyncIterator[PostgresStore]:
    schema = f"test_outage_{uuid.uuid4().hex[:12]}"
    s = PostgresStore(postgres_dsn, schema=schema)
    await s.open()
    yield s
    await s.close()
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _terminate(dsn: str, pids: set[int]) -> None:
    with psycopg.connect(dsn, autocommit=True) as admin:
        for pid in pids:
            assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)


@pytest.mark.postgres
async def test_postgres_writer_killed_is_an_outage_and_the_next_write_reconnects(
    pg_store: PostgresStore, postgres_dsn: str,
) -> None:
    await pg_store.append_events("c", evs("c", 1, 1))
    assert pg_store._writer is not None
    await asyncio.to_thread(_terminate, postgres_dsn, {pg_store._writer.info.backend_pid})
    with pytest.raises(StoreUnavailable) as raised:
        await pg_store.append_events("c", evs("c", 2, 2))
    assert raised.value.cause in ("server shutting down", "connection lost", "cannot reach the server")
    assert postgres_dsn not in str(raised.value)
    assert not pg_store.health().ok and pg_store.health().cause == raised.value.cause
    await pg_store.append_events("c", evs("c", 2, 2))            # a new connection
    assert await pg_store.read_events("c", 0) == evs("c", 1, 2)
    assert pg_store.health() == StoreHealth(True)
    assert pg_store.stats.outages == 1 and pg_store.stats.reconnects >= 1


@pytest.mark.postgres
async def test_postgres_readers_killed_are_an_outage_and_the_next_read_reconnects(
    pg_store: PostgresStore, postgres_dsn: str,
) -> None:
    await pg_store.append_events("c", evs("c", 1, 3))
    await asyncio.gather(*(pg_store.read_events("c", 0) for _ in range(4)))   # every reader connected
    pids = {conn.info.backend_pid for conn in pg_store._reader_conns}
    await asyncio.to_thread(_terminate, postgres_dsn, pids)
    failures = 0
    for _ in range(len(pids)):                                  # each killed reader fails once, then reconnects
        try:
            await pg_store.read_events("c", 0)
        except StoreUnavailable:
            failures += 1
    assert failures >= 1
    assert await pg_store.read_events("c", 0) == evs("c", 1, 3)
    assert await pg_store.last_seq("c") == 3
    assert pg_store.health() == StoreHealth(True)


@pytest.mark.postgres
async def test_postgres_a_log_goes_on_after_its_stores_writer_was_killed(
    pg_store: PostgresStore, postgres_dsn: str,
) -> None:
    # The append the kill refused is tried again by the log on a new connection, and commits: seqs
    # stay contiguous, and every event is published once.
    log = EventLog("c", flush_interval_ms=0,
                   persist=lambda batch, outputs: pg_store.append_events("c", batch, outputs),
                   read_back=lambda after, limit: pg_store.read_events("c", after, limit))
    published: list[Event] = []
    log.subscribe(published.extend)
    log.emit(ThinkingDelta(turn_id="t1", round=1, text="a"))
    await log.flush()
    assert pg_store._writer is not None
    await asyncio.to_thread(_terminate, postgres_dsn, {pg_store._writer.info.backend_pid})
    log.emit(ThinkingDelta(turn_id="t1", round=1, text="b"))
    log.emit(ThinkingDelta(turn_id="t1", round=1, text="c"))
    await log.flush()
    assert [e.seq for e in await pg_store.read_events("c", 0)] == [1, 2, 3] == [e.seq for e in published]
    assert EVENTLOG_STATS.retried_batches >= 1


# -- URLs ---------------------------------------------------------------------------------------


def test_sqlite_url_names_a_file(tmp_path: Path) -> None:
    s = store_from_url(f"sqlite:///{tmp_path}/x.db")
    assert isinstance(s, SqliteStore) and s.path == f"{tmp_path}/x.db"


def test_sqlite_url_relative_path() -> None:
    s = store_from_url("sqlite:///data/x.db")
    assert isinstance(s, SqliteStore) and s.path == "data/x.db"


def test_sqlite_url_durability_option(tmp_path: Path) -> None:
    s = store_from_url(f"sqlite:///{tmp_path}/x.db?synchronous=normal")
    assert isinstance(s, SqliteStore) and (s.path, s.synchronous) == (f"{tmp_path}/x.db", "NORMAL")
    default = store_from_url(f"sqlite:///{tmp_path}/x.db")
    assert isinstance(default, SqliteStore) and default.synchronous == "FULL"


def test_sqlite_memory_url() -> None:
    s = store_from_url("sqlite://:memory:")
    assert isinstance(s, SqliteStore) and s.path == ":memory:"


def test_postgres_url_with_schema() -> None:
    s = store_from_url("postgresql://u@db:5432/app?schema=tenant_a&sslmode=disable")
    assert isinstance(s, PostgresStore)
    assert (s.dsn, s.schema) == ("postgresql://u@db:5432/app?sslmode=disable", "tenant_a")


def test_the_append_interval_in_a_store_url(tmp_path: Path) -> None:
    sqlite = store_from_url(f"sqlite:///{tmp_path}/x.db?append_interval_ms=0&synchronous=NORMAL")
    assert isinstance(sqlite, SqliteStore) and sqlite._group._append_interval_s == 0
    postgres = store_from_url("postgresql://u@db:5432/app?append_interval_ms=2.5&sslmode=disable")
    assert isinstance(postgres, PostgresStore) and postgres._group._append_interval_s == 0.0025
    assert postgres.dsn == "postgresql://u@db:5432/app?sslmode=disable"
    default = store_from_url(f"sqlite:///{tmp_path}/x.db")
    assert isinstance(default, SqliteStore) and default._group._append_interval_s == APPEND_INTERVAL_S


@pytest.mark.parametrize(
    "url", ["redis://x", "sqlite://", "sqlite:///", "nothing", "sqlite:///x.db?synchronous=OFF", "sqlite:///x.db?mode=ro",
            "sqlite:///x.db?append_interval_ms=-1", "sqlite:///x.db?append_interval_ms=soon",
            "postgresql://u@db/app?append_interval_ms=5000"]
)
def test_unknown_store_url_is_rejected(url: str) -> None:
    with pytest.raises(ValueError):
        store_from_url(url)


def test_every_backend_implements_the_store_protocol(make_store: StoreFactory) -> None:
    assert isinstance(make_store(), Store)


async def test_open_store_opens_it_creating_missing_directories(tmp_path: Path) -> None:
    from actors.store import open_store

    s = await open_store(f"sqlite:///{tmp_path}/data/deeper/x.db")
    try:
        await s.append_events("c", evs("c", 1, 1))
        assert await s.last_seq("c") == 1
    finally:
        await s.close()
