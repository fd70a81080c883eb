"""protocol/frames.py: the wire frames of reactgate.v1 (docs/wire-protocol.md), decoded and encoded without I/O."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from protocol.events import EVENT_KINDS, STREAM_KINDS, ConversationDeleted, Event
from protocol.frames import (
    CLIENT_FRAME_TYPES,
    ERROR_CODES,
    TITLE_MAX_CHARS,
    Ack,
    AnswerFrame,
    CancelFrame,
    ConversationEntry,
    ConversationsFrame,
    DeleteFrame,
    ErrorCode,
    ErrorFrame,
    ExportCompleted,
    ExportFrame,
    FrameError,
    InvalidCursor,
    ListFrame,
    Open,
    Ping,
    Pong,
    SetModeFrame,
    SteerFrame,
    Subscribe,
    Unsubscribe,
    UserMessageFrame,
    decode_client_frame,
    decode_cursor,
    decode_server_frame,
    encode_cursor,
    encode_event,
    encode_frame,
    recover_id,
    title_of,
)


def frame(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


VALID = [
    (frame(type="open", id="1"), Open(id="1")),
    (frame(type="open", id="1", conversation_id="c", agent="demo", mode="ask"),
     Open(id="1", conversation_id="c", agent="demo", mode="ask")),
    (frame(type="subscribe", id="2", conversation_id="c"), Subscribe(id="2", conversation_id="c", after_seq=0)),
    (frame(type="subscribe", id="2", conversation_id="c", after_seq=7), Subscribe(id="2", conversation_id="c", after_seq=7)),
    (frame(type="unsubscribe", id="3", conversation_id="c"), Unsubscribe(id="3", conversation_id="c")),
    (frame(type="user_message", id="4", conversation_id="c", text="hi"),
     UserMessageFrame(id="4", conversation_id="c", text="hi")),
    (frame(type="steer", id="5", conversation_id="c", text="stop"), SteerFrame(id="5", conversation_id="c", text="stop")),
    (frame(type="answer", id="6", conversation_id="c", ask_id="a1", answer="yes"),
     AnswerFrame(id="6", conversation_id="c", ask_id="a1", answer="yes")),
    (frame(type="set_mode", id="7", conversation_id="c", mode="ask"), SetModeFrame(id="7", conversation_id="c", mode="ask")),
    (frame(type="cancel", id="8", conversation_id="c"), CancelFrame(id="8", conversation_id="c")),
    (frame(type="ping", id="9"), Ping(id="9")),
    (frame(type="delete", id="10", conversation_id="c"), DeleteFrame(id="10", conversation_id="c")),
    (frame(type="export", id="11", conversation_id="c"), ExportFrame(id="11", conversation_id="c")),
    (frame(type="list", id="12", limit=20), ListFrame(id="12", limit=20)),
    (frame(type="list", id="12", limit=1, before="abc"), ListFrame(id="12", limit=1, before="abc")),
]


@pytest.mark.parametrize(("raw", "expected"), VALID, ids=[v[1].__class__.__name__ for v in VALID])
def test_every_client_frame_type_decodes(raw: bytes, expected: object) -> None:
    assert decode_client_frame(raw) == expected
    assert decode_client_frame(raw.decode()) == expected  # text frames arrive as str


def test_the_frame_table_covers_every_type() -> None:
    assert {type(v[1]).__struct_config__.tag for v in VALID} == set(CLIENT_FRAME_TYPES)


def test_key_order_does_not_matter() -> None:
    assert decode_client_frame(b'{"id":"1","text":"t","conversation_id":"c","type":"user_message"}') == (
        UserMessageFrame(id="1", conversation_id="c", text="t")
    )


def bad(raw: bytes | str) -> FrameError:
    with pytest.raises(FrameError) as info:
        decode_client_frame(raw)
    assert info.value.code is ErrorCode.BAD_REQUEST
    return info.value


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        (frame(type="user_message", id="1", conversation_id="c", text=1), "`$.text`"),
        (frame(type="user_message", id="1", conversation_id="c"), "`text`"),
        (frame(type="subscribe", id="1", conversation_id=5), "`$.conversation_id`"),
        (frame(type="subscribe", id="1", conversation_id="c", after_seq=-1), "`$.after_seq`"),
        (frame(type="subscribe", id="1", conversation_id="c", after_seq="3"), "`$.after_seq`"),
        (frame(type="set_mode", id="1", conversation_id="c"), "`mode`"),
        (frame(type="set_mode", id="1", conversation_id="c", mode="god"), "`$.mode`"),
        (frame(type="open", id="1", mode="god"), "`$.mode`"),
        (frame(type="answer", id="1", conversation_id="c", answer="y"), "`ask_id`"),
        (frame(type="ping", id="1", extra=True), "`extra`"),
        (frame(type="ping"), "`id`"),
        (frame(type="ping", id=""), "`$.id`"),
        (frame(type="ping", id="x" * 129), "`$.id`"),
        (frame(type="ping", id=3), "`$.id`"),
        (frame(id="1"), "`type`"),
        (frame(type="launch_missiles", id="1"), "`$.type`"),
        (frame(type="list", id="1"), "`limit`"),
        (frame(type="list", id="1", limit=0), "`$.limit`"),
        (frame(type="list", id="1", limit=101), "`$.limit`"),
        (frame(type="list", id="1", limit=5, before=""), "`$.before`"),
        (frame(type="list", id="1", limit=5, conversation_id="c"), "`conversation_id`"),
    ],
)
def test_each_error_names_the_field(raw: bytes, names: str) -> None:
    assert names in bad(raw).message


def test_unknown_type_lists_the_known_types() -> None:
    assert "known types: open, subscribe" in bad(frame(type="nope", id="1")).message


@pytest.mark.parametrize("raw", [b"", b"{", b"not json", b"\xff\xfe", b'{"type":"ping"', b'{"type":"ping","id":"1"} x'])
def test_invalid_json_is_bad_request(raw: bytes) -> None:
    assert bad(raw).message.startswith("invalid JSON")


@pytest.mark.parametrize("raw", [b"[]", b"1", b'"ping"', b"null"])
def test_a_frame_must_be_an_object(raw: bytes) -> None:
    assert "Expected `object`" in bad(raw).message


def test_the_id_is_recovered_from_a_bad_frame() -> None:
    assert bad(frame(type="user_message", id="abc", conversation_id="c", text=1)).id == "abc"
    assert bad(frame(type="nope", id="abc")).id == "abc"
    assert bad(frame(type="ping", id="abc", extra=1)).id == "abc"


@pytest.mark.parametrize(
    "raw",
    [b"{", frame(type="ping", id=1), frame(type="ping", id=""), frame(type="ping", id="x" * 129), b"[]",
     frame(type="ping")],
)
def test_no_id_is_invented(raw: bytes) -> None:
    assert bad(raw).id is None


def test_deep_nesting_is_a_frame_error() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    # the id is best effort here: skipping the nested value may itself exceed the depth limit
    assert bad(b'{"type":"ping","id":"1","x":' + deep + b"}").id in (None, "1")
    assert bad(b'{"x":' + deep + b',"type":"ping","id":"1"}').id in (None, "1")
    assert bad(b'{"type":"ping","id":"1","x":[[[[1]]]]}').id == "1"
    assert recover_id(b'{"id":' + deep + b"}") is None


def test_every_error_code_is_documented() -> None:
    assert set(ERROR_CODES) == set(ErrorCode)
    assert {c.value for c in ErrorCode} == {
        "bad_request", "unauthorized", "forbidden", "not_found", "rate_limited", "too_large",
        "slow_consumer", "overloaded", "internal", "quota_exceeded", "unavailable",
    }


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
frame_like = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from([*CLIENT_FRAME_TYPES, "nope"]) | json_values,
        "id": st.text(max_size=130) | json_values,
        "conversation_id": st.text(max_size=5) | json_values,
        "text": st.text(max_size=5) | json_values,
        "after_seq": st.integers() | json_values,
        "mode": st.sampled_from(["agent", "ask", "x"]) | json_values,
        "ask_id": json_values,
        "answer": json_values,
        "agent": json_values,
        "junk": json_values,
    },
)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200) | json_values.map(json.dumps) | frame_like.map(json.dumps))
def test_arbitrary_input_raises_only_frame_error(data: bytes | str) -> None:
    try:
        decoded = decode_client_frame(data)
    except FrameError as exc:
        assert exc.code is ErrorCode.BAD_REQUEST
        assert exc.id is None or 1 <= len(exc.id) <= 128
    else:
        assert type(decoded).__struct_config__.tag in CLIENT_FRAME_TYPES


# -- server frames -----------------------------------------------------------------------------


def test_ack_always_carries_its_status() -> None:
    assert json.loads(encode_frame(Ack(id="1", status="accepted"))) == {"type": "ack", "id": "1", "status": "accepted"}
    assert json.loads(encode_frame(Ack(id="1", status="duplicate", conversation_id="c"))) == {
        "type": "ack", "id": "1", "status": "duplicate", "conversation_id": "c",
    }
    assert json.loads(encode_frame(Ack(id="1", status="accepted", conversation_id="c", last_seq=0)))["last_seq"] == 0


def test_error_frame_shape() -> None:
    assert json.loads(encode_frame(ErrorFrame(code=ErrorCode.FORBIDDEN, message="m"))) == {
        "type": "error", "code": "forbidden", "message": "m",
    }
    slow = ErrorFrame(code=ErrorCode.SLOW_CONSUMER, message="m", conversation_id="c", last_seq=4)
    assert json.loads(encode_frame(slow)) == {
        "type": "error", "code": "slow_consumer", "message": "m", "conversation_id": "c", "last_seq": 4,
    }


# Every error frame but `unavailable` keeps the bytes it had before `retry_after_ms` existed: the
# optional fields are omitted unless set, in the order they were declared.
ERROR_BYTES = [
    (ErrorFrame(code=ErrorCode.BAD_REQUEST, message="invalid JSON: x"),
     b'{"type":"error","code":"bad_request","message":"invalid JSON: x"}'),
    (ErrorFrame(code=ErrorCode.RATE_LIMITED, message="rate limit exceeded: frame not processed", id="m1"),
     b'{"type":"error","code":"rate_limited","message":"rate limit exceeded: frame not processed","id":"m1"}'),
    (ErrorFrame(code=ErrorCode.SLOW_CONSUMER, message="send queue full", conversation_id="c", last_seq=4),
     b'{"type":"error","code":"slow_consumer","message":"send queue full","conversation_id":"c","last_seq":4}'),
    (ErrorFrame(code=ErrorCode.INTERNAL, message="internal error (ref 1a2b3c4d5e6f)", id="m2", conversation_id="c"),
     b'{"type":"error","code":"internal","message":"internal error (ref 1a2b3c4d5e6f)","id":"m2","conversation_id":"c"}'),
    (ErrorFrame(code=ErrorCode.QUOTA_EXCEEDED, message="q", id="m4", conversation_id="c", quota="turns_per_minute",
                scope="user", resets_at="2026-12-01T06:09:00Z"),
     b'{"type":"error","code":"quota_exceeded","message":"q","id":"m4","conversation_id":"c",'
     b'"quota":"turns_per_minute","scope":"user","resets_at":"2026-12-01T06:09:00Z"}'),
    # docs/wire-protocol.md#5-error-codes: the new code, its field last
    (ErrorFrame(code=ErrorCode.UNAVAILABLE, id="m5", conversation_id="c", retry_after_ms=1000,
                message="store unavailable: failover; frame not processed, send it again (same id) after 1000 ms"),
     b'{"type":"error","code":"unavailable","message":"store unavailable: failover; frame not processed, '
     b'send it again (same id) after 1000 ms","id":"m5","conversation_id":"c","retry_after_ms":1000}'),
]  # fmt: skip


@pytest.mark.parametrize(("error", "wire"), ERROR_BYTES, ids=[str(e.code) for e, _ in ERROR_BYTES])
def test_error_frames_keep_their_bytes_and_retry_after_ms_only_where_set(error: ErrorFrame, wire: bytes) -> None:
    assert encode_frame(error) == wire
    assert decode_server_frame(wire) == error
    assert (b"retry_after_ms" in wire) is (error.code is ErrorCode.UNAVAILABLE)


def test_a_client_of_before_reads_an_unavailable_frame() -> None:
    # A decoder that does not know `retry_after_ms` (msgspec ignores unknown fields of a server frame).
    class OldErrorFrame(msgspec.Struct, tag_field="type", tag="error"):
        code: str
        message: str
        id: str | None = None

    old = msgspec.json.decode(ERROR_BYTES[-1][1], type=OldErrorFrame)
    assert (old.code, old.id) == ("unavailable", "m5")


def test_pong() -> None:
    assert json.loads(encode_frame(Pong(id="9"))) == {"type": "pong", "id": "9"}


def test_export_completed_is_a_frame_type_of_its_own() -> None:
    done = ExportCompleted(id="x1", conversation_id="c", events=0, last_seq=0)
    assert encode_frame(done) == b'{"type":"export.completed","id":"x1","conversation_id":"c","events":0,"last_seq":0}'
    assert decode_server_frame(encode_frame(done)) == done


def test_conversation_deleted_is_an_event_frame_decoded_to_its_struct() -> None:
    frame = encode_event(Event.of("c", 33, ConversationDeleted(last_seq=32), 1.5))
    assert frame == b'{"type":"event","conversation_id":"c","seq":33,"event":"conversation.deleted",' \
                    b'"data":{"last_seq":32},"ts":1.5}'
    assert decode_server_frame(frame) == Event.of("c", 33, ConversationDeleted(last_seq=32), 1.5)


@given(
    st.text(min_size=1, max_size=20),
    st.integers(min_value=1, max_value=2**40),
    st.text(max_size=20),
    st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3),
    st.floats(min_value=0, max_value=2e9),
)
def test_encode_event_is_the_event_frame(cid: str, seq: int, name: str, data: dict[str, Any], ts: float) -> None:
    assume(name not in EVENT_KINDS | STREAM_KINDS)  # known kinds: tests/test_event_bytes.py, against recorded bytes
    event = Event(conversation_id=cid, seq=seq, event=name, data=data, ts=ts)
    spliced = encode_event(event)
    assert spliced.startswith(b'{"type":"event","conversation_id":')
    assert json.loads(spliced) == {"type": "event", "conversation_id": cid, "seq": seq, "event": name, "data": data,
                                   "ts": ts}
    assert decode_server_frame(spliced) == event


ENTRY = ConversationEntry(conversation_id="c_1", agent="demo", created_at=1.5, last_active_at=2.25, last_seq=7,
                          title="weather in Paris?", running=False)


def test_a_conversations_frame_is_a_frame_type_of_its_own_and_omits_next_before_on_the_last_page() -> None:
    last = ConversationsFrame(id="l1", conversations=[ENTRY])
    assert encode_frame(last) == (
        b'{"type":"conversations","id":"l1","conversations":[{"conversation_id":"c_1","agent":"demo",'
        b'"created_at":1.5,"last_active_at":2.25,"last_seq":7,"title":"weather in Paris?","running":false}]}')
    more = ConversationsFrame(id="l2", conversations=[ENTRY], next_before=encode_cursor(ENTRY))
    assert decode_server_frame(encode_frame(last)) == last and decode_server_frame(encode_frame(more)) == more


URL_SAFE = st.characters(categories=(), include_characters="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


@given(st.floats(allow_nan=False, allow_infinity=False), st.text(URL_SAFE, min_size=1, max_size=128))
def test_a_cursor_names_exactly_the_position_of_its_entry_and_fits_a_list_frame(at: float, cid: str) -> None:
    entry = ConversationEntry(conversation_id=cid, agent="a", created_at=0.0, last_active_at=at, last_seq=0,
                              title="", running=False)
    cursor = encode_cursor(entry)
    assert decode_cursor(cursor) == (at, cid)
    assert decode_client_frame(frame(type="list", id="1", limit=1, before=cursor)) == ListFrame(id="1", limit=1, before=cursor)


@pytest.mark.parametrize("text", ["", "!!", "bm90IGpzb24", "WzEsMl0", "WyJ4IiwiYyJd", "WzEuMCwiIl0", "é"])
def test_anything_but_a_cursor_is_refused(text: str) -> None:
    with pytest.raises(InvalidCursor):
        decode_cursor(text)


def test_a_title_is_the_first_message_folded_and_cut() -> None:
    assert title_of("  weather\n in   Paris? ") == "weather in Paris?"
    long = "word " * 40
    assert len(title_of(long)) == TITLE_MAX_CHARS and title_of(long).endswith("…")
    assert title_of("x" * TITLE_MAX_CHARS) == "x" * TITLE_MAX_CHARS


def test_server_frames_round_trip() -> None:
    for f in (Ack(id="1", status="accepted", conversation_id="c", last_seq=3, after_seq=1), Pong(id="2"),
              ErrorFrame(code=ErrorCode.RATE_LIMITED, message="slow down", id="3")):
        assert decode_server_frame(encode_frame(f)) == f
    with pytest.raises(msgspec.ValidationError):
        decode_server_frame(b'{"type":"nope"}')
