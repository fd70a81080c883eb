"""The embedded store: one SQLite file in WAL mode, written with group commit (docs/design.md#store).

Durability choice. In WAL mode a commit appends the transaction to the -wal file; with
`synchronous=NORMAL` that write reaches the OS page cache but is not fsynced, which survives the
process being SIGKILLed (the kernel still writes the file) but can lose the last commits on an OS
crash or power cut. `synchronous=FULL` fsyncs the WAL on every commit, which also survives those.
Group commit pays one fsync per batch, not per append, so the default is FULL: an event a client
saw is never lost, even to a power cut. NORMAL is there for hosts that accept that trade.

Threads. The sqlite3 module releases the GIL while SQLite works, so the hot path — a batch of
appends — runs as one call on a dedicated writer thread holding the only write connection (one
thread hop per batch, measured faster than aiosqlite's hop per statement). Each statement still
releases and takes back the GIL, and a busy event loop hands it back only at its switch interval:
adjacent appends are therefore written together, one statement per table (`_append_run`). Reads
run on a small pool of reader threads, each with its own connection: WAL lets them read while the
writer commits.

Outages (docs/design.md#store-outage). A full disk, a lock held past `busy_timeout_ms` and an I/O
error are a pause, not a failure: they are raised as `StoreUnavailable` (`sqlite_outage` says which
errors), a batch that meets one is rolled back whole, and the connection that saw it is made again
at its next use (never that of `:memory:`, which is the database). While it lasts, `health()` says
so and the store looks by itself whether it is back (`Prober`); a full disk is back once its file
system has room again.

The schema and the SQL are shared with the PostgreSQL store: actors/store/schema.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from actors.identity import Owner
from actors.quotas import QuotaCharge, QuotaCounter
from actors.store.base import (
    APPEND_INTERVAL_S,
    DEFAULT_READ_LIMIT,
    ConversationExists,
    GroupCommit,
    ListedConversation,
    Outcome,
    QuotaRefused,
    RoundOutput,
    StoreClosed,
    StoreHealth,
    StoreStats,
    StoreUnavailable,
    Tombstoned,
    check_append,
    decode_event,
    decode_output,
    encode_event_data,
    judge_appends,
    listed,
    output_row,
    snapshot_keys,
    snapshot_owner,
)
from actors.store.outage import DISK_FULL, HealthTracker, Prober, counters, sqlite_outage
from actors.store.schema import SQLITE_SQL as SQL
from protocol.events import Event
from protocol.frames import Cursor

T = TypeVar("T")
WriteOp = Callable[[sqlite3.Connection], Any]

MEMORY = ":memory:"
ROOM_NEEDED = 1 << 20   # a full disk is back once its file system has this much room (bytes)


class SqliteStore:
    """`Store` on one SQLite file (or `:memory:`, which keeps one connection for everything)."""

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: Literal["NORMAL", "FULL"] = "FULL",
        busy_timeout_ms: int = 5000,
        max_batch: int = 512,
        append_interval_s: float = APPEND_INTERVAL_S,
        readers: int = 2,
    ) -> None:
        self.path = str(path)
        self.synchronous = synchronous
        self.busy_timeout_ms = busy_timeout_ms
        self.stats = StoreStats()
        self._readers = readers
        self._group: GroupCommit[WriteOp] = GroupCommit(
            self._commit_batch, self.stats, max_batch=max_batch, append_interval_s=append_interval_s
        )
        self._writer_pool: ThreadPoolExecutor | None = None
        self._reader_pool: ThreadPoolExecutor | None = None
        self._writer: sqlite3.Connection | None = None
        self._reader_conns: list[sqlite3.Connection] = []
        self._reader_local = threading.local()
        self._reader_lock = threading.Lock()
        self._writer_stale = False    # an outage spoiled the write connection: made again at next use
        self._health = HealthTracker(self.stats)
        self._prober = Prober(self._health, self._probe)

    # -- lifecycle --------------------------------------------------------------------------

    async def open(self) -> None:
        if self._writer is not None:
            return
        if self.path != MEMORY:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._writer_pool = ThreadPoolExecutor(1, thread_name_prefix="sqlite-writer")
        self._writer = await self._on_writer(self._connect_writer)
        if self.path == MEMORY:
            self._reader_pool = self._writer_pool      # one connection: a second would be another db
        else:
            self._reader_pool = ThreadPoolExecutor(self._readers, thread_name_prefix="sqlite-reader")
        self._group.start()

    async def close(self) -> None:
        if self._writer is None:
            return
        await self._prober.stop()
        await self._group.stop()
        writer, self._writer = self._writer, None
        await self._on_writer(writer.close)
        assert self._writer_pool is not None and self._reader_pool is not None
        if self._reader_pool is not self._writer_pool:
            self._reader_pool.shutdown(wait=True)
        self._writer_pool.shutdown(wait=True)
        with self._reader_lock:
            for conn in self._reader_conns:
                conn.close()
            self._reader_conns.clear()
        self._reader_local = threading.local()
        self._writer_pool = self._reader_pool = None

    def health(self) -> StoreHealth:
        return self._health.health()

    def counters(self) -> dict[str, float]:
        return counters(self.stats)

    async def __aenter__(self) -> SqliteStore:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE ... COMMIT per batch).
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
        return conn

    def _connect_writer(self) -> sqlite3.Connection:
        conn = self._connect()
        if self.path != MEMORY:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise RuntimeError(f"SQLite at {self.path} refused WAL mode (got {mode})")
        conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        listing = conn.execute(SQL.has_list).fetchone() is not None
        conn.executescript(SQL.schema)
        if not listing:  # a database older than the conversation list (docs/design.md#conversation-list)
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(SQL.fill_list)
            conn.execute("COMMIT")
        return conn

    def _reader(self) -> sqlite3.Connection:
        if self.path == MEMORY:
            assert self._writer is not None
            return self._writer
        conn: sqlite3.Connection | None = getattr(self._reader_local, "conn", None)
        if conn is None:
            conn = self._connect()
            conn.execute("PRAGMA query_only = ON")
            self._reader_local.conn = conn
            with self._reader_lock:
                self._reader_conns.append(conn)
        return conn

    def _read_sync(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._reader()
        try:
            return fn(conn)
        except sqlite3.Error as exc:
            if self.path != MEMORY and sqlite_outage(exc) is not None:
                # This thread's connection saw an outage: the next read here makes a new one.
                self._reader_local.conn = None
                with self._reader_lock:
                    if conn in self._reader_conns:
                        self._reader_conns.remove(conn)
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
                self.stats.reconnects += 1
            raise

    async def _on_writer(self, fn: Callable[[], T]) -> T:
        assert self._writer_pool is not None
        return await asyncio.get_running_loop().run_in_executor(self._writer_pool, fn)

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._reader_pool is None:
            raise StoreClosed("store is not open")
        try:
            value = await asyncio.get_running_loop().run_in_executor(
                self._reader_pool, functools.partial(self._read_sync, fn)
            )
        except sqlite3.Error as exc:
            unavailable = self._unavailable(exc, write=False)
            if unavailable is None:
                raise
            raise unavailable from exc
        self._health.succeeded(write=False)
        return value

    async def _write(self, op: WriteOp, *, kind: str = "write", events: int = 0) -> Any:
        """`op` through the group commit; an outage an op met on its own is raised as one, too."""
        try:
            return await self._group.submit(op, kind=kind, events=events)
        except sqlite3.Error as exc:
            unavailable = self._unavailable(exc, write=True)
            if unavailable is None:
                raise
            raise unavailable from exc

    # -- outages (docs/design.md#store-outage) -------------------------------------------------

    def _unavailable(self, exc: sqlite3.Error, *, write: bool) -> StoreUnavailable | None:
        """StoreUnavailable (caused by `exc`) when `exc` is an outage — noted, and the write
        connection made again at its next use; None when it is not."""
        cause = sqlite_outage(exc)
        if cause is None:
            return None
        unavailable = StoreUnavailable(cause)
        unavailable.__cause__ = exc
        detail = f"{exc} ({self.path})" if cause == DISK_FULL else f"{exc}"
        if self._health.failed(unavailable, write=write, detail=detail):
            self._prober.start()
        if write and self.path != MEMORY:
            self._writer_stale = True
        return unavailable

    async def _probe(self) -> None:
        """A write when writes failed (an empty transaction: it takes the write lock), else a read."""
        if self._health.write_outage:
            await self._write(functools.partial(_probe_write, self.path, self._health.health().cause == DISK_FULL))
        else:
            await self._read(lambda conn: conn.execute("SELECT 1").fetchone())

    # -- group commit -----------------------------------------------------------------------

    async def _commit_batch(self, ops: list[WriteOp]) -> list[Outcome]:
        try:
            outcomes = await self._on_writer(functools.partial(self._commit_batch_sync, ops))
        except sqlite3.Error as exc:
            unavailable = self._unavailable(exc, write=True)
            if unavailable is None:
                raise
            raise unavailable from exc
        self._health.succeeded(write=True)
        return outcomes

    def _write_connection(self) -> sqlite3.Connection:
        conn = self._writer
        if conn is None:
            raise StoreClosed("store is not open")
        if self._writer_stale:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
            self._writer = conn = self._connect_writer()  # raises while the outage lasts: stale still
            self._writer_stale = False
            self.stats.reconnects += 1
        return conn

    def _commit_batch_sync(self, ops: list[WriteOp]) -> list[Outcome]:
        """One transaction for the batch. Ops run bare first (two statements fewer per op than a
        savepoint each); if one fails, the transaction is rolled back and the batch runs again with
        a savepoint per op, so one op that fails leaves no trace and fails only its caller. Nothing
        is committed before either run finished, and callers learn outcomes only after the commit.
        An op that meets an outage (a full disk, ...) fails the whole batch: so would all the others."""
        conn = self._write_connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            outcomes: list[Outcome] = []
            failure: Exception | None = None
            try:
                for run in _runs(ops):
                    if isinstance(run, list):
                        outcomes.extend(_append_run(run, conn))
                    else:
                        outcomes.append(Outcome(value=run(conn)))
            except Exception as exc:
                failure = exc
            if isinstance(failure, sqlite3.Error) and sqlite_outage(failure) is not None:
                raise failure
            if failure is not None:
                conn.execute("ROLLBACK")
                if len(ops) == 1:
                    return [Outcome(error=failure)]   # the rollback was its savepoint: nothing to commit
                conn.execute("BEGIN IMMEDIATE")
                outcomes = [self._run_isolated(conn, op) for op in ops]
            conn.execute("COMMIT")
            self.stats.commits += 1
        except BaseException:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):  # the error that got here is the one to tell
                    conn.execute("ROLLBACK")
            raise
        return outcomes

    @staticmethod
    def _run_isolated(conn: sqlite3.Connection, op: WriteOp) -> Outcome:
        conn.execute("SAVEPOINT op")
        try:
            value = op(conn)
        except Exception as exc:
            conn.execute("ROLLBACK TO op")
            conn.execute("RELEASE op")
            return Outcome(error=exc)
        conn.execute("RELEASE op")
        return Outcome(value=value)

    # -- conversations ----------------------------------------------------------------------

    async def create_conversation(
        self, conversation_id: str, owner: Owner, agent: str, created_at: float
    ) -> None:
        await self._write(
            functools.partial(_create_conversation, conversation_id, owner, agent, created_at)
        )

    async def conversation_owner(self, conversation_id: str) -> tuple[Owner, str] | None:
        def read(conn: sqlite3.Connection) -> tuple[Owner, str] | None:
            row = conn.execute(SQL.conversation_owner, (conversation_id,)).fetchone()
            return None if row is None else (Owner(tenant=row[0], sub=row[1]), row[2])

        return await self._read(read)

    # -- the conversation list (docs/design.md#conversation-list) ------------------------------

    async def note_activity(self, conversation_id: str, *, running: bool, at: float | None = None,
                            title: str = "") -> None:
        when = at if at is not None else float("-inf")
        await self._write(functools.partial(_note_activity, (int(running), when, when, title, conversation_id)))

    async def list_conversations(self, owner: Owner | None, limit: int, before: Cursor | None = None) -> list[ListedConversation]:
        statement, args = SQL.list_page(owner, limit, before)

        def read(conn: sqlite3.Connection) -> list[ListedConversation]:
            return [listed(*row) for row in conn.execute(statement, args).fetchall()]

        return await self._read(read)

    # -- events -----------------------------------------------------------------------------

    async def append_events(
        self, conversation_id: str, events: Sequence[Event], outputs: Sequence[RoundOutput] = ()
    ) -> None:
        if not events:
            return
        check_append(conversation_id, events)
        rows = [(conversation_id, e.seq, e.event, encode_event_data(e), e.ts) for e in events]
        output_rows = [output_row(conversation_id, events[-1].seq, o) for o in outputs]
        await self._write(_Append(conversation_id, rows, output_rows), kind="append", events=len(rows))

    async def read_events(
        self, conversation_id: str, after_seq: int, limit: int = DEFAULT_READ_LIMIT
    ) -> list[Event]:
        if limit <= 0:
            return []
        def read(conn: sqlite3.Connection) -> list[Event]:
            rows = conn.execute(SQL.read_events, (conversation_id, after_seq, limit)).fetchall()
            return [decode_event(conversation_id, *row) for row in rows]

        return await self._read(read)

    async def last_seq(self, conversation_id: str) -> int:
        return await self._read(functools.partial(_last_seq, conversation_id))

    # -- snapshots --------------------------------------------------------------------------

    async def save_snapshot(self, conversation_id: str, seq: int, data: bytes) -> None:
        await self._write(functools.partial(_save_snapshot, conversation_id, seq, bytes(data)))

    async def load_snapshot(self, conversation_id: str) -> tuple[int, bytes] | None:
        def read(conn: sqlite3.Connection) -> tuple[int, bytes] | None:
            row = conn.execute(SQL.load_snapshot, (conversation_id,)).fetchone()
            return None if row is None else (row[0], bytes(row[1]))

        return await self._read(read)

    # -- idempotency keys -------------------------------------------------------------------

    async def remember_key(self, conversation_id: str, key: str, now: float) -> bool:
        return bool(await self._write(functools.partial(_remember_key, conversation_id, key, now)))

    async def prune_keys(self, older_than: float) -> int:
        return int(await self._write(functools.partial(_prune_keys, older_than)))

    async def forget_key(self, conversation_id: str, key: str) -> None:
        await self._write(functools.partial(_forget_key, conversation_id, key))

    # -- tool results -----------------------------------------------------------------------

    async def record_tool_result(self, conversation_id: str, call_id: str, payload: bytes) -> bool:
        return bool(
            await self._write(
                functools.partial(_record_tool_result, conversation_id, call_id, bytes(payload))
            )
        )

    async def tool_result(self, conversation_id: str, call_id: str) -> bytes | None:
        def read(conn: sqlite3.Connection) -> bytes | None:
            row = conn.execute(SQL.tool_result, (conversation_id, call_id)).fetchone()
            return None if row is None else bytes(row[0])

        return await self._read(read)

    # -- round outputs (docs/design.md#replay) -----------------------------------------------

    async def round_outputs(self, conversation_id: str) -> list[RoundOutput]:
        def read(conn: sqlite3.Connection) -> list[RoundOutput]:
            rows = conn.execute(SQL.read_round_outputs, (conversation_id,)).fetchall()
            return [decode_output(*row) for row in rows]

        return await self._read(read)

    # -- quota counters (docs/design.md#quotas) ------------------------------------------------

    async def charge_quota(self, charges: Sequence[QuotaCharge]) -> int | None:
        try:
            await self._write(functools.partial(_charge_quota, list(charges)))
        except QuotaRefused as refused:
            return refused.index
        return None

    async def release_quota(self, holder: QuotaCounter | None, releases: Sequence[QuotaCharge]) -> bool:
        return bool(await self._write(functools.partial(_release_quota, holder, list(releases))))

    async def quota_counts(self, counters: Sequence[QuotaCounter]) -> list[int]:
        def read(conn: sqlite3.Connection) -> list[int]:
            rows = [conn.execute(SQL.quota_count, tuple(c)).fetchone() for c in counters]
            return [0 if row is None else int(row[0]) for row in rows]

        return await self._read(read)

    async def quota_rows(self, scope: str, since: int) -> list[tuple[str, str, int, int]]:
        def read(conn: sqlite3.Connection) -> list[tuple[str, str, int, int]]:
            return [(str(k), str(q), int(w), int(u)) for k, q, w, u in conn.execute(SQL.quota_rows, (scope, since))]

        return await self._read(read)

    async def prune_quota(self, older_than: int) -> int:
        return int(await self._write(functools.partial(_prune_quota, older_than)))

    # -- deletion (docs/design.md#deletion) ----------------------------------------------------

    async def delete_conversation(self, conversation_id: str, request_key: str, now: float) -> bool:
        return bool(await self._write(functools.partial(_delete, conversation_id, request_key, now)))

    async def tombstone(self, conversation_id: str) -> str | None:
        def read(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(SQL.tombstone, (conversation_id,)).fetchone()
            return None if row is None else str(row[0])

        return await self._read(read)


# -- write ops: run on the writer thread, inside the batch transaction ----------------------------


def _probe_write(path: str, disk_full: bool, conn: sqlite3.Connection) -> None:
    """Whether writes may go again: the batch's transaction took the write lock; a full disk must
    also have room again (an empty transaction needs none)."""
    if disk_full and path != MEMORY:
        stat = os.statvfs(Path(path).resolve().parent)
        if stat.f_bavail * stat.f_frsize < ROOM_NEEDED:
            raise sqlite3.OperationalError("database or disk is full")

# One writer holds the file's write lock for the whole batch, so a tombstone read inside an op holds
# until its commit: a write checked here cannot land after a delete (docs/design.md#deletion).


def _refuse_deleted(conversation_id: str, conn: sqlite3.Connection) -> None:
    if conn.execute(SQL.tombstone, (conversation_id,)).fetchone() is not None:
        raise Tombstoned(conversation_id)


def _delete(conversation_id: str, request_key: str, now: float, conn: sqlite3.Connection) -> bool:
    if conn.execute(SQL.insert_tombstone, (conversation_id, request_key, now)).rowcount != 1:
        return False  # deleted before: the first delete's tombstone stays
    conn.execute(SQL.delete_conversation, (conversation_id,))
    for statement in SQL.delete_rows:
        conn.execute(statement, (conversation_id,))
    conn.executemany(SQL.delete_snapshot, [(key,) for key in snapshot_keys(conversation_id)])
    return True


def _note_activity(args: tuple[Any, ...], conn: sqlite3.Connection) -> None:
    conn.execute(SQL.note_activity, args)


def _last_seq(conversation_id: str, conn: sqlite3.Connection) -> int:
    row = conn.execute(SQL.last_seq, (conversation_id,)).fetchone()
    return 0 if row is None else int(row[0])


def _append(
    conversation_id: str, rows: list[tuple[str, int, str, bytes, float]], output_rows: list[tuple[Any, ...]],
    conn: sqlite3.Connection,
) -> None:
    # The one rule of appends (actors/store/base.py `judge_appends`), inside the committing transaction.
    deleted = conn.execute(SQL.tombstone, (conversation_id,)).fetchone() is not None
    (outcome,) = judge_appends([(conversation_id, rows[0][1], rows[-1][1])], {conversation_id} if deleted else (),
                               {conversation_id: _last_seq(conversation_id, conn)})
    if outcome.error is not None:
        raise outcome.error
    conn.execute(SQL.set_last_seq, (conversation_id, rows[-1][1]))
    conn.executemany(SQL.insert_event, rows)
    if output_rows:  # in the op's savepoint: with its round's events, or not at all (docs/design.md#replay)
        conn.executemany(SQL.insert_round_output, output_rows)


@dataclass(slots=True)
class _Append:
    """An append as data: alone in its batch it runs as `_append`; next to other appends, they all go
    in together (`_append_run`)."""

    conversation_id: str
    rows: list[tuple[str, int, str, bytes, float]]
    output_rows: list[tuple[Any, ...]]

    def __call__(self, conn: sqlite3.Connection) -> None:
        _append(self.conversation_id, self.rows, self.output_rows, conn)


def _runs(ops: Sequence[WriteOp]) -> Iterator[WriteOp | list[_Append]]:
    """The ops of a batch in order, each run of adjacent appends of distinct conversations as one list:
    nothing moves past another op, so a batch's order is the order its ops were submitted in."""
    run: list[_Append] = []
    in_run: set[str] = set()       # the run's conversations: a set, as a batch holds up to 512 ops
    for op in ops:
        if isinstance(op, _Append) and op.conversation_id not in in_run:
            run.append(op)
            in_run.add(op.conversation_id)
            continue
        if run:
            yield run if len(run) > 1 else run[0]
        run, in_run = [], set()
        if isinstance(op, _Append):
            run.append(op)
            in_run.add(op.conversation_id)
        else:
            yield op
    if run:
        yield run if len(run) > 1 else run[0]


