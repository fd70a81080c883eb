"""End-to-end harness: a real `reactgate` server on a loopback port, a real `websockets` client.

Three pieces, shared by every `tests/test_e2e_*.py`:

- `local_server(store_path, script, ...)`: `GatewayServer` + the production `LocalBackend`
  (`gateway.app.local_backend`), in-process on 127.0.0.1:0, a temporary SQLite store, and the
  demo profile playing `script` through the real LiteLLM streaming path (SPEC §7);
- `Client`: a thin wrapper over `websockets.asyncio.client` that records every frame it reads
  (events per conversation, replies by id) and waits on *conditions* with timeouts, never on
  wall-clock sleeps; `LocalServer.stalling_client()` is one whose socket blocks the server's
  after a few KiB once the test stops reading (slow consumers);
- `ServeProcess`: `reactgate serve --backend local --port 0 --store sqlite:///…` as a subprocess,
  for the kill/drain tests; the port is read from the server's own "listening on" log line.

Scripts are built with `thinking`/`action`/`call`/`complete`/`text_round` so tests read as
what the model says.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import jwt
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

from actors.llm.scripts import parse_script, register_script
from actors.local import LocalBackend
from actors.profile import AgentProfile, demo_profile
from actors.store.sqlite import SqliteStore
from actors.tools.demo import demo_registry
from gateway.app import AgentSetup, local_backend
from gateway.server import GatewayServer
from gateway.settings import Settings
from protocol.events import Event
from protocol.frames import SUBPROTOCOL, encode_event
from tests.roundkit import action, call, complete, text_round, thinking

TIMEOUT = 20.0          # a generous bound for one condition; the tests never assert durations
PROTO = [Subprotocol(SUBPROTOCOL)]
SECRET = "e2e-secret-for-hs256-long-enough-32b!"
REPO = Path(__file__).resolve().parent.parent
_names = itertools.count(1)
T = TypeVar("T")


# -- scripts (SPEC §7) --------------------------------------------------------------------------












def script(*rounds: Mapping[str, Any], loop: bool = False) -> dict[str, Any]:
    return {"rounds": list(rounds), "loop": loop}


def weather_then_answer(answer: str = "It rains in Paris, 12 °C.", **answer_round: Any) -> dict[str, Any]:
    """The demo turn: observe (demo.weather), then complete — a legal finish (SPEC §4.1)."""
    return script(
        text_round(thinking("Checking the weather."), action(call("demo.weather", city="Paris"))),
        text_round(thinking("Answering."), action(complete(answer)), **answer_round),
        loop=True,
    )


def slow_answer_script(answer_chars: int = 240, delay_ms: float = 15) -> dict[str, Any]:
    """A turn whose answer streams slowly (4 chars per delta, `delay_ms` before each)."""
    answer = " ".join(f"word{i:03d}" for i in range(answer_chars // 8))[:answer_chars]
    return weather_then_answer(answer, chunk_chars=4, delay_ms=delay_ms)


# -- tokens (SPEC §6 Auth) -----------------------------------------------------------------------


def token(sub: str = "alice", tenant: str = "acme", *, secret: str = SECRET, exp_in: float = 3600) -> str:
    return jwt.encode({"sub": sub, "tenant": tenant, "exp": int(time.time() + exp_in)}, secret, algorithm="HS256")


# -- the client ----------------------------------------------------------------------------------


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

    async def _read(self) -> dict[str, Any]:
        raw = await self.ws.recv()
        frame: dict[str, Any] = json.loads(raw)
        if frame.get("type") == "event":
            self.events.setdefault(frame["conversation_id"], []).append(frame)
        else:
            self.others.append(frame)
        return frame

    async def until(self, check: Callable[[], T | None], timeout: float = TIMEOUT) -> T:
        """Read frames until `check()` (over what was recorded) returns something other than None."""

        async def loop() -> T:
            while (found := check()) is None:
                await self._read()
            return found

        return await asyncio.wait_for(loop(), timeout)

    async def reply(self, frame_id: str, timeout: float = TIMEOUT) -> dict[str, Any]:
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


async def wait_until(predicate: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    """A condition on server state that no frame announces (polled, bounded by `timeout`)."""

    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout)


def comparable(events: Sequence[Mapping[str, Any]]) -> list[tuple[int, str, Any, float]]:
    """What two clients must agree on, event by event."""
    return [(e["seq"], e["event"], e["data"], e["ts"]) for e in events]


def as_frames(log: Sequence[Event]) -> list[dict[str, Any]]:
    """Durable events as the event frames a client receives (the gateway's own encoding)."""
    return [json.loads(encode_event(e)) for e in log]


def check_log(events: Sequence[Mapping[str, Any]]) -> None:
    """Seq 1..N with no gap and no duplicate; every tool.call has one tool.result; turns start and end once."""
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    calls = [e["data"]["call_id"] for e in events if e["event"] == "tool.call"]
    results = [e["data"]["call_id"] for e in events if e["event"] == "tool.result"]
    assert sorted(calls) == sorted(results) and len(set(calls)) == len(calls), (calls, results)
    started = [e["data"]["turn_id"] for e in events if e["event"] == "turn.started"]
    ended = [e["data"]["turn_id"] for e in events if e["event"] == "turn.completed"]
    assert started == ended, (started, ended)


# -- the in-process server ------------------------------------------------------------------------


@dataclass
class LocalServer:
    server: GatewayServer
    backend: LocalBackend
    settings: Settings
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}/ws"

    def client(self, bearer: str | None = None, **kwargs: Any) -> contextlib.AbstractAsyncContextManager[Client]:
        return client(self.url, bearer, **kwargs)

    @contextlib.asynccontextmanager
    async def stalling_client(self, buffer_bytes: int = 4096) -> AsyncIterator[Client]:
        """A client whose socket buffers hold a few KiB on both sides and whose library stops reading
        after one queued frame: once the test stops calling recv, the server's socket blocks."""
        sock = small_rcvbuf_socket(self.host, self.port, buffer_bytes)
        async with client(self.url, sock=sock, max_queue=1) as c:
            await c.request(type="ping")  # the server's session exists
            self.throttle(c, buffer_bytes)
            yield c

    def throttle(self, c: Client, sndbuf: int = 4096) -> None:
        """Give the server's side of `c`'s connection a small, fixed send buffer (no autotuning to
        megabytes), so a client that stops reading blocks the server's socket after a few KiB."""
        port = c.ws.local_address[1]
        (session,) = [s for s in self.server.sessions if getattr(s.sink, "remote_address", (None, None))[1] == port]
        session.sink.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)  # type: ignore[attr-defined]

    async def log(self, conversation_id: str) -> list[Event]:
        """The conversation's durable log, read from the store."""
        return await self.backend.store.read_events(conversation_id, 0, limit=100_000)


