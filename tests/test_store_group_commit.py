"""SQLite group commit (actors/store/sqlite.py): a batch runs bare, in one transaction; when one of
its ops fails, the batch runs again with a savepoint per op — every other op commits exactly once,
the failed one leaves no trace, and nothing is committed in between."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from actors.store.base import SeqConflict, Tombstoned
from actors.store.sqlite import SqliteStore, _Append, _delete


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    async with SqliteStore(tmp_path / "gc.sqlite3") as s:
        yield s


def remember(key: str, runs: list[str]) -> object:
    def op(conn: sqlite3.Connection) -> int:
        runs.append(key)
        return conn.execute("INSERT INTO idempotency_keys VALUES ('c', ?, 0)", (key,)).rowcount
    return op


def half_then_fail(runs: list[str]) -> object:
    def op(conn: sqlite3.Connection) -> None:
        runs.append("bad")
        conn.execute("INSERT INTO idempotency_keys VALUES ('c', 'half', 0)")
        raise ValueError("refused after writing")
    return op


def keys(store: SqliteStore) -> list[str]:
    assert store._writer is not None
    return [row[0] for row in store._writer.execute("SELECT key FROM idempotency_keys ORDER BY key")]


def traced(store: SqliteStore) -> list[str]:
    assert store._writer is not None
    statements: list[str] = []
    store._writer.set_trace_callback(statements.append)
    return statements


async def test_a_batch_that_succeeds_commits_once_without_savepoints(store: SqliteStore) -> None:
    runs: list[str] = []
    statements = traced(store)
    outcomes = store._commit_batch_sync([remember("a", runs), remember("b", runs)])  # type: ignore[list-item]
    assert [o.value for o in outcomes] == [1, 1] and runs == ["a", "b"]
    assert not any("SAVEPOINT" in s for s in statements)
    assert statements.count("COMMIT") == 1 and keys(store) == ["a", "b"]


async def test_one_failing_op_fails_alone_and_leaves_no_trace(store: SqliteStore) -> None:
    runs: list[str] = []
    commits = store.stats.commits
    outcomes = store._commit_batch_sync(
        [remember("a", runs), half_then_fail(runs), remember("b", runs)])  # type: ignore[list-item]
    assert [o.value for o in outcomes] == [1, None, 1]
    assert isinstance(outcomes[1].error, ValueError)
    assert keys(store) == ["a", "b"]                   # each once; the failed op's write is gone
    assert store.stats.commits == commits + 1          # one transaction for the whole batch
    assert runs == ["a", "bad", "a", "bad", "b"]       # bare until the failure, then isolated


async def test_a_failing_op_alone_commits_nothing(store: SqliteStore) -> None:
    runs: list[str] = []
    commits = store.stats.commits
    [outcome] = store._commit_batch_sync([half_then_fail(runs)])  # type: ignore[list-item]
    assert isinstance(outcome.error, ValueError)
    assert keys(store) == [] and store.stats.commits == commits and runs == ["bad"]
    assert store._writer is not None and not store._writer.in_transaction


# -- adjacent appends go in together: a statement is a GIL round trip of the writer thread ----------


def append(cid: str, first: int, count: int = 2) -> _Append:
    return _Append(cid, [(cid, seq, "answer.delta", b'{"text":"x"}', 1.0) for seq in range(first, first + count)], [])


def stored(store: SqliteStore, cid: str) -> tuple[list[int], int | None]:
    assert store._writer is not None
    seqs = [row[0] for row in store._writer.execute("SELECT seq FROM events WHERE conversation_id = ? ORDER BY seq", (cid,))]
    last = store._writer.execute("SELECT last_seq FROM streams WHERE conversation_id = ?", (cid,)).fetchone()
    return seqs, None if last is None else last[0]


async def test_adjacent_appends_go_in_with_a_few_statements_and_each_is_checked_alone(store: SqliteStore) -> None:
    store._commit_batch_sync([append("old", 1), functools.partial(_delete, "gone", "k", 0.0)])  # type: ignore[list-item]
    batch = [append(f"c{i}", 1) for i in range(200)] + [append("old", 5), append("gone", 1), append("old2", 3)]
    statements = traced(store)
    outcomes = store._commit_batch_sync(batch)  # type: ignore[arg-type]
    assert len(statements) == 6, statements             # BEGIN, 2 reads, 2 writes, COMMIT — not 4 per append
    assert all(o.error is None for o in outcomes[:200])
    assert isinstance(outcomes[200].error, SeqConflict)      # old's log ends at 2: 5 would leave a gap
    assert isinstance(outcomes[201].error, Tombstoned)       # deleted: never written to again
    assert isinstance(outcomes[202].error, SeqConflict)      # a new log starts at 1
    assert stored(store, "c0") == ([1, 2], 2) and stored(store, "c199") == ([1, 2], 2)
    assert stored(store, "old") == ([1, 2], 2) and stored(store, "gone") == ([], None)
    assert stored(store, "old2") == ([], None)


async def test_a_batch_keeps_its_order_around_other_ops_and_repeated_conversations(store: SqliteStore) -> None:
    batch = [append("a", 1), append("b", 1), append("a", 3),           # a twice: its second append follows its first
             functools.partial(_delete, "b", "k", 0.0), append("b", 3)]  # written before the delete, refused after it
    outcomes = store._commit_batch_sync(batch)  # type: ignore[arg-type]
    assert [o.error for o in outcomes[:4]] == [None, None, None, None]
    assert isinstance(outcomes[4].error, Tombstoned)
    assert stored(store, "a") == ([1, 2, 3, 4], 4)
    assert stored(store, "b") == ([], None)     # the delete removed what came before it