def _append_run(appends: list[_Append], conn: sqlite3.Connection) -> list[Outcome]:
    """Adjacent appends in four statements (five with round outputs), whatever their number. Each
    statement is a round trip of the writer thread for the GIL, which an event loop busy with
    hundreds of streams hands back only at its switch interval: statement by statement, a batch of
    200 appends took its events' delivery past 250 ms (bench/README.md, `peer_bench.py`). The checks
    are `_append`'s (`judge_appends`), append by append; a refused append writes nothing."""
    cids = [a.conversation_id for a in appends]
    deleted = {cid for (cid,) in conn.execute(SQL.tombstoned(len(cids)), cids)}
    (found,) = conn.execute(SQL.last_seqs(len(cids)), cids).fetchone()
    heads: dict[str, int] = json.loads(found or "{}")
    outcomes = judge_appends([(a.conversation_id, a.rows[0][1], a.rows[-1][1]) for a in appends], deleted, heads)
    accepted = [a for a, outcome in zip(appends, outcomes, strict=True) if outcome.error is None]
    rows = [row for a in accepted for row in a.rows]
    for start in range(0, len(rows), SQL.MAX_ROWS):
        part = rows[start : start + SQL.MAX_ROWS]
        conn.execute(SQL.insert_events(len(part)), [value for row in part for value in row])
    streams = [(a.conversation_id, a.rows[-1][1]) for a in accepted]
    for start in range(0, len(streams), SQL.MAX_ROWS):
        moved = streams[start : start + SQL.MAX_ROWS]
        conn.execute(SQL.set_last_seqs(len(moved)), [value for stream in moved for value in stream])
    output_rows = [row for a in accepted for row in a.output_rows]
    if output_rows:  # only with their round's events (docs/design.md#replay)
        conn.executemany(SQL.insert_round_output, output_rows)
    return outcomes


