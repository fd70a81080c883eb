"""`reactgate conversations` (docs/design.md#conversation-list): the list for operators, read from a
real SQLite store — everyone's or one owner's, newest activity first, page after page."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from actors.identity import Owner
from actors.store.sqlite import SqliteStore
from gateway.cli import main

ALICE = Owner(tenant="acme", sub="alice")
BOB = Owner(tenant="globex", sub="bob")


@pytest.fixture
def store(tmp_path: Path) -> str:
    """alice's a0, a1, a2 and bob's b0, b1, created in the order a0 b0 a1 b1 a2; a1 titled and running."""
    path = tmp_path / "store.sqlite3"

    async def fill() -> None:
        s = SqliteStore(path)
        await s.open()
        for at, (cid, owner) in enumerate([("a0", ALICE), ("b0", BOB), ("a1", ALICE), ("b1", BOB), ("a2", ALICE)]):
            await s.create_conversation(cid, owner, "demo", 1000.0 + at)
        await s.note_activity("a1", running=True, at=1002.5, title="weather in Paris?")
        await s.close()

    asyncio.run(fill())
    return f"sqlite:///{path}"


def listed(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["conversations", *args, "--json"]) == 0
    document: dict[str, Any] = json.loads(capsys.readouterr().out)
    return document


def test_everyones_conversations_newest_first_each_naming_its_owner(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    document = listed(capsys, "--store", store)
    assert [(c["conversation_id"], c["tenant"], c["sub"]) for c in document["conversations"]] == [
        ("a2", "acme", "alice"), ("b1", "globex", "bob"), ("a1", "acme", "alice"), ("b0", "globex", "bob"),
        ("a0", "acme", "alice")]
    assert "next_before" not in document
    a1 = document["conversations"][2]
    assert a1 == {"tenant": "acme", "sub": "alice", "conversation_id": "a1", "agent": "demo", "created_at": 1002.0,
                  "last_active_at": 1002.5, "last_seq": 0, "title": "weather in Paris?", "running": True}


def test_one_owners_conversations_page_by_page(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    first = listed(capsys, "--store", store, "--tenant", "acme", "--sub", "alice", "--limit", "2")
    assert [c["conversation_id"] for c in first["conversations"]] == ["a2", "a1"]
    rest = listed(capsys, "--store", store, "--tenant", "acme", "--sub", "alice", "--limit", "2",
                  "--before", first["next_before"])
    assert [c["conversation_id"] for c in rest["conversations"]] == ["a0"] and "next_before" not in rest


def test_the_table_shows_each_row_and_the_next_pages_cursor(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conversations", "--store", store, "--limit", "3"]) == 0
    captured = capsys.readouterr()
    for text in ("a2", "b1", "a1", "globex", "weather in Paris?", "1970-01-01T00:16:42Z"):
        assert text in captured.out
    assert "a0" not in captured.out and captured.err.startswith("more: --before ")


@pytest.mark.parametrize(("args", "message"), [
    (["--tenant", "acme"], "--tenant and --sub go together"),
    (["--limit", "0"], "--limit must be from 1 to 1000"),
    (["--before", "forged"], "before: not a cursor of this server"),
])
def test_bad_input_exits_2_saying_why(store: str, capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    assert main(["conversations", "--store", store, *args]) == 2
    assert message in capsys.readouterr().err


def test_a_store_that_does_not_exist_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conversations", "--store", f"sqlite:///{tmp_path}/none.sqlite3"]) == 2
    assert "no SQLite store at" in capsys.readouterr().err
