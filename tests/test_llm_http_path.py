"""The HTTP path (docs/design.md#scripted-model): LiteLLM's `openai/` provider against `reactgate mock-llm` over real HTTP on
loopback yields the same events as the `scripted/` custom provider for the same script."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from actors.llm.mock_server import start_mock_server
from actors.llm.scripts import parse_script
from protocol.events import payload_builtins
from tests.convkit import (
    Harness,
    harness,
    profile_for,
    rounds_script,
    text_round,
    thinking,
    tool_round,
)

ROOT = Path(__file__).resolve().parent.parent
ANSWER = "It is raining in Paris, 12 °C. Take an umbrella."
CONTINUED = thinking("Paris reports rain.") + (
    '<channel:action>{"action": "complete", "final_answer": ' + json.dumps(ANSWER, ensure_ascii=False) + "}"
    "</channel:action>"
)
SCRIPT = rounds_script(
    {**tool_round("demo.weather", say="Checking the weather in Paris.", city="Paris"), "chunk_chars": 3},
    text_round(CONTINUED[:70], finish_reason="length", chunk_chars=7),   # cut inside the answer …
    text_round(CONTINUED[70:], chunk_chars=5),                            # … and continued (docs/design.md#continuation)
)


def comparable(h: Harness) -> list[tuple[str, dict[str, Any]]]:
    """Events by name and data, without `ts`; a tool's measured duration is not part of the script."""
    out = []
    for e in h.events:
        data = {k: v for k, v in payload_builtins(e.data).items() if k != "duration_ms"}
        out.append((e.event, data))
    return out


async def run_turn(h: Harness) -> list[tuple[str, dict[str, Any]]]:
    done = await h.turn("weather in paris?")
    assert done["reason"] == "complete" and done["final_answer"] == ANSWER
    h.check_invariants()
    return comparable(h)


def openai_harness(port: int) -> Harness:
    return harness(
        profile=profile_for("openai/scripted"),
        model_kwargs={"api_base": f"http://127.0.0.1:{port}/v1", "api_key": "sk-loopback"},
        conversation_id="http-path",
    )


async def test_openai_provider_against_the_in_process_mock_gets_the_custom_provider_events() -> None:
    expected = await run_turn(harness(SCRIPT, conversation_id="custom-path"))

    runner, port = await start_mock_server(parse_script(SCRIPT))
    try:
        got = await run_turn(openai_harness(port))
    finally:
        await runner.cleanup()
    assert got == expected
    assert [name for name, _ in got].count("round.completed") == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _mock_command(script: Path, port: int) -> list[str]:
    console = Path(sys.executable).parent / "reactgate"
    if console.exists() or shutil.which("reactgate"):
        exe = str(console) if console.exists() else str(shutil.which("reactgate"))
        return [exe, "mock-llm", "--script", str(script), "--port", str(port)]
    return [sys.executable, "-m", "gateway.cli", "mock-llm", "--script", str(script), "--port", str(port)]


async def test_openai_provider_against_the_mock_llm_command_gets_the_custom_provider_events(tmp_path: Path) -> None:
    expected = await run_turn(harness(SCRIPT, conversation_id="custom-path"))

    script_file = tmp_path / "script.json"
    script_file.write_text(json.dumps(SCRIPT), encoding="utf-8")
    port = _free_port()
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    proc = await asyncio.create_subprocess_exec(
        *_mock_command(script_file, port), cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        if f":{port}/v1" not in line.decode():
            rest = await asyncio.wait_for(proc.stdout.read(), 10)
            pytest.fail(f"mock-llm did not start: {(line + rest).decode()}")
        got = await run_turn(openai_harness(port))
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)
    assert got == expected
