"""Every event a client sees stays byte-compatible with the wire format (docs/wire-protocol.md#8-event-reference).

`fixtures/event_bytes.jsonl` holds the `data` bytes of every event of eleven conversations, as the
gateway sent them before events were typed (captured from that code, with `duration_ms` set to 0).
The same conversations played now must give the same bytes, event for event, and every stored
payload must decode to its struct and encode back to the same bytes.

Kinds added since (`ADDED`) are additions: they come between the recorded events, whose bytes and
order stay as recorded, and their seqs move the recorded ones up by one each; their own shape is
pinned below.
"""

from __future__ import annotations

import json
import pickle
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
import pytest

from actors.round import interrupted_round
from actors.turn_machine import ROUND_INTERRUPTED
from protocol import events as events_module
from protocol import frames as frames_module
from protocol.events import EVENT_KINDS, AskUser, Event, decode_data, encode_data
from protocol.frames import decode_server_frame, encode_event
from tests.convkit import (
    Harness,
    action,
    answer_round,
    call,
    harness,
    rounds_script,
    script_model,
    text_round,
    thinking,
    tool_round,
)

FIXTURE = Path(__file__).with_name("fixtures") / "event_bytes.jsonl"
DURATION = re.compile(rb'"duration_ms":\d+')
RECORDED = [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines()]

SCENARIOS: dict[str, Callable[[], Awaitable[Harness]]] = {}


def scenario(f: Callable[[], Awaitable[Harness]]) -> Callable[[], Awaitable[Harness]]:
    SCENARIOS[f.__name__] = f
    return f


@scenario
async def weather_then_answer() -> Harness:
    h = harness(rounds_script(tool_round("demo.weather", city="Paris"), answer_round("It rains in Paris, 12 °C.")))
    await h.turn("weather?")
    return h


@scenario
async def illegal_finish_then_tools() -> Harness:
    h = harness(rounds_script(answer_round("Too early."), tool_round("demo.clock"),
                              text_round(thinking("two"), action(call("demo.weather", city="Paris")), action(call("demo.render", source="x", format="pdf"))),
                              text_round(thinking("bad"), action('{"action": "complete", "final_answer": "x", "extra": 1}')),
                              answer_round("Done.")))
    await h.turn("go")
    return h


@scenario
async def allow_no_tool() -> Harness:
    h = harness(rounds_script(answer_round("Hello!")), finish_policy="allow_no_tool")
    await h.turn("hi")
    return h


@scenario
async def failing_tool_and_ui_command() -> Harness:
    h = harness(rounds_script(tool_round("demo.fail", message="boom"), tool_round("demo.open_tab", name="docs"),
                              text_round(thinking("code"), action(call("demo.eval")), "<channel:code>1+2</channel:code>"),
                              answer_round("Opened.")))
    await h.turn("go")
    return h


@scenario
async def ask_user() -> Harness:
    h = harness(rounds_script(tool_round("react.ask_user", question="Which city?", options=["Paris", "Rome"]),
                              answer_round("Paris it is.")))
    h.answer_asks("Paris")
    await h.turn("go")
    return h


@scenario
async def fallback() -> Harness:
    first = script_model(rounds_script({"error": "rate_limit"}, {"error": "bad_request"}, answer_round("Rain.")), name="bytes-first")
    second = script_model(rounds_script({"error": "bad_request"}, tool_round("demo.weather", city="Paris")), name="bytes-second")
    h = harness(model=first, fallbacks=[second])
    await h.turn("go")
    return h


@scenario
async def iteration_limit() -> Harness:
    h = harness(rounds_script(tool_round("demo.clock"), loop=True), max_iterations=2)
    await h.turn("go")
    return h


@scenario
async def salvaged() -> Harness:
    h = harness(rounds_script(tool_round("demo.clock"),
                              text_round(thinking("a"), '<channel:action>{"action": "complete", "final_answer": "Half an answer", "oops": ]</channel:action>')))
    await h.turn("go")
    return h


@scenario
async def protocol_violation() -> Harness:
    h = harness(rounds_script({"text": "Hello there, no channels."}, loop=True), max_protocol_retries=1)
    await h.turn("go")
    return h


@scenario
async def steered() -> Harness:
    slow = {"deltas": ["<channel:thinking>Look", "ing up ", "the weather ", "in every city ", "of the world",
               "</channel:thinking>", action(call("demo.search", query="weather"))], "delay_ms": 200}
    h = harness(rounds_script(slow, tool_round("demo.clock"), answer_round("Paris only.")))
    h.when("thinking.delta", lambda e: h.conv.steer("just Paris"))
    await h.turn("go")
    return h


@scenario
async def exploration_budget() -> Harness:
    h = harness(rounds_script(tool_round("demo.search", query="a"), tool_round("demo.search", query="b"),
                              tool_round("demo.clock"),
                              tool_round("react.ask_user", question="[[EXPLORATION_BUDGET]] more?", options=["Continue exploring", "Stop for now"]),
                              tool_round("demo.search", query="c"), answer_round("ok")), exploration_soft_cap=1)
    h.answer_asks("Stop for now")
    await h.turn("go")
    return h


