"""`delete` and `export` over a real gateway on loopback, on both backends (docs/wire-protocol.md#delete,
docs/wire-protocol.md#export, docs/design.md#deletion).

A delete mid-answer ends every watcher's stream with `conversation.deleted` as its next seq, leaves
nothing of the conversation in the store but its tombstone (the SQLite file is read directly), stops
it where it was hosted (on Ray: no host holds it, the Directory has no placement for it), and from
then on the id answers exactly like one that never existed. An export is, frame for frame and byte
for byte, what a subscriber got, then `export.completed`. Both are idempotent by frame id and only
the owner's.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.hosting.local import LocalBackend
from tests.e2e import (
    LocalServer,
    RayHosting,
    local_server,
    ray_hosting,
    ray_server,
    slow_answer_script,
    token,
)
from tests.kit import TIMEOUT, Client

SECRET = "delete-export-secret-for-hs256-32b!"
SCRIPT = slow_answer_script(answer_chars=160, delay_ms=10)   # the answer streams for a while: time to cut it
NEVER = "c_NeverExistedNeverExisted"                         # an id nobody owns
# Every table that keys a row by conversation (the tool pool's snapshot has a key of its own).
TABLES = ("conversations", "streams", "events", "snapshots", "idempotency_keys", "tool_results", "round_outputs",
          "conversation_list")


@pytest.fixture(scope="module")
def hosting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayHosting]:
    with ray_hosting(tmp_path_factory.mktemp("ray"), {"slow": SCRIPT}) as hosting:
        yield hosting


@pytest.fixture(params=["local", pytest.param("ray", marks=pytest.mark.ray)])
async def served(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[LocalServer, Path]]:
    """A gateway with auth on (owners are real) over either backend, and its SQLite file."""
    if request.param == "local":
        path = tmp_path / "local.sqlite3"
        async with local_server(path, SCRIPT, auth_secret=SECRET) as server:
            yield server, path
        return
    hosting: RayHosting = request.getfixturevalue("hosting")
    async with ray_server(hosting, auth_secret=SECRET) as server:
        yield server, Path(hosting.config.store_url.removeprefix("sqlite:///"))


def alice() -> str:
    return token("alice", secret=SECRET)


def mallory() -> str:
    return token("mallory", secret=SECRET)


def rows(store: Path, cid: str) -> dict[str, int]:
    """How many rows each table holds for the conversation, read straight from the file."""
    with sqlite3.connect(store) as db:
        found = {t: db.execute(f"SELECT count(*) FROM {t} WHERE conversation_id = ?", (cid,)).fetchone()[0]
                 for t in (*TABLES, "tombstones")}
        found["toolpool snapshot"] = db.execute(
            "SELECT count(*) FROM snapshots WHERE conversation_id = ?", (f"toolpool/{cid}",)).fetchone()[0]
    return found


async def held_by(server: LocalServer, cid: str) -> list[str]:
    """Where the conversation is held now: an activation on a host, a placement in the Directory."""
    backend = server.backend
    if isinstance(backend, LocalBackend):
        return ["local host"] if cid in backend.host.active_ids else []
    import ray

    from actors.ray.names import NAMESPACE

    held = []
    for name in await backend.hosts():
        if cid in (await ray.get_actor(name, namespace=NAMESPACE).stats.remote())["active_ids"]:
            held.append(name)
    if await backend.holder(cid) is not None:
        held.append("directory")
    return held


async def frames_until(c: Client, last: Callable[[dict[str, Any]], bool]) -> list[str]:
    """Every frame as received, raw, up to the first one `last` accepts."""
    frames: list[str] = []

    async def read() -> list[str]:
        while True:
            raw = await c.ws.recv()
            assert isinstance(raw, str)
            frames.append(raw)
            if last(json.loads(raw)):
                return frames

    return await asyncio.wait_for(read(), TIMEOUT)


def events_of(frames: list[str], cid: str) -> list[str]:
    return [f for f in frames if json.loads(f).get("type") == "event" and json.loads(f)["conversation_id"] == cid]


async def refusals(c: Client, cid: str) -> list[dict[str, Any]]:
    """What `open`, `subscribe`, `user_message`, `export` and `delete` naming `cid` get (ids dropped)."""
    replies = [
        await c.request(type="open", conversation_id=cid),
        await c.request(type="subscribe", conversation_id=cid),
        await c.request(type="user_message", conversation_id=cid, text="hi"),
        await c.request(type="export", conversation_id=cid),
        await c.request(type="delete", conversation_id=cid),
    ]
    return [{k: v for k, v in r.items() if k not in ("id", "conversation_id")} for r in replies]


FORBIDDEN = {"type": "error", "code": "forbidden", "message": "forbidden: no such conversation for this caller"}


async def test_a_delete_mid_stream_ends_the_stream_and_leaves_only_a_tombstone(served: tuple[LocalServer, Path]) -> None:
    server, store = served
    async with server.client(alice()) as watcher, server.client(alice()) as other:
        cid = await watcher.open()
        await watcher.subscribe(cid)
        await watcher.say(cid, id="m1")
        await watcher.event(cid, "answer.delta")                      # the answer is streaming
        before = rows(store, cid)
        assert all(before[t] > 0 for t in TABLES) and before["tombstones"] == 0, before

        ack = await other.request(type="delete", id="d1", conversation_id=cid)
        assert ack == {"type": "ack", "id": "d1", "status": "accepted", "conversation_id": cid}
        final = await watcher.event(cid, "conversation.deleted")
        assert watcher.seqs(cid) == list(range(1, final["seq"] + 1))  # the next seq after what it got
        assert final["data"] == {"last_seq": final["seq"] - 1}        # and it got everything published

        # Nothing follows, and nothing is written: a whole turn of another conversation runs on the
        # same hosts meanwhile (the deleted turn had more to stream), then everything is looked at again.
        other_cid = await other.open()
        await other.subscribe(other_cid)
        await other.say(other_cid, id="m2")
        await other.turn_completed(other_cid)
        assert (await watcher.request(type="ping"))["type"] == "pong"
        assert watcher.events[cid][-1] == final
        assert rows(store, cid) == {**dict.fromkeys(TABLES, 0), "tombstones": 1, "toolpool snapshot": 0}
        assert await held_by(server, cid) == []

        # From now on the id is nobody's: every frame naming it gets what a never-existing one gets.
        assert await refusals(other, cid) == await refusals(other, NEVER) == [FORBIDDEN] * 5


async def test_an_export_is_byte_for_byte_what_a_subscriber_saw(served: tuple[LocalServer, Path]) -> None:
    server, _ = served
    async with server.client(alice()) as c:
        cid = await c.open()
        await c.send(type="subscribe", id="s1", conversation_id=cid)
        await c.send(type="user_message", id="m1", conversation_id=cid, text="weather in Paris?")
        seen = events_of(await frames_until(c, lambda f: f.get("event") == "turn.completed"), cid)
    async with server.client(alice()) as c:
        await c.send(type="export", id="x1", conversation_id=cid)
        frames = await frames_until(c, lambda f: f["type"] == "export.completed")
    last_seq = len(seen)
    assert json.loads(frames[0]) == {"type": "ack", "id": "x1", "status": "accepted", "conversation_id": cid,
                                     "last_seq": last_seq}
    assert frames[1:-1] == seen                                       # same events, same order, same bytes
    assert json.loads(frames[-1]) == {"type": "export.completed", "id": "x1", "conversation_id": cid,
                                      "events": last_seq, "last_seq": last_seq}


async def test_a_second_device_and_an_export_read_what_the_user_wrote(served: tuple[LocalServer, Path]) -> None:
    """The user's words are in the log (docs/wire-protocol.md#usermessage): another connection of the
    same owner — a second device — replays them before each turn, and an export holds them."""
    server, store = served
    async with server.client(alice()) as phone:
        cid = await phone.open()
        await phone.subscribe(cid)
        await phone.say(cid, "weather in Paris?", id="m1")
        await phone.turn_completed(cid)
    async with server.client(alice()) as laptop:
        await laptop.send(type="subscribe", id="s1", conversation_id=cid, after_seq=0)
        replayed = [json.loads(f) for f in events_of(
            await frames_until(laptop, lambda f: f.get("event") == "turn.completed"), cid)]
        await laptop.send(type="export", id="x1", conversation_id=cid)
        exported = [json.loads(f) for f in await frames_until(laptop, lambda f: f["type"] == "export.completed")]
    assert [(e["event"], e["data"]) for e in replayed[:2]] == [
        ("user.message", {"message_id": "m1", "text": "weather in Paris?"}),
        ("turn.started", {"turn_id": "t1", "user_message_id": "m1"}),
    ]
    assert [e["data"]["text"] for e in exported if e.get("event") == "user.message"] == ["weather in Paris?"]
    async with server.client(alice()) as phone:
        assert (await phone.request(type="delete", id="d1", conversation_id=cid))["status"] == "accepted"
    with sqlite3.connect(store) as db:  # deleted with the conversation, like every event
        assert db.execute("SELECT count(*) FROM events WHERE conversation_id = ?", (cid,)).fetchone()[0] == 0


async def test_delete_and_export_are_idempotent_by_frame_id_and_the_owners_alone(
    served: tuple[LocalServer, Path],
) -> None:
    server, store = served
    async with server.client(alice()) as owner, server.client(mallory()) as stranger:
        cid = await owner.open()
        await owner.subscribe(cid)
        await owner.say(cid, id="m1")
        await owner.turn_completed(cid)

        # A stranger gets what it would get for an id that never existed, and changes nothing.
        assert await refusals(stranger, cid) == await refusals(stranger, NEVER) == [FORBIDDEN] * 5
        assert rows(store, cid)["tombstones"] == 0

        exports = []
        for _ in range(2):  # the same id twice: `duplicate`, and the export again, whole
            await owner.send(type="export", id="x1", conversation_id=cid)
            exports.append(await frames_until(owner, lambda f: f["type"] == "export.completed"))
        assert [json.loads(e[0])["status"] for e in exports] == ["accepted", "duplicate"]
        assert exports[0][1:] == exports[1][1:]

        assert (await owner.request(type="delete", id="d1", conversation_id=cid))["status"] == "accepted"
        assert (await owner.request(type="delete", id="d1", conversation_id=cid))["status"] == "duplicate"
        assert await owner.request(type="delete", id="d2", conversation_id=cid) == {**FORBIDDEN, "id": "d2",
                                                                                       "conversation_id": cid}
        # the deleting frame's id is the owner's key, not anyone's
        assert (await stranger.request(type="delete", id="d1", conversation_id=cid))["code"] == "forbidden"
        assert (await owner.request(type="export", id="x1", conversation_id=cid))["code"] == "forbidden"


async def test_a_deleted_conversation_gives_its_open_conversation_quota_back(tmp_path: Path) -> None:
    async with local_server(tmp_path / "q.sqlite3", SCRIPT, auth_secret=SECRET,
                            quota_open_conversations_per_user=1) as server, server.client(alice()) as c:
        first = await c.open()
        assert (await c.request(type="open"))["code"] == "quota_exceeded"
        assert (await c.request(type="delete", conversation_id=first))["status"] == "accepted"
        assert (await c.request(type="open"))["type"] == "ack"     # released before the delete's ack
