"""The one test kit for talking to a gateway: a recording client, waiting, and plain HTTP.

Every test that speaks `reactgate.v1` over a real socket uses these, whatever serves the socket
(the production local backend in `tests/e2e.py`, or the gateway-only fake in
`tests/gateway_harness.py`). The client records every frame it reads — events per conversation,
replies by id — and every wait is a condition over what was recorded, bounded by a timeout, never a
wall-clock sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, TypeVar

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

from protocol.frames import SUBPROTOCOL

TIMEOUT = 20.0          # a generous bound for one condition; the tests never assert durations
PROTO = [Subprotocol(SUBPROTOCOL)]
T = TypeVar("T")


class Client:
    """Records every frame read: events per conversation in arrival order, other frames in `others`
    until a waiter claims them. Every wait is a condition over what was recorded, bounded by a timeout."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.events: dict[str, list[dict[str, Any]]] = {}
        self.others: list[dict[str, Any]] = []
        self._ids = itertools.count(1)

    # -- sending -------------------------------------------------------------------------------

    async def send(self, **frame: Any) -> str:
        frame.setdefault("id", f"f{next(self._ids)}")
        await self.ws.send(json.dumps(frame))
        return str(frame["id"])

    async def request(self, **frame: Any) -> dict[str, Any]:
        """Send a frame; its reply (ack, error or pong with the same id)."""
        return await self.reply(await self.send(**frame))

    async def open(self, **fields: Any) -> str:
        ack = await self.request(type="open", **fields)
        assert ack["type"] == "ack", ack
        return str(ack["conversation_id"])

    async def subscribe(self, conversation_id: str, after_seq: int = 0) -> dict[str, Any]:
        ack = await self.request(type="subscribe", conversation_id=conversation_id, after_seq=after_seq)
        assert ack["type"] == "ack", ack
        return ack

    async def say(self, conversation_id: str, text: str = "weather in Paris?", id: str | None = None) -> dict[str, Any]:
        fields = {"id": id} if id else {}
        return await self.request(type="user_message", conversation_id=conversation_id, text=text, **fields)

    # -- receiving -------------------------------------------------------------------------------

    async def _read(self, *, keep: bool = True) -> dict[str, Any]:
        raw = await self.ws.recv()
        frame: dict[str, Any] = json.loads(raw)
        if frame.get("type") == "event":
            self.events.setdefault(frame["conversation_id"], []).append(frame)
        elif keep:
            self.others.append(frame)
        return frame

    async def recv(self, timeout: float = TIMEOUT) -> dict[str, Any]:
        """The next frame, whatever it is (an event is recorded too; a reply is handed over, not kept)."""
        return await asyncio.wait_for(self._read(keep=False), timeout)

    async def until(self, check: Callable[[], T | None], timeout: float = TIMEOUT) -> T:
        """Read frames until `check()` (over what was recorded) returns something other than None."""

        async def loop() -> T:
            while (found := check()) is None:
                await self._read()
            return found

        return await asyncio.wait_for(loop(), timeout)

    async def reply(self, frame_id: str | None, timeout: float = TIMEOUT) -> dict[str, Any]:
        """The ack, error or pong carrying `frame_id` (None: the next one without an id)."""

        def claim() -> dict[str, Any] | None:
            for i, frame in enumerate(self.others):
                if frame.get("id") == frame_id:
                    return self.others.pop(i)
            return None

        return await self.until(claim, timeout)

    async def error(self, code: str, timeout: float = TIMEOUT) -> dict[str, Any]:
        """The next unclaimed error frame with `code` (e.g. slow_consumer, which carries no id)."""

        def claim() -> dict[str, Any] | None:
            for i, frame in enumerate(self.others):
                if frame.get("type") == "error" and frame.get("code") == code:
                    return self.others.pop(i)
            return None

        return await self.until(claim, timeout)

    async def event(self, conversation_id: str, name: str, timeout: float = TIMEOUT, **match: Any) -> dict[str, Any]:
        """The first event `name` of the conversation received so far or to come, whose data matches."""

        def find() -> dict[str, Any] | None:
            for frame in self.events.get(conversation_id, ()):
                if frame["event"] == name and all(frame["data"].get(k) == v for k, v in match.items()):
                    return frame
            return None

        return await self.until(find, timeout)

    async def turn_completed(self, conversation_id: str, turn_id: str = "t1", timeout: float = TIMEOUT) -> dict[str, Any]:
        return await self.event(conversation_id, "turn.completed", timeout, turn_id=turn_id)

    async def closed(self, timeout: float = TIMEOUT) -> ConnectionClosed:
        """Read until the server closes the connection; the ConnectionClosed (`.rcvd.code`)."""

        async def loop() -> ConnectionClosed:
            try:
                while True:
                    await self._read()
            except ConnectionClosed as exc:
                return exc

        return await asyncio.wait_for(loop(), timeout)

    async def events_until(self, conversation_id: str, seq: int, timeout: float = TIMEOUT) -> list[dict[str, Any]]:
        """Read until the conversation's event `seq` arrived; returns that conversation's events."""
        def arrived() -> bool | None:
            return True if any(e["seq"] >= seq for e in self.events.get(conversation_id, ())) else None

        await self.until(arrived, timeout)
        return self.events[conversation_id]

    def seqs(self, conversation_id: str) -> list[int]:
        return [e["seq"] for e in self.events.get(conversation_id, ())]

    def last_seq(self, conversation_id: str) -> int:
        seqs = self.seqs(conversation_id)
        return seqs[-1] if seqs else 0

    def abort(self) -> None:
        """Drop the TCP connection with no close handshake (a lost network, a killed laptop)."""
        self.ws.transport.abort()


@contextlib.asynccontextmanager
async def client(url: str, bearer: str | None = None, **kwargs: Any) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else None
    async with connect(url, subprotocols=PROTO, additional_headers=headers, open_timeout=TIMEOUT, **kwargs) as ws:
        yield Client(ws)


async def wait_until(predicate: Callable[[], bool], timeout: float = TIMEOUT, every: float = 0.005) -> None:
    """A condition on server state that no frame announces (polled, bounded by `timeout`)."""

    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(every)

    await asyncio.wait_for(poll(), timeout)


async def http_get(
    host: str, port: int, path: str, timeout: float = TIMEOUT, headers: Mapping[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """A minimal HTTP/1.1 GET on the gateway's port, with `headers` added: (status, lower-cased headers, body)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{extra}Connection: close\r\n\r\n".encode())
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
