"""A multi-node rehearsal on one machine (issue 11): what an operator meets, with nothing lost.

One run builds, in a private directory, what a Kubernetes deployment has:

- a Ray cluster of two nodes (`ray start --head` and `ray start --address`, each its own raylet),
  token auth on (`RAY_AUTH_MODE=token`, a fresh random token in a file named by
  `RAY_AUTH_TOKEN_PATH`; `HOME` and `RAY_TMPDIR` point into the private directory, so neither
  `~/.ray/auth_token` nor `/tmp/ray/ray_current_cluster` is read or written), explicit free ports;
- two gateways, `reactgate serve --backend ray --ray-address ray://127.0.0.1:<client port>`, on
  PostgreSQL in a schema of this run's own, behind a *front door*: one loopback port that hands
  each new connection to the next live gateway, as a Service does;
- clients streaming: `client.loadtest` users (one conversation each), which classify every event
  by seq (lost, duplicated, out of order) and check each answer against the deltas they read.

Then the faults, each while turns stream, each a table row that must read 0:
1. SIGTERM one gateway: it drains; its clients resume on the other.
2. SIGKILL the other: the turns keep running in the hosts; clients resume on a restarted gateway.
3. SIGKILL the worker node's raylet mid-answer: its hosts die with it; the Directory re-activates
   their conversations on the surviving node, the cut answers are continued (salvaged), and the
   side-effect counter of the agent's own tool shows every tool call ran exactly once.
4. A changed agent profile rolled out (new gateways first, then the old ones stopped): the next turn
   of every existing conversation runs the new profile's tool, and the old generation's hosts and
   tool pool exit (docs/design.md#generations).

Beside the clients' own checks, the durable log is audited: a user message whose turn started twice,
or a turn that completed twice, is a double activation; a tool call is checked against the file its
tool appends to.

Placement. Every reactgate actor asks Ray for 0 CPUs, and Ray's scheduler then prefers the node of
whoever creates the actor: the Directory and tool pool land next to the creating driver (for Ray
Client, the head), the hosts next to the Directory. The rehearsal creates the Directory and the
tool pool itself, pinned to the head, occupies the head's one CPU (the head's scheduler should then
send the hosts elsewhere), and has the Directory create the hosts, replacing any that lands on the
head until one runs on the worker. Nothing in actors/ changes; k8s/README.md says what this means
for a real cluster.

`--compare` measures, before the faults, the two ways a gateway can join the cluster, on the same
cluster, load and placement: (a) Ray Client, (b) a Ray node of its own (`ray start --address …
--num-cpus 0` beside the gateway, in a PID namespace of its own like a pod, so the driver attaches
to that node and not to the head's).

    .venv/bin/python bench/cluster_rehearsal.py            # ~6 min: --compare, then the 4 steps
    .venv/bin/python bench/cluster_rehearsal.py --quick    # ~2 min: fewer clients, no --compare
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from client.loadtest.runner import LoadConfig, LoadRunner, Result  # noqa: E402
from protocol.events import AnswerDelta, ToolCalled, TurnCompleted, TurnStarted  # noqa: E402

BIN = Path(sys.executable).parent
DSN = os.environ.get("REACTGATE_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
LISTENING = re.compile(rb"reactgate gateway listening on ([0-9.]+):(\d+)")
CLK_TCK = os.sysconf("SC_CLK_TCK")
# The gateways' settings beyond their command line. The load is one user with many conversations
# behind one front door (one IP): per-user and per-IP quotas off, as README.md#quotas says for load
# tests. The operator builds its RayConfig from the same values, so its configuration is theirs.
GATEWAY_SETTINGS = {"hosts": 2, "quota_concurrent_turns_per_user": 0, "quota_turns_per_minute_per_user": 0,
                    "quota_connections_per_user": 0, "quota_connections_per_ip": 0}
GATEWAY_ENV = {f"REACTGATE_{key.upper()}": str(value) for key, value in GATEWAY_SETTINGS.items()}

# -- the agent: the rehearsal's own tool, which counts its side effects -----------------------------

TOOL_MODULE = '''\
"""The rehearsal's tool: every execution appends one line, so a call run twice shows. Profile v1
names `weather`, v2 `weather_v2`: the result says which profile's tool ran."""
from pathlib import Path

from actors.tools import ToolContext, tool

LOG = Path({log!r})


def _count(ctx: ToolContext) -> None:
    with LOG.open("a") as f:
        f.write(f"{{ctx.conversation_id}} {{ctx.call_id}}\\n")


@tool(trait="exploration", safety="safe", description="Look up the weather (and count the side effect).")
def weather(city: str, ctx: ToolContext) -> dict:
    _count(ctx)
    return {{"city": city, "sky": "rain", "celsius": 12, "profile": "v1"}}


@tool(trait="exploration", safety="safe", description="Look up the weather (and count the side effect).")
def weather_v2(city: str, ctx: ToolContext) -> dict:
    _count(ctx)
    return {{"city": city, "sky": "rain", "celsius": 12, "profile": "v2"}}
'''

PROFILE = '''\
name = "rehearsal"
model = "scripted/demo"
fallbacks = []
states = ["default"]
initial_state = "default"
placement = "sharded"
instructions = "Answer about the weather."

[policies]
max_actions_per_round = 2
max_iterations = 15
finish_policy = "observe"
flush_interval_ms = 25