def store_url(path: Path) -> str:
    return f"sqlite:///{path.resolve()}"


@contextlib.asynccontextmanager
async def local_server(
    store_path: Path,
    script_data: Mapping[str, Any] | None = None,
    *,
    policies: Mapping[str, Any] | None = None,
    profile: AgentProfile | None = None,
    **settings: Any,
) -> AsyncIterator[LocalServer]:
    """The production assembly (`gateway.app.local_backend`) on 127.0.0.1:0: `profile` (default: the
    demo agent) playing `script_data`, with `policies` overridden and `settings` as Settings fields."""
    registry = demo_registry()
    profile = profile or demo_profile(known_tools=registry)
    name = f"e2e-{os.getpid()}-{next(_names)}"
    register_script(name, parse_script(script_data or weather_then_answer()))
    profile = profile.with_script(name)
    if policies:
        profile = profile.model_copy(update={"policies": profile.policies.model_copy(update=dict(policies))})
    config = Settings(host="127.0.0.1", port=0, backend="local", store=store_url(store_path), **settings)
    backend = local_backend(config, AgentSetup(profile, registry, None))
    assert isinstance(backend, LocalBackend)
    server = GatewayServer(config, backend)
    host, port = await server.start()
    try:
        yield LocalServer(server, backend, config, host, port)
    finally:
        await server.drain()


# -- the server as a process (`reactgate serve`) ---------------------------------------------------

LISTENING = re.compile(rb"reactgate gateway listening on ([0-9.]+):(\d+)")


@dataclass
class ServeProcess:
    """`reactgate serve --backend local --port 0 --store sqlite:///…` with stdout/stderr in a log file."""

    store_path: Path
    log_path: Path
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0

    def command(self) -> list[str]:
        return [reactgate(), "serve", "--backend", "local", "--store", store_url(self.store_path), *self.args]

    def spawn(self) -> subprocess.Popen[bytes]:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         env=serve_env(self.env), cwd=REPO)
        return self.proc

    async def start(self, timeout: float = 60.0) -> ServeProcess:
        """Spawn, then wait for the "listening on" line and a ready `/readyz`."""
        if "--port" not in self.args:
            self.args = [*self.args, "--port", "0"]
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        proc = self.spawn()

        def listening() -> int | None:
            found = LISTENING.search(self.log_path.read_bytes()[offset:])
            return int(found.group(2)) if found else None

        async def wait_port() -> int:
            while (port := listening()) is None:
                if proc.poll() is not None:
                    raise AssertionError(f"reactgate serve exited with {proc.returncode}:\n{self.output()}")
                await asyncio.sleep(0.05)
            return port

        self.port = await asyncio.wait_for(wait_port(), timeout)
        status, _ = await asyncio.wait_for(http_get("127.0.0.1", self.port, "/readyz"), timeout)
        assert status == 200, self.output()
        return self

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    async def wait(self, timeout: float = 30.0) -> int:
        proc = self.proc
        assert proc is not None

        async def loop() -> int:
            while (code := proc.poll()) is None:
                await asyncio.sleep(0.05)
            return code

        return await asyncio.wait_for(loop(), timeout)

    def stop(self) -> None:
        """Cleanup: SIGKILL whatever still runs (only this test's own process)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def run_serve(*args: str, env: Mapping[str, str] | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """`reactgate serve ARGS` to completion (for start-up refusals)."""
    return subprocess.run([reactgate(), "serve", *args], capture_output=True, text=True, env=serve_env(env or {}),
                          timeout=timeout, cwd=REPO, check=False)


def reactgate() -> str:
    """The console script installed next to this interpreter (the venv's `reactgate`)."""
    exe = Path(sys.executable).with_name("reactgate")
    assert exe.exists(), f"{exe} is missing: install the package (pip install -e .)"
    return str(exe)


def serve_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The test process's environment minus any REACTGATE_* setting of the developer's shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACTGATE_")}
    return {**env, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "RAY_USAGE_STATS_ENABLED": "0", **extra}


async def read_log(store_path: Path, conversation_id: str) -> list[Event]:
    """A conversation's durable log, read straight from the SQLite file."""
    store = SqliteStore(str(store_path))
    await store.open()
    try:
        return await store.read_events(conversation_id, 0, limit=100_000)
    finally:
        await store.close()


async def http_get(host: str, port: int, path: str, timeout: float = TIMEOUT) -> tuple[int, bytes]:
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def small_rcvbuf_socket(host: str, port: int, size: int = 4096) -> socket.socket:
    """A connected client socket with a small receive buffer: a client that stops reading stalls the
    server's socket after a few KiB, instead of after the kernel's autotuned megabytes."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
    sock.connect((host, port))
    sock.setblocking(False)
    return sock
