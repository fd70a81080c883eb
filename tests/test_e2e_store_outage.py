"""The store goes away and comes back (docs/design.md#store-outage), over a real gateway on the local
and the Ray backend, with a private PostgreSQL (tests/pgkit.py) stopped as a crash stops it:

- a 5 s outage mid-answer: `/readyz` says the store is unavailable, then ready again; every turn completes whole, each client saw every event once, seqs
  contiguous, the store's replay equal to what each client saw; the next turn and a new conversation
  work;
- a command during the outage is refused `unavailable` with `retry_after_ms`, and the same frame
  (same id) is accepted once the store is back;
- an outage longer than `store_outage_s`: the conversations deactivate, and each recovers at its next
  activation with its cut answer continued.

The outage lengths are the faults themselves (a failover takes seconds), not waits for an event:
every wait for what the server does is a wait for that event.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e import (
    LocalServer,
    RayHosting,
    as_frames,
    check_log,
    local_server,
    ray_hosting,
    ray_server,
    slow_answer_script,
)
from tests.kit import Client, http_get
from tests.pgkit import PrivatePostgres, require_private_postgres

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# The demo turn, then a 240-character answer in 60 chunks 50 ms apart: 3 s of streaming to cut into;
# asked to continue a cut answer, the model goes on from it (docs/design.md#continuation).
SCRIPT = {**slow_answer_script(answer_chars=240, delay_ms=50), "continues": True}
CONVERSATIONS = 4
OUTAGE_S = 5.0
TURN_TIMEOUT_S = 120.0
_schemas = itertools.count(1)

Serve = Callable[..., contextlib.AbstractAsyncContextManager[LocalServer]]


@pytest.fixture(scope="module")
def pg() -> Iterator[PrivatePostgres]:
    require_private_postgres()
    server = PrivatePostgres().init()
    try:
        yield server
    finally:
        server.shutdown()


@pytest.fixture
def store(pg: PrivatePostgres) -> Iterator[PrivatePostgres]:
    """The private server, running, for one test (a test that stopped it and failed leaves it up)."""
    yield pg
    if pg.postmaster_pid() is None:
        pg.start()


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory, pg: PrivatePostgres) -> Iterator[RayHosting]:
    url = f"{pg.dsn}?schema=ray_{uuid.uuid4().hex[:8]}"
    with ray_hosting(tmp_path_factory.mktemp("ray"), {"demo": SCRIPT}, store=url) as hosting:
        yield hosting


@pytest.fixture(params=["local", pytest.param("ray", marks=pytest.mark.ray)])
def serve(request: pytest.FixtureRequest, tmp_path: Path, store: PrivatePostgres) -> Serve:
    if request.param == "ray":
        hosting: RayHosting = request.getfixturevalue("ray_cluster")
        return lambda **settings: ray_server(hosting, **settings)
    url = f"{store.dsn}?schema=local_{next(_schemas)}_{uuid.uuid4().hex[:8]}"
    return lambda **settings: local_server(tmp_path / "unused.sqlite3", SCRIPT, store=url, **settings)


@contextlib.asynccontextmanager
async def outage(pg: PrivatePostgres, seconds: float) -> AsyncIterator[None]:
    """The store crashes, stays away `seconds` (the fault's length), and comes back."""
    await asyncio.to_thread(pg.stop, "immediate")
    try:
        yield
        await asyncio.sleep(seconds)
    finally:
        await asyncio.to_thread(pg.start)


async def readyz(server: LocalServer, status: int) -> bytes:
    """/readyz's body, once it answers `status` (the gateway looks at its store every 2 s)."""
    async def poll() -> bytes:
        while True:
            got, _, body = await http_get(server.host, server.port, "/readyz")
            if got == status:
                return body
            await asyncio.sleep(0.1)

    return await asyncio.wait_for(poll(), TURN_TIMEOUT_S)


async def streaming(c: Client, cids: list[str]) -> None:
    """Every conversation is mid-answer."""
    await c.until(lambda: all(any(e["event"] == "answer.delta" for e in c.events.get(cid, ())) for cid in cids)
                  or None, TURN_TIMEOUT_S)


async def whole(server: LocalServer, c: Client, cid: str, turns: int) -> None:
    """What the client saw is the store's log, event for event, with `turns` whole turns."""
    await c.turn_completed(cid, f"t{turns}", TURN_TIMEOUT_S)
    seen = c.events[cid]
    check_log(seen)
    assert seen == as_frames(await server.log(cid))
    for turn in range(1, turns + 1):
        done = next(e["data"] for e in seen if e["event"] == "turn.completed" and e["data"]["turn_id"] == f"t{turn}")
        answer = "".join(e["data"]["text"] for e in seen if e["event"] == "answer.delta" and e["data"]["turn_id"] == f"t{turn}")
        assert (done["reason"], done["final_answer"]) == ("complete", answer), [
            (e["seq"], e["event"], e["data"].get("text") or e["data"].get("kind") or "") for e in seen]


async def test_a_short_outage_mid_answer_pauses_every_turn_and_loses_nothing(serve: Serve, store: PrivatePostgres) -> None:
    async with serve() as server, server.client() as c:
        cids = [await c.open() for _ in range(CONVERSATIONS)]
        for cid in cids:
            await c.subscribe(cid)
            await c.say(cid)
        await streaming(c, cids)
        async with outage(store, OUTAGE_S):
            # the replica says why it takes no new conversations — on Ray too, where only hosts write
            body = await readyz(server, 503)
            assert body.startswith(b"not ready: store unavailable since "), body
        await readyz(server, 200)
        for cid in cids:
            await whole(server, c, cid, 1)
        # the next turn, and a conversation opened after the outage
        await c.say(cids[0], id="again")
        await whole(server, c, cids[0], 2)
        fresh = await c.open()
        await c.subscribe(fresh)
        await c.say(fresh)
        await whole(server, c, fresh, 1)


async def test_a_command_during_the_outage_is_unavailable_and_the_same_frame_goes_through_after(
    serve: Serve, store: PrivatePostgres,
) -> None:
    async with serve() as server, server.client() as c:
        cid = await c.open()
        await c.subscribe(cid)
        await c.say(cid)
        await streaming(c, [cid])
        async with outage(store, OUTAGE_S):
            refused = await c.request(type="user_message", id="during", conversation_id=cid, text="and Oslo?")
            assert (refused["type"], refused["code"]) == ("error", "unavailable"), refused
            assert refused["retry_after_ms"] > 0 and "internal" not in refused["message"]
        await whole(server, c, cid, 1)
        accepted = await c.request(type="user_message", id="during", conversation_id=cid, text="and Oslo?")
        assert (accepted["type"], accepted["status"]) == ("ack", "accepted")
        await whole(server, c, cid, 2)


async def test_an_outage_past_store_outage_s_recovers_each_conversation_at_its_next_activation(
    serve: Serve, store: PrivatePostgres,
) -> None:
    async with serve(store_outage_s=2.0) as server:
        async with server.client() as c:
            cids = [await c.open() for _ in range(2)]
            for cid in cids:
                await c.subscribe(cid)
                await c.say(cid)
            await streaming(c, cids)
            async with outage(store, OUTAGE_S):
                pass
        async with server.client() as again:   # a client comes back: subscribing activates each
            for cid in cids:
                await again.subscribe(cid)
            for cid in cids:
                await whole(server, again, cid, 1)
