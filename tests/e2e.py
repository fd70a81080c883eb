"""End-to-end harness: a real `reactgate` server on a loopback port, a real `websockets` client.

Three pieces, shared by every `tests/test_e2e_*.py`:

- `local_server(store_path, script, ...)`: `GatewayServer` + the production `LocalBackend`
  (`gateway.app.local_backend`), in-process on 127.0.0.1:0, a temporary SQLite store, and the
  demo profile playing `script` through the real LiteLLM streaming path (docs/design.md#scripted-model);
- the client of `tests/kit.py` (re-exported here), and `LocalServer.stalling_client()`, one whose
  socket blocks the server's after a few KiB once the test stops reading (slow consumers);
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
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jwt

from actors.hosting.local import LocalBackend
from actors.llm.scripts import parse_script, register_script
from actors.profile import AgentProfile, demo_profile
from actors.store.sqlite import SqliteStore
from actors.tools.demo import demo_registry
from gateway.app import AgentSetup, local_backend
from gateway.server import GatewayServer
from gateway.session import WebSocketSink
from gateway.settings import Settings
from protocol.events import Event
from protocol.frames import encode_event
from tests.kit import Client, client, http_get
from tests.roundkit import action, call, complete, text_round, thinking

if TYPE_CHECKING:
    from actors.ray.backend import RayBackend
    from actors.ray.config import RayConfig

SECRET = "e2e-secret-for-hs256-long-enough-32b!"
REPO = Path(__file__).resolve().parent.parent
_names = itertools.count(1)


# -- scripts (docs/design.md#scripted-model) --------------------------------------------------------------------------












def script(*rounds: Mapping[str, Any], loop: bool = False) -> dict[str, Any]:
    return {"rounds": list(rounds), "loop": loop}


def weather_then_answer(answer: str = "It rains in Paris, 12 °C.", **answer_round: Any) -> dict[str, Any]:
    """The demo turn: observe (demo.weather), then complete — a legal finish (docs/design.md#observe-before-finish)."""
    return script(
        text_round(thinking("Checking the weather."), action(call("demo.weather", city="Paris"))),
        text_round(thinking("Answering."), action(complete(answer)), **answer_round),
        loop=True,
    )


def slow_answer_script(answer_chars: int = 240, delay_ms: float = 15) -> dict[str, Any]:
    """A turn whose answer streams slowly (4 chars per delta, `delay_ms` before each)."""
    answer = " ".join(f"word{i:03d}" for i in range(answer_chars // 8))[:answer_chars]
    return weather_then_answer(answer, chunk_chars=4, delay_ms=delay_ms)


# -- tokens (docs/wire-protocol.md#authentication) -----------------------------------------------------------------------


def token(
    sub: str = "alice", tenant: str = "acme", *, secret: Any = SECRET, exp_in: float = 3600, algorithm: str = "HS256",
    headers: dict[str, Any] | None = None, **claims: Any,
) -> str:
    """A token the e2e server accepts by default: `iat` now, `exp` in `exp_in` s (required claims,
    docs/wire-protocol.md#authentication). `claims` add or replace claims; a None drops one."""
    now = time.time()
    payload = {"sub": sub, "tenant": tenant, "iat": int(now), "exp": int(now + exp_in), **claims}
    return jwt.encode({k: v for k, v in payload.items() if v is not None}, secret, algorithm=algorithm, headers=headers)


# -- the client ----------------------------------------------------------------------------------


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
    backend: LocalBackend | RayBackend   # a RayBackend from `ray_server`
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
        (ws,) = [s.sink.ws for s in self.server.sessions
                 if isinstance(s.sink, WebSocketSink) and s.sink.ws.remote_address[1] == port]
        ws.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)

    async def log(self, conversation_id: str) -> list[Event]:
        """The conversation's durable log, read from the store."""
        return await self.backend.store.read_events(conversation_id, 0, limit=100_000)


def store_url(path: Path) -> str:
    return f"sqlite:///{path.resolve()}"


def _playing(profile: AgentProfile, script_data: Mapping[str, Any]) -> AgentProfile:
    name = f"e2e-{os.getpid()}-{next(_names)}"
    register_script(name, parse_script(script_data))
    return profile.with_script(name)


@contextlib.asynccontextmanager
async def local_server(
    store_path: Path,
    script_data: Mapping[str, Any] | None = None,
    *,
    policies: Mapping[str, Any] | None = None,
    profile: AgentProfile | None = None,
    others: Sequence[tuple[AgentProfile, Mapping[str, Any]]] = (),
    scripted: bool = True,
    **settings: Any,
) -> AsyncIterator[LocalServer]:
    """The production assembly (`gateway.app.local_backend`) on 127.0.0.1:0: `profile` (default: the
    demo agent) playing `script_data`, with `policies` overridden and `settings` as Settings fields;
    `others`, more agents served beside it, each playing its script (docs/design.md#several-agents).
    `scripted=False`: the profile calls its own models (a misconfigured one: never a real provider)."""
    registry = demo_registry()
    profile = profile or demo_profile(known_tools=registry)
    if scripted:
        profile = _playing(profile, script_data or weather_then_answer())
    if policies:
        profile = profile.model_copy(update={"policies": profile.policies.model_copy(update=dict(policies))})
    config = Settings(**{"host": "127.0.0.1", "port": 0, "backend": "local", "store": store_url(store_path), **settings})
    served = tuple(_playing(other, data) for other, data in others)
    async with serving(config, AgentSetup(profile, registry, None, served)) as server:
        yield server


@contextlib.asynccontextmanager
async def serving(config: Settings, setup: AgentSetup) -> AsyncIterator[LocalServer]:
    """`setup` (its agents and their tools) assembled as production does (`gateway.app.local_backend`)
    under `config`, started, and drained when the block ends."""
    backend = local_backend(config, setup)
    assert isinstance(backend, LocalBackend)
    server = GatewayServer(config, backend)
    host, port = await server.start()
    try:
        yield LocalServer(server, backend, config, host, port)
    finally:
        await server.drain()


# -- the same server on the Ray backend (tests/test_hosting.py's Ray) ---------------------------------


@dataclass(frozen=True)
class RayHosting:
    """A real Ray instance for one test module and the RayConfig its hosts run. Hosts are started
    once per Ray instance, so every `ray_server` of the module shares this config (store, agents)."""

    config: RayConfig
    default_agent: str


@contextlib.contextmanager
def local_ray(env: Mapping[str, str] | None = None) -> Iterator[Any]:
    """A Ray of this test module's own until the block ends (2 CPUs, no dashboard, reactgate's
    namespace, workers at production's niceness; `env`: its workers' environment variables).
    `address="local"`, as `RayBackend` starts one: a bare `ray.init()` would join whatever cluster a
    `ray start` on this machine recorded."""
    import ray

    from actors.ray.config import WORKER_NICENESS
    from actors.ray.names import NAMESPACE

    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace=NAMESPACE, log_to_driver=False,
             runtime_env={"env_vars": dict(env)} if env else None,
             _system_config={"worker_niceness": WORKER_NICENESS})   # as RayBackend starts one
    try:
        yield ray
    finally:
        ray.shutdown()


@contextlib.contextmanager
def ray_hosting(
    root: Path, scripts: Mapping[str, Mapping[str, Any]], unscripted: Mapping[str, AgentProfile] | None = None,
    profiles: Mapping[str, AgentProfile] | None = None, store: str | None = None,
) -> Iterator[RayHosting]:
    """`local_ray` until the block ends, with one agent per script: the demo
    profile (or the one `profiles` gives) named after the script's key, playing it (the first is the
    default agent); and each of `unscripted` as it is, calling its own models (a misconfigured one:
    never a real provider). `store`: another store than the SQLite file under `root`."""
    from actors.ray.config import RayConfig

    registry = demo_registry()
    served: dict[str, AgentProfile] = {}
    files = {}
    for agent, data in scripts.items():
        path = root / f"{agent}.json"
        path.write_text(json.dumps(data))
        name = f"e2e-ray-{os.getpid()}-{agent}"
        files[name] = str(path)  # each Ray host registers it (gateway/app.py's ray_config does the same)
        base = (profiles or {}).get(agent) or demo_profile(known_tools=registry)
        served[agent] = base.model_copy(update={"name": agent}).with_script(name)
    served.update(unscripted or {})
    config = RayConfig(store_url=store or store_url(root / "ray.sqlite3"), registry=registry, profiles=served,
                       scripts=files, hosts=2)
    with local_ray():
        yield RayHosting(config, next(iter(scripts)))


@contextlib.asynccontextmanager
async def ray_server(hosting: RayHosting, **settings: Any) -> AsyncIterator[LocalServer]:
    """`local_server`'s gateway over a `RayBackend` on `hosting`'s Ray, with `settings` as Settings fields."""
    from actors.ray.backend import RayBackend

    config = Settings(host="127.0.0.1", port=0, backend="ray", store=hosting.config.store_url, **settings)
    server = GatewayServer(config, RayBackend(hosting.config, default_agent=hosting.default_agent))
    host, port = await server.start()
    try:
        yield LocalServer(server, server.backend, config, host, port)  # type: ignore[arg-type]
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
        status, _, _ = await asyncio.wait_for(http_get("127.0.0.1", self.port, "/readyz"), timeout)
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


def small_rcvbuf_socket(host: str, port: int, size: int = 4096) -> socket.socket:
    """A connected client socket with a small receive buffer: a client that stops reading stalls the
    server's socket after a few KiB, instead of after the kernel's autotuned megabytes."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
    sock.connect((host, port))
    sock.setblocking(False)
    return sock
