"""A long soak against a real `reactgate serve`, in one command: does anything grow with the
conversations *served* rather than with the conversations *live*?

    .venv/bin/python bench/soak.py                          # 10 minutes, local backend, SQLite
    .venv/bin/python bench/soak.py --backend ray            # Ray: a ConversationHost SIGKILLed every 200 s
    .venv/bin/python bench/soak.py --store postgres --store-restart-every 120   # a private PostgreSQL, restarted
    .venv/bin/python bench/soak.py --quick                  # ~45 s: 0.5 minute of load (tests/test_soak.py)
    # --minutes M  --workers N  --idle-ttl S  --sample-s S  --chunk-ms MS  --host-kill-every S  --keep DIR  --types

What runs, on loopback ports picked free, and stops by itself:
- `reactgate serve` (`--backend local` by default, or `ray` with 2 hosts) playing a scripted agent
  in-process (a `demo.weather` tool round, then a ~64-chunk answer), with every quota off and
  `REACTGATE_IDLE_TTL_S` short (20 s), so that a conversation left alone passivates. The server runs
  from this file (`soak.py _serve …`, which calls `gateway.cli.main(["serve", …])`, the very command)
  so that a sampler task can read, from outside the modules, the sizes of every per-conversation map
  it can reach: the host cores' maps, the ownership cache and the tool executor's (local), the
  gateway's routes and watches, each ConversationHost's maps and outboxes, the Directory's placement
  table and the tool pool's maps (Ray, through the documented `actor.__ray_call__`); plus the count
  of objects the collector tracks and of asyncio tasks, per process.
- `--workers` simulated users (default 12), each a `ClientSession` (client/session.py) over a
  WebSocket, episode after episode: open a new conversation (or, one time in six, re-open one left
  to passivate: its whole log is replayed from seq 1 and verified, and it runs one more turn on its
  restored snapshot), run one or two turns; a fifth of the turns are cut mid-answer (the connection
  aborted at the first `answer.delta`, reconnected at once, resumed after the last seq); then the
  conversation is deleted (half of them) or left to passivate. Every event is judged as it arrives by
  the load tester's `SeqTracker` (client/loadtest/user.py): duplicated, out of order, and lost (up
  to the head the server reports at the episode's end); every turn must complete with the
  `final_answer` its `answer.delta`s spelled out.
- Faults on a timer: with `--backend ray`, a ConversationHost process SIGKILLed (one at a time, in
  turn; the local backend has no host process of its own to kill: not applicable). With
  `--store postgres --store-restart-every S`, a private PostgreSQL (initdb and pg_ctl from
  /usr/lib/postgresql/15/bin, run as the `postgres` user, its own port and data directory, stopped at
  the end by its own postmaster pid) is stopped and started again. Without `--store-restart-every`,
  `--store postgres` uses 127.0.0.1:5432 database `test` with a schema of its own (dropped after).
- A sample every `--sample-s` (10 s): the RSS and open file descriptors of the gateway and of every
  Ray process of the server (ConversationHosts, tool pool, Directory; the rest of Ray summed), the
  store connections of the whole process tree (SQLite: descriptors open on the database file;
  PostgreSQL: TCP connections to its port), and the map sizes above.

Then, for every series, a least-squares slope against the number of conversations served so far
(and against time), fitted after the warm-up (the first 15% of the run, at least two idle TTLs),
within each process incarnation (a host killed and replaced starts a new segment, fitted after a
warm-up of its own). A series grows with what is *served* when its slope is above its bar and three
standard errors: 0.05 entries per conversation served for a map (a map that holds what is live has
none: the live count is flat), 2 KB of RSS, 5 collector-tracked objects, 0.01 descriptors,
connections or processes. A process's own figures (RSS, objects, descriptors, connections) warm up
for minutes (caches, lazily opened connections, cyclic garbage waiting for a full collection), so
they are judged only over at least 4 minutes of one process incarnation, and must keep their pace
over the second half of that window too (a cache filling up slows down; a leak does not). A map with
a documented cap (a host's memory of deleted conversations, 10,000; the ownership cache, 100,000) is
shown as bounded by its cap; the live counts and the rest of Ray's processes are shown, not judged.
Exit 1, with a line naming each, if any series grows with conversations served, or if any event was
lost, duplicated or out of order, or any turn failed, was garbled or never completed (a conversation
whose turn never completed is kept, not deleted, and its last events in the store are printed).

`--types` adds, per process, a full collection before each count ("gc objects after a full
collection": garbage that merely waits for one is not a leak), the objects by type and the asyncio
tasks by coroutine, and prints the types that grew most: where to look when a process grows.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.pgkit import PG_BIN, PrivatePostgres  # noqa: E402

SHARED_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
START_TIMEOUT_S = 120.0
TURN_TIMEOUT_S = 120.0        # a turn cut by a fault still completes well within this
TOOL_ROUND = ('<channel:thinking>Checking the weather in Paris.</channel:thinking>\n<channel:action>```json\n'
              '{"action": "call_tool", "tool_call": {"tool_id": "demo.weather", "params": {"city": "Paris"}}}\n'
              "```</channel:action>")
ANSWER_ROUND = ('<channel:thinking>Paris reports rain at 12 °C.</channel:thinking>\n<channel:action>```json\n'
                '{"action": "complete", "final_answer": "It is raining in Paris, 12 °C. Take an umbrella, and a '
                'light jacket would not hurt at that temperature."}\n```</channel:action>')
QUOTAS_OFF = {f"REACTGATE_QUOTA_{name}": "0" for name in (
    "OPEN_CONVERSATIONS_PER_USER", "OPEN_CONVERSATIONS_PER_TENANT", "CONCURRENT_TURNS_PER_USER",
    "CONCURRENT_TURNS_PER_TENANT", "TURNS_PER_MINUTE_PER_USER", "TURNS_PER_MINUTE_PER_TENANT",
    "TOKENS_PER_DAY_PER_USER", "TOKENS_PER_DAY_PER_TENANT", "CONNECTIONS_PER_IP", "CONNECTIONS_PER_USER")}

# Bars: a series grows with what is served when its slope per conversation served is above its bar
# (and three standard errors). Documented caps: such a map grows until its cap, then is cleared.
MAP_BAR = 0.05                # entries per conversation served
RSS_BAR_KB = 2.0              # KB of RSS per conversation served
FD_BAR = 0.01                 # descriptors, connections or processes per conversation served
OBJECTS_BAR = 5.0             # objects the collector tracks, per conversation served
CAPS = {"deleted remembered": 10_000, "ownership cache": 100_000}
# A process's RSS, objects, descriptors and connections warm up (caches, lazily opened connections,
# allocator arenas) for minutes: judged only over a window at least this long. Maps are exact: always.
MIN_PROCESS_WINDOW_S = 240.0


# =====================================================================================================
# The server side: `soak.py _serve --samples F --period S -- serve …` runs `reactgate serve` with a
# sampler task in its event loop. These functions run in the server's processes (the Ray ones are
# shipped by value with `__ray_call__`), so each imports what it needs itself.


def _size(obj: Any, *path: str) -> int | None:
    """len() of obj.<path…>, or None when a private attribute moved (others may rename them)."""
    try:
        for name in path:
            obj = getattr(obj, name)
        return len(obj)
    except Exception:
        return None


def _host_core_sizes(core: Any) -> dict[str, int | None]:
    return {
        "active (live)": _size(core, "_active"),
        "activating": _size(core, "_activating"),
        "listeners": _size(core, "_listeners"),
        "deleting": _size(core, "_deleting"),
        "deleted remembered": _size(core, "_deleted"),
        "metering tasks": _size(core, "_metering"),
    }


def _process_sizes(types: bool = False) -> dict[str, Any]:
    import asyncio
    import gc
    from collections import Counter

    try:
        tasks: int | None = len(asyncio.all_tasks())
    except RuntimeError:
        tasks = None
    out: dict[str, Any] = {"asyncio tasks": tasks, "gc objects": len(gc.get_objects())}
    if types:  # `--types`: what a full collection leaves, and what those objects are, to find what grows
        gc.collect()
        objects = gc.get_objects()
        out["gc objects after a full collection"] = len(objects)
        out["types"] = dict(Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in objects).most_common(80))
        out["task coroutines"] = dict(Counter(
            f"{getattr(o.get_coro(), '__qualname__', '?')} ({'done' if o.done() else 'pending'})"
            for o in objects if type(o) is asyncio.Task).most_common(20))
        del objects
    return out


def _ray_host_sample(host: Any, types: bool) -> dict[str, Any]:
    import os

    out: dict[str, Any] = {"pid": os.getpid(), "name": host.name}
    core = getattr(host, "_core", None)
    if core is not None:
        out |= _host_core_sizes(core)
    boxes = getattr(getattr(host, "_outboxes", None), "_boxes", None)
    if boxes is not None:
        for _ in range(5):  # a sync call on an async actor: read while its loop may run
            try:
                values = list(boxes.values())
                break
            except RuntimeError:
                values = []
        out["outbox gateways"] = len(values)
        out["outbox watches"] = sum(len(b.watches) for b in values)
        out["outbox pending"] = sum(len(b.pending) for b in values)
    return out | _process_sizes(types)


def _ray_pool_sample(actor: Any, types: bool) -> dict[str, Any]:
    import os

    pool = getattr(actor, "_pool", None)
    held = pool.held() if pool is not None and hasattr(pool, "held") else {}
    if pool is not None and not held:  # a pool from before `held()`: its maps, read directly
        executor, durable = getattr(pool, "_executor", None), getattr(pool, "_durable", None)
        held = {"exploration counters": _size(executor, "_exploration"), "workspaces": _size(executor, "_workspaces"),
                "versions": _size(pool, "_versions"), "loads": _size(pool, "_loading"),
                "executed counts": _size(durable, "executed"), "inflight calls": _size(pool, "_inflight")}
    return {"pid": os.getpid(), **held} | _process_sizes(types)


def _ray_directory_sample(directory: Any, types: bool) -> dict[str, Any]:
    import os

    core = directory.core
    table = getattr(core, "_table", None)
    return {
        "pid": os.getpid(),
        "hosts": sorted(getattr(core, "_handles", {})),
        "placement assigned": _size(table, "assigned"),
        "placement hosts": (_size(table, "live") or 0) + (_size(table, "dedicated") or 0) + (_size(table, "draining") or 0),
        "orphans": _size(core, "orphans"),
        "incarnations": _size(core, "_incarnations"),
        "tasks": _size(directory, "_tasks"),
    } | _process_sizes(types)


def _gateway_sample(backend: Any, types: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"pid": os.getpid(), "ownership cache": _size(backend, "owners", "_cache")}
    host = getattr(backend, "host", None)
    if host is not None:  # local: the host core, and the tool executor behind durable results
        out |= {f"host {k}": v for k, v in _host_core_sizes(host).items()}
        tools = host.runtime.tools
        inner = getattr(tools, "inner", None)
        out |= {"tools: executed counts": _size(tools, "executed"),
                "tools: exploration counters": _size(inner, "_exploration"),
                "tools: workspaces": _size(inner, "_workspaces"),
                "tools: conversation slots": _size(inner, "_conversation_slots")}
    else:  # ray: what the gateway keeps per conversation
        links = getattr(backend, "_links", {})
        out |= {"routes": _size(backend, "_routes"), "host links": len(links),
                "link watches": sum(len(link.watched) for link in list(links.values())),
                "listeners": _size(backend, "_listeners"), "watch locks": _size(backend, "_watch_locks"),
                "tasks": _size(backend, "_tasks")}
    return out | _process_sizes(types)


async def _ray_sample(backend: Any, types: bool) -> dict[str, Any]:
    import ray

    from actors.ray.names import DIRECTORY_NAME, NAMESPACE, tool_pool

    async def call(name: str, fn: Callable[[Any, bool], dict[str, Any]]) -> dict[str, Any] | None:
        try:
            actor = ray.get_actor(name, namespace=NAMESPACE)
            return dict(await asyncio.wait_for(actor.__ray_call__.remote(fn, types), 10.0))
        except Exception as exc:  # a host just killed, not yet replaced
            return {"error": type(exc).__name__}

    directory = await call(DIRECTORY_NAME, _ray_directory_sample) or {}
    hosts = {}
    for name in directory.get("hosts", []):
        sample = await call(name, _ray_host_sample)
        if sample is not None and "error" not in sample:
            hosts[name] = sample
    pool = await call(tool_pool(backend.config.generation), _ray_pool_sample)
    return {"directory": directory, "hosts": hosts, "tool pool": pool}


def serve_with_sampler(samples: Path, period_s: float, argv: list[str], types: bool = False) -> int:
    """`reactgate serve` itself (gateway.cli.main), with a sampler task started once the backend is."""
    import gateway.app

    build = gateway.app.build_backend

    def build_and_watch(settings: Any) -> Any:
        backend: Any = build(settings)
        start = backend.start

        async def start_and_sample() -> None:
            await start()
            task = asyncio.get_running_loop().create_task(_sample_forever(backend, samples, period_s, types))
            backend._soak_sampler = task  # held: a task nobody references may be collected

        backend.start = start_and_sample
        return backend

    gateway.app.build_backend = build_and_watch  # type: ignore[assignment]
    from gateway.cli import main

    return main(argv)


async def _sample_forever(backend: Any, samples: Path, period_s: float, types: bool) -> None:
    ray_backend = not hasattr(backend, "host")
    with samples.open("a", encoding="utf-8") as out:
        while True:
            row: dict[str, Any] = {"t": time.time()}
            try:
                row["gateway"] = _gateway_sample(backend, types)
            except Exception as exc:  # a sample that failed is a row that says why, never a dead sampler
                row["gateway_error"] = repr(exc)
            if ray_backend:
                try:
                    row["ray"] = await _ray_sample(backend, types)
                except Exception as exc:
                    row["ray_error"] = repr(exc)
            out.write(json.dumps(row) + "\n")
            out.flush()
            await asyncio.sleep(period_s)


# =====================================================================================================
# Processes, from /proc.


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not listen on {port} within {START_TIMEOUT_S:.0f} s")


def tree_pids(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def rss_mb(pid: int) -> float | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return None


def fd_targets(pid: int) -> list[str]:
    out = []
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return out


def tcp_inodes_to(port: int) -> set[str]:
    """Socket inodes of established TCP connections whose remote port is `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                parts = line.split()
                if len(parts) > 9 and parts[3] == "01" and int(parts[2].rsplit(":", 1)[1], 16) == port:
                    found.add(parts[9])
    return found


def cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return ""


# =====================================================================================================
# A private PostgreSQL, for the store-restart fault: tests/pgkit.py's (the tests that break the store use it too).


def private_postgres() -> PrivatePostgres:
    if not (PG_BIN / "initdb").exists():
        raise RuntimeError(f"--store-restart-every needs PostgreSQL's binaries in {PG_BIN}")
    if os.geteuid() != 0:
        raise RuntimeError("--store-restart-every runs PostgreSQL as the `postgres` user: run the bench as root")
    return PrivatePostgres().init()


def drop_schema(dsn: str, schema: str) -> None:
    import psycopg

    with contextlib.suppress(Exception), psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# =====================================================================================================
# The load: simulated users whose conversations come and go.


@dataclass
class Totals:
    created: list[float] = field(default_factory=list)      # monotonic time of each new conversation
    revisits: int = 0
    deleted: int = 0
    left: int = 0               # left to passivate
    turns_started: int = 0
    turns_completed: int = 0
    turns_failed: int = 0       # ended with a reason other than complete
    turns_stuck: int = 0        # never completed within TURN_TIMEOUT_S
    garbled: int = 0
    cuts: int = 0
    resumes: int = 0
    events: int = 0
    replayed: int = 0           # events of a re-opened conversation's log, replayed and verified
    lost: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    unverified: int = 0         # episodes whose stream never reached the head the server reported
    stuck: list[str] = field(default_factory=list)   # what a stuck turn's client knew
    stuck_ids: list[str] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)

    def served(self, mono: float) -> int:
        return bisect.bisect_right(self.created, mono)


@dataclass
class _Turn:
    message_id: str
    cut: bool
    turn_id: str | None = None
    answer: list[str] = field(default_factory=list)
    reason: str | None = None
    final: str | None = None


class Conv:
    """One conversation's client: a ClientSession over a WebSocket, reconnected at once when cut."""

    def __init__(self, url: str, totals: Totals, conversation_id: str | None = None) -> None:
        from client.loadtest.user import SeqTracker
        from client.session import ClientSession

        self.url = url
        self.totals = totals
        self.session = ClientSession(conversation_id)
        self.tracker = SeqTracker()
        self.changed = asyncio.Event()
        self.opened_head: int | None = None
        self.head: int | None = None
        self.fatal: str | None = None
        self.turn: _Turn | None = None
        self.turns: list[_Turn] = []
        self._ws: Any = None
        self._closing = False
        self._cut_due = False
        self._task: asyncio.Task[None] | None = None
        self._retries: set[asyncio.Task[None]] = set()

    @property
    def deleted(self) -> bool:
        return self.session.ended == "deleted"

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        self._closing = True
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._ws.close(), 5)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        for task in self._retries:
            task.cancel()

    async def until(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if self.fatal is not None or (self.session.ended is not None and not self.deleted):
                return False
            self.changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                return condition()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)
        return True

    async def _run(self) -> None:
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed, InvalidHandshake
        from websockets.typing import Subprotocol

        from protocol.frames import SUBPROTOCOL

        failures = 0
        while not self._closing and self.session.ended is None:
            cut = False
            try:
                async with connect(self.url, subprotocols=[Subprotocol(SUBPROTOCOL)], open_timeout=10,
                                   max_size=None, compression=None, ping_interval=None) as ws:
                    self._ws, failures = ws, 0
                    self.session.connected()
                    await self._react()
                    async for raw in ws:
                        self._receive(raw)
                        await self._react()
                        if self._cut_due:
                            self._cut_due, cut = False, True
                            self.totals.cuts += 1
                            ws.transport.abort()  # no close frame: a crashed client, a cut network
                    if not cut and not self._closing:
                        self.totals.errors["closed by the server"] += 1
            except ConnectionClosed:
                if not cut and not self._closing:
                    self.totals.errors["connection lost"] += 1
            except (OSError, InvalidHandshake, TimeoutError) as exc:
                failures += 1
                self.totals.errors[f"connect failed: {type(exc).__name__}"] += 1
            finally:
                self._ws = None
                self.session.disconnected()
                self.changed.set()
            if not cut and not self._closing:
                await asyncio.sleep(min(2.0, 0.1 * 2 ** min(failures, 5)))

    def _receive(self, raw: str | bytes) -> None:
        import msgspec

        from protocol.events import Event
        from protocol.frames import decode_server_frame

        try:
            frame = decode_server_frame(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.totals.errors["unreadable frame"] += 1
            return
        if isinstance(frame, Event) and frame.conversation_id == self.session.conversation_id:
            self.tracker.observe(frame.seq)  # judged as it arrives, before the session drops repeats
        self.session.receive_frame(frame)

    async def _react(self) -> None:
        """Handle the session's outputs and send the frames they hold, in order."""
        import msgspec

        from client.session import (
            CommandFailed,
            Deleted,
            Fatal,
            GapDetected,
            Head,
            Opened,
            Resumed,
            RetryLater,
            Send,
            ServerError,
        )
        from protocol.events import Event

        frames = []
        while outputs := self.session.outputs():
            for output in outputs:
                match output:
                    case Send(frame=frame):
                        frames.append(frame)
                    case Event():
                        self._on_event(output)
                    case Opened(head=head):
                        self.opened_head = head
                    case Resumed():
                        self.totals.resumes += 1
                    case Head(head=head):
                        self.head = head
                    case RetryLater(frame=frame):
                        self._retry_later(frame.id)
                    case CommandFailed(code=code):
                        self.totals.errors[f"command failed: {code}"] += 1
                    case ServerError(code=code):
                        self.totals.errors[f"server error: {code}"] += 1
                    case GapDetected():
                        self.totals.errors["gap detected (resubscribed)"] += 1
                    case Fatal(reason=reason):
                        self.fatal = reason
                    case Deleted():
                        pass
        self.changed.set()
        ws = self._ws
        if ws is None:
            return  # pending commands go out again with the next connection's open ack
        encode = msgspec.json.encode
        for frame in frames:
            try:
                await ws.send(encode(frame).decode())
            except Exception:
                return  # the connection is going: the session re-sends what is pending

    def _retry_later(self, frame_id: str) -> None:
        async def later() -> None:
            await asyncio.sleep(0.5)
            self.session.retry(frame_id)
            await self._react()

        task = asyncio.get_running_loop().create_task(later())
        self._retries.add(task)
        task.add_done_callback(self._retries.discard)

    def _on_event(self, event: Any) -> None:
        from protocol.events import AnswerDelta, AskUser, TurnCompleted, TurnStarted

        self.totals.events += 1
        turn, data = self.turn, event.data
        if turn is None:
            self.totals.replayed += 1
            return
        match data:
            case TurnStarted(turn_id=turn_id, user_message_id=message_id) if message_id == turn.message_id:
                turn.turn_id = turn_id
            case AnswerDelta(turn_id=turn_id, text=text) if turn_id == turn.turn_id:
                turn.answer.append(text)
                if turn.cut:
                    turn.cut, self._cut_due = False, True
            case AskUser(turn_id=turn_id, ask_id=ask_id, options=options) if turn_id == turn.turn_id:
                self.session.answer(ask_id, options[0] if options else "yes")
            case TurnCompleted(turn_id=turn_id, reason=reason, final_answer=final) if turn_id == turn.turn_id:
                turn.reason, turn.final = str(reason), final

    # -- what a user does ---------------------------------------------------------------------------

    async def run_turn(self, text: str, cut: bool) -> None:
        turn = self.turn = _Turn(self.session.user_message(text), cut)
        self.turns.append(turn)
        self.totals.turns_started += 1
        await self._react()
        started = time.time()
        if not await self.until(lambda: turn.reason is not None, TURN_TIMEOUT_S):
            self.totals.turns_stuck += 1
            self.totals.errors[f"turn not completed: {self.fatal or 'timeout'}"] += 1
            self.totals.stuck_ids.append(self.session.conversation_id or "")
            self.totals.stuck.append(
                f"{self.session.conversation_id} message {turn.message_id[:8]} sent at {started:.1f}: "
                f"{'acked' if turn.message_id not in self.session.pending_ids else 'never acked'}, "
                f"{'turn ' + turn.turn_id if turn.turn_id else 'no turn.started'}, {len(''.join(turn.answer))} answer "
                f"chars, last seq {self.session.last_seq}, {'connected' if self._ws is not None else 'not connected'}")
        elif turn.reason in ("complete", "exit", "salvaged"):
            self.totals.turns_completed += 1
            if "".join(turn.answer) != turn.final:
                self.totals.garbled += 1
        else:
            self.totals.turns_failed += 1
            self.totals.errors[f"turn ended {turn.reason}"] += 1
        self.turn = None

    async def verify(self) -> None:
        """Every event up to the server's head arrived: ask the head, wait for the stream to reach it."""
        self.head = None
        self.session.check_head()
        await self._react()
        reached = await self.until(lambda: self.head is not None and self.session.last_seq >= self.head, 60.0)
        if self.head is not None:
            self.tracker.settle(self.head)
        if not reached:
            self.totals.unverified += 1

    def settle(self) -> None:
        t = self.tracker
        self.totals.lost += t.lost
        self.totals.duplicated += t.duplicated
        self.totals.out_of_order += t.out_of_order


@dataclass
class LoadPlan:
    url: str
    workers: int
    until: float                 # monotonic: no episode starts after this
    idle_ttl_s: float
    seed: int = 1
    revisit: float = 1 / 6       # an episode re-opens a conversation left to passivate
    cut: float = 0.2             # a turn is cut mid-answer
    delete: float = 0.5          # an episode ends with a delete (else the conversation is left)
    think_s: float = 0.2


class Load:
    def __init__(self, plan: LoadPlan, totals: Totals) -> None:
        self.plan = plan
        self.totals = totals
        self.rng = random.Random(plan.seed)
        self.left: list[tuple[float, str]] = []   # (when it was left, conversation id): passivating
        self.open_now = 0

    async def run(self) -> None:
        await asyncio.gather(*(self._worker(i) for i in range(self.plan.workers)))

    async def _worker(self, index: int) -> None:
        await asyncio.sleep(index * 0.25)   # a steady rate, not a herd
        while time.monotonic() < self.plan.until:
            try:
                await self._episode()
            except Exception as exc:
                self.totals.errors[f"episode failed: {type(exc).__name__}: {exc}"[:120]] += 1
            await asyncio.sleep(self.plan.think_s)

    def _passivated(self) -> str | None:
        """A conversation left long enough ago to have passivated (idle TTL + the reaper's period)."""
        ripe = time.monotonic() - self.plan.idle_ttl_s * 1.5 - 2.0
        if self.left and self.left[0][0] < ripe:
            return self.left.pop(0)[1]
        return None

    async def _episode(self) -> None:
        rng, totals = self.rng, self.totals
        cid = self._passivated() if rng.random() < self.plan.revisit else None
        conv = Conv(self.plan.url, totals, cid)
        self.open_now += 1
        conv.start()
        try:
            if not await conv.until(lambda: conv.opened_head is not None, 60.0):
                totals.errors[f"open failed: {conv.fatal or 'timeout'}"] += 1
                return
            if cid is None:
                totals.created.append(time.monotonic())
                turns = rng.choice((1, 1, 2))
            else:
                totals.revisits += 1
                head = conv.opened_head or 0
                # Its whole log, replayed from seq 1 after its re-activation from the snapshot.
                if not await conv.until(lambda: conv.session.last_seq >= head, 60.0):
                    totals.errors["replay did not reach the head"] += 1
                turns = 1
            for _ in range(turns):
                await conv.run_turn("What is the weather in Paris?", cut=rng.random() < self.plan.cut)
            await conv.verify()
            if conv.session.conversation_id in totals.stuck_ids:
                totals.left += 1   # kept, not deleted: the store shows what became of its turn
            elif rng.random() < self.plan.delete:
                conv.session.delete()
                await conv._react()
                if await conv.until(lambda: conv.deleted, 60.0):
                    totals.deleted += 1
                else:
                    totals.errors[f"delete not acked: {conv.fatal or 'timeout'}"] += 1
            else:
                totals.left += 1
                self.left.append((time.monotonic(), conv.session.conversation_id or ""))
        finally:
            conv.settle()
            self.open_now -= 1
            await conv.close()


# =====================================================================================================
# The run.


@dataclass
class Sample:
    t: float                                     # unix time
    values: dict[str, tuple[float, Any]]         # series → (value, segment: the pid holding it)


@dataclass
class Run:
    samples: list[Sample] = field(default_factory=list)
    faults: list[tuple[float, str]] = field(default_factory=list)
    mono_minus_wall: float = field(default_factory=lambda: time.monotonic() - time.time())
    server_rows: list[dict[str, Any]] = field(default_factory=list)


def flatten(row: dict[str, Any], backend: str) -> dict[str, tuple[float, Any]]:
    """One server sample row → series name → (value, segment)."""
    out: dict[str, tuple[float, Any]] = {}
    gw = row.get("gateway", {})
    for key, value in gw.items():
        if key != "pid" and isinstance(value, int | float):
            out[f"gateway: {key}"] = (value, gw.get("pid"))
    ray_row = row.get("ray") or {}
    for index, (name, host) in enumerate(sorted((ray_row.get("hosts") or {}).items())):
        label = f"host {name.rsplit('-', 1)[-1] if '-' in name else index}"
        for key, value in host.items():
            if key not in ("pid", "name") and isinstance(value, int | float):
                out[f"{label}: {key}"] = (value, host.get("pid"))
    for part in ("tool pool", "directory"):
        sample = ray_row.get(part) or {}
        for key, value in sample.items():
            if key not in ("pid", "hosts") and isinstance(value, int | float) and not isinstance(value, bool):
                out[f"{part}: {key}"] = (value, sample.get("pid"))
    if backend == "ray":
        live = [v for k, (v, _) in out.items() if k.startswith("host ") and k.endswith(": active (live)")]
        out["live conversations (hosts' active)"] = (sum(live), None)
    else:
        if "gateway: host active (live)" in out:
            out["live conversations (hosts' active)"] = (out["gateway: host active (live)"][0], None)
    return out


def process_roles(row: dict[str, Any] | None, server_pid: int) -> dict[int, str]:
    roles = {server_pid: "gateway"}
    ray_row = (row or {}).get("ray") or {}
    for name, host in (ray_row.get("hosts") or {}).items():
        if "pid" in host:
            roles[int(host["pid"])] = f"host {name.rsplit('-', 1)[-1]}"
    for part in ("tool pool", "directory"):
        pid = (ray_row.get(part) or {}).get("pid")
        if pid:
            roles[int(pid)] = part
    return roles


def proc_sample(server_pid: int, roles: dict[int, str], store: str, store_target: str | int) -> dict[str, tuple[float, Any]]:
    """RSS and descriptors per process of the server's tree, its store connections, its process count."""
    pids = tree_pids(server_pid)
    out: dict[str, tuple[float, Any]] = {}
    other_rss, other = 0.0, 0
    pg_inodes = tcp_inodes_to(int(store_target)) if store == "postgres" else set()
    conns = 0
    for pid in pids:
        targets = fd_targets(pid)
        if store == "postgres":
            conns += sum(1 for t in targets if t.startswith("socket:[") and t[8:-1] in pg_inodes)
        else:
            conns += sum(1 for t in targets if t == store_target)
        rss = rss_mb(pid)
        if rss is None:
            continue
        role = roles.get(pid)
        if role is None:
            if "ConversationHost" in cmdline(pid):
                continue  # a replacement host the server's sampler has not named yet
            other_rss += rss
            other += 1
            continue
        out[f"{role}: RSS MB"] = (rss, pid)
        out[f"{role}: open fds"] = (len(targets), pid)
    if len(pids) > 1:
        out["rest of Ray: RSS MB (summed)"] = (other_rss, None)
        out["processes in the server's tree"] = (len(pids), None)
    out["store connections"] = (conns, None)
    return out


def read_new_rows(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    if not path.exists():
        return [], offset
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    rows = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
    return rows, offset + end


async def drive(args: argparse.Namespace, port: int, server: subprocess.Popen[bytes], samples_path: Path,
                store_target: str | int, pg: PrivatePostgres | None, totals: Totals) -> Run:
    run = Run()
    start = time.monotonic()
    until = start + args.minutes * 60
    plan = LoadPlan(f"ws://127.0.0.1:{port}/ws", args.workers, until, args.idle_ttl, seed=args.seed)
    load = Load(plan, totals)
    offset = 0
    latest: dict[str, Any] | None = None
    stop = asyncio.Event()

    async def sampler() -> None:
        nonlocal offset, latest
        next_progress = start + 60
        while not stop.is_set():
            rows, offset = read_new_rows(samples_path, offset)
            for row in rows:
                run.server_rows.append(row)
                run.samples.append(Sample(row["t"], flatten(row, args.backend)))
                latest = row
            values = await asyncio.to_thread(proc_sample, server.pid, process_roles(latest, server.pid),
                                             args.store, store_target)
            run.samples.append(Sample(time.time(), values))
            now = time.monotonic()
            if now >= next_progress:
                next_progress += 60
                live = flatten(latest, args.backend).get("live conversations (hosts' active)", ("?",))[0] if latest else "?"
                print(f"  {(now - start) / 60:4.1f} min: {totals.served(now):,} conversations served, {live} live, "
                      f"{totals.turns_completed:,} turns, {totals.events:,} events, {len(run.faults)} faults; "
                      f"load average {os.getloadavg()[0]:.2f}", flush=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), args.sample_s)

    async def host_killer() -> None:
        turn = 0
        await asyncio.sleep(args.host_kill_every)
        while time.monotonic() < until - 20:
            hosts = sorted(((latest or {}).get("ray") or {}).get("hosts", {}).items())
            if hosts:
                name, host = hosts[turn % len(hosts)]
                turn += 1
                pid = int(host["pid"])
                if pid in tree_pids(server.pid) and "ConversationHost" in cmdline(pid):
                    os.kill(pid, signal.SIGKILL)
                    run.faults.append((time.time(), f"SIGKILL {name} (pid {pid})"))
            await asyncio.sleep(args.host_kill_every)

    async def store_restarter() -> None:
        assert pg is not None
        await asyncio.sleep(args.store_restart_every)
        while time.monotonic() < until - 20:
            t0 = time.time()
            await asyncio.to_thread(pg.stop, "fast")
            await asyncio.sleep(args.store_down_s)
            await asyncio.to_thread(pg.start)
            run.faults.append((t0, f"PostgreSQL restarted (down {time.time() - t0:.1f} s)"))
            await asyncio.sleep(args.store_restart_every)

    background = [asyncio.create_task(sampler())]
    if args.backend == "ray" and args.host_kill_every > 0:
        background.append(asyncio.create_task(host_killer()))
    if pg is not None and args.store_restart_every > 0:
        background.append(asyncio.create_task(store_restarter()))
    try:
        await load.run()
        for task in background[1:]:
            task.cancel()
        await asyncio.sleep(args.sample_s + 0.5)   # one more sample after the load
    finally:
        stop.set()
        for task in background:
            if task is not background[0]:
                task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
    return run


# =====================================================================================================
# The fit and the table.


@dataclass
class Fit:
    name: str
    start: float
    end: float
    peak: float
    slope: float           # per conversation served
    se: float
    per_min: float         # per minute
    served: int            # conversations served within the fitted window
    points: int
    verdict: str = ""
    leak: bool = False
    late_slope: float = 0.0  # over the second half of the window
    window_s: float = 0.0
    late_se: float = math.inf


def pooled_slope(points: Sequence[tuple[float, float, Any]]) -> tuple[float, float, int]:
    """Least squares of y on x with one intercept per segment (a process incarnation): the common
    slope and its standard error."""
    segments: dict[Any, list[tuple[float, float]]] = {}
    for x, y, seg in points:
        segments.setdefault(seg, []).append((x, y))
    sxx = sxy = 0.0
    residual: list[tuple[float, float]] = []
    n = 0
    for pts in segments.values():
        if len(pts) < 2:
            continue
        mx = sum(p[0] for p in pts) / len(pts)
        my = sum(p[1] for p in pts) / len(pts)
        for x, y in pts:
            sxx += (x - mx) ** 2
            sxy += (x - mx) * (y - my)
            residual.append((x - mx, y - my))
        n += len(pts)
    if sxx <= 0:
        return 0.0, math.inf, n
    slope = sxy / sxx
    dof = n - len([s for s in segments.values() if len(s) >= 2]) - 1
    rss = sum((dy - slope * dx) ** 2 for dx, dy in residual)
    se = math.sqrt(rss / dof / sxx) if dof > 0 else math.inf
    return slope, se, n


def bar_of(name: str) -> tuple[float, str]:
    if name.endswith("RSS MB") or name.endswith("RSS MB (summed)"):
        return RSS_BAR_KB / 1024, "rss"
    if "fds" in name or "connections" in name or "processes" in name:
        return FD_BAR, "fd"
    if "gc objects" in name:
        return OBJECTS_BAR, "objects"
    return MAP_BAR, "map"


def fit_all(run: Run, totals: Totals, fit_from: float, warmup_s: float) -> list[Fit]:
    series: dict[str, list[tuple[float, float, Any]]] = {}
    for sample in run.samples:
        for name, (value, seg) in sample.values.items():
            series.setdefault(name, []).append((sample.t, float(value), seg))
    fits = []
    for name, pts in series.items():
        pts.sort(key=lambda p: p[0])
        # Each process incarnation warms up like the first: a host started after a kill is fitted
        # from `warmup_s` after its first sample on.
        born: dict[Any, float] = {}
        for t, _, seg in pts:
            born.setdefault(seg, t)
        window = [p for p in pts if p[0] >= max(fit_from, born[p[2]] + warmup_s if p[2] is not None else fit_from)]
        served_pts = [(totals.served(t + run.mono_minus_wall), v, seg) for t, v, seg in window]
        time_pts = [((t - fit_from) / 60, v, seg) for t, v, seg in window]
        spans: dict[Any, list[float]] = {}
        for t, _, seg in window:
            spans.setdefault(seg, []).append(t)
        fit_window_s = max((max(ts) - min(ts) for ts in spans.values()), default=0.0)  # the longest incarnation
        slope, se, n = pooled_slope(served_pts)
        per_min, _, _ = pooled_slope(time_pts)
        served = (served_pts[-1][0] - served_pts[0][0]) if served_pts else 0
        fit = Fit(name, pts[0][1], pts[-1][1], max(p[1] for p in pts), slope, se, per_min, int(served), n)
        # The second half of the window too: a cache filling up to its size (SQLite's page cache,
        # the allocator's arenas) slows down; a leak keeps its pace.
        later = served_pts[len(served_pts) // 2:]
        fit.late_slope, fit.late_se, _ = pooled_slope(later)
        fit.window_s = fit_window_s
        judge(fit)
        fits.append(fit)
    return fits


def judge(fit: Fit) -> None:
    bar, kind = bar_of(fit.name)
    cap = next((c for key, c in CAPS.items() if fit.name.endswith(key)), None)
    if fit.name.startswith("live conversations"):
        fit.verdict = "the live count (reference)"
        return
    if fit.name.endswith("(live)"):
        fit.verdict = "live (reference)"   # a replaced host fills up again: not judged
        return
    if fit.name.startswith("rest of Ray"):
        fit.verdict = "Ray's own processes: shown, not judged"
        return
    if fit.points < 3 or fit.served <= 0:
        fit.verdict = "too few samples"
        return
    grows = fit.slope > bar and fit.slope > 3 * fit.se
    if kind == "map" and fit.slope * fit.served < 10:
        grows = False                      # fewer than 10 entries over the window: no trend to speak of
    if not grows:
        fit.verdict = "flat: holds what is live" if kind == "map" else "flat"
        return
    if kind != "map" and fit.window_s < MIN_PROCESS_WINDOW_S:
        fit.verdict = f"grows; too short to judge ({fit.window_s:.0f} s < {MIN_PROCESS_WINDOW_S:.0f} s)"
        return
    if kind in ("rss", "objects") and not (fit.late_slope > bar and fit.late_slope > 3 * fit.late_se):
        fit.verdict = f"levels off (second half {fit.late_slope * 1000:+,.1f}{' MB' if kind == 'rss' else ''})"
        return
    if cap is not None and fit.peak <= cap:
        fit.verdict = f"grows with served, bounded by its cap ({cap:,})"
        return
    fit.leak = True
    fit.verdict = "LEAK: grows with conversations served"


def fmt(value: float, name: str) -> str:
    if name.endswith("MB") or name.endswith("(summed)"):
        return f"{value:,.1f}"
    return f"{value:,.0f}"


def fmt_slope(fit: Fit) -> str:
    per_k = fit.slope * 1000
    if fit.name.endswith("MB") or fit.name.endswith("(summed)"):
        return f"{per_k:+,.2f} MB ±{fit.se * 1000:,.2f}" if math.isfinite(fit.se) else f"{per_k:+,.2f} MB"
    return f"{per_k:+,.1f} ±{fit.se * 1000:,.1f}" if math.isfinite(fit.se) else f"{per_k:+,.1f}"


def print_table(fits: list[Fit]) -> None:
    def order(f: Fit) -> tuple[int, str]:
        head = f.name.split(":")[0]
        rank = 0 if f.name.startswith("live") else 1 if head == "gateway" else 2 if head.startswith("host") else \
            3 if head == "tool pool" else 4 if head == "directory" else 5
        return rank, f.name

    rows = [["process: series", "start", "end", "max", "slope / 1,000 served", "per minute", "verdict"]]
    for f in sorted(fits, key=order):
        per_min = f"{f.per_min:+,.2f}" if f.name.endswith("MB") or f.name.endswith("(summed)") else f"{f.per_min:+,.1f}"
        rows.append([f.name, fmt(f.start, f.name), fmt(f.end, f.name), fmt(f.peak, f.name), fmt_slope(f), per_min,
                     f.verdict])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(w) if j in (0, 6) else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths, strict=True))))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def print_type_growth(run: Run, fit_from: float, top: int = 10) -> None:
    """`--types`: per process, the object types whose count grew most from the first sample after the
    warm-up to the last one (of the same process incarnation)."""
    def parts(row: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        yield "gateway", row.get("gateway", {})
        ray_row = row.get("ray") or {}
        for name, host in (ray_row.get("hosts") or {}).items():
            yield f"host {name.rsplit('-', 1)[-1]}", host
        for part in ("tool pool", "directory"):
            yield part, ray_row.get(part) or {}

    first: dict[str, dict[str, Any]] = {}
    last: dict[str, dict[str, Any]] = {}
    for row in run.server_rows:
        if row["t"] < fit_from:
            continue
        for label, sample in parts(row):
            if "types" not in sample:
                continue
            if label not in first or first[label].get("pid") != sample.get("pid"):
                first[label] = sample
            last[label] = sample
    print("object types that grew most after the warm-up (--types):")
    for label in sorted(last):
        before, after = first[label]["types"], last[label]["types"]
        growth = sorted(((after[k] - before.get(k, 0), k) for k in after), reverse=True)[:top]
        print(f"  {label}: " + ", ".join(f"{k} {d:+,}" for d, k in growth if d > 0))


def print_store_tail(store_url: str, conversation_ids: list[str], t0: float) -> None:
    """What the store holds of conversations whose turn never completed for their client (SQLite, or
    PostgreSQL while it still runs: before the private one is stopped)."""
    query = "SELECT seq, event, ts FROM events WHERE conversation_id = {p} ORDER BY seq DESC LIMIT 8"
    if store_url.startswith("sqlite:///"):
        import sqlite3

        conn: Any = sqlite3.connect(f"file:{store_url.removeprefix('sqlite:///')}?mode=ro", uri=True, timeout=10)
        query = query.format(p="?")
    else:
        import psycopg

        conn = psycopg.connect(store_url.split("?")[0], connect_timeout=10)
        query = query.format(p="%s")
    with contextlib.closing(conn):
        for cid in conversation_ids:
            rows = conn.execute(query, (cid,)).fetchall()
            tail = ", ".join(f"{seq} {event} @{ts - t0:.1f}s" for seq, event, ts in reversed(rows))
            print(f"  store, {cid}: … {tail or 'no events'}")


def deliveries_failures(totals: Totals) -> list[str]:
    bad = [f"{name}={n}" for name, n in (
        ("lost", totals.lost), ("duplicated", totals.duplicated), ("out_of_order", totals.out_of_order),
        ("garbled_turns", totals.garbled), ("failed_turns", totals.turns_failed), ("stuck_turns", totals.turns_stuck),
        ("unverified_episodes", totals.unverified)) if n]
    if not totals.created:
        bad.append("no conversation served")
    return bad


# =====================================================================================================


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_serve":
        inner = argparse.ArgumentParser(prog="soak.py _serve")
        inner.add_argument("--samples", type=Path, required=True)
        inner.add_argument("--period", type=float, required=True)
        inner.add_argument("--types", action="store_true")
        inner.add_argument("serve", nargs=argparse.REMAINDER)
        a = inner.parse_args(sys.argv[2:])
        argv = a.serve[1:] if a.serve and a.serve[0] == "--" else a.serve
        return serve_with_sampler(a.samples, a.period, argv, a.types)

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="minutes of load (default 10)")
    parser.add_argument("--backend", choices=["local", "ray"], default="local")
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--workers", type=int, default=12, help="simulated users at once (default 12)")
    parser.add_argument("--idle-ttl", type=float, default=20.0, help="REACTGATE_IDLE_TTL_S (default 20)")
    parser.add_argument("--sample-s", type=float, default=10.0, help="sampling period (default 10 s)")
    parser.add_argument("--chunk-ms", type=float, default=10.0, help="scripted model chunk interval (default 10)")
    parser.add_argument("--host-kill-every", type=float, default=200.0,
                        help="ray: SIGKILL a ConversationHost this often, each in turn (default 200 s; 0: never)")
    parser.add_argument("--store-restart-every", type=float, default=0.0,
                        help="postgres: run a private PostgreSQL and restart it this often (default 0: never)")
    parser.add_argument("--store-down-s", type=float, default=2.0, help="how long the store stays down (default 2)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true",
                        help="0.5 minute, 6 users, idle TTL 3 s, a sample every 2 s, a host kill at 15 s (ray)")
    parser.add_argument("--keep", metavar="DIR", help="keep the logs, the store and the samples here")
    parser.add_argument("--types", action="store_true",
                        help="also count the objects of each process by type, and print the types that grew most")
    args = parser.parse_args()
    if args.quick:
        args.minutes, args.workers, args.idle_ttl, args.sample_s = 0.5, 6, 3.0, 2.0
        args.host_kill_every = min(args.host_kill_every, 15.0) if args.host_kill_every else 0.0
        args.store_restart_every = min(args.store_restart_every, 12.0) if args.store_restart_every else 0.0
    if args.store_restart_every and args.store != "postgres":
        parser.error("--store-restart-every needs --store postgres (SQLite cannot be restarted from outside)")

    with contextlib.ExitStack() as stack:
        if args.keep:
            work = Path(args.keep)
            work.mkdir(parents=True, exist_ok=True)
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rgsoak-")))
        return soak(args, work, stack)


def soak(args: argparse.Namespace, work: Path, stack: contextlib.ExitStack) -> int:
    load0 = os.getloadavg()[0]
    faults = []
    if args.backend == "ray" and args.host_kill_every > 0:
        faults.append(f"a ConversationHost SIGKILLed every {args.host_kill_every:g} s")
    if args.store_restart_every > 0:
        faults.append(f"PostgreSQL restarted every {args.store_restart_every:g} s (down {args.store_down_s:g} s)")
    print(f"soak: {args.minutes:g} min, backend {args.backend}, store {args.store}, {args.workers} users, idle TTL "
          f"{args.idle_ttl:g} s, 4-char chunks every {args.chunk_ms:g} ms, a sample every {args.sample_s:g} s; faults: "
          f"{'; '.join(faults) or 'none'}{' (local backend: no host process to kill)' if args.backend == 'local' else ''}; "
          f"load average {load0:.2f}", flush=True)

    script = work / "script.json"
    rounds = [{"text": text, "chunk_chars": 4, "delay_ms": args.chunk_ms} for text in (TOOL_ROUND, ANSWER_ROUND)]
    script.write_text(json.dumps({"loop": True, "continues": True, "rounds": rounds}), encoding="utf-8")
    pg: PrivatePostgres | None = None
    store_target: str | int
    if args.store == "sqlite":
        db = work / "store.sqlite3"
        store_url, store_target = f"sqlite:///{db}", str(db)
    elif args.store_restart_every > 0:
        pg = private_postgres()
        stack.callback(pg.shutdown)
        store_url, store_target = pg.dsn, pg.port
    else:
        schema = f"soak_{uuid.uuid4().hex[:10]}"
        store_url, store_target = f"{SHARED_POSTGRES}?schema={schema}", 5432
        stack.callback(drop_schema, SHARED_POSTGRES, schema)

    env = {k: v for k, v in os.environ.items() if not k.startswith("REACTGATE_")}
    env |= {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "RAY_USAGE_STATS_ENABLED": "0", "NO_COLOR": "1", "TERM": "dumb",
            "REACTGATE_IDLE_TTL_S": str(args.idle_ttl), "REACTGATE_HOSTS": "2", **QUOTAS_OFF}
    port = free_port()
    samples_path = work / "samples.jsonl"
    samples_path.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "_serve", "--samples", str(samples_path),
           "--period", str(args.sample_s), *(["--types"] if args.types else []), "--", "serve", "--backend", args.backend, "--port", str(port),
           "--store", store_url, "--script", str(script)]
    log = work / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
    stack.callback(stop_server, server)
    try:
        wait_for_port(port, server, "reactgate serve")
    except RuntimeError as exc:
        print(f"soak: FAIL: {exc}; its log:\n{log.read_text(errors='replace')[-3000:]}")
        return 1
    totals = Totals()
    t0 = time.time()
    run = asyncio.run(drive(args, port, server, samples_path, store_target, pg, totals))
    wall = time.time() - t0
    if server.poll() is not None:
        print(f"soak: FAIL: the server exited with {server.returncode} during the run; its log:\n"
              f"{log.read_text(errors='replace')[-3000:]}")
        return 1

    warmup = min(max(0.15 * args.minutes * 60, 2 * args.idle_ttl + 5), 0.4 * args.minutes * 60)
    fits = fit_all(run, totals, t0 + warmup, warmup)
    (work / "series.json").write_text(json.dumps({
        "t0": t0, "warmup_s": warmup, "faults": run.faults,
        "served_at": [t - run.mono_minus_wall for t in totals.created],
        "samples": [{"t": s.t, "values": s.values} for s in run.samples]}), encoding="utf-8")
    served = len(totals.created)
    print()
    print(f"{served:,} conversations served ({totals.revisits:,} re-opened after passivating, {totals.deleted:,} deleted, "
          f"{totals.left:,} left to passivate) in {wall / 60:.1f} min; {totals.turns_completed:,} turns completed, "
          f"{totals.cuts:,} cut mid-answer and resumed ({totals.resumes:,} resumes), {totals.events:,} events "
          f"({totals.replayed:,} of them replays of re-opened logs); load average {load0:.2f} at the start, "
          f"{os.getloadavg()[0]:.2f} at the end")
    for t, what in run.faults:
        print(f"  fault at {t - t0:6.1f} s: {what}")
    if not run.faults and ((args.backend == "ray" and args.host_kill_every) or args.store_restart_every):
        print("  (no fault fired: the run was shorter than the fault period)")
    print(f"slopes fitted from {warmup:.0f} s on (after the warm-up), per process incarnation; bars: "
          f"{MAP_BAR * 1000:g} entries, {RSS_BAR_KB * 1000 / 1024:.2f} MB RSS, {FD_BAR * 1000:g} fds or connections, "
          f"{OBJECTS_BAR * 1000:g} objects per 1,000 conversations served")
    print()
    print_table(fits)
    print()
    print(f"deliveries: lost {totals.lost}, duplicated {totals.duplicated}, out of order {totals.out_of_order}, "
          f"garbled turns {totals.garbled}, failed turns {totals.turns_failed}, stuck turns {totals.turns_stuck}, "
          f"unverified episodes {totals.unverified}")
    if totals.errors:
        print("client-side notes: " + ", ".join(f"{k} ×{n}" for k, n in totals.errors.most_common(12)))
    for line in totals.stuck[:10]:
        print(f"  stuck turn (t0 {t0:.1f}): {line}")
    if totals.stuck_ids and (args.store == "sqlite" or pg is not None):
        print_store_tail(store_url, totals.stuck_ids[:10], t0)
    if args.types:
        print_type_growth(run, t0 + warmup)
    leaks = [f for f in fits if f.leak]
    bad = deliveries_failures(totals)
    if leaks or bad:
        reasons = [f"{f.name} grows {f.slope * 1000:+,.1f} per 1,000 conversations served" for f in leaks] + bad
        print("verdict: FAIL — " + "; ".join(reasons))
        return 1
    print("verdict: PASS — nothing grows with the conversations served; 0 lost, duplicated or out of order")
    return 0


def stop_server(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        server.send_signal(signal.SIGINT)   # serve drains; Ray shuts down with it
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


if __name__ == "__main__":
    sys.exit(main())
