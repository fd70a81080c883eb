"""The one home of the stores' schema and SQL (docs/design.md#store).

Both stores keep the same tables and run the same statements; the dialects differ only in the
placeholder style (`?` for sqlite3, `%s` for psycopg), a few type names, and SQLite's
`WITHOUT ROWID` on the small-rowed tables that are only ever reached by their primary key. So the DDL is one
template and every statement is written once, with `?` placeholders, and rendered per dialect:
`SQLITE_SQL` and `POSTGRES_SQL`. Every table is created `IF NOT EXISTS`, and a table is only ever
added, never changed: a database created before a table existed gains it when a store opens it, and
what it already holds keeps its layout (`round_outputs` came that way: docs/design.md#replay).

What only one dialect runs is marked as such: SQLite appends row-wise (`executemany`), while
PostgreSQL writes all the appends of a batch set-wise (`unnest`) after locking their `streams`
rows. Connection and transaction control (pragmas, savepoints, the advisory lock) stays with each
store's concurrency model, in its own module.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from actors.identity import Owner


@dataclass(frozen=True, slots=True)
class Dialect:
    """What differs between the SQL the two stores speak."""

    name: str
    param: str           # the DB-API placeholder of the driver
    text: str
    integer: str         # 64-bit
    real: str            # 64-bit float
    blob: str
    without_rowid: str   # the clause closing a table reached only by its primary key

    def sql(self, statement: str) -> str:
        """`statement`, written with `?` placeholders, in this dialect's placeholder style."""
        # psycopg reads any `%` as a placeholder: statements here have none to escape.
        assert "%" not in statement, statement
        return statement.replace("?", self.param)


SQLITE = Dialect("sqlite", "?", "TEXT", "INTEGER", "REAL", "BLOB", " WITHOUT ROWID")
POSTGRES = Dialect("postgresql", "%s", "text", "bigint", "double precision", "bytea", "")

