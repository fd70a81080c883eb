"""The cluster store: PostgreSQL through psycopg 3 async, written with group commit (docs/design.md#store).

One writer connection commits batches of writes from all the conversations of this process (one
transaction, one WAL flush per batch); a small pool of autocommit connections serves reads.
Several processes (hosts) may share one database: the seq check reads the conversation's
`streams` row under a row lock inside the committing transaction, and the events primary key is
the backstop, so two activations that ever raced cannot both append the same seq (a seq is never
reused: docs/design.md#store); keys and tool results rely on `ON CONFLICT DO NOTHING`, atomic
across processes. All the appends of a batch are written with three statements, whatever their
number, and the round outputs riding with them with one more (two more read their tombstones under
lock: deletion, below). The schema and the SQL are shared
with the SQLite store: actors/store/schema.py.

Deletion (docs/design.md#deletion): a delete removes the conversation's ownership row first, and
every write first takes a KEY SHARE lock on the ownership rows it writes for, then reads their
tombstones in a statement of its own. A write that got its lock first commits before the delete
can, and the delete then removes what it wrote; a write that waited on the delete reads the
tombstone after the delete committed, and is refused. Either way nothing survives a delete.

Durability follows the server's `synchronous_commit` (on by default: a commit is flushed).

Outages (docs/design.md#store-outage). A lost connection, a server shutting down or restarting, a
failover's read-only server, a server out of disk or connections are a pause, not a failure: they
are raised as `StoreUnavailable` (`postgres_outage` says which errors; the cause names what
happened, never the DSN), a batch that meets one fails whole, and the connection that saw it is
made again at its next use, reads' and writes' alike. A commit whose answer was lost with the
connection is such an outage too: its outcome is unknown, and the event log recognises an append
that had in fact committed (actors/eventlog.py). Connections use TCP keepalives and a TCP user
timeout unless the DSN sets them, so a server that vanished without a word is noticed in seconds,
not at the kernel's retransmission limit. While an outage lasts, `health()` says so and the store
looks by itself whether it is back (`Prober`).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import psycopg.conninfo

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
    StoreError,
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
from actors.store.outage import HealthTracker, Prober, counters, postgres_detail, postgres_outage
from actors.store.schema import POSTGRES_SQL as SQL
from protocol.events import Event
from protocol.frames import Cursor

Conn = psycopg.AsyncConnection[Any]


@dataclass(slots=True)
class _Append:
    """An append as data, so that all the appends of a batch are written set-wise."""

    conversation_id: str
    first: int
    last: int
    seqs: list[int]
    names: list[str]
    datas: list[bytes]
    tss: list[float]
    outputs: list[tuple[Any, ...]]      # round_outputs rows, committed with these events


@dataclass(slots=True)
class _Delete:
    """A conversation's deletion as data: it splits the batch it is in (`_run_transaction`)."""

    conversation_id: str
    request_key: str
    now: float

    async def __call__(self, conn: Conn) -> bool:
        cid = self.conversation_id
        # The ownership row first: its row lock is what every write for the conversation waits on.
        await conn.execute(SQL.delete_conversation, (cid,))
        cur = await conn.execute(SQL.insert_tombstone, (cid, self.request_key, self.now))
        if cur.rowcount != 1:
            return False  # deleted before (its ownership row is long gone): the first tombstone stays
        for statement in SQL.delete_rows:
            await conn.execute(statement, (cid,))
        for key in snapshot_keys(cid):
            await conn.execute(SQL.delete_snapshot, (key,))
        return True


WriteOp = _Append | _Delete | Callable[[Conn], Awaitable[Any]]

# Serializes schema creation of processes starting together (CREATE ... IF NOT EXISTS can race).
_SCHEMA_LOCK = 0x72656163  # "reac"
IDLE_CHECK_S = 5.0          # a connection idle longer is checked before use (`_alive`)

_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")

# libpq's liveness settings, unless the DSN sets its own: a dead peer is noticed within about 25 s
# of silence, and data left unacknowledged for 30 s fails the call (an outage), instead of a call
# hanging for the kernel's ~15 minutes of retransmissions.
_LIVENESS = {"keepalives": "1", "keepalives_idle": "10", "keepalives_interval": "5", "keepalives_count": "3",
             "tcp_user_timeout": "30000"}


