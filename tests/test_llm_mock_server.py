"""`reactgate mock-llm`: the same scripts over HTTP, for LiteLLM's `openai/` provider (docs/design.md#scripted-model).

The HTTP path must be indistinguishable from the custom provider for `stream_model`: same deltas,
same finish reasons, same error kinds.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from actors.llm.errors import ErrorKind
from actors.llm.mock_server import STATS, MockStats, run_mock_server, start_mock_server
from actors.llm.scripts import (
    CALL_INDEX_HEADER,
    CONVERSATION_HEADER,
    Round,
    Script,
    register_script,
)
from actors.llm.stream import ModelDelta, ModelFinished, ProviderError, StreamItem, stream_model

ROOT = Path(__file__).resolve().parent.parent
MESSAGES = [{"role": "user", "content": "hi"}]

SCRIPT = Script(
    rounds=[
        Round(text="<channel:thinking>Checking the weather.</channel:thinking>", chunk_chars=4),
        Round(deltas=["<channel:", "thinking>", "é°€😀", "", "</channel:thinking>"], finish_reason="length"),
        Round(text="same" * 150, chunk_chars=4),  # 150 identical chunks over HTTP too
        Round(text="", finish_reason="length"),
    ]
)


class Server:
    def __init__(self, port: int, stats: MockStats) -> None:
        self.base = f"http://127.0.0.1:{port}/v1"
        self.stats = stats


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    runner, port = await start_mock_server(SCRIPT)
    try:
        yield Server(port, runner.app[STATS])
    finally:
        await runner.cleanup()


async def outcome(model: str, start: int, api_base: str | None = None, **kw: Any) -> list[StreamItem] | tuple[str, bool]:
    """The items of one call at call index `start`, or (error kind, after_first_delta)."""
    counter = itertools.count(start)
    items: list[StreamItem] = []
    try:
        async for item in stream_model(
            [model], MESSAGES, conversation_id="conv", next_call_index=lambda: next(counter),
            api_base=api_base, api_key="sk-mock" if api_base else None, **kw,
        ):
            items.append(item)
    except ProviderError as exc:
        return exc.kind, exc.after_first_delta
    return items


def without_model(items: list[StreamItem] | tuple[str, bool]) -> Any:
    if isinstance(items, tuple):
        return items
    return [ModelFinished(i.finish_reason, "") if isinstance(i, ModelFinished) else i for i in items]


@pytest.mark.parametrize("call_index", range(len(SCRIPT.rounds)))
async def test_http_path_streams_the_same_items_as_the_custom_provider(server: Server, call_index: int) -> None:
    scripted = register_script("m-same", SCRIPT)
    direct = await outcome(scripted, call_index)
    http = await outcome("openai/m-same", call_index, server.base)
    assert without_model(http) == without_model(direct)
    assert isinstance(http, list) and isinstance(http[-1], ModelFinished)
    assert http[-1].finish_reason == SCRIPT.rounds[call_index].finish_reason


@pytest.mark.parametrize("kind", list(ErrorKind))
async def test_errors_before_first_delta_map_to_the_same_kinds(kind: ErrorKind) -> None:
    script = Script(rounds=[Round(error=kind)])
    runner, port = await start_mock_server(script)
    try:
        http = await outcome("openai/x", 0, f"http://127.0.0.1:{port}/v1")
        assert runner.app[STATS].requests == 1  # no hidden retries: each would be an uncounted model call
    finally:
        await runner.cleanup()
    direct = await outcome(register_script(f"m-err-{kind.value}", script), 0)
    assert http == direct == (kind.value, False)


@pytest.mark.parametrize(
    "kind", [ErrorKind.RATE_LIMIT, ErrorKind.TIMEOUT, ErrorKind.SERVER_ERROR, ErrorKind.BAD_REQUEST]
)
async def test_errors_mid_stream_map_to_the_same_kinds(kind: ErrorKind) -> None:
    script = Script(rounds=[Round(deltas=["ab", "cd"], error=kind)])
    runner, port = await start_mock_server(script)
    try:
        http = await outcome("openai/x", 0, f"http://127.0.0.1:{port}/v1")
    finally:
        await runner.cleanup()
    direct = await outcome(register_script(f"m-mid-{kind.value}", script), 0)
    assert http == direct == (kind.value, True)


async def test_exhausted_script_maps_to_script_exhausted(server: Server) -> None:
    assert await outcome("openai/x", len(SCRIPT.rounds), server.base) == ("script_exhausted", False)


async def test_read_timeout_maps_to_timeout() -> None:
    runner, port = await start_mock_server(Script(rounds=[Round(deltas=["late"], delay_ms=3000)]))
    try:
        http = await outcome("openai/x", 0, f"http://127.0.0.1:{port}/v1", timeout_s=0.2)
    finally:
        await runner.cleanup()
    assert http == ("timeout", False)


@pytest.mark.parametrize("hang_after", [1, 2])   # mid-stream, and after the last chunk (no finish)
async def test_a_hanging_round_goes_silent_on_both_players_until_the_idle_timeout_cuts_it(hang_after: int) -> None:
    script = Script(rounds=[Round(deltas=["ab", "cd"], hang_after=hang_after)])
    runner, port = await start_mock_server(script)
    try:
        http = await outcome("openai/x", 0, f"http://127.0.0.1:{port}/v1", idle_timeout_s=0.3)
    finally:
        await runner.cleanup()
    direct = await outcome(register_script(f"m-hang-{hang_after}", script), 0, idle_timeout_s=0.3)
    assert http == direct == ("timeout", True)


async def test_closing_early_closes_the_http_stream(server: Server) -> None:
    runner, port = await start_mock_server(Script(rounds=[Round(text="z" * 2000, chunk_chars=1, delay_ms=2)]))
    try:
        stats = runner.app[STATS]
        counter = itertools.count()
        got: list[StreamItem] = []
        gen = stream_model(["openai/x"], MESSAGES, conversation_id="c", next_call_index=lambda: next(counter),
                           api_base=f"http://127.0.0.1:{port}/v1", api_key="sk-mock")
        async with aclosing(gen):
            async for item in gen:
                got.append(item)
                if len(got) == 3:
                    break
        await stats.wait_until(lambda s: s.streams_aborted == 1)
        assert stats.streams_completed == 0
        assert got == [ModelDelta("z")] * 3
    finally:
        await runner.cleanup()


# -- raw HTTP ------------------------------------------------------------------------------------


async def sse_events(resp: aiohttp.ClientResponse) -> list[str]:
    body = (await resp.read()).decode()
    assert body.endswith("\n\n")
    return [block.removeprefix("data: ") for block in body.strip().split("\n\n")]


async def test_sse_wire_format(server: Server) -> None:
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"{server.base}/chat/completions",
                               json={"model": "m", "messages": MESSAGES, "stream": True},
                               headers={CONVERSATION_HEADER: "c", CALL_INDEX_HEADER: "0"})
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = await sse_events(resp)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == SCRIPT.rounds[0].text
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_without_call_index_the_server_counts_per_conversation(server: Server) -> None:
    async def first_text(conversation: str) -> str:
        async with aiohttp.ClientSession() as http:
            resp = await http.post(f"{server.base}/chat/completions",
                                   json={"model": "m", "messages": MESSAGES, "stream": False},
                                   headers={CONVERSATION_HEADER: conversation})
            return str((await resp.json())["choices"][0]["message"]["content"])

    assert await first_text("a") == SCRIPT.rounds[0].text
    assert await first_text("b") == SCRIPT.rounds[0].text  # its own copy
    assert await first_text("a") == "".join(SCRIPT.rounds[1].chunks)


async def test_models_endpoint(server: Server) -> None:
    async with aiohttp.ClientSession() as http:
        resp = await http.get(f"{server.base}/models")
        assert resp.status == 200
        assert (await resp.json())["object"] == "list"


def test_run_mock_server_rejects_a_bad_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rounds": [{"txt": "typo"}]}))
    assert run_mock_server(bad, port=0) == 2
    assert "bad.json: rounds.0.txt" in capsys.readouterr().err


async def test_cli_serves_a_script(tmp_path: Path) -> None:
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"rounds": [{"text": "from the cli"}]}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "mock-llm", "--script", str(script), "--port", "0",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        base = line.split(" at ", 1)[1].split()[0]
        items = await outcome("openai/any", 0, base)
        assert isinstance(items, list) and "".join(i.text for i in items if isinstance(i, ModelDelta)) == "from the cli"
    finally:
        proc.terminate()
        await proc.wait()