# Tables. `streams` holds each conversation's last_seq: the append's seq check reads it inside the
# committing transaction (docs/design.md#write-ahead), and the events primary key is the backstop.
# `round_outputs` holds what the model wrote in each round, before any gate, committed with the
# append that carries the round's `round.completed` (`seq` is that append's last seq), so that a
# completed round always has its output (docs/design.md#replay). `raw` is UTF-8 bytes: model text
# may hold a NUL, which a PostgreSQL text column refuses (and a refused append stops the log).
# `models` is a JSON array. `tombstones` holds one row per deleted conversation, all that is left of
# it: the key of the request that deleted it (a digest, no identity: docs/design.md#deletion).
# `conversation_list` holds what a list page shows of each conversation (docs/design.md#conversation-list),
# the owner again beside it, so that a page is one range of one index — `conversations` is never
# altered — and `running` is 0 or 1.
# `events` is a rowid table on SQLite, its primary key a separate index: a batch interleaves the
# appends of hundreds of conversations, and keyed by (conversation_id, seq) each row would dirty a
# leaf page of its own, written to the WAL and again at checkpoint; in rowid order the rows fill the
# table's last pages and only the small index entries scatter. Measured on the writer's pattern (300
# conversations, 60 events a commit): ~33 → ~21 µs of CPU per event (bench/README.md). A database
# made before keeps its WITHOUT ROWID table, which reads and writes the same.
_DDL = """
CREATE TABLE IF NOT EXISTS conversations (
    conversation_id {text} PRIMARY KEY,
    tenant {text} NOT NULL,
    sub {text} NOT NULL,
    agent {text} NOT NULL,
    created_at {real} NOT NULL
);
CREATE TABLE IF NOT EXISTS streams (
    conversation_id {text} PRIMARY KEY,
    last_seq {integer} NOT NULL
){without_rowid};
CREATE TABLE IF NOT EXISTS events (
    conversation_id {text} NOT NULL,
    seq {integer} NOT NULL,
    event {text} NOT NULL,
    data {blob} NOT NULL,
    ts {real} NOT NULL,
    PRIMARY KEY (conversation_id, seq)
);
CREATE TABLE IF NOT EXISTS snapshots (
    conversation_id {text} PRIMARY KEY,
    seq {integer} NOT NULL,
    data {blob} NOT NULL
);
CREATE TABLE IF NOT EXISTS idempotency_keys (
    conversation_id {text} NOT NULL,
    key {text} NOT NULL,
    seen_at {real} NOT NULL,
    PRIMARY KEY (conversation_id, key)
){without_rowid};
CREATE INDEX IF NOT EXISTS idempotency_keys_seen_at ON idempotency_keys (seen_at);
CREATE TABLE IF NOT EXISTS tool_results (
    conversation_id {text} NOT NULL,
    call_id {text} NOT NULL,
    payload {blob} NOT NULL,
    PRIMARY KEY (conversation_id, call_id)
);
CREATE TABLE IF NOT EXISTS round_outputs (
    conversation_id {text} NOT NULL,
    turn_id {text} NOT NULL,
    round {integer} NOT NULL,
    seq {integer} NOT NULL,
    raw {blob} NOT NULL,
    models {text} NOT NULL,
    mode {text} NOT NULL,
    agent_state {text} NOT NULL,
    phase {text} NOT NULL,
    PRIMARY KEY (conversation_id, turn_id, round)
);
CREATE TABLE IF NOT EXISTS tombstones (
    conversation_id {text} PRIMARY KEY,
    request_key {text} NOT NULL,
    deleted_at {real} NOT NULL
){without_rowid};
CREATE TABLE IF NOT EXISTS quota_counters (
    scope {text} NOT NULL,
    key {text} NOT NULL,
    quota {text} NOT NULL,
    window_start {integer} NOT NULL,
    used {integer} NOT NULL,
    PRIMARY KEY (scope, key, quota, window_start)
){without_rowid};
CREATE INDEX IF NOT EXISTS quota_counters_window ON quota_counters (window_start);
CREATE TABLE IF NOT EXISTS conversation_list (
    conversation_id {text} PRIMARY KEY,
    tenant {text} NOT NULL,
    sub {text} NOT NULL,
    agent {text} NOT NULL,
    created_at {real} NOT NULL,
    last_active_at {real} NOT NULL,
    title {text} NOT NULL,
    running {integer} NOT NULL
);
CREATE INDEX IF NOT EXISTS conversation_list_owner ON conversation_list (tenant, sub, last_active_at, conversation_id);
CREATE INDEX IF NOT EXISTS conversation_list_recent ON conversation_list (last_active_at, conversation_id);
"""

# The heads and tails the row-wise (SQLite) and set-wise (PostgreSQL) appends share.
_INSERT_EVENTS = "INSERT INTO events (conversation_id, seq, event, data, ts)"
_UPSERT_STREAMS = "INSERT INTO streams (conversation_id, last_seq)"
_SET_LAST_SEQ = " ON CONFLICT (conversation_id) DO UPDATE SET last_seq = excluded.last_seq"
_INSERT_ROUND_OUTPUTS = (
    "INSERT INTO round_outputs (conversation_id, turn_id, round, seq, raw, models, mode, agent_state, phase)"
)
_ROUND_OUTPUT_ONCE = " ON CONFLICT (conversation_id, turn_id, round) DO NOTHING"
_UPSERT_QUOTA = (
    "INSERT INTO quota_counters (scope, key, quota, window_start, used) VALUES (?, ?, ?, ?, ?)"
    " ON CONFLICT (scope, key, quota, window_start) DO UPDATE SET used = quota_counters.used + excluded.used"
)
_QUOTA_ROW = " WHERE scope = ? AND key = ? AND quota = ? AND window_start = ?"
# A list page: the row's columns, its last seq from `streams` (its primary key), newest first; the
# position a cursor names is compared as a row value, which both databases read as a range of the index.
_LIST = (
    "SELECT l.conversation_id, l.tenant, l.sub, l.agent, l.created_at, l.last_active_at, s.last_seq, l.title,"
    " l.running FROM conversation_list l LEFT JOIN streams s ON s.conversation_id = l.conversation_id"
)
_LIST_ORDER = " ORDER BY l.last_active_at DESC, l.conversation_id DESC LIMIT ?"
_LIST_AFTER = "(l.last_active_at, l.conversation_id) < (?, ?)"