class PostgresStore:
    """`Store` on PostgreSQL. `schema` puts every table in that schema (created on open), so
    deployments and tests can share one database without seeing each other."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str | None = None,
        readers: int = 2,
        max_batch: int = 512,
        append_interval_s: float = APPEND_INTERVAL_S,
        connect_timeout_s: float = 10.0,
    ) -> None:
        if schema is not None and not _IDENTIFIER.fullmatch(schema):
            raise ValueError(f"schema must be a lower-case SQL identifier, got {schema!r}")
        self.dsn = dsn
        self.schema = schema
        self.stats = StoreStats()
        self._connect_timeout_s = connect_timeout_s
        self._readers_size = readers
        self._group: GroupCommit[WriteOp] = GroupCommit(
            self._commit_batch, self.stats, max_batch=max_batch, append_interval_s=append_interval_s
        )
        self._writer: Conn | None = None
        self._idle: asyncio.Queue[Conn | None] | None = None
        self._reader_conns: set[Conn] = set()
        # Outages seen so far; a pooled read connection made before the last one is made again before
        # its next use — the server it talked to may be gone though the socket does not know it yet.
        self._outages = 0
        self._made_at: dict[int, int] = {}   # id(read connection) → self._outages when it was made
        self._used_at: dict[int, float] = {}  # id(read connection) → when it was last handed out
        self._open = False
        self._health = HealthTracker(self.stats)
        self._prober = Prober(self._health, self._probe)
        try:
            given = psycopg.conninfo.conninfo_to_dict(dsn)
        except psycopg.Error:
            given = {}   # connecting says what is wrong with it
        self._liveness = {key: value for key, value in _LIVENESS.items() if key not in given}

    # -- lifecycle --------------------------------------------------------------------------

    async def open(self) -> None:
        if self._open:
            return
        writer = await self._connect()
        try:
            async with writer.transaction():
                await writer.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                if self.schema is not None:
                    await writer.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
                cur = await writer.execute(SQL.has_list)
                listing = await cur.fetchone()
                await writer.execute(SQL.schema)
                if listing is None or not listing[0]:  # older than the list (docs/design.md#conversation-list)
                    await writer.execute(SQL.fill_list)
        except BaseException:
            await writer.close()
            raise
        self._writer = writer
        self._idle = asyncio.Queue()
        for _ in range(self._readers_size):
            self._idle.put_nowait(None)         # readers connect on first use
        self._open = True
        self._group.start()

    async def close(self) -> None:
        if not self._open:
            return
        await self._prober.stop()
        await self._group.stop()
        self._open = False
        if self._writer is not None:
            await self._writer.close()
            self._writer = None
        self._idle = None
        for conn in self._reader_conns:
            await conn.close()
        self._reader_conns.clear()
        self._made_at.clear()
        self._used_at.clear()

    def health(self) -> StoreHealth:
        return self._health.health()

    def counters(self) -> dict[str, float]:
        return counters(self.stats)

    async def __aenter__(self) -> PostgresStore:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _connect(self) -> Conn:
        kwargs: dict[str, Any] = {"autocommit": True, "connect_timeout": max(1, round(self._connect_timeout_s)),
                                  **self._liveness}
        if self.schema is not None:
            kwargs["options"] = f"-c search_path={self.schema}"
        return await psycopg.AsyncConnection.connect(self.dsn, **kwargs)

    @asynccontextmanager
    async def _reader(self) -> AsyncIterator[Conn]:
        if self._idle is None:
            raise StoreClosed("store is not open")
        idle = self._idle
        conn = await idle.get()
        try:
            try:
                if conn is not None and not await self._alive(conn):
                    self._made_at.pop(id(conn), None)   # dead while idle: made again below, no outage yet
                if conn is None or conn.closed or conn.broken or self._made_at.get(id(conn)) != self._outages:
                    if conn is not None:
                        self._reader_conns.discard(conn)
                        self._made_at.pop(id(conn), None)
                        self._used_at.pop(id(conn), None)
                        self.stats.reconnects += 1
                        with contextlib.suppress(Exception):
                            await conn.close()
                    conn = None
                    conn = await self._connect()
                    self._reader_conns.add(conn)
                    self._made_at[id(conn)] = self._outages
                self._used_at[id(conn)] = time.monotonic()
                yield conn
            except (psycopg.Error, OSError) as exc:
                unavailable = self._unavailable(exc, write=False, broken=conn is not None and (conn.broken or conn.closed))
                if unavailable is None:
                    raise
                if conn is not None:  # e.g. a read-only replica after a failover: the slot connects again
                    self._reader_conns.discard(conn)
                    self._made_at.pop(id(conn), None)
                    with contextlib.suppress(Exception):
                        await conn.close()
                raise unavailable from exc
            self._health.succeeded(write=False)
        finally:
            # A connection that broke is dropped; the slot reconnects on its next use.
            idle.put_nowait(None if conn is None or conn.closed or conn.broken else conn)

    async def _alive(self, conn: Conn) -> bool:
        """A connection idle for over IDLE_CHECK_S is asked first: a server that went away and came
        back (a restart this process never saw) left it dead, and the call must not pay for it."""
        if time.monotonic() - self._used_at.get(id(conn), 0.0) < IDLE_CHECK_S:
            return True
        try:
            await conn.execute("SELECT 1")
            return True
        except (psycopg.Error, OSError):
            self._reader_conns.discard(conn)
            with contextlib.suppress(Exception):
                await conn.close()
            return False

    async def _write(self, op: WriteOp, *, kind: str = "write", events: int = 0) -> Any:
        """`op` through the group commit; an outage an op met on its own is raised as one, too."""
        try:
            return await self._group.submit(op, kind=kind, events=events)
        except (psycopg.Error, OSError) as exc:
            unavailable = self._unavailable(exc, write=True)
            if unavailable is None:
                raise
            raise unavailable from exc

    # -- outages (docs/design.md#store-outage) -------------------------------------------------

    def _unavailable(self, exc: BaseException, *, write: bool, broken: bool = False) -> StoreUnavailable | None:
        """StoreUnavailable (caused by `exc`) when `exc` is an outage, noted; None when it is not."""
        cause = postgres_outage(exc, broken=broken)
        if cause is None:
            return None
        unavailable = StoreUnavailable(cause)
        unavailable.__cause__ = exc
        self._outages += 1   # every pooled read connection is made again before its next use
        if self._health.failed(unavailable, write=write, detail=postgres_detail(exc)):
            self._prober.start()
        return unavailable

    async def _probe(self) -> None:
        """The write connection made again, and the server takes writes (not a standby)."""
        await self._write(_probe_writable)

    async def _drop_writer(self) -> None:
        """The write connection saw an outage: the next batch connects again (a failover may have
        moved the primary; a broken connection cannot be used anyway)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            self.stats.reconnects += 1
            with contextlib.suppress(Exception):
                await writer.close()

    # -- group commit -----------------------------------------------------------------------

    async def _commit_batch(self, ops: list[WriteOp]) -> list[Outcome]:
        if not self._open and self._writer is None:
            raise StoreClosed("store is not open")
        try:
            outcomes = await self._commit_batch_on_writer(ops)
        except (psycopg.Error, OSError) as exc:
            writer = self._writer
            unavailable = self._unavailable(exc, write=True, broken=writer is not None and (writer.broken or writer.closed))
            if unavailable is None:
                raise
            await self._drop_writer()
            raise unavailable from exc
        self._health.succeeded(write=True)
        return outcomes

    async def _commit_batch_on_writer(self, ops: list[WriteOp]) -> list[Outcome]:
        if self._writer is not None and not await self._alive(self._writer):
            self._writer = None   # dead while idle (a restart this process never saw): nothing was sent on it
        if self._writer is None or self._writer.closed or self._writer.broken:
            self._writer = await self._connect()
        conn = self._writer
        self._used_at[id(conn)] = time.monotonic()
        try:
            return await self._run_transaction(conn, ops)
        except psycopg.Error as exc:
            if conn.broken or conn.closed or postgres_outage(exc) is not None:
                raise  # the whole batch meets it (no op is at fault): an outage
            failure: BaseException = exc
        # An op aborted the transaction (nothing of the batch committed): commit each op on its own
        # so that only the faulty one fails. This includes a batch of one: the typical abort is a
        # first append racing another process's (events primary key), and once that one committed
        # the retry sees its streams row and fails with SeqConflict.
        outcomes: list[Outcome] = []
        for op in ops:
            if conn.broken or conn.closed:
                outcomes.append(Outcome(error=failure))
                continue
            try:
                outcomes.extend(await self._run_transaction(conn, [op]))
            except psycopg.Error as exc:
                failure = exc
                outcomes.append(Outcome(error=exc))
        return outcomes

    async def _run_transaction(self, conn: Conn, ops: list[WriteOp]) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(ops)
        async with conn.transaction():
            # A delete splits the batch: what was submitted before it runs before it (and is deleted
            # by it), what was submitted after it meets its tombstone (docs/design.md#deletion).
            start = 0
            for end, op in enumerate(ops, 1):
                if isinstance(op, _Delete) or end == len(ops):
                    await _run_part(conn, ops, range(start, end), outcomes)
                    start = end
        self.stats.commits += 1
        return [outcome for outcome in outcomes if outcome is not None]

    # -- conversations ----------------------------------------------------------------------

    async def create_conversation(
        self, conversation_id: str, owner: Owner, agent: str, created_at: float
    ) -> None:
        async def op(conn: Conn) -> None:
            if await _deleted(conn, [conversation_id]):
                raise ConversationExists(conversation_id)  # a deleted id is never given out again
            cur = await conn.execute(
                SQL.insert_conversation, (conversation_id, owner.tenant, owner.sub, agent, created_at)
            )
            if cur.rowcount == 1:
                await conn.execute(SQL.insert_listed, (conversation_id, owner.tenant, owner.sub, agent, created_at,
                                                       created_at))
                return
            cur = await conn.execute(SQL.conversation_owner, (conversation_id,))
            row = await cur.fetchone()
            if row is None or tuple(row) != (owner.tenant, owner.sub, agent):
                raise ConversationExists(conversation_id)

        await self._write(op)

    async def conversation_owner(self, conversation_id: str) -> tuple[Owner, str] | None:
        async with self._reader() as conn:
            cur = await conn.execute(SQL.conversation_owner, (conversation_id,))
            row = await cur.fetchone()
        return None if row is None else (Owner(tenant=row[0], sub=row[1]), row[2])

    # -- the conversation list (docs/design.md#conversation-list) ------------------------------

    async def note_activity(self, conversation_id: str, *, running: bool, at: float | None = None,
                            title: str = "") -> None:
        when = at if at is not None else float("-inf")
        args = (int(running), when, when, title, conversation_id)

        async def op(conn: Conn) -> None:
            await conn.execute(SQL.note_activity, args)

        await self._write(op)

    async def list_conversations(self, owner: Owner | None, limit: int, before: Cursor | None = None) -> list[ListedConversation]:
        statement, args = SQL.list_page(owner, limit, before)
        async with self._reader() as conn:
            cur = await conn.execute(statement, args)
            rows = await cur.fetchall()
        return [listed(*row) for row in rows]

    # -- events -----------------------------------------------------------------------------

    async def append_events(
        self, conversation_id: str, events: Sequence[Event], outputs: Sequence[RoundOutput] = ()
    ) -> None:
        if not events:
            return
        check_append(conversation_id, events)
        op = _Append(
            conversation_id,
            events[0].seq,
            events[-1].seq,
            [e.seq for e in events],
            [e.event for e in events],
            [encode_event_data(e) for e in events],
            [e.ts for e in events],
            [output_row(conversation_id, events[-1].seq, o) for o in outputs],
        )
        await self._write(op, kind="append", events=len(events))

    async def read_events(
        self, conversation_id: str, after_seq: int, limit: int = DEFAULT_READ_LIMIT
    ) -> list[Event]:
        if limit <= 0:
            return []
        async with self._reader() as conn:
            cur = await conn.execute(SQL.read_events, (conversation_id, after_seq, limit))
            rows = await cur.fetchall()
        return [decode_event(conversation_id, seq, name, bytes(data), ts) for seq, name, data, ts in rows]

    async def last_seq(self, conversation_id: str) -> int:
        async with self._reader() as conn:
            cur = await conn.execute(SQL.last_seq, (conversation_id,))
            row = await cur.fetchone()
        return 0 if row is None else int(row[0])

    # -- snapshots --------------------------------------------------------------------------

    async def save_snapshot(self, conversation_id: str, seq: int, data: bytes) -> None:
        payload = bytes(data)

        async def op(conn: Conn) -> None:
            await _refuse_deleted(conn, snapshot_owner(conversation_id))
            await conn.execute(SQL.save_snapshot, (conversation_id, seq, payload))

        await self._write(op)

    async def load_snapshot(self, conversation_id: str) -> tuple[int, bytes] | None:
        async with self._reader() as conn:
            cur = await conn.execute(SQL.load_snapshot, (conversation_id,))
            row = await cur.fetchone()
        return None if row is None else (int(row[0]), bytes(row[1]))

    # -- idempotency keys -------------------------------------------------------------------

    async def remember_key(self, conversation_id: str, key: str, now: float) -> bool:
        async def op(conn: Conn) -> bool:
            await _refuse_deleted(conn, conversation_id)
            cur = await conn.execute(SQL.remember_key, (conversation_id, key, now))
            return cur.rowcount == 1

        return bool(await self._write(op))

    async def prune_keys(self, older_than: float) -> int:
        async def op(conn: Conn) -> int:
            cur = await conn.execute(SQL.prune_keys, (older_than,))
            return cur.rowcount

        return int(await self._write(op))

    async def forget_key(self, conversation_id: str, key: str) -> None:
        async def op(conn: Conn) -> None:
            await conn.execute(SQL.forget_key, (conversation_id, key))

        await self._write(op)

    # -- tool results -----------------------------------------------------------------------

    async def record_tool_result(self, conversation_id: str, call_id: str, payload: bytes) -> bool:
        data = bytes(payload)

        async def op(conn: Conn) -> bool:
            await _refuse_deleted(conn, conversation_id)
            cur = await conn.execute(SQL.record_tool_result, (conversation_id, call_id, data))
            return cur.rowcount == 1

        return bool(await self._write(op))

    async def tool_result(self, conversation_id: str, call_id: str) -> bytes | None:
        async with self._reader() as conn:
            cur = await conn.execute(SQL.tool_result, (conversation_id, call_id))
            row = await cur.fetchone()
        return None if row is None else bytes(row[0])

    # -- round outputs (docs/design.md#replay) -----------------------------------------------

    async def round_outputs(self, conversation_id: str) -> list[RoundOutput]:
        async with self._reader() as conn:
            cur = await conn.execute(SQL.read_round_outputs, (conversation_id,))
            rows = await cur.fetchall()
        return [decode_output(*row) for row in rows]

    # -- quota counters (docs/design.md#quotas) ------------------------------------------------

    async def charge_quota(self, charges: Sequence[QuotaCharge]) -> int | None:
        todo = list(charges)

        async def op(conn: Conn) -> None:
            # A savepoint of its own: the batch's transaction has none per op, and a refusal must take
            # back the charges this op made before it (QuotaRefused is a StoreError: the batch goes on).
            async with conn.transaction():
                for index, (counter, amount, limit) in enumerate(todo):
                    if limit is None:
                        await conn.execute(SQL.charge_quota, (*counter, amount))
                        continue
                    if amount > limit:
                        raise QuotaRefused(index)
                    cur = await conn.execute(SQL.charge_quota_within, (*counter, amount, limit))
                    if cur.rowcount != 1:
                        raise QuotaRefused(index)

        try:
            await self._write(op)
        except QuotaRefused as refused:
            return refused.index
        return None

    async def release_quota(self, holder: QuotaCounter | None, releases: Sequence[QuotaCharge]) -> bool:
        todo = list(releases)

        async def op(conn: Conn) -> bool:
            if holder is not None:
                cur = await conn.execute(SQL.drop_quota_holder, tuple(holder))
                if cur.rowcount != 1:
                    return False  # released before: nothing is given back twice
            for counter, amount, _ in todo:
                await conn.execute(SQL.release_quota, (amount, amount, *counter))
            return True

        return bool(await self._write(op))

    async def quota_counts(self, counters: Sequence[QuotaCounter]) -> list[int]:
        found = []
        async with self._reader() as conn:
            for counter in counters:
                cur = await conn.execute(SQL.quota_count, tuple(counter))
                row = await cur.fetchone()
                found.append(0 if row is None else int(row[0]))
        return found

    async def quota_rows(self, scope: str, since: int) -> list[tuple[str, str, int, int]]:
        async with self._reader() as conn:
            cur = await conn.execute(SQL.quota_rows, (scope, since))
            rows = await cur.fetchall()
        return [(str(k), str(q), int(w), int(u)) for k, q, w, u in rows]

    async def prune_quota(self, older_than: int) -> int:
        async def op(conn: Conn) -> int:
            cur = await conn.execute(SQL.prune_quota, (older_than,))
            return cur.rowcount

        return int(await self._write(op))

    # -- deletion (docs/design.md#deletion) ----------------------------------------------------

    async def delete_conversation(self, conversation_id: str, request_key: str, now: float) -> bool:
        return bool(await self._write(_Delete(conversation_id, request_key, now)))

    async def tombstone(self, conversation_id: str) -> str | None:
        async with self._reader() as conn:
            cur = await conn.execute(SQL.tombstone, (conversation_id,))
            row = await cur.fetchone()
        return None if row is None else str(row[0])


