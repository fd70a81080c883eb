"""The server as a process (`reactgate serve --backend local --store sqlite:///…`), killed and drained.

- SIGKILL in the middle of a streaming answer, restart on the same SQLite file: the client resumes
  from its last seq with every durable event intact, every event it saw is in the log, and the
  cut turn ends exactly once, its answer continued from what had streamed (docs/design.md#recovery).
- SIGTERM: clients get close 1012, the process exits cleanly, and a fresh server on the same store
  lets them resume with no gap and no duplicate (docs/wire-protocol.md#10-delivery-idempotency-resume-multiplexing).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol.frames import CloseCode
from tests.e2e import ServeProcess, as_frames, check_log, comparable, read_log, slow_answer_script
from tests.kit import client

pytestmark = pytest.mark.slow


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[list[ServeProcess]]:
    started: list[ServeProcess] = []
    yield started
    for p in started:
        p.stop()


def serve(tmp_path: Path, processes: list[ServeProcess], name: str) -> ServeProcess:
    script_file = tmp_path / "script.json"
    if not script_file.exists():  # ~400 answer chars, 4 per delta, 15 ms apart: a few seconds of streaming
        script = slow_answer_script(answer_chars=400, delay_ms=15)
        script["continues"] = True  # asked to continue a cut answer, it continues it
        script_file.write_text(json.dumps(script))
    p = ServeProcess(tmp_path / "store.sqlite3", tmp_path / f"{name}.log", args=["--script", str(script_file)])
    processes.append(p)
    return p


def answer_deltas(events: list[dict[str, Any]]) -> int:
    return sum(e["event"] == "answer.delta" for e in events)


async def test_sigkill_mid_answer_then_restart_on_the_same_store_resumes_with_every_durable_event(
    tmp_path: Path, processes: list[ServeProcess]
) -> None:
    first = await serve(tmp_path, processes, "first").start()
    assert b"event loop: uvloop" in first.log_path.read_bytes()  # the default loop, where uvloop installs
    async with client(first.url) as c:
        cid = await c.open()
        await c.subscribe(cid)
        await c.say(cid, id="m1")
        await c.until(lambda: answer_deltas(c.events[cid]) >= 3 or None, timeout=60)
        first.signal(signal.SIGKILL)
        assert await first.wait() == -signal.SIGKILL
        await c.closed()
    seen = list(c.events[cid])

    second = await serve(tmp_path, processes, "second").start()
    async with client(second.url) as c:
        reopened = await c.request(type="open", conversation_id=cid)
        assert reopened["last_seq"] >= seen[-1]["seq"]  # nothing the client saw was lost
        await c.subscribe(cid, after_seq=seen[-1]["seq"])
        done = await c.turn_completed(cid)
        resumed = c.events[cid]
    second.signal(signal.SIGTERM)
    assert await second.wait() == 0

    union = seen + resumed
    log = as_frames(await read_log(tmp_path / "store.sqlite3", cid))
    assert comparable(union) == comparable(log)  # seq 1..N once each, and what the client saw is the log
    check_log(union)
    completed = [e for e in log if e["event"] == "turn.completed"]
    assert completed == [done]  # the cut turn ended exactly once
    # an answer had streamed when the process died: it is continued, never regenerated nor cut short
    streamed = "".join(e["data"]["text"] for e in log if e["event"] == "answer.delta")
    whole = " ".join(f"word{i:03d}" for i in range(50))  # slow_answer_script(answer_chars=400)'s answer
    assert done["data"]["reason"] == "complete" and done["data"]["final_answer"] == streamed == whole
    assert streamed.startswith("".join(e["data"]["text"] for e in seen if e["event"] == "answer.delta"))
    assert [e["data"]["kind"] for e in log if e["event"] == "trace"] == []  # nothing salvaged


async def test_sigterm_closes_clients_with_1012_and_a_fresh_server_on_the_same_store_resumes(
    tmp_path: Path, processes: list[ServeProcess]
) -> None:
    first = await serve(tmp_path, processes, "first").start()
    async with client(first.url) as c:
        cid = await c.open()
        await c.subscribe(cid)
        await c.say(cid, id="m1")
        await c.until(lambda: answer_deltas(c.events[cid]) >= 1 or None, timeout=60)
        first.signal(signal.SIGTERM)
        closed = await c.closed()
        assert closed.rcvd is not None and closed.rcvd.code == CloseCode.SERVICE_RESTART
    assert await first.wait() == 0  # drained within the grace period
    seen = list(c.events[cid])

    second = await serve(tmp_path, processes, "second").start()
    async with client(second.url) as c:
        await c.subscribe(cid, after_seq=seen[-1]["seq"])
        done = await c.turn_completed(cid)
        resumed = c.events[cid]
        assert (await c.say(cid, id="m1"))["status"] == "duplicate"  # the key survived the restart
    second.signal(signal.SIGTERM)
    assert await second.wait() == 0

    union = seen + resumed
    assert comparable(union) == comparable(as_frames(await read_log(tmp_path / "store.sqlite3", cid)))
    check_log(union)
    assert [e["data"]["turn_id"] for e in union if e["event"] == "turn.completed"] == ["t1"]
    assert done["data"]["reason"] == "complete" and "partial" not in done["data"]
