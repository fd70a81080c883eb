"""300 streaming conversations against a real `reactgate serve`, in one command (issue 10).

    .venv/bin/python bench/load_300.py                          # local and ray × http and scripted
    .venv/bin/python bench/load_300.py --backend local --model http --duration 20
    # --conversations N  --duration S (30)  --cut-fraction F  --ramp-up S  --chunk-ms MS  --py-spy DIR  --keep DIR

Per (backend, model) it starts, on loopback ports picked free:
- `reactgate mock-llm --script S` (model `http` only): the model in its own process, reached by the
  agent through LiteLLM's `openai/` provider on the fast path (actors/llm/fast.py), `api_base` set in
  the agent profile's `[model_settings]`; with model `scripted`, the server plays S in-process
  (`serve --script S`);
- `reactgate serve --backend B` with every per-user and per-tenant quota off (0) and a fresh SQLite
  store: all 300 users are the one anonymous user on one address;
- `reactgate loadtest --conversations 300 --cut-fraction 0.05 --ramp-up 5`: every user runs turns
  back to back (a tool round, then a ~60-chunk answer, 4-char chunks at 20 chunks/s), 5% of users
  are cut once mid-answer and resume. The users start over 5 s (about one turn): started in the
  same instant on the same script, all 300 would stay in step, every chunk of every conversation
  arriving in the same millisecond (`--ramp-up 0` measures that herd).

It prints one table: delivery p50/p99/max, events, lost/duplicated/out-of-order/garbled, and the
CPU of the server (its whole process tree: Ray's processes too) and of mock-llm, in % of one core
and µs per delivered event, read from /proc, with the server's idle CPU over 5 s before the load
(Ray's own background work). Everything stops by itself; exit 1 if a run failed the
load tester's checks or the delivery p99 bar (`--p99-bar-ms`, 250).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEMO_PROFILE = ROOT / "actors" / "builtin" / "demo.toml"
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
MOCK_KEY_ENV = "REACTGATE_LOAD_MOCK_KEY"   # the profile names it; mock-llm ignores its value
CLK_TCK = os.sysconf("SC_CLK_TCK")
START_TIMEOUT_S = 90.0
IDLE_S = 5.0


def script_json(chunk_ms: float) -> str:
    rounds = [{"text": text, "chunk_chars": 4, "delay_ms": chunk_ms} for text in (TOOL_ROUND, ANSWER_ROUND)]
    return json.dumps({"loop": True, "continues": True, "rounds": rounds})


def http_profile(api_base: str) -> str:
    """The demo agent, served by `openai/scripted` at mock-llm's address."""
    text = DEMO_PROFILE.read_text(encoding="utf-8")
    text = text.replace('model = "scripted/demo"', 'model = "openai/scripted"', 1)
    return text + f'\n[model_settings]\napi_base = "{api_base}"\napi_key_env = "{MOCK_KEY_ENV}"\n'


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


# -- CPU of a process tree, from /proc ---------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                ppid = int(stat[stat.rindex(")") + 2:].split()[1])
                tree.setdefault(ppid, []).append(int(entry))
    return tree


