"""Load shedding end to end (docs/design.md#overload): a gateway whose event loop runs late refuses
new clients — a WebSocket handshake, a frontend's request — with 503 and Retry-After, before their
token is looked at, while a connection already open goes on being served; once the loop is on time
again, new clients get in.

The loop is made late for real: the gateway runs in the test's process, the test holds its loop
with CPU work, and the gateway's own probe sees the timers fire late. While the test checks what a
late replica does, it keeps the loop late (held most of the time, free in between), so a slow
machine cannot see it recover before the checks are done. Both backends: the gateway is
the same program, the hosting under it is not (tests/e2e.py `ray_server`). The other signal, late
live events, is measured by the gateway's sessions whatever the backend: it is shown on the gateway
alone, with a fake backend whose events are as late as a test makes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from client.connection import Backoff, Connection, ConnectionLost
from client.session import ClientSession, Opened
from gateway.overload import RETRY_AFTER_S
from gateway.server import LISTEN_BACKLOG
from tests.e2e import (
    SECRET,
    LocalServer,
    RayHosting,
    check_log,
    local_server,
    ray_hosting,
    ray_server,
    token,
    weather_then_answer,
)
from tests.gateway_harness import Harness, running
from tests.kit import PROTO, TIMEOUT, http_get, wait_until

LIMIT_MS = 100
HOLD_S = 3.0   # the probe sees ≥ 2.9 s late: a second of probes before the lag falls under half the limit
BUSY_S, FREE_S = 0.3, 0.05   # kept late: each probe fires up to 0.3 s late, far over LIMIT_MS


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayHosting]:
    with ray_hosting(tmp_path_factory.mktemp("ray"), {"demo": weather_then_answer()}) as hosting:
        yield hosting


@pytest.fixture(params=["local", pytest.param("ray", marks=pytest.mark.ray)])
async def server(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LocalServer]:
    settings = {"auth_secret": SECRET, "overload_lag_ms": LIMIT_MS}
    if request.param == "ray":
        async with ray_server(request.getfixturevalue("ray_cluster"), **settings) as s:
            yield s
    else:
        async with local_server(tmp_path / "s.sqlite3", **settings) as s:
            yield s


def hold_the_loop(seconds: float) -> None:
    """CPU work on the gateway's own loop: nothing else runs on it meanwhile, its timers fire late."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@contextlib.asynccontextmanager
async def loop_kept_late() -> AsyncIterator[None]:
    """The loop held BUSY_S out of every BUSY_S + FREE_S until the block ends: late for as long as a
    check takes, however slow the machine, and the rest of the loop still runs in between."""

    async def hog() -> None:
        while True:
            hold_the_loop(BUSY_S)
            await asyncio.sleep(FREE_S)

    task = asyncio.get_running_loop().create_task(hog())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def refused_handshake(s: LocalServer | Harness, bearer: str | None) -> InvalidStatus:
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else None
    with pytest.raises(InvalidStatus) as refused:
        async with connect(s.url, subprotocols=PROTO, additional_headers=headers, open_timeout=TIMEOUT):
            pass
    return refused.value


async def post_chat(s: LocalServer, bearer: str) -> tuple[int, bytes, dict[str, str]]:
    body = {"id": "chat-1", "messages": [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}]}
    async with aiohttp.ClientSession() as http, http.post(
        f"http://127.0.0.1:{s.port}/api/chat", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {bearer}"},
        timeout=aiohttp.ClientTimeout(total=TIMEOUT),
    ) as response:
        return response.status, await response.read(), dict(response.headers)


async def test_a_late_loop_refuses_new_clients_and_serves_the_open_ones(server: LocalServer) -> None:
    s, alice = server, token("alice")
    async with s.client(alice) as open_before:
        cid = await open_before.open()
        await open_before.subscribe(cid)
        assert not s.server.overload.overloaded

        async with loop_kept_late():
            await wait_until(lambda: s.server.overload.overloaded)

            # a new WebSocket: 503 and Retry-After; the connection open before is served meanwhile
            # (its message taken between a refusal and a state still overloaded)
            refused = (await refused_handshake(s, alice)).response
            ack = await open_before.say(cid)
            assert ack["type"] == "ack", ack
            assert s.server.overload.overloaded, "the loop recovered before the open connection was checked"
            for response in (refused, (await refused_handshake(s, None)).response):   # no token: no token check
                assert response.status_code == 503
                assert response.headers["Retry-After"] == str(RETRY_AFTER_S)
                assert response.body is not None
                assert response.body.startswith(b"overloaded: this replica is late (its event loop runs ")
            # a frontend's request: the same refusal, before the body is read for a turn
            status, body, headers = await post_chat(s, alice)
            assert (status, headers.get("Retry-After")) == (503, str(RETRY_AFTER_S)), body
            assert body.startswith(b"overloaded: ")
            # liveness is not load: the probe of a load balancer still gets its answer
            assert (await http_get(s.host, s.port, "/healthz"))[0] == 200

        done = await open_before.turn_completed(cid)
        assert done["data"]["final_answer"]
        check_log(open_before.events[cid])

    # on time again: a new client gets in
    await wait_until(lambda: not s.server.overload.overloaded)
    async with s.client(alice) as later:
        assert (await later.request(type="ping"))["type"] == "pong"
    _, _, page = await http_get(s.host, s.port, "/metrics")
    assert b'reactgate_connections_refused_total{reason="overloaded"} 3.0' in page
    assert b"reactgate_event_loop_lag_seconds " in page