class Statements:
    """The schema and every statement both stores run, in one dialect."""

    def __init__(self, dialect: Dialect) -> None:
        sql = dialect.sql
        self.dialect = dialect
        self.schema = _DDL.format(
            text=dialect.text,
            integer=dialect.integer,
            real=dialect.real,
            blob=dialect.blob,
            without_rowid=dialect.without_rowid,
        )

        # conversations: created once; a repeat with the same owner and agent is a no-op.
        self.insert_conversation = sql(
            "INSERT INTO conversations (conversation_id, tenant, sub, agent, created_at)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (conversation_id) DO NOTHING"
        )
        self.conversation_owner = sql(
            "SELECT tenant, sub, agent FROM conversations WHERE conversation_id = ?"
        )

        # the conversation list (docs/design.md#conversation-list): its row is inserted with the
        # conversation, in the same op; a note moves `last_active_at` only forward and sets a title
        # only once. Pages are keyset, never OFFSET: by owner, or everyone's (operators).
        self.insert_listed = sql(
            "INSERT INTO conversation_list (conversation_id, tenant, sub, agent, created_at, last_active_at, title,"
            " running) VALUES (?, ?, ?, ?, ?, ?, '', 0) ON CONFLICT (conversation_id) DO NOTHING"
        )
        self.note_activity = sql(
            "UPDATE conversation_list SET running = ?,"
            " last_active_at = CASE WHEN ? > last_active_at THEN ? ELSE last_active_at END,"
            " title = CASE WHEN title = '' THEN ? ELSE title END WHERE conversation_id = ?"
        )
        self.list_owned = sql(_LIST + " WHERE l.tenant = ? AND l.sub = ?" + _LIST_ORDER)
        self.list_owned_after = sql(_LIST + " WHERE l.tenant = ? AND l.sub = ? AND " + _LIST_AFTER + _LIST_ORDER)
        self.list_all = sql(_LIST + _LIST_ORDER)
        self.list_all_after = sql(_LIST + " WHERE " + _LIST_AFTER + _LIST_ORDER)
        # A database older than the list gets a row per conversation when the table is created: its
        # last activity is its last event's time, its title unknown (""), not running until noted.
        self.fill_list = sql(
            "INSERT INTO conversation_list (conversation_id, tenant, sub, agent, created_at, last_active_at, title,"
            " running) SELECT c.conversation_id, c.tenant, c.sub, c.agent, c.created_at,"
            " COALESCE((SELECT e.ts FROM streams s JOIN events e ON e.conversation_id = s.conversation_id"
            " AND e.seq = s.last_seq WHERE s.conversation_id = c.conversation_id), c.created_at), '', 0"
            " FROM conversations c WHERE true ON CONFLICT (conversation_id) DO NOTHING"
        )

        # events
        self.read_events = sql(
            "SELECT seq, event, data, ts FROM events WHERE conversation_id = ? AND seq > ?"
            " ORDER BY seq LIMIT ?"
        )
        self.last_seq = sql("SELECT last_seq FROM streams WHERE conversation_id = ?")

        # snapshots: a newer snapshot replaces an older one, never the other way round.
        self.save_snapshot = sql(
            "INSERT INTO snapshots (conversation_id, seq, data) VALUES (?, ?, ?)"
            " ON CONFLICT (conversation_id) DO UPDATE SET seq = excluded.seq, data = excluded.data"
            " WHERE excluded.seq >= snapshots.seq"
        )
        self.load_snapshot = sql("SELECT seq, data FROM snapshots WHERE conversation_id = ?")

        # idempotency keys (docs/wire-protocol.md#10-delivery-idempotency-resume-multiplexing):
        # checked and inserted in one atomic statement; the first insert wins.
        self.remember_key = sql(
            "INSERT INTO idempotency_keys (conversation_id, key, seen_at) VALUES (?, ?, ?)"
            " ON CONFLICT (conversation_id, key) DO NOTHING"
        )
        self.prune_keys = sql("DELETE FROM idempotency_keys WHERE seen_at < ?")

        # tool results: the first durable result wins (docs/design.md#recovery).
        self.record_tool_result = sql(
            "INSERT INTO tool_results (conversation_id, call_id, payload) VALUES (?, ?, ?)"
            " ON CONFLICT (conversation_id, call_id) DO NOTHING"
        )
        self.tool_result = sql("SELECT payload FROM tool_results WHERE conversation_id = ? AND call_id = ?")

        # round outputs (docs/design.md#replay): written with their round's events; a round is
        # written once, and a repeat (a stale activation's) changes nothing.
        self.read_round_outputs = sql(
            "SELECT turn_id, round, raw, models, mode, agent_state, phase FROM round_outputs"
            " WHERE conversation_id = ? ORDER BY seq, turn_id, round"
        )

        # deletion (docs/design.md#deletion): one transaction. The ownership row goes first: on
        # PostgreSQL its row lock orders the delete against every write (postgres.py). Then the
        # tombstone, which every later write for the conversation is checked against, then every
        # table keyed by the conversation (snapshots by each of its keys: `delete_snapshot`).
        self.tombstone = sql("SELECT request_key FROM tombstones WHERE conversation_id = ?")
        self.insert_tombstone = sql(
            "INSERT INTO tombstones (conversation_id, request_key, deleted_at) VALUES (?, ?, ?)"
            " ON CONFLICT (conversation_id) DO NOTHING"
        )
        self.delete_conversation = sql("DELETE FROM conversations WHERE conversation_id = ?")
        self.delete_rows = tuple(
            sql(f"DELETE FROM {table} WHERE conversation_id = ?")
            for table in ("streams", "events", "idempotency_keys", "tool_results", "round_outputs", "conversation_list")
        )
        self.delete_snapshot = sql("DELETE FROM snapshots WHERE conversation_id = ?")

        # quota counters (docs/design.md#quotas): one row per (scope, key, quota, window start); a
        # gauge's window start is 0. A charge with a limit moves the counter only if it stays within
        # the limit, in one upsert: atomic across every process sharing the database (the conflicting
        # row is locked and the condition read from its latest version). A release never goes below 0;
        # a lease row (the holder) is dropped by the release that gives its charge back, once.
        self.charge_quota = sql(_UPSERT_QUOTA)
        self.charge_quota_within = sql(_UPSERT_QUOTA + " WHERE quota_counters.used + excluded.used <= ?")
        self.release_quota = sql(
            "UPDATE quota_counters SET used = CASE WHEN used > ? THEN used - ? ELSE 0 END" + _QUOTA_ROW
        )
        self.drop_quota_holder = sql("DELETE FROM quota_counters" + _QUOTA_ROW)
        self.quota_count = sql("SELECT used FROM quota_counters" + _QUOTA_ROW)
        self.quota_rows = sql(
            "SELECT key, quota, window_start, used FROM quota_counters"
            " WHERE scope = ? AND (window_start = 0 OR window_start >= ?)"
        )
        self.prune_quota = sql("DELETE FROM quota_counters WHERE window_start > 0 AND window_start < ?")
        # a key remembered for a command the quota then refused: the client may send it again
        self.forget_key = sql("DELETE FROM idempotency_keys WHERE conversation_id = ? AND key = ?")


    def list_page(self, owner: Owner | None, limit: int, before: tuple[float, str] | None) -> tuple[str, tuple[Any, ...]]:
        """The statement of a list page and its arguments: by owner or everyone's, after a position or not."""
        position = tuple(before) if before is not None else ()
        if owner is None:
            return (self.list_all_after if before else self.list_all), (*position, limit)
        return (self.list_owned_after if before else self.list_owned), (owner.tenant, owner.sub, *position, limit)


