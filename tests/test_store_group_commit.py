"""SQLite group commit (actors/store/sqlite.py): a batch runs bare, in one transaction; when one of
its ops fails, the batch runs again with a savepoint per op — every other op commits exactly once,
the failed one leaves no trace, and nothing is committed in between."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from actors.store.sqlite import SqliteStore


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