async def _probe_writable(conn: Conn) -> None:
    cur = await conn.execute("SHOW transaction_read_only")
    row = await cur.fetchone()
    if row is not None and str(row[0]).lower() == "on":
        raise psycopg.errors.ReadOnlySqlTransaction("the server is read-only")


async def _run_part(conn: Conn, ops: list[WriteOp], part: range, outcomes: list[Outcome | None]) -> None:
    """Run the ops of `part`, appends first: everything of the batch commits together, so that changes
    no result; the other ops keep their submission order (e.g. the same key twice)."""
    appends = [(i, op) for i in part if isinstance(op := ops[i], _Append)]
    if appends:
        results = await _append_all(conn, [op for _, op in appends])
        for (i, _), outcome in zip(appends, results, strict=True):
            outcomes[i] = outcome
    for i in part:
        op = ops[i]
        if isinstance(op, _Append):
            continue
        # Store errors are raised by an op before it writes anything: the batch goes on.
        try:
            outcomes[i] = Outcome(value=await op(conn))
        except StoreError as exc:
            outcomes[i] = Outcome(error=exc)


async def _deleted(conn: Conn, conversation_ids: list[str]) -> set[str]:
    """Those of `conversation_ids` that were deleted, with their ownership rows locked (KEY SHARE)
    until the transaction ends, so that no delete of them can commit in between (module docstring)."""
    await conn.execute(SQL.lock_owners, (conversation_ids,))
    cur = await conn.execute(SQL.tombstoned, (conversation_ids,))  # a new snapshot: after any wait
    return {str(cid) for (cid,) in await cur.fetchall()}