class SqliteStatements(Statements):
    """SQLite only: an append alone is written row by row (`executemany`) and its stream row set; the
    appends next to one another in a batch are written with one statement per table (`_append_run`), since
    each statement is a round trip of the writer thread for the GIL (actors/store/sqlite.py)."""

    MAX_ROWS = 1000    # rows of one multi-row statement: 5,000 parameters, far below SQLite's limit

    def __init__(self) -> None:
        super().__init__(SQLITE)
        self.has_list = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'conversation_list'"
        self.insert_event = SQLITE.sql(_INSERT_EVENTS + " VALUES (?, ?, ?, ?, ?)")
        self.set_last_seq = SQLITE.sql(_UPSERT_STREAMS + " VALUES (?, ?)" + _SET_LAST_SEQ)
        self.insert_round_output = SQLITE.sql(
            _INSERT_ROUND_OUTPUTS + " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)" + _ROUND_OUTPUT_ONCE
        )

    @staticmethod
    @functools.lru_cache(maxsize=256)
    def tombstoned(n: int) -> str:
        return f"SELECT conversation_id FROM tombstones WHERE conversation_id IN ({', '.join('?' * n)})"

    @staticmethod
    @functools.lru_cache(maxsize=256)
    def last_seqs(n: int) -> str:
        """The streams' last_seqs as one JSON object: one row, whatever n."""
        return ("SELECT json_group_object(conversation_id, last_seq) FROM streams"
                f" WHERE conversation_id IN ({', '.join('?' * n)})")

    @staticmethod
    @functools.lru_cache(maxsize=256)
    def insert_events(n: int) -> str:
        return _INSERT_EVENTS + " VALUES " + ", ".join(("(?, ?, ?, ?, ?)",) * n)

    @staticmethod
    @functools.lru_cache(maxsize=256)
    def set_last_seqs(n: int) -> str:
        return _UPSERT_STREAMS + " VALUES " + ", ".join(("(?, ?)",) * n) + _SET_LAST_SEQ


