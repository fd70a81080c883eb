"""The gateway alone: a real GatewayServer on 127.0.0.1:0 over `FakeBackend`, for the edge tests
(frames, limits, slow consumers, drain) that need no conversation logic behind the socket. The
client, waiting and HTTP helpers are the shared ones of `tests/kit.py`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from gateway.server import GatewayServer
from gateway.settings import Settings
from tests.fake_backend import FakeBackend
from tests.kit import Client, client


@dataclass
class Harness:
    server: GatewayServer
    backend: FakeBackend
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}/ws"

    def client(self, token: str | None = None, **kwargs: Any) -> contextlib.AbstractAsyncContextManager[Client]:
        return client(self.url, token, **kwargs)


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