async def _refuse_deleted(conn: Conn, conversation_id: str) -> None:
    if await _deleted(conn, [conversation_id]):
        raise Tombstoned(conversation_id)


async def _append_all(conn: Conn, appends: list[_Append]) -> list[Outcome]:
    """Write every append of a batch in three statements (a fourth for round outputs), whatever the
    batch size, after two that lock their ownership rows and read their tombstones.

    An append for a deleted conversation fails with Tombstoned. The conversations' `streams` rows
    are locked (in id order, so that processes sharing the
    database cannot deadlock) and their last_seq read; each append is checked against it in
    submission order; the accepted events go in with one INSERT and the new last_seqs with one
    upsert. A conversation without a row yet has no row to lock: if another process appends its
    first events concurrently, the events primary key rejects the second batch, which is then
    retried op by op and fails that append with SeqConflict (`_commit_batch`).
    """
    cids = sorted({a.conversation_id for a in appends})
    deleted = await _deleted(conn, cids)  # before the streams rows: a delete locks in that order too
    cur = await conn.execute(SQL.lock_streams, (cids,))
    current = {cid: int(last) for cid, last in await cur.fetchall()}
    outcomes = judge_appends([(a.conversation_id, a.first, a.last) for a in appends], deleted, current)
    accepted = [a for a, outcome in zip(appends, outcomes, strict=True) if outcome.error is None]
    if not accepted:
        return outcomes
    await conn.execute(
        SQL.insert_events,
        (
            [a.conversation_id for a in accepted for _ in a.seqs],
            [seq for a in accepted for seq in a.seqs],
            [name for a in accepted for name in a.names],
            [data for a in accepted for data in a.datas],
            [ts for a in accepted for ts in a.tss],
        ),
    )
    changed = sorted({a.conversation_id for a in accepted})
    await conn.execute(SQL.set_last_seqs, (changed, [current[cid] for cid in changed]))
    rows = [row for a in accepted for row in a.outputs]
    if rows:  # only with accepted appends: an output commits with its round's events (docs/design.md#replay)
        await conn.execute(SQL.insert_round_outputs, tuple(list(column) for column in zip(*rows, strict=True)))
    return outcomes