[[tools]]
id = "rehearsal.weather"
impl = "rehearsal_tools:{impl}"
'''

ANSWER = " ".join(f"word{i:03d}" for i in range(30))  # 239 chars: ~60 deltas, ~2 s of streaming


def script() -> dict[str, Any]:
    """Observe (the counting tool), then a slowly streamed answer: a fault lands mid-answer."""
    call = {"action": "call_tool", "tool_call": {"tool_id": "rehearsal.weather", "params": {"city": "Paris"}}}
    done = {"action": "complete", "final_answer": ANSWER}

    def text(thinking: str, action: dict[str, Any]) -> str:
        return (f"<channel:thinking>{thinking}</channel:thinking>\n"
                f"<channel:action>```json\n{json.dumps(action)}\n```</channel:action>")

    return {"loop": True, "continues": True, "rounds": [
        {"text": text("Checking the weather.", call), "chunk_chars": 8, "delay_ms": 10},
        {"text": text("Answering.", done), "chunk_chars": 4, "delay_ms": 25},
    ]}


# -- processes, ports, CPU ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_ports() -> list[str]:
    """Every port a Ray node opens, chosen now (workers: random ports), so runs never collide."""
    ports = ["--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
             "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port"]
    return [arg for flag in ports for arg in (flag, str(free_port()))] + ["--min-worker-port", "0",
                                                                            "--max-worker-port", "0"]


# Ray Client gives every client a server process of its own, on the first port from 23000 that the
# head's proxier finds free (a bind test, then the server starts and binds it a second or two
# later). Two clusters on one machine (the rehearsal and tests/test_ray_auth.py under pytest-xdist)
# that connect clients at once can both pick 23000, and one server dies as it starts
# ("SpecificServer startup failed"). One connect at a time on the machine closes that window.
RAY_CLIENT_LOCK = Path("/tmp/reactgate-ray-client-connect.lock")


@contextlib.contextmanager
def ray_client_connecting() -> Iterator[None]:
    """Held from a Ray Client's start until its server is up (blocks while another holds it)."""
    with RAY_CLIENT_LOCK.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def tree(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children(p)
    return found


def cpu_s(pids: Sequence[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])   # utime, stime
    return total / CLK_TCK


def pids_matching(*needles: str) -> list[int]:
    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if all(n in cmd for n in needles):
                out.append(int(proc.name))
    return out


# `ray start` gives a starting node a fixed 30 s to register with the GCS (Ray has no setting for
# it), then exits with this. On a busy machine that is a slow start, not a broken cluster: the node is
# started again, once — as KubeRay restarts a container whose `ray start` failed (k8s/README.md).
REGISTRATION_TIMED_OUT = b"timed out during startup"
START_ATTEMPTS = 2


def signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


# -- the cluster -------------------------------------------------------------------------------------------


@dataclass
class Cluster:
    """Head + worker, each `ray start --block` in a session of its own (its process group holds
    every process of that node, stopped by its id), everything under `root`."""

    root: Path
    head_cpus: int = 1
    worker_cpus: int = 2
    gcs_port: int = field(default_factory=free_port)
    client_port: int = field(default_factory=free_port)
    head: subprocess.Popen[bytes] | None = None
    worker: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.token_file = self.root / "ray_token"
        self.token_file.write_text(secrets.token_hex(32))
        self.token_file.chmod(0o600)
        (self.root / "home").mkdir()
        (self.root / "tmp").mkdir()

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def client_address(self) -> str:
        return f"ray://127.0.0.1:{self.client_port}"

    def env(self) -> dict[str, str]:
        """What every process of the rehearsal runs with: this cluster's token, private temp dirs."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("REACTGATE_", "RAY_"))}
        return {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_file),
                "HOME": str(self.root / "home"), "RAY_TMPDIR": str(self.root / "tmp"), "TMPDIR": str(self.root / "tmp"),
                "RAY_USAGE_STATS_ENABLED": "0", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}

    def _ray_start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = (self.root / f"{name}.log").open("ab")
        return subprocess.Popen([str(BIN / "ray"), "start", "--block", "--disable-usage-stats", *args],
                                env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def start(self, timeout_s: float = 120.0) -> None:
        self.start_head(timeout_s)
        self.worker = self._start_node("worker", lambda: [
            "--address", self.gcs_address, "--node-ip-address", "127.0.0.1", "--num-cpus", str(self.worker_cpus),
            *node_ports()], timeout_s)

    def start_head(self, timeout_s: float = 120.0) -> None:
        # --node-ip-address 127.0.0.1 is what we ask; Ray replaces a loopback IP with the machine's
        # own address (services.resolve_ip_for_localhost) and binds its gRPC servers to every
        # interface: on this machine the token is what keeps other callers out.
        self.head = self._start_node("head", lambda: [
            "--head", "--node-ip-address", "127.0.0.1", "--port", str(self.gcs_port),
            "--ray-client-server-port", str(self.client_port), "--num-cpus", str(self.head_cpus),
            "--include-dashboard", "false", "--temp-dir", str(self.root / "ray"), *node_ports()], timeout_s)

    def _start_node(self, name: str, args: Callable[[], list[str]], timeout_s: float) -> subprocess.Popen[bytes]:
        """`ray start` of one node, tried again once if it timed out registering with the GCS
        (`REGISTRATION_TIMED_OUT`); any other failure, or a second one, is the rehearsal's error."""
        log = self.root / f"{name}.log"
        for attempt in range(1, START_ATTEMPTS + 1):
            offset = log.stat().st_size if log.exists() else 0
            proc = self._ray_start(name, args())
            try:
                self._started(name, proc, timeout_s, offset)
                return proc
            except RuntimeError:
                signal_group(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
                if attempt == START_ATTEMPTS or REGISTRATION_TIMED_OUT not in log.read_bytes()[offset:]:
                    raise
                print(f"ray start of the {name} timed out registering with the GCS: starting it again", flush=True)
        raise AssertionError("unreachable")

    def _started(self, name: str, proc: subprocess.Popen[bytes], timeout_s: float, offset: int = 0) -> None:
        log, deadline = self.root / f"{name}.log", time.monotonic() + timeout_s
        while b"Ray runtime started" not in log.read_bytes()[offset:]:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start of the {name} failed:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)

    def worker_raylet(self) -> int:
        assert self.worker is not None
        [pid] = [p for p in tree(self.worker.pid) if Path(f"/proc/{p}/comm").read_text().strip() == "raylet"]
        return pid

    def kill_worker_node(self) -> None:
        """SIGKILL the worker's raylet: its workers (the hosts) die with it, as on a lost node."""
        os.kill(self.worker_raylet(), signal.SIGKILL)

    def stop(self) -> None:
        """SIGKILL each node's process group (a SIGTERM makes a node wait up to 30 s for a GCS that
        may be gone), then anything of ours that left its group: it still names our directory."""
        for proc in (self.worker, self.head):
            if proc is not None:
                signal_group(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
        for pid in pids_matching(str(self.root)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# -- gateways -----------------------------------------------------------------------------------------------


@dataclass
class Gateway:
    """`reactgate serve --backend ray` in a session of its own. `mode`: "client" joins through Ray
    Client; "node" first runs `ray start --address … --num-cpus 0` in a PID namespace of its own, then
    execs the server there, as k8s/gateway.yaml does in a pod: the driver attaches to that raylet
    (the only one it can see), and every process of the namespace ends with the server."""

    name: str
    cluster: Cluster
    serve_args: list[str]
    mode: str = "client"
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0
    restarts: int = 0

    @property
    def log_path(self) -> Path:
        return self.cluster.root / f"gateway-{self.name}.log"

    def command(self) -> list[str]:
        reactgate = str(BIN / "reactgate")
        if self.mode == "client":
            return [reactgate, "serve", "--backend", "ray", "--ray-address", self.cluster.client_address,
                    *self.serve_args]
        ray_node = " ".join([str(BIN / "ray"), "start", "--disable-usage-stats", "--address",
                             self.cluster.gcs_address, "--node-ip-address", "127.0.0.1", "--num-cpus", "0",
                             *node_ports()])
        serve = " ".join([reactgate, "serve", "--backend", "ray", "--ray-address", self.cluster.gcs_address,
                          *self.serve_args])
        node_log = self.cluster.root / f"gateway-{self.name}-node.log"
        return ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c",
                f"{ray_node} >>{node_log} 2>&1 && exec {serve}"]

    async def start(self, timeout_s: float = 120.0, attempts: int = 3) -> Gateway:
        """Spawn, wait for "listening on" and a ready /readyz. A start that crashes is restarted, as
        a kubelet would: on the loaded machine the head's Ray Client server sometimes dies as it
        starts ("SpecificServer startup failed"), and a pod's Ray node can be slow to register."""
        for attempt in range(attempts):
            try:
                return await self._start(timeout_s)
            except RuntimeError as exc:
                self.stop()
                if attempt == attempts - 1:
                    raise
                self.restarts += 1
                cause = [line for line in str(exc).splitlines() if "Error" in line][-1:] or ["?"]
                print(f"gateway {self.name} did not start ({cause[0].strip()}); restarting it", flush=True)
                await asyncio.sleep(2.0)
        raise AssertionError("unreachable")

    async def _start(self, timeout_s: float) -> Gateway:
        with contextlib.ExitStack() as connecting:
            if self.mode == "client":  # until ready: its Ray Client server is up (see RAY_CLIENT_LOCK)
                await asyncio.to_thread(connecting.enter_context, ray_client_connecting())
            return await self._spawn(timeout_s)

    async def _spawn(self, timeout_s: float) -> Gateway:
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.command(), env={**self.cluster.env(), **self.env}, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=REPO, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while (found := LISTENING.search(self.log_path.read_bytes()[offset:])) is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gateway {self.name} did not start:\n{self.log_path.read_text()[-3000:]}")
            await asyncio.sleep(0.1)
        self.port = int(found.group(2))
        while await asyncio.to_thread(self._readyz) != 200:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gateway {self.name} never ready:\n{self.log_path.read_text()[-3000:]}")
            await asyncio.sleep(0.2)
        return self

    def _readyz(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as response:
                return int(response.status)
        except OSError:
            return 0

    @property
    def server_pid(self) -> int:
        """The `reactgate serve` process (in "node" mode, the namespace's first process)."""
        assert self.proc is not None
        if self.mode == "client":
            return self.proc.pid
        return children(self.proc.pid)[0]

    def pod_pids(self) -> list[int]:
        """Every process this gateway brings: in "node" mode its Ray node too; in "client" mode the
        Ray Client server the head runs for it is counted by `Rehearsal.client_servers`."""
        assert self.proc is not None
        return tree(self.proc.pid)

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.server_pid, sig)

    async def wait(self, timeout_s: float = 60.0) -> int | None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self.proc.poll()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            signal_group(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)


class FrontDoor:
    """One loopback port in front of the gateways, as a Service is: each new connection goes to the
    next gateway in `live` (round robin); a gateway leaves `live` before it is stopped, as a pod
    leaves the endpoints before SIGTERM."""

    def __init__(self) -> None:
        self.live: list[Gateway] = []
        self.forwarded: list[float] = []   # when each connection reached a gateway (wall time)
        self._next = 0
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.live:  # no gateway at all: the client's connection fails, and it retries
            writer.close()
            return
        gateway = self.live[self._next % len(self.live)]
        self._next += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        except OSError:
            writer.close()
            return
        self.forwarded.append(time.time())

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(OSError):
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


# -- the operator: this process as a Ray driver ------------------------------------------------------------


class Operator:
    """Pins what must outlive a node to the head, and reports where each actor runs."""

    def __init__(self, cluster: Cluster) -> None:
        # Before Ray's first import: it reads RAY_AUTH_MODE then (and the token from the file it names).
        os.environ.update({k: v for k, v in cluster.env().items() if k.startswith("RAY_")})
        import ray

        from actors.ray.names import NAMESPACE

        ray.init(address=cluster.gcs_address, namespace=NAMESPACE, log_to_driver=False)
        deadline = time.monotonic() + 120
        while len([n for n in ray.nodes() if n["Alive"]]) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError("the worker node never joined")
            time.sleep(0.2)
        self.ray = ray
        self.head_id = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "node:__internal_head__" in n["Resources"])
        self.blocker: Any = None

    def pin(self, serve_settings: dict[str, Any], head_cpus: int) -> None:
        """Directory and tool pool on the head, created with the gateways' own RayConfig; the head's
        CPUs taken, so that the Directory's scheduler prefers the worker for the hosts; then the
        hosts, until at least one runs on the worker (Ray's choice is not always the one its policy
        predicts: a host on the head is killed, and the Directory replaces it)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from actors.ray import names
        from actors.ray.directory import Directory
        from actors.ray.singletons import get_or_create
        from actors.ray.tool_pool import ToolPoolActor
        from gateway.app import agent_setup, ray_config
        from gateway.settings import Settings

        on_head = NodeAffinitySchedulingStrategy(self.head_id, soft=False)
        config = ray_config(settings := Settings(**serve_settings), agent_setup(settings))
        directory = get_or_create(Directory, names.DIRECTORY_NAME, scheduling_strategy=on_head)
        get_or_create(ToolPoolActor, names.tool_pool(config.generation), config, scheduling_strategy=on_head)

        @self.ray.remote(num_cpus=head_cpus)
        class HeadCpus:
            def ready(self) -> bool:
                return True

        self.blocker = HeadCpus.options(scheduling_strategy=on_head).remote()  # type: ignore[attr-defined]
        self.ray.get(self.blocker.ready.remote(), timeout=60)
        hosts = self.ray.get(directory.ensure_hosts.remote(config.hosts, config), timeout=60)
        for _ in range(10):
            deadline = time.monotonic() + 120
            while not set(hosts) <= set(self.ray.get(directory.hosts.remote())):
                if time.monotonic() > deadline:
                    raise RuntimeError("the hosts never registered")
                time.sleep(0.2)
            where = self.placement()
            if any(where.get(h) == "worker" for h in hosts):
                return
            self.ray.kill(self.ray.get_actor(hosts[0], namespace=names.NAMESPACE), no_restart=True)
            time.sleep(1.0)
        raise RuntimeError(f"no host would run on the worker node: {self.placement()}")

    def placement(self) -> dict[str, str]:
        """reactgate actor name → "head" / "worker" / "other" (a gateway's node)."""
        import ray._private.state as state

        worker_ids = {n["NodeID"] for n in self.ray.nodes() if n["Alive"] and n["NodeID"] != self.head_id}
        out = {}
        for info in state.actors().values():
            name = info.get("Name") or ""
            if info.get("State") != "ALIVE" or not name.startswith("reactgate"):
                continue
            node = info["Address"]["NodeID"]
            out[name] = "head" if node == self.head_id else ("worker" if node in worker_ids else "other")
        return out

    def handovers(self) -> dict[str, int]:
        from actors.ray.names import DIRECTORY_NAME, NAMESPACE

        return dict(self.ray.get(self.ray.get_actor(DIRECTORY_NAME, namespace=NAMESPACE).handovers.remote()))

    def close(self) -> None:
        self.ray.shutdown()


# -- measuring one step ----------------------------------------------------------------------------------------


@dataclass
class Row:
    step: str
    conversations: int = 0
    turns: int = 0
    lost: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    garbled: int = 0
    failed_turns: int = 0
    double_activated: int = 0
    tools_not_once: int = 0
    reconnected: int = 0           # client connections the fault broke (the step did hit them)
    cut_mid_answer: int = 0        # turns whose answer was streaming across the fault
    partial: int = 0               # answers salvaged as they stood, not continued (docs/design.md#continuation)
    done_unwatched: int = 0        # turns the hosts completed while no gateway ran (step 2)
    new_profile_turns: int = 0     # next turns of existing conversations that ran the new profile (step 4)
    # How long clients took to resume. "clients" (a gateway fault: clients are cut off): from the
    # fault to each reconnection reaching a live gateway through the front door. "hosts" (a host
    # fault: clients stay connected, turns stall): per conversation mid-turn at the fault, until the
    # store holds its next event.
    resume_from: str = "clients"
    resume_p50_s: float = 0.0
    resume_max_s: float = 0.0
    failures: list[str] = field(default_factory=list)
    note: str = ""

    ZEROS = ("lost", "duplicated", "out_of_order", "garbled", "failed_turns", "double_activated", "tools_not_once")

    def ok(self) -> bool:
        return all(getattr(self, k) == 0 for k in self.ZEROS) and not self.failures


class Audit:
    """The durable log and the tool's side-effect file, read after a step."""

    def __init__(self, store_url: str, tool_log: Path) -> None:
        from actors.store import store_from_url

        self.store = store_from_url(store_url)
        self.tool_log = tool_log
        self.stalls: list[float] = []   # per conversation mid-turn at the fault: until its next event

    async def __aenter__(self) -> Audit:
        await self.store.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.store.close()

    async def check(self, row: Row, conversations: Sequence[str], fault_at: float | None = None,
                    quiet: tuple[float, float] | None = None) -> None:
        self.stalls = []
        lines = self.tool_log.read_text().splitlines() if self.tool_log.exists() else []
        executed = Counter(tuple(line.split()) for line in lines)   # (conversation, call id): call ids are per conversation
        for cid in conversations:
            events = await self.store.read_events(cid, 0, limit=100_000)
            started = Counter(e.data.user_message_id for e in events if isinstance(e.data, TurnStarted))
            completed = Counter(e.data.turn_id for e in events if isinstance(e.data, TurnCompleted))
            row.turns += len(completed)
            row.partial += sum(1 for e in events if isinstance(e.data, TurnCompleted) and e.data.partial)
            row.double_activated += sum(n - 1 for n in started.values() if n > 1)
            row.double_activated += sum(n - 1 for n in completed.values() if n > 1)
            calls = [e.data.call_id for e in events if isinstance(e.data, ToolCalled)]
            row.tools_not_once += sum(1 for call in calls if executed[(cid, call)] != 1)
            if fault_at is not None:
                spans: dict[str, list[float]] = {}
                for e in events:
                    if isinstance(e.data, AnswerDelta):
                        spans.setdefault(e.data.turn_id, []).append(e.ts)
                row.cut_mid_answer += sum(1 for ts in spans.values() if min(ts) < fault_at < max(ts))
            if fault_at is not None:
                after = [e.ts for e in events if e.ts > fault_at]
                before = [e for e in events if e.ts <= fault_at]
                in_turn = before and not isinstance(before[-1].data, TurnCompleted)
                if in_turn and after:
                    self.stalls.append(min(after) - fault_at)
            if quiet is not None:
                row.done_unwatched += sum(1 for e in events if isinstance(e.data, TurnCompleted)
                                          and quiet[0] < e.ts < quiet[1])
        if row.resume_from == "hosts" and self.stalls:
            stalls = sorted(self.stalls)
            row.resume_p50_s, row.resume_max_s = stalls[len(stalls) // 2], stalls[-1]


def fill(row: Row, result: Result) -> None:
    stats = result.stats
    row.conversations = len(result.users)
    row.lost, row.duplicated, row.out_of_order = result.lost, result.duplicated, result.out_of_order
    row.garbled = stats.garbled_turns
    row.failed_turns = stats.turns_failed + result.incomplete_turns
    row.reconnected = stats.errors["client.closed_by_server"] + stats.errors["client.connection_lost"]
    row.failures = [f for f in result.failures() if not f.startswith(("failed_turns", "incomplete_turns", "lost",
                                                                       "duplicated", "out_of_order", "garbled"))]


ROLL_OUT_S = 10.0   # about what two gateways take to start here


def load(door: FrontDoor, conversations: int, duration_s: float) -> LoadRunner:
    return LoadRunner(LoadConfig(url=door.url, conversations=conversations, duration_s=duration_s,
                                 drain_timeout_s=120.0))


async def with_fault(door: FrontDoor, row: Row, runner: LoadRunner, after_s: float,
                     fault: Callable[[], Awaitable[None]], *, mid_answer: bool = False) -> tuple[Result, float]:
    """Run the load; `after_s` into it — and with `mid_answer`, once every user's answer is streaming
    (its first answer.delta seen, its turn not over; at most MID_ANSWER_WAIT_S more) — the fault.
    Fills `row` from the clients' side; returns the result and the fault's wall time."""
    task = asyncio.create_task(runner.run())
    await asyncio.sleep(after_s)
    if mid_answer:
        deadline = time.monotonic() + MID_ANSWER_WAIT_S
        while not _all_mid_answer(runner) and time.monotonic() < deadline and not task.done():
            await asyncio.sleep(0.01)  # polling the clients' own state: the fault waits for the streams
    fault_at = time.time()
    await fault()
    result = await task
    fill(row, result)
    if row.resume_from == "clients":
        waits = sorted(t - fault_at for t in door.forwarded if t > fault_at)
        if waits:
            row.resume_p50_s, row.resume_max_s = waits[len(waits) // 2], waits[-1]
    return result, fault_at


MID_ANSWER_WAIT_S = 10.0


def _all_mid_answer(runner: LoadRunner) -> bool:
    users = getattr(runner, "users", [])
    return bool(users) and all(u.turn is not None and u.turn.answer for u in users)


# -- the rehearsal ------------------------------------------------------------------------------------------------


@dataclass
class Plan:
    conversations: int = 12
    step_s: float = 8.0            # each step's load: turns start for this long, then drain
    fault_after_s: float = 2.0
    compare: bool = True
    compare_conversations: int = 40
    compare_s: float = 15.0
    steps: frozenset[str] = frozenset("1234")  # which faults to run, in order (the test runs 1 and 3)


@dataclass
class Comparison:
    mode: str
    events: int
    events_per_s: float
    p50_ms: float
    p99_ms: float
    gateway_cpu_us_per_event: float     # the reactgate processes
    pod_cpu_us_per_event: float         # + what each gateway brings: its Ray Client server / its Ray node
    failures: list[str]


class Rehearsal:
    def __init__(self, plan: Plan, root: Path) -> None:
        self.plan = plan
        self.root = root
        self.schema = f"rehearsal_{secrets.token_hex(4)}"
        self.store_url = f"{DSN}?schema={self.schema}"
        self.cluster = Cluster(root)
        self.door = FrontDoor()
        self.gateways: list[Gateway] = []
        self.rows: list[Row] = []
        self.comparisons: list[Comparison] = []
        self.placements: dict[str, dict[str, str]] = {}
        agent = root / "agent"
        agent.mkdir()
        self.tool_log = root / "tool_calls.log"
        (agent / "rehearsal_tools.py").write_text(TOOL_MODULE.format(log=str(self.tool_log)))
        self.profile = agent / "rehearsal.toml"
        self.profile.write_text(PROFILE.format(impl="weather"))
        self.profile_v2 = agent / "rehearsal_v2.toml"   # step 4's change: another tool implementation
        self.profile_v2.write_text(PROFILE.format(impl="weather_v2"))
        self.script = agent / "script.json"
        self.script.write_text(json.dumps(script()))
        self.operator: Operator | None = None

    def serve_settings(self) -> dict[str, Any]:
        return {"backend": "ray", "store": self.store_url, "agent": self.profile, "script": self.script,
                "ray_address": self.cluster.client_address, **GATEWAY_SETTINGS}

    def serve_args(self, profile: Path) -> list[str]:
        return ["--host", "127.0.0.1", "--port", "0", "--store", self.store_url, "--agent", str(profile),
                "--script", str(self.script)]

    def gateway(self, name: str, mode: str = "client", profile: Path | None = None) -> Gateway:
        gateway = Gateway(name, self.cluster, self.serve_args(profile or self.profile), mode, GATEWAY_ENV)
        self.gateways.append(gateway)
        return gateway

    async def run(self) -> None:
        await asyncio.to_thread(self.cluster.start)
        await self.door.start()
        self.operator = await asyncio.to_thread(Operator, self.cluster)
        await asyncio.to_thread(self.operator.pin, self.serve_settings(), self.cluster.head_cpus)
        if self.plan.compare:
            await self.compare()
        await self.steps()

    # -- (a) Ray Client vs (b) a Ray node of its own --------------------------------------------------

    async def compare(self) -> None:
        for mode in ("client", "node", "client", "node"):  # twice each, alternating: the machine's drift shows
            gateways = await asyncio.gather(*(self.gateway(f"{mode}-{i}", mode).start() for i in range(2)))
            self.door.live = list(gateways)
            self.placements[f"compare-{mode}"] = self.operator.placement() if self.operator else {}
            await load(self.door, 4, 2.0).run()          # warm: every host has run a turn
            servers = self.client_servers() if mode == "client" else []
            gw_pids = [g.server_pid for g in gateways]
            pod_pids = [p for g in gateways for p in g.pod_pids()] + servers
            cpu0, pod0 = cpu_s(gw_pids), cpu_s(pod_pids)
            result = await load(self.door, self.plan.compare_conversations, self.plan.compare_s).run()
            gw_cpu, pod_cpu = cpu_s(gw_pids) - cpu0, cpu_s(pod_pids) - pod0
            events = max(1, result.stats.events)
            delivery = result.stats.delivery
            self.comparisons.append(Comparison(
                mode, result.stats.events, result.stats.events / result.elapsed_s,
                delivery.get_value_at_percentile(50) / 1e3, delivery.get_value_at_percentile(99) / 1e3,
                gw_cpu / events * 1e6, pod_cpu / events * 1e6, result.failures()))
            self.door.live = []
            for gateway in gateways:
                gateway.signal(signal.SIGTERM)
            for gateway in gateways:
                await gateway.wait()
                gateway.stop()

    def client_servers(self) -> list[int]:
        """The head's Ray Client processes: the proxy every call passes through, and one server per
        connected driver — part of what (a) costs (no other Ray Client user runs meanwhile)."""
        return pids_matching("ray.util.client.server", f":{self.cluster.gcs_port}", "--mode=")

    # -- the faults --------------------------------------------------------------------------------------

    async def steps(self) -> None:
        plan = self.plan
        a, b = await asyncio.gather(self.gateway("a").start(), self.gateway("b").start())
        self.door.live = [a, b]
        self.placements["steps"] = self.operator.placement() if self.operator else {}
        async with Audit(self.store_url, self.tool_log) as audit:
            # 1. SIGTERM one gateway: it leaves the front door, drains (1012), its clients resume on b.
            async def drain_a() -> None:
                self.door.live = [b]
                a.signal(signal.SIGTERM)

            if "1" in plan.steps:
                row = Row("1 SIGTERM gateway a")
                result, at = await with_fault(self.door, row, load(self.door, plan.conversations, plan.step_s),
                                              plan.fault_after_s, drain_a)
                await audit.check(row, ids(result), at)
                if await a.wait() != 0:
                    row.failures.append(f"gateway a exited with {a.proc.returncode if a.proc else None} after SIGTERM")
                self.rows.append(row)

            # 2. SIGKILL b: no gateway at all; the hosts go on; a restarted gateway serves the clients.
            quiet: list[float] = []

            async def kill_b() -> None:
                self.door.live = []
                b.signal(signal.SIGKILL)
                quiet.append(time.time())
                restarted = await self.gateway("c").start()
                quiet.append(time.time())
                self.door.live = [restarted]

            if "2" in plan.steps:
                row = Row("2 SIGKILL gateway b")
                result, at = await with_fault(self.door, row, load(self.door, plan.conversations, plan.step_s),
                                              plan.fault_after_s, kill_b)
                await audit.check(row, ids(result), at, (quiet[0], quiet[1]))
                self.rows.append(row)
                c = self.door.live[0]
                d = await self.gateway("d").start()
                self.door.live = [c, d]

            # 3. The worker node's raylet dies mid-answer: its hosts with it.
            if "3" in plan.steps:
                before = self.operator.handovers() if self.operator else {}
                doomed = [name for name, node in (self.operator.placement() if self.operator else {}).items()
                          if node == "worker"]

                async def kill_worker() -> None:
                    self.cluster.kill_worker_node()

                row = Row("3 SIGKILL worker raylet", resume_from="hosts")
                result, at = await with_fault(self.door, row, load(self.door, plan.conversations, plan.step_s),
                                              plan.fault_after_s, kill_worker, mid_answer=True)
                await audit.check(row, ids(result), at)
                after = self.operator.handovers() if self.operator else {}
                row.note = f"hosts killed {len(doomed)}, conversations handed over {after.get('resumed', 0) - before.get('resumed', 0)}"
                if not any(n.startswith("reactgate-host") for n in doomed):
                    row.failures.append("no host ran on the worker node: the step tested nothing")
                self.placements["after step 3"] = self.operator.placement() if self.operator else {}
                if "worker" in self.placements["after step 3"].values():
                    row.failures.append("an actor still reports the dead worker node")
                self.rows.append(row)

            # 4. A changed profile, rolled out as `kubectl rollout restart` would: new gateways first
            #    (their generation becomes current: the old hosts drain, the old gateways are refused
            #    and drain), then the old ones stopped.
            if "4" in plan.steps:
                await self.step_4(audit, list(self.door.live))

    async def step_4(self, audit: Audit, old: list[Gateway]) -> None:
        from actors.ray.names import generation_of

        plan = self.plan
        placed = self.operator.placement() if self.operator else {}
        old_generations = {g for name in placed if (g := generation_of(name))}

        async def roll_out() -> None:
            new = await asyncio.gather(self.gateway("e", profile=self.profile_v2).start(),
                                       self.gateway("f", profile=self.profile_v2).start())
            self.door.live = list(new)
            for gateway in old:
                if gateway.proc is not None and gateway.proc.poll() is None:
                    gateway.signal(signal.SIGTERM)

        row = Row("4 profile change, rolling restart")
        # Turns go on for as long as new gateways take to start, so that the switch lands mid-stream.
        runner = load(self.door, plan.conversations, plan.step_s + ROLL_OUT_S)
        result, at = await with_fault(self.door, row, runner, plan.fault_after_s, roll_out)
        await audit.check(row, ids(result), at)
        # The next turn of every existing conversation runs under the new profile.
        profiles = await asyncio.gather(*(next_turn(self.door.url, cid) for cid in ids(result)))
        row.new_profile_turns = sum(1 for p in profiles if p == "v2")
        stale = len(profiles) - row.new_profile_turns
        if stale:
            row.failures.append(f"{stale} next turns did not run the new profile's tool: {Counter(profiles)}")
        # ... and the old generation's hosts and tool pool exit.
        deadline, gone_after = time.monotonic() + 60, None
        while time.monotonic() < deadline:
            left = [n for n in (self.operator.placement() if self.operator else {}) if generation_of(n) in old_generations
                    or any(n.endswith(g) for g in old_generations)]
            if not left:
                gone_after = time.time() - at
                break
            await asyncio.sleep(0.5)
        if gone_after is None:
            row.failures.append(f"old generation's actors still running: {left}")
        row.note = (f"next turns under the new profile {len(profiles) - stale}/{len(profiles)}; "
                    f"old hosts gone {gone_after:.0f} s after the roll-out began" if gone_after is not None else "")
        for gateway in old:
            if await gateway.wait(30) is None:
                row.failures.append(f"old gateway {gateway.name} still running")
        self.rows.append(row)

    async def close(self) -> None:
        for gateway in self.gateways:
            gateway.stop()
        await self.door.close()
        if self.operator is not None:
            with contextlib.suppress(Exception):
                self.operator.close()
        self.cluster.stop()
        drop_schema(self.schema)


async def next_turn(url: str, conversation_id: str) -> str | None:
    """One more turn of an existing conversation; the `profile` its tool result names."""
    from client.connection import Connection
    from client.session import ClientSession, Fatal
    from protocol.events import Event, ToolResult

    session = ClientSession(conversation_id)
    message_id = session.user_message("And tomorrow?")
    turn_id, profile = None, None
    async with Connection(session, url, give_up_after_s=60) as connection:
        async for output in connection:
            match output:
                case Event(data=TurnStarted(turn_id=tid, user_message_id=mid)) if mid == message_id:
                    turn_id = tid
                case Event(data=ToolResult(turn_id=tid, result=result)) if tid == turn_id and result:
                    profile = result.get("profile")
                case Event(data=TurnCompleted(turn_id=tid)) if tid == turn_id:
                    return profile
                case Fatal(reason=reason):
                    raise RuntimeError(f"{conversation_id}: {reason}")
    return None


def ids(result: Result) -> list[str]:
    return [u.conversation_id for u in result.users if u.conversation_id]


def drop_schema(schema: str) -> None:
    import psycopg

    with contextlib.suppress(psycopg.Error), psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# -- output ----------------------------------------------------------------------------------------------------


def table(rows: Sequence[Row]) -> str:
    head = ("step", "conv", "turns", "lost", "dup", "ooo", "garbled", "failed", "double-act", "tools≠1",
            "reconn", "cut mid-ans", "partial", "resume p50 s", "resume max s", "note")
    lines: list[tuple[str, ...]] = [head]
    for r in rows:
        lines.append((r.step, str(r.conversations), str(r.turns), str(r.lost), str(r.duplicated), str(r.out_of_order),
                      str(r.garbled), str(r.failed_turns), str(r.double_activated), str(r.tools_not_once),
                      str(r.reconnected), str(r.cut_mid_answer), str(r.partial), f"{r.resume_p50_s:.2f}", f"{r.resume_max_s:.2f}",
                      "; ".join(filter(None, [r.note, f"resume seen by the {r.resume_from}", *(f"turns completed with no gateway up: {r.done_unwatched}"
                                                        for _ in [0] if r.done_unwatched), *r.failures]))))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) for line in lines)


def comparison_table(results: Sequence[Comparison]) -> str:
    by_mode: dict[str, list[Comparison]] = {}
    for c in results:
        by_mode.setdefault(c.mode, []).append(c)
    out = ["mode              events/s  p50 ms  p99 ms  gateway CPU µs/event  + its Ray part µs/event"]
    for c in results:
        out.append(f"{c.mode:<16}  {c.events_per_s:8.0f}  {c.p50_ms:6.1f}  {c.p99_ms:6.1f}  "
                   f"{c.gateway_cpu_us_per_event:20.1f}  {c.pod_cpu_us_per_event:23.1f}"
                   + (f"  FAILED {c.failures}" if c.failures else ""))
    if "client" in by_mode and "node" in by_mode:
        def mean(mode: str, key: str) -> float:
            values = [getattr(c, key) for c in by_mode[mode]]
            return sum(values) / len(values)

        ratios = {key: mean("node", key) / max(1e-9, mean("client", key))
                  for key in ("events_per_s", "p50_ms", "p99_ms", "gateway_cpu_us_per_event", "pod_cpu_us_per_event")}
        out.append("ratio (b) node / (a) client: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
    return "\n".join(out)


@contextlib.contextmanager
def private_root() -> Iterator[Path]:
    # Short: Ray's socket paths live under it and must fit in 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="rgc", dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def main_async(plan: Plan, json_path: Path | None, keep_logs: Path | None) -> int:
    with private_root() as root:
        rehearsal = Rehearsal(plan, root)
        error: BaseException | None = None
        try:
            await rehearsal.run()
        except BaseException as exc:  # report what ran, then the error
            error = exc
        finally:
            await rehearsal.close()
            if keep_logs is not None:
                keep_logs.mkdir(parents=True, exist_ok=True)
                for log in [*root.glob("*.log"), *root.glob("ray/session_*/logs/ray_client_server*")]:
                    shutil.copy(log, keep_logs / log.name)
        print(f"placement of reactgate's actors: {json.dumps(rehearsal.placements)}")
        if rehearsal.comparisons:
            print("\nGateways joining the cluster: (a) Ray Client vs (b) a Ray node of their own\n"
                  + comparison_table(rehearsal.comparisons))
        print("\n" + table(rehearsal.rows))
        if json_path is not None:
            json_path.write_text(json.dumps({
                "rows": [asdict(r) for r in rehearsal.rows], "comparisons": [asdict(c) for c in rehearsal.comparisons],
                "placements": rehearsal.placements, "error": repr(error) if error else None}, indent=1))
        if error is not None:
            raise error
        return 0 if rehearsal.rows and all(r.ok() for r in rehearsal.rows) else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer clients, shorter steps, no --compare")
    parser.add_argument("--compare", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--conversations", type=int)
    parser.add_argument("--json", type=Path, help="write the rows and comparisons here")
    parser.add_argument("--keep-logs", type=Path, help="copy the cluster's and gateways' logs here")
    parser.add_argument("--steps", default="1234", help="which faults to run, e.g. 13 (default: all four)")
    args = parser.parse_args()
    plan = Plan(conversations=6, step_s=4.0, fault_after_s=1.5, compare=False) if args.quick else Plan()
    if args.compare is not None:
        plan.compare = args.compare
    if args.conversations:
        plan.conversations = args.conversations
    if not set(args.steps) <= set("1234") or not args.steps:
        parser.error(f"--steps takes digits 1 to 4, not {args.steps!r}")
    plan.steps = frozenset(args.steps)
    sys.exit(asyncio.run(main_async(plan, args.json, args.keep_logs)))


if __name__ == "__main__":
    main()