def recorded(name: str) -> list[tuple[int, str, str]]:
    return [(r["seq"], r["event"], r["data"]) for r in RECORDED if r["scenario"] == name]


def test_the_fixture_covers_every_event_kind() -> None:
    kinds = {r["event"] for r in RECORDED}
    assert kinds == set(EVENT_KINDS) - ADDED
    traces = {json.loads(r["data"])["kind"] for r in RECORDED if r["event"] == "trace"}
    assert traces == {"illegal_finish", "no_tool_finish", "iteration_limit", "salvaged"}


# Kinds added after the fixture was captured: the user's own words (docs/wire-protocol.md#usermessage).
ADDED = frozenset({"user.message"})


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_events_are_byte_identical_to_the_recorded_wire_format(name: str) -> None:
    h = await SCENARIOS[name]()
    assert [e.seq for e in h.events] == list(range(1, len(h.events) + 1))
    now = [(e.event, DURATION.sub(b'"duration_ms":0', encode_data(e.data)).decode())
           for e in h.events if e.event not in ADDED]
    assert now == [(event, data) for _, event, data in recorded(name)]
    # Each turn is preceded by the message that started it: the user's words, then turn.started.
    for i, e in enumerate(h.events):
        if e.event == "turn.started":
            said = h.events[i - 1]
            assert said.event == "user.message" and said.data.message_id == e.data.user_message_id  # type: ignore[union-attr]


async def test_the_user_message_event_carries_the_words_the_id_and_the_kind() -> None:
    h = await SCENARIOS["weather_then_answer"]()
    said = h.events[0]
    assert (said.seq, said.event) == (1, "user.message")
    assert encode_data(said.data) == b'{"message_id":"m1","text":"weather?"}'   # kind "message" is the default


def test_stored_data_decodes_to_its_struct_and_back_to_the_same_bytes() -> None:
    for r in RECORDED:
        data = decode_data(r["event"], r["data"])
        assert not isinstance(data, dict) and r["event"] == type(data).KIND, r
        assert encode_data(data).decode() == r["data"]


def test_an_event_frame_decodes_to_the_same_typed_event() -> None:
    r = next(r for r in RECORDED if r["event"] == "round.completed")
    event = Event.of("c_1", r["seq"], decode_data(r["event"], r["data"]), 1796021140.5)  # type: ignore[arg-type]
    frame = encode_event(event)
    assert frame.startswith(b'{"type":"event","conversation_id":"c_1"')
    assert decode_server_frame(frame) == event


def test_an_unknown_kind_is_kept_as_plain_data() -> None:
    frame = b'{"type":"event","conversation_id":"c","seq":1,"event":"future.kind","data":{"x":[1]},"ts":1.0}'
    event = decode_server_frame(frame)
    assert isinstance(event, Event) and event.data == {"x": [1]}
    assert encode_event(event) == frame


def test_a_known_kind_with_a_missing_field_is_refused_naming_it() -> None:
    with pytest.raises(msgspec.ValidationError, match="turn_id"):
        decode_data("turn.started", b'{"user_message_id":"m1"}')


def test_the_round_a_crash_cut_reports_interrupted() -> None:
    data = interrupted_round("t2", 3, ROUND_INTERRUPTED)
    assert json.loads(encode_data(data)) == {
        "turn_id": "t2", "round": 3,
        "streamed_state": {"answer_streamed": False, "answer_text": "", "lanes": []},
        "accepted": [], "denied": [],
        "notices": [{"code": "round_interrupted", "message": ROUND_INTERRUPTED.message}],
        "interrupted": True,
    }


def _structs(module: object) -> list[type[msgspec.Struct]]:
    found = [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, msgspec.Struct)]
    return [cls for cls in found if cls.__struct_config__.omit_defaults]


@pytest.mark.parametrize("cls", [*_structs(events_module), *_structs(frames_module)], ids=lambda c: c.__name__)
def test_no_omitted_default_changes_identity_through_pickle(cls: type[msgspec.Struct]) -> None:
    """msgspec's omit_defaults drops a value only when it *is* the default object. An event crosses
    Ray pickled; a default that comes back as an equal but other object (a non-empty str, a float, a
    large int) would be sent on the live path and omitted on replay, so the same event would have two
    byte forms. Every omitted default must survive pickling as itself (None, bools, small ints, '')."""
    for field in msgspec.structs.fields(cls):
        default = field.default
        if default is msgspec.NODEFAULT:
            continue
        assert pickle.loads(pickle.dumps(default)) is default, (
            f"{cls.__name__}.{field.name} = {default!r}: an unpickled copy is another object")


def test_a_question_pickled_as_ray_carries_it_encodes_as_stored() -> None:
    asked = Event.of("c", 7, ts=1.0, data=AskUser(
        turn_id="t1", ask_id="t1.1.0", question="Which city?", options=["Paris", "Oslo"], timeout_s=300))
    live = encode_event(pickle.loads(pickle.dumps(asked)))  # as a Ray gateway gets it from a host
    assert live == encode_event(asked)
    assert b'"kind"' not in live  # docs/wire-protocol.md#ask_user: omitted for the model's question
