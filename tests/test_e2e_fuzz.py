"""Hostile frames against the real backend (docs/wire-protocol.md#11-limits-slow-consumers-drain): junk bytes, binary frames, wrong
types, missing fields, huge strings, deep nesting, and malformed frames aimed at a live
conversation. Each gets an error frame (never `internal`) or the documented close code, the server
stays up, and a well-behaved client on another connection completes its turn meanwhile with a
gap-free log identical to the store's.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed

from protocol.frames import CloseCode
from tests.e2e import as_frames, check_log, comparable, local_server, slow_answer_script
from tests.frame_strategies import fields, json_values, scalars
from tests.kit import Client

MAX_FRAME = 4096
# What a hostile but authenticated client may provoke; never `internal`.
EXPECTED_CODES = {"bad_request", "forbidden", "not_found", "overloaded"}
TARGET = "@@live-conversation@@"  # replaced by the live conversation's id (longer than any generated text)

not_a_string = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.lists(scalars, max_size=2)
# Frames naming the live conversation, each invalid by construction: they must never touch it.
aimed = st.one_of(
    st.builds(lambda text: {"type": "user_message", "id": "x", "conversation_id": TARGET, "text": text},
              not_a_string | st.just("")),
    st.builds(lambda seq: {"type": "subscribe", "id": "x", "conversation_id": TARGET, "after_seq": seq},
              st.integers(max_value=-1) | st.text(max_size=4) | st.floats(allow_nan=False)),
    st.builds(lambda mode: {"type": "set_mode", "id": "x", "conversation_id": TARGET, "mode": mode},
              st.text(max_size=6).filter(lambda m: m not in ("agent", "ask")) | not_a_string),
    st.builds(lambda extra: {"type": "cancel", "id": "x", "conversation_id": TARGET, "surprise": extra}, json_values),
    st.builds(lambda ask: {"type": "answer", "id": "x", "conversation_id": TARGET, "ask_id": ask}, json_values),
    st.builds(lambda long_id: {"type": "steer", "id": long_id, "conversation_id": TARGET, "text": "stop"},
              st.text(min_size=129, max_size=200)),
).map(json.dumps)


def deep(depth: int) -> str:
    return '{"type":"ping","id":"d","x":' + "[" * depth + "]" * depth + "}"


def huge(size: int) -> str:
    return json.dumps({"type": "user_message", "id": "h", "conversation_id": TARGET, "text": "x" * size})


hostile = st.one_of(
    st.binary(max_size=64),                                              # binary frame
    st.binary(max_size=64).map(lambda b: b.decode("utf-8", "replace")),  # junk text
    st.text(max_size=64),
    json_values.map(json.dumps),                                         # JSON that is not a frame
    fields.map(json.dumps),                                              # wrong types / missing fields
    aimed,
    st.integers(min_value=MAX_FRAME, max_value=3 * MAX_FRAME).map(huge),  # over the frame limit: 1009
    st.integers(min_value=1, max_value=MAX_FRAME // 2 - 40).map(deep),
)


def size(message: str | bytes) -> int:
    return len(message.encode() if isinstance(message, str) else message)


async def probe(bad: Client, message: str | bytes) -> list[dict[str, Any]] | int:
    """Send one hostile frame, then a ping: the replies up to the pong, or the close code."""
    await bad.ws.send(message)
    try:
        await bad.send(type="ping", id="probe")
        replies: list[dict[str, Any]] = []
        while not replies or replies[-1].get("id") != "probe":
            replies.append(await bad._read())
        return replies
    except ConnectionClosed as closed:
        return closed.rcvd.code if closed.rcvd is not None else -1


_stores = itertools.count()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=st.lists(hostile, min_size=1, max_size=6))
async def test_hostile_frames_get_error_frames_or_documented_closes_while_a_good_client_completes_a_turn(
    tmp_path: Path, messages: list[str | bytes]
) -> None:
    store = tmp_path / f"fuzz-{next(_stores)}.sqlite3"
    async with local_server(store, slow_answer_script(answer_chars=80, delay_ms=2), max_frame_bytes=MAX_FRAME,
                            rate_per_s=1000, rate_burst=1000) as s, s.client() as good:
        cid = await good.open()
        await good.subscribe(cid)
        await good.say(cid, id="m1")
        async with contextlib.AsyncExitStack() as connections:
            bad = await connections.enter_async_context(s.client())
            for message in messages:
                if isinstance(message, str):
                    message = message.replace(TARGET, cid)
                outcome = await probe(bad, message)
                if isinstance(outcome, int):
                    # the only close one frame may cause: over max_frame_bytes
                    assert outcome == CloseCode.MESSAGE_TOO_BIG and size(message) > MAX_FRAME, (outcome, message)
                    bad = await connections.enter_async_context(s.client())
                    continue
                assert outcome[-1] == {"type": "pong", "id": "probe"}
                for reply in outcome[:-1]:
                    assert reply["type"] in ("ack", "error", "event", "conversations"), reply
                    if reply["type"] == "error":
                        assert reply["code"] in EXPECTED_CODES, reply
                    if reply.get("conversation_id") == cid:
                        assert reply["type"] == "error", (reply, message)  # nothing aimed at it was accepted
                if isinstance(message, bytes):
                    assert outcome[0]["code"] == "bad_request"

        # Meanwhile the well-behaved client was unaffected: its one turn completed, every event
        # arrived exactly once and in order, and nothing but its own replies came back to it.
        done = await good.turn_completed(cid)
        assert done["data"]["reason"] == "complete"
        assert (await good.request(type="ping"))["type"] == "pong"
        assert good.others == []
        assert comparable(good.events[cid]) == comparable(as_frames(await s.log(cid)))
        check_log(good.events[cid])