def tree_cpu_s(pid: int) -> dict[str, float]:
    """utime + stime of `pid` and every live descendant (Ray's raylet, GCS and workers included),
    by role: the process itself ("gateway"), Ray's ConversationHosts ("hosts"), the rest ("ray other")."""
    tree, total, todo = _children(), {"gateway": 0.0, "hosts": 0.0, "ray other": 0.0}, [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{p}/cmdline").read_bytes()
            role = "gateway" if p == pid else "hosts" if b"ConversationHost" in cmdline else "ray other"
            total[role] += (int(fields[11]) + int(fields[12])) / CLK_TCK
        todo.extend(tree.get(p, ()))
    return total


def tree_pids(pid: int) -> list[int]:
    tree, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(tree.get(p, ()))
    return out


# -- one run ------------------------------------------------------------------------------------------


@dataclass
class Row:
    backend: str
    model: str
    figures: dict[str, str]
    server_cpu_s: float
    server_split: dict[str, float]
    idle_split: dict[str, float]       # share of a core per role, idle, before the load
    mock_cpu_s: float
    client_cpu_s: float
    wall_s: float
    exit_code: int

    @property
    def events(self) -> int:
        return int(self.figures.get("events", 0))

    def per_event_us(self, cpu_s: float) -> str:
        return f"{cpu_s / self.events * 1e6:.0f}" if self.events else "-"


@contextlib.contextmanager
def started(cmd: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)    # serve drains, Ray shuts down with it
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def reactgate() -> list[str]:
    script = Path(sys.executable).with_name("reactgate")
    return [str(script)] if script.exists() else [sys.executable, "-m", "gateway.cli"]


def run_one(backend: str, model: str, args: argparse.Namespace, work: Path) -> Row:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACTGATE_")}
    env |= {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "RAY_USAGE_STATS_ENABLED": "0", "NO_COLOR": "1",
            "TERM": "dumb", MOCK_KEY_ENV: "loopback-mock", **QUOTAS_OFF}
    run_dir = work / f"{backend}-{model}"
    run_dir.mkdir(parents=True, exist_ok=True)
    script = run_dir / "script.json"
    script.write_text(script_json(args.chunk_ms), encoding="utf-8")
    port = free_port()
    serve = [*reactgate(), "serve", "--backend", backend, "--port", str(port),
             "--store", f"sqlite:///{run_dir}/store.sqlite3"]
    with contextlib.ExitStack() as stack:
        mock = None
        if model == "http":
            mock_port = free_port()
            mock = stack.enter_context(started(
                [*reactgate(), "mock-llm", "--script", str(script), "--port", str(mock_port)], env,
                run_dir / "mock-llm.log"))
            wait_for_port(mock_port, mock, "mock-llm")
            profile = run_dir / "agent.toml"
            profile.write_text(http_profile(f"http://127.0.0.1:{mock_port}/v1"), encoding="utf-8")
            serve += ["--agent", str(profile)]
        else:
            serve += ["--script", str(script)]
        server = stack.enter_context(started(serve, env, run_dir / "serve.log"))
        wait_for_port(port, server, "reactgate serve")
        time.sleep(1.0)   # Ray's hosts finish starting after the port opens
        idle_before = tree_cpu_s(server.pid)
        time.sleep(IDLE_S)  # the server's own background cost, before any load
        idle_after = tree_cpu_s(server.pid)
        idle = {role: (idle_after[role] - idle_before.get(role, 0.0)) / IDLE_S for role in idle_after}
        spy = None
        if args.py_spy:
            pids = tree_pids(server.pid)
            spy = [subprocess.Popen(
                [str(Path(sys.executable).with_name("py-spy")), "record", "--nonblocking", "-r", "50",
                 "-f", "raw", "-o", str(Path(args.py_spy) / f"{backend}-{model}-{pid}.txt"), "--pid", str(pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for pid in pids if _is_python(pid)]
        load = [*reactgate(), "loadtest", "--url", f"ws://127.0.0.1:{port}/ws",
                "--conversations", str(args.conversations), "--duration", str(args.duration),
                "--cut-fraction", str(args.cut_fraction), "--seed", "1", "--script", str(script),
                "--ramp-up", str(args.ramp_up), "--drain-timeout", "60"]
        server_before = tree_cpu_s(server.pid)
        mock_before = sum(tree_cpu_s(mock.pid).values()) if mock else 0.0
        children_before = os.times()
        t0 = time.monotonic()
        done = subprocess.run(load, env=env, cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        wall = time.monotonic() - t0
        children_after = os.times()
        server_after = tree_cpu_s(server.pid)
        split = {role: server_after[role] - server_before.get(role, 0.0) for role in server_after}
        mock_cpu = sum(tree_cpu_s(mock.pid).values()) - mock_before if mock else 0.0
        for p in spy or ():
            p.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(30)
    (run_dir / "loadtest.out").write_text(done.stdout + done.stderr, encoding="utf-8")
    figures: dict[str, str] = {}
    for line in done.stdout.splitlines():
        if line.startswith(("lost=", "delivery_p50_ms=")):
            figures |= dict(re.findall(r"(\w+)=(\S+)", line))
    client_cpu = (children_after.children_user + children_after.children_system
                  - children_before.children_user - children_before.children_system)
    return Row(backend, model, figures, sum(split.values()), split, idle, mock_cpu, client_cpu, wall, done.returncode)


def _is_python(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return "python" in Path(f"/proc/{pid}/exe").resolve().name
    return False


# -- the table ---------------------------------------------------------------------------------------


COLUMNS = ("backend", "model", "p50 ms", "p99 ms", "max ms", "events", "turns", "cuts", "lost", "dup", "ooo",
           "garbled", "server CPU", "µs/event", "mock CPU", "client CPU", "verdict")


def cells(row: Row, bar_ms: float) -> list[str]:
    f, wall = row.figures, row.wall_s
    bad = [k for k in ("lost", "duplicated", "out_of_order", "garbled_turns", "failed_turns", "incomplete_turns",
                       "foreign_events", "unreadable_frames", "unverified_users") if f.get(k, "?") != "0"]
    p99 = float(f.get("delivery_p99_ms", "nan").replace("-", "nan"))
    verdict = "PASS" if row.exit_code == 0 and not bad and p99 <= bar_ms else \
        "FAIL " + ",".join(bad + ([f"p99>{bar_ms:g}"] if not p99 <= bar_ms else []) + ([f"exit {row.exit_code}"]
                                                                                     if row.exit_code else []))
    return [row.backend, row.model, f.get("delivery_p50_ms", "-"), f.get("delivery_p99_ms", "-"),
            f.get("delivery_max_ms", "-"), f.get("events", "-"), f.get("turns", "-"), f.get("reconnects", "-"),
            f.get("lost", "-"), f.get("duplicated", "-"), f.get("out_of_order", "-"), f.get("garbled_turns", "-"),
            f"{row.server_cpu_s / wall:.0%}", row.per_event_us(row.server_cpu_s),
            f"{row.mock_cpu_s / wall:.0%}" if row.model == "http" else "-", f"{row.client_cpu_s / wall:.0%}",
            verdict]


def print_table(rows: list[Row], bar_ms: float) -> None:
    body = [list(COLUMNS)] + [cells(r, bar_ms) for r in rows]
    widths = [max(len(line[i]) for line in body) for i in range(len(COLUMNS))]
    for line in body:
        print("  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))))
    print("CPU columns: % of one core over the load test's wall time; µs/event = server CPU / events delivered.")
    for r in rows:
        roles = [role for role in r.server_split if r.backend == "ray" or role == "gateway"]
        print(f"  {r.backend} {r.model}: server CPU by process under load (idle before it): " + ", ".join(
            f"{role} {r.server_split[role] / r.wall_s:.0%} ({r.idle_split.get(role, 0.0):.0%})" for role in roles))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["local", "ray", "both"], default="both")
    parser.add_argument("--model", choices=["http", "scripted", "both"], default="both")
    parser.add_argument("--conversations", type=int, default=300)
    parser.add_argument("--duration", type=float, default=30.0, help="seconds users start turns (default 30)")
    parser.add_argument("--cut-fraction", type=float, default=0.05)
    parser.add_argument("--ramp-up", type=float, default=5.0,
                        help="users start evenly over this many seconds (default 5, about one turn; 0: all at once)")
    parser.add_argument("--chunk-ms", type=float, default=50.0, help="model chunk interval (default 50: 20/s)")
    parser.add_argument("--p99-bar-ms", type=float, default=250.0)
    parser.add_argument("--py-spy", metavar="DIR", help="record raw py-spy profiles of the server's processes here")
    parser.add_argument("--keep", metavar="DIR", help="keep logs, stores and loadtest output here")
    args = parser.parse_args()
    if args.py_spy:
        Path(args.py_spy).mkdir(parents=True, exist_ok=True)
    backends = ["local", "ray"] if args.backend == "both" else [args.backend]
    models = ["http", "scripted"] if args.model == "both" else [args.model]
    print(f"{args.conversations} conversations, {args.duration:g} s of turns, 4-char chunks every "
          f"{args.chunk_ms:g} ms, flush_interval_ms 25, {args.cut_fraction:.0%} cut mid-answer, ramp-up {args.ramp_up:g} s; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    rows = []
    with contextlib.ExitStack() as stack:
        work = Path(args.keep) if args.keep else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        for backend in backends:
            for model in models:
                rows.append(run_one(backend, model, args, work))
                print_table(rows[-1:], args.p99_bar_ms)
                print(flush=True)
    print_table(rows, args.p99_bar_ms)
    return 0 if all(cells(r, args.p99_bar_ms)[-1] == "PASS" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
