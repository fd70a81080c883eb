"""Summarise raw py-spy profiles (`py-spy record -f raw`, as `peer_bench.py --py-spy DIR` writes them)
of a reactgate server: each stack counted once, in the first part of the path it passes through.

    .venv/bin/python bench/spy_summary.py /tmp/spy/local-1000-*.txt > bench/profiles/NAME.txt

A stack whose innermost frame is native code below Python (`NATIVE`: the event loop's own C code —
uvloop's epoll, socket reads and writes, callbacks — or Ray's) counts there; any other stack counts in
the first of `PARTS` it passes through, in their order (the SQLite writer thread first, then Ray's
calls, the socket send, the model stream, ...). py-spy samples a thread
that waits in a system call (the writer's fsync) as busy: its share is larger than its CPU.
"""

from __future__ import annotations

import collections
import sys

PARTS: list[tuple[str, list[str]]] = [
    ("SQLite writer thread", ["_worker (concurrent/futures/thread.py"]),
    ("Ray calls: made, answered, their values (de)serialised", ["ray/actor.py", "ray/_private/serialization.py",
                                                               "ray/_raylet", "ray/_private/async_compat.py"]),
    ("socket send (Session._write, websockets)", ["Session._write", "Connection.send (websockets", "Connection.send_data"]),
    ("model stream read and decode (fast_stream, aiohttp)", ["fast_stream", "aiohttp/"]),
    ("round engine, turn, gates", ["actors/round.py", "actors/turn.py", "actors/gates.py", "round_streams.py",
                                   "actors/decision.py", "actors/native.py"]),
    ("event log and group commit (the loop's side)", ["actors/eventlog.py", "store/base.py", "store/sqlite.py"]),
    ("subscription", ["subscription.py"]),
    ("WebSocket receive, handshake, dispatch", ["websockets/", "gateway/session.py", "gateway/front.py",
                                               "gateway/dispatch.py", "gateway/server.py", "gateway/overload.py"]),
    ("model request building, token count", ["actors/llm/request.py", "token_counter", "tiktoken"]),
]
# Innermost frames that are native code below them: the event loop (uvloop under `Runner.run`; a Ray
# actor's asyncio loop in its own thread, `Thread.run`), Ray's core worker (`Worker.main_loop`), and
# threads with no Python frame at all (Ray's C++ threads).
NATIVE = {
    "Runner.run": "event loop's own C code (Runner.run self: uvloop)",
    "Thread.run": "a Ray actor's loop thread, native code (Thread.run self)",
    "Worker.main_loop": "Ray's core worker, native code (Worker.main_loop self)",
    "(no frame)": "threads with no Python frame (native threads: Ray's, on ray)",
}


def summarise(path: str, top: int = 12) -> None:
    parts: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    total = 0
    with open(path, encoding="utf-8") as raw:
        for line in raw:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not count.isdigit():
                continue
            n = int(count)
            total += n
            leaf = stack.rsplit(";", 1)[-1].rsplit(":", 1)[0] or "(no frame)"
            leaves[leaf] += n
            native = NATIVE.get(leaf.split(" (", 1)[0])
            if native is not None:
                parts[native] += n
                continue
            parts[next((label for label, keys in PARTS if any(k in stack for k in keys)), "other")] += n
    print(f"{path.rsplit('/', 1)[-1]}: {total} samples")
    if not total:
        return
    print("  by part of the path (first match):")
    for label, n in parts.most_common():
        print(f"    {100 * n / total:5.1f}%  {label}")
    print("  by innermost frame:")
    for leaf, n in leaves.most_common(top):
        print(f"    {100 * n / total:5.1f}%  {leaf}")


if __name__ == "__main__":
    for profile in sys.argv[1:]:
        summarise(profile)
        print()
