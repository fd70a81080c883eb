"""Hostile input over a real socket: junk bytes, binary frames, wrong types, missing fields, huge
strings, deep nesting. Each gets an error frame or a documented close code, never a crash, while a
well-behaved client on another connection keeps working (docs/wire-protocol.md#11-limits-slow-consumers-drain)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed

from protocol.frames import CloseCode, ErrorCode
from tests.frame_strategies import fields, json_values
from tests.gateway_harness import Harness, running
from tests.kit import Client

MAX_FRAME = 4096
# Codes a hostile but authenticated client may legitimately provoke; never `internal`.
EXPECTED_CODES = {ErrorCode.BAD_REQUEST, ErrorCode.FORBIDDEN, ErrorCode.NOT_FOUND, ErrorCode.OVERLOADED}



def deep(depth: int) -> str:
    return '{"type":"ping","id":"d","x":' + "[" * depth + "]" * depth + "}"


def huge(size: int) -> str:
    return json.dumps({"type": "user_message", "id": "h", "conversation_id": "c", "text": "x" * size})


hostile = st.one_of(
    st.binary(max_size=64),                                   # binary frame
    st.binary(max_size=64).map(lambda b: b.decode("utf-8", "replace")),  # junk text
    st.text(max_size=64),
    json_values.map(json.dumps),                              # JSON that is not a frame
    fields.map(json.dumps),                                   # wrong types / missing fields
    st.integers(min_value=1, max_value=3 * MAX_FRAME).map(huge),
    st.integers(min_value=1, max_value=MAX_FRAME // 2 - 40).map(deep),
)


@pytest.fixture
async def harness() -> AsyncIterator[tuple[Harness, Client, str]]:
    async with running(max_frame_bytes=MAX_FRAME, rate_burst=1000, rate_per_s=1000) as h, h.client() as good:
        cid = await good.open()
        await good.request(type="subscribe", conversation_id=cid)
        yield h, good, cid


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(message=hostile)
async def test_hostile_frames_get_error_frames_or_documented_closes(
    harness: tuple[Harness, Client, str], message: str | bytes
) -> None:
    h, good, cid = harness
    async with h.client() as c:
        await c.ws.send(message)
        try:
            await c.send(type="ping", id="probe")
            replies: list[dict[str, Any]] = []
            while not replies or replies[-1].get("id") != "probe":
                replies.append(await c.recv())
        except ConnectionClosed as closed:
            # the only close a single frame may cause: over max_frame_bytes
            assert closed.rcvd is not None and closed.rcvd.code == CloseCode.MESSAGE_TOO_BIG
            assert len(message.encode() if isinstance(message, str) else message) > MAX_FRAME
        else:
            assert replies[-1] == {"type": "pong", "id": "probe"}
            for reply in replies[:-1]:
                assert reply["type"] in ("ack", "error", "event", "pong", "conversations"), reply
                if reply["type"] == "error":
                    assert reply["code"] in EXPECTED_CODES, reply
            if isinstance(message, bytes):
                assert replies[0]["code"] == "bad_request"

    # Meanwhile the well-behaved client is unaffected.
    last = await h.backend.emit(cid, 1)
    assert (await good.request(type="ping"))["type"] == "pong"
    assert [e["seq"] for e in await good.events_until(cid, last)] == list(range(1, last + 1))