def _create_conversation(
    conversation_id: str, owner: Owner, agent: str, created_at: float, conn: sqlite3.Connection
) -> None:
    if conn.execute(SQL.tombstone, (conversation_id,)).fetchone() is not None:
        raise ConversationExists(conversation_id)  # a deleted id is never given out again
    cur = conn.execute(SQL.insert_conversation, (conversation_id, owner.tenant, owner.sub, agent, created_at))
    if cur.rowcount == 1:
        conn.execute(SQL.insert_listed, (conversation_id, owner.tenant, owner.sub, agent, created_at, created_at))
        return
    row = conn.execute(SQL.conversation_owner, (conversation_id,)).fetchone()
    if tuple(row) != (owner.tenant, owner.sub, agent):
        raise ConversationExists(conversation_id)


def _save_snapshot(conversation_id: str, seq: int, data: bytes, conn: sqlite3.Connection) -> None:
    _refuse_deleted(snapshot_owner(conversation_id), conn)
    conn.execute(SQL.save_snapshot, (conversation_id, seq, data))


def _remember_key(conversation_id: str, key: str, now: float, conn: sqlite3.Connection) -> bool:
    _refuse_deleted(conversation_id, conn)
    return conn.execute(SQL.remember_key, (conversation_id, key, now)).rowcount == 1


