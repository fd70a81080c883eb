"""The README's first command works on the checkout under test: `./dev serve` (default backend, Ray)
answers /readyz, serves the demo agent's full turn over a WebSocket, and drains on SIGTERM.

Under CI this runs on a clean clone right after `./dev test` set up its fresh .venv, so together
with the suite itself it proves both README commands from a clean clone.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


async def _demo_turn(port: int) -> list[dict[str, object]]:
    events: list[dict[str, object]] = []
    async with connect(f"ws://127.0.0.1:{port}/ws", subprotocols=["reactgate.v1"]) as ws:  # type: ignore[list-item]
        await ws.send(json.dumps({"type": "open", "id": "o"}))
        cid = json.loads(await ws.recv())["conversation_id"]
        await ws.send(json.dumps({"type": "subscribe", "id": "s", "conversation_id": cid}))
        await ws.send(json.dumps({"type": "user_message", "id": "u", "conversation_id": cid,
                                  "text": "What's the weather in Paris?"}))
        while not events or events[-1]["event"] != "turn.completed":
            frame = json.loads(await asyncio.wait_for(ws.recv(), 60))
            if frame["type"] == "event":
                events.append(frame)
    return events


def test_dev_serve_starts_the_demo_and_drains(tmp_path: Path) -> None:
    port = _free_port()
    env = {**os.environ, "REACTGATE_RAY_CPUS": "2"}
    proc = subprocess.Popen(
        ["./dev", "serve", "--port", str(port), "--store", f"sqlite:///{tmp_path}/readme.sqlite3"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not _ready(port):
            assert proc.poll() is None, f"./dev serve exited early:\n{proc.stdout.read() if proc.stdout else ''}"
            assert time.monotonic() < deadline, "./dev serve never became ready"
            time.sleep(0.25)
        events = asyncio.run(_demo_turn(port))
        names = [e["event"] for e in events]
        assert names[:2] == ["user.message", "turn.started"] and "tool.call" in names and "answer.delta" in names
        assert events[0]["data"] == {"message_id": "u", "text": "What's the weather in Paris?"}
        done = events[-1]["data"]
        assert isinstance(done, dict) and done["reason"] == "complete" and "Paris" in done["final_answer"]
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=90) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