async def test_late_live_events_refuse_new_clients_and_a_replay_is_not_late() -> None:
    """The other signal, on the gateway alone (a fake backend stands in for a host that is late): live
    events that reach their connection's queue later than the limit make the replica refuse new
    clients; the same number of events replayed from history do not. The limit is 1 µs, so every live
    event is late; the loop's own signal is off."""
    async with running(overload_lag_ms=0, overload_delivery_ms=0.001) as h:
        async with h.client() as reader:
            cid = await reader.open()
            await h.backend.emit(cid, 300)                   # history: made before the subscription
            await reader.subscribe(cid)
            await reader.until(lambda: reader.last_seq(cid) == 300 or None)
            await wait_until(lambda: h.server.overload.volume == 0.0 and h.server.overload._arrived == 0)
            assert not h.server.overload.overloaded

            await h.backend.emit(cid, 300)                   # live: made after it
            await wait_until(lambda: h.server.overload.overloaded)
            refused = (await refused_handshake(h, None)).response
            assert refused.status_code == 503 and refused.headers["Retry-After"] == str(RETRY_AFTER_S)
            assert refused.body is not None and refused.body.startswith(b"overloaded: this replica is late (")
            assert b"of its events arrive later than 0 ms" in refused.body
            await reader.until(lambda: reader.last_seq(cid) == 600 or None)   # the open connection is served
            assert reader.seqs(cid) == list(range(1, 601))

        await wait_until(lambda: not h.server.overload.overloaded)          # nothing late arrives any more
        async with h.client() as later:
            assert (await later.request(type="ping"))["type"] == "pong"


async def test_the_listening_socket_queues_a_burst_of_clients_instead_of_dropping_them() -> None:
    """A burst of new clients waits in the kernel's accept queue until the gateway answers each (a 503
    when late), instead of being dropped when the queue is full (asyncio's default holds 100: 1,000
    clients within 5 s overflowed it, bench/README.md "Overload"). The queue's size, as the kernel
    reports it for a listening socket (`ss`: Send-Q), is LISTEN_BACKLOG, or the kernel's cap if lower."""
    ss = shutil.which("ss")
    if ss is None:
        pytest.skip("iproute2's ss is not installed: it is what reads a listening socket's queue size")
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    async with running() as h:
        listed = subprocess.run([ss, "-Hltn", f"sport = :{h.port}"], capture_output=True, text=True, check=True).stdout
    (line,) = listed.splitlines()
    state, _, queue_size, *_ = line.split()
    assert state == "LISTEN" and int(queue_size) == min(LISTEN_BACKLOG, somaxconn) > 100


async def test_the_client_library_waits_the_refusals_retry_after_then_gets_in() -> None:
    """client/connection.py, refused by a late gateway: its next attempt is no sooner than the 503's
    Retry-After, though its own backoff would come back within 20 ms; once the gateway is on time,
    the connection opens."""
    async with running(overload_lag_ms=LIMIT_MS) as h:
        assert (await http_get(h.host, h.port, "/healthz"))[0] == 200   # the gateway's probe is running
        hold_the_loop(HOLD_S)
        await wait_until(lambda: h.server.overload.overloaded)
        items: list[Any] = []
        connection = Connection(ClientSession(), h.url, backoff=Backoff(base_s=0.01, cap_s=0.02))
        async with connection:
            async for item in connection:
                items.append(item)
                if isinstance(item, Opened):
                    break
        lost = [item for item in items if isinstance(item, ConnectionLost)]
        assert lost and lost[0].reason.startswith("HTTP 503 overloaded: this replica is late")
        assert all(item.retry_in_s >= RETRY_AFTER_S for item in lost if item.reason.startswith("HTTP 503"))
        assert isinstance(items[-1], Opened)
