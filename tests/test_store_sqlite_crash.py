"""docs/design.md#write-ahead across a crash: every append that returned survives SIGKILL of the process.

A child process appends events for several conversations concurrently (so appends share group
commits) and prints `conversation seq` after each append returned — the moment the runtime would
send the event to a client. The test kills it mid-stream, reopens the file and finds every printed
event there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from actors.store.sqlite import SqliteStore

REPO = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from actors.store.sqlite import SqliteStore
    from protocol.events import AnswerDelta, Event

    async def writer(store, cid):
        seq = 0
        while True:
            batch = [
                Event.of(cid, seq + i, AnswerDelta(turn_id="t1", round=1, text="x" * 200), ts=0.0)
                for i in (1, 2)
            ]
            await store.append_events(cid, batch)
            seq += 2
            sys.stdout.write(f"{cid} {seq}\\n")
            sys.stdout.flush()

    async def main():
        store = SqliteStore(sys.argv[1], synchronous=sys.argv[2])
        await store.open()
        await asyncio.gather(*(writer(store, f"c{i}") for i in range(8)))

    asyncio.run(main())
    """
)

KILL_AFTER_LINES = 400


@pytest.mark.slow
@pytest.mark.parametrize("synchronous", ["FULL", "NORMAL"])
async def test_every_returned_append_survives_sigkill(tmp_path: Path, synchronous: str) -> None:
    path = tmp_path / "crash.db"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), synchronous],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert child.stdout is not None
    acknowledged: dict[str, int] = {}
    lines = 0
    try:
        while lines < KILL_AFTER_LINES:
            line = child.stdout.readline()     # blocks until the child acknowledged one more append
            if not line:
                pytest.fail(f"child exited early: {child.wait()} {child.stderr.read() if child.stderr else ''}")
            cid, seq = line.split()
            acknowledged[cid] = max(acknowledged.get(cid, 0), int(seq))
            lines += 1
        child.send_signal(signal.SIGKILL)
        # Lines still in the pipe were acknowledged before the kill, too.
        rest, _ = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    for line in rest.splitlines():
        if line.count(" ") == 1:                # the kill may cut the very last line short
            cid, seq = line.split()
            acknowledged[cid] = max(acknowledged.get(cid, 0), int(seq))

    store = SqliteStore(path)
    await store.open()
    try:
        for cid, seq in acknowledged.items():
            events = await store.read_events(cid, 0, limit=1_000_000)
            # Every acknowledged seq is there, and the log is contiguous from 1 (nothing torn).
            assert [e.seq for e in events] == list(range(1, len(events) + 1))
            assert len(events) >= seq, f"{cid}: acknowledged seq {seq}, store has {len(events)}"
            assert await store.last_seq(cid) == len(events)
    finally:
        await store.close()
    assert len(acknowledged) == 8
