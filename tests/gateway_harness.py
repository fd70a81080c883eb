"""Test harness for the gateway edge tests: a real GatewayServer on 127.0.0.1:0 over FakeBackend,
and a thin real-websockets client that separates replies (ack/error/pong) from events."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.typing import Subprotocol

from gateway.server import GatewayServer
from gateway.settings import Settings
from protocol.frames import SUBPROTOCOL
from tests.fake_backend import FakeBackend

TIMEOUT = 10.0
PROTO = [Subprotocol(SUBPROTOCOL)]


@dataclass
class Harness:
    server: GatewayServer
    backend: FakeBackend
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}/ws"

    @contextlib.asynccontextmanager
    async def client(self, token: str | None = None, **kwargs: Any) -> AsyncIterator[Client]:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        async with connect(self.url, subprotocols=PROTO, additional_headers=headers, **kwargs) as ws:
            yield Client(ws)


@contextlib.asynccontextmanager
async def running(**overrides: Any) -> AsyncIterator[Harness]:
    backend = FakeBackend()
    settings = Settings(host="127.0.0.1", port=0, backend="local", **overrides)
    server = GatewayServer(settings, backend)
    host, port = await server.start()
    try:
        yield Harness(server, backend, host, port)
    finally:
        await server.drain()


class Client:
    """Replies are matched by id; events received meanwhile are kept in order in `events`."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self.unsolicited: list[dict[str, Any]] = []  # errors without our id (slow_consumer, ...)
        self._n = 0

    def next_id(self) -> str:
        self._n += 1
        return f"f{self._n}"

    async def send(self, **frame: Any) -> str:
        frame.setdefault("id", self.next_id())
        await self.ws.send(json.dumps(frame))
        return str(frame["id"])

    async def recv(self, timeout: float = TIMEOUT) -> dict[str, Any]:
        raw = await asyncio.wait_for(self.ws.recv(), timeout)
        frame: dict[str, Any] = json.loads(raw)
        return frame

    async def reply(self, frame_id: str | None, timeout: float = TIMEOUT) -> dict[str, Any]:
        """The next ack/error/pong carrying `frame_id` (None: the next error without an id)."""

        async def wait() -> dict[str, Any]:
            while True:
                frame = await self.recv(timeout=None)  # type: ignore[arg-type]
                if frame["type"] == "event":
                    self.events.append(frame)
                elif frame.get("id") == frame_id:
                    return frame
                else:
                    self.unsolicited.append(frame)

        return await asyncio.wait_for(wait(), timeout)

    async def request(self, **frame: Any) -> dict[str, Any]:
        return await self.reply(await self.send(**frame))

    async def open(self, **fields: Any) -> str:
        ack = await self.request(type="open", **fields)
        assert ack["type"] == "ack", ack
        return str(ack["conversation_id"])

    async def events_until(self, conversation_id: str, seq: int, timeout: float = TIMEOUT) -> list[dict[str, Any]]:
        """Receive until the event `seq` of a conversation arrived; returns that conversation's events."""

        def have() -> bool:
            return any(e["conversation_id"] == conversation_id and e["seq"] >= seq for e in self.events)

        async def wait() -> None:
            while not have():
                frame = await self.recv(timeout=None)  # type: ignore[arg-type]
                (self.events if frame["type"] == "event" else self.unsolicited).append(frame)

        await asyncio.wait_for(wait(), timeout)
        return [e for e in self.events if e["conversation_id"] == conversation_id]


async def wait_until(predicate: Callable[[], bool], timeout: float = TIMEOUT, every: float = 0.005) -> None:
    """Wait for a condition on server state that has no event to await (polled, bounded)."""

    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(every)

    await asyncio.wait_for(poll(), timeout)


async def http_get(host: str, port: int, path: str, timeout: float = TIMEOUT) -> tuple[int, dict[str, str], bytes]:
    """A minimal HTTP/1.1 GET on the gateway's port (no third-party client needed)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body