class PostgresStatements(Statements):
    """PostgreSQL only: all the appends of a batch in three statements (four with round outputs),
    whatever their number.

    Each statement takes arrays (one element per row, psycopg adapts Python lists).
    """

    def __init__(self) -> None:
        super().__init__(POSTGRES)
        self.has_list = "SELECT to_regclass('conversation_list') IS NOT NULL"  # in the connection's search_path
        # Locks the streams rows of the batch's conversations in id order (see postgres._append_all).
        self.lock_streams = (
            "SELECT conversation_id, last_seq FROM streams WHERE conversation_id = ANY(%s)"
            " ORDER BY conversation_id FOR UPDATE"
        )
        self.insert_events = (
            _INSERT_EVENTS
            + " SELECT * FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::bytea[], %s::float8[])"
        )
        self.set_last_seqs = (
            _UPSERT_STREAMS + " SELECT * FROM unnest(%s::text[], %s::bigint[])" + _SET_LAST_SEQ
        )
        self.insert_round_outputs = (
            _INSERT_ROUND_OUTPUTS
            + " SELECT * FROM unnest(%s::text[], %s::text[], %s::bigint[], %s::bigint[], %s::bytea[],"
            " %s::text[], %s::text[], %s::text[], %s::text[])"
            + _ROUND_OUTPUT_ONCE
        )
        # Deletion's guard (docs/design.md#deletion): a write first takes a KEY SHARE lock on the
        # ownership rows of the conversations it writes for — a delete's DELETE of such a row waits
        # for it, and it waits for a delete holding one — and only then, in a statement of its own
        # (so with a snapshot taken after that wait), reads their tombstones.
        self.lock_owners = (
            "SELECT conversation_id FROM conversations WHERE conversation_id = ANY(%s)"
            " ORDER BY conversation_id FOR KEY SHARE"
        )
        self.tombstoned = "SELECT conversation_id FROM tombstones WHERE conversation_id = ANY(%s)"


SQLITE_SQL = SqliteStatements()
POSTGRES_SQL = PostgresStatements()