def _prune_keys(older_than: float, conn: sqlite3.Connection) -> int:
    return conn.execute(SQL.prune_keys, (older_than,)).rowcount


def _forget_key(conversation_id: str, key: str, conn: sqlite3.Connection) -> None:
    conn.execute(SQL.forget_key, (conversation_id, key))


def _charge_quota(charges: list[QuotaCharge], conn: sqlite3.Connection) -> None:
    for index, (counter, amount, limit) in enumerate(charges):
        if limit is None:
            conn.execute(SQL.charge_quota, (*counter, amount))
        elif amount > limit or conn.execute(SQL.charge_quota_within, (*counter, amount, limit)).rowcount != 1:
            raise QuotaRefused(index)  # the op's savepoint takes back the charges before it


def _release_quota(holder: QuotaCounter | None, releases: list[QuotaCharge], conn: sqlite3.Connection) -> bool:
    if holder is not None and conn.execute(SQL.drop_quota_holder, tuple(holder)).rowcount != 1:
        return False  # released before: nothing is given back twice
    for counter, amount, _ in releases:
        conn.execute(SQL.release_quota, (amount, amount, *counter))
    return True


def _prune_quota(older_than: int, conn: sqlite3.Connection) -> int:
    return conn.execute(SQL.prune_quota, (older_than,)).rowcount


def _record_tool_result(conversation_id: str, call_id: str, payload: bytes, conn: sqlite3.Connection) -> bool:
    _refuse_deleted(conversation_id, conn)
    return conn.execute(SQL.record_tool_result, (conversation_id, call_id, payload)).rowcount == 1
