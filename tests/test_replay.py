"""Policy replay (docs/design.md#replay): conversations recorded through the local stack (the
production `LocalBackend` over a SQLite store, the scripted model through LiteLLM), then replayed
under their own profile (nothing differs) and under changed ones (the diff names what changed)."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sqlite3
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from actors.catalog import Safety
from actors.conversation import Runtime
from actors.hosting.backend import Answer, Steer, UserMessage
from actors.hosting.local import LocalBackend
from actors.identity import Owner
from actors.llm.scripts import parse_script, register_script
from actors.llm.stream import stream_model
from actors.native import is_native, replayed
from actors.profile import AgentProfile, load_profile
from actors.replay import Governance, ReplayReport, TurnEnd, replay
from actors.store import RoundOutput, store_from_url
from actors.tools.demo import demo_registry, demo_tools, fixed_clock
from actors.tools.durable import DurableTools
from actors.tools.executor import LocalToolExecutor
from actors.tools.registry import ToolRegistry
from actors.turn_machine import GIVE_UP_MESSAGES
from gateway import replay_command
from gateway.cli import parser as cli_parser
from protocol.events import EndReason, Event, encode_data
from tests.roundkit import action, call, complete, text_round, thinking

OWNER = Owner(tenant="acme", sub="alice")
TIMEOUT = 30.0
_names = itertools.count(1)

PROFILE_A = """
name = "notes"
model = "scripted/unused"
states = ["default", "focused"]

[policies]
exploration_soft_cap = 2

[[tools]]
id = "demo.weather"
[[tools]]
id = "demo.write_note"
states = ["focused"]
[[tools]]
id = "demo.focus_project"
[[tools]]
id = "demo.clock"
[[tools]]
id = "react.ask_user"
"""
# B: A without demo.write_note.
PROFILE_B = PROFILE_A.replace('[[tools]]\nid = "demo.write_note"\nstates = ["focused"]\n', "")
# A, allowing a finish with no observation.
PROFILE_A_NO_TOOL = PROFILE_A.replace("exploration_soft_cap = 2", 'exploration_soft_cap = 2\nfinish_policy = "allow_no_tool"')


def step(tool_id: str, say: str = "Working.", **params: Any) -> dict[str, Any]:
    return text_round(thinking(say), action(call(tool_id, **params)))


def answer(text: str, say: str = "Answering.") -> dict[str, Any]:
    return text_round(thinking(say), action(complete(text)))


# A note needs the focused state: refused (tool_unavailable) before the project is in focus.
NOTE_TURN = [
    step("demo.write_note", text="milk"),
    step("demo.focus_project", name="groceries"),
    step("demo.write_note", text="milk"),
    answer("Noted: milk."),
]
# In ask mode, once in focus: the write is refused (ASK_MODE_DENIED), the weather is not.
ASK_TURN = [
    step("demo.focus_project", name="groceries"),
    step("demo.write_note", text="milk"),
    step("demo.weather", city="Paris"),
    answer("It rains in Paris; I could not write the note in ask mode."),
]


# -- recording through the local stack ----------------------------------------------------------


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


@dataclass
class Recording:
    url: str
    conversation_id: str

    async def load(self) -> tuple[list[Event], list[RoundOutput]]:
        store = store_from_url(self.url)
        await store.open()
        try:
            return await store.read_events(self.conversation_id, 0, limit=100_000), await store.round_outputs(
                self.conversation_id)
        finally:
            await store.close()

    async def replay(self, governance: Governance) -> ReplayReport:
        events, outputs = await self.load()
        return replay(self.conversation_id, events, outputs, governance)


def profile(text: str, tmp_path: Path, name: str = "a.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def governance(text: str, registry: ToolRegistry | None = None) -> Governance:
    registry = registry or demo_registry()
    return Governance.of(load_profile(text, known_tools=registry), registry)


def local_backend(path: Path | str, agent: AgentProfile) -> LocalBackend:
    """The production local backend over the SQLite file at `path` (or the store a URL names)."""
    registry = demo_registry()
    store = store_from_url(path if isinstance(path, str) else sqlite_url(path))
    runtime = Runtime(
        registry=registry, tools=DurableTools(LocalToolExecutor(registry, clock=fixed_clock()), store),
        stream_model=stream_model, count_tokens=lambda messages: 0,
    )
    return LocalBackend(store, runtime, {agent.name: agent}, default_agent=agent.name)


def scripted(profile_text: str, rounds: Sequence[Mapping[str, Any]]) -> AgentProfile:
    """The profile, playing `rounds` (one per model call, across turns)."""
    name = f"replay-{next(_names)}"
    register_script(name, parse_script({"rounds": list(rounds)}))
    return load_profile(profile_text, known_tools=demo_registry()).with_script(name)


async def record(
    path: Path | str, rounds: Sequence[Mapping[str, Any]], *messages: str, mode: str = "agent",
    conversation_id: str | None = None,
) -> Recording:
    """Under profile A, each message a turn played to its end, on a fresh local backend over the
    store at `path`."""
    backend = local_backend(path, scripted(PROFILE_A, rounds))
    await backend.start()
    try:
        opened = await backend.open(OWNER, conversation_id, None, mode)
        cid = opened.conversation_id
        for text in messages:
            await backend.command(OWNER, cid, UserMessage(id=f"m-{next(_names)}", text=text))
            await asyncio.wait_for(backend.host.idle(cid), TIMEOUT)
    finally:
        await backend.stop()
    return Recording(path if isinstance(path, str) else sqlite_url(path), cid)


def turn_ends(events: Sequence[Event]) -> list[tuple[str, str]]:
    return [(e.data.reason, e.data.final_answer) for e in events if e.event == "turn.completed"]  # type: ignore[union-attr]


# -- what is stored ------------------------------------------------------------------------------


async def test_each_round_stores_what_the_model_wrote_before_any_gate(tmp_path: Path) -> None:
    rec = await record(tmp_path / "s.db", ASK_TURN, "note milk, and the weather?", mode="ask")
    events, outputs = await rec.load()
    completed = [(e.data.turn_id, e.data.round) for e in events if e.event == "round.completed"]  # type: ignore[union-attr]
    assert [(o.turn_id, o.round) for o in outputs] == completed == [("t1", 1), ("t1", 2), ("t1", 3), ("t1", 4)]
    assert [o.raw for o in outputs] == [r["text"] for r in ASK_TURN]   # the denied write included
    assert b"milk" in outputs[1].raw.encode() and b"milk" not in b"".join(encode_data(e.data) for e in events if e.event != "user.message")
    ((model,),) = {o.models for o in outputs}
    assert model.startswith("scripted/replay-")
    assert [(o.mode, o.agent_state, o.phase) for o in outputs] == [
        ("ask", "default", "decision"), ("ask", "focused", "decision"),
        ("ask", "focused", "decision"), ("ask", "focused", "decision"),
    ]


async def test_a_length_cut_round_stores_the_call_and_its_continuation_as_one_output(tmp_path: Path) -> None:
    full = answer("It rains in Paris, 12 °C. Take an umbrella.")["text"]
    head, tail = full[: full.index("umbrella")], full[full.index("umbrella"):]
    rec = await record(tmp_path / "s.db", [
        step("demo.weather", city="Paris"),
        {"text": head, "finish_reason": "length", "chunk_chars": 5},
        {"text": tail},
    ], "weather?")
    events, outputs = await rec.load()
    assert [o.raw for o in outputs] == [step("demo.weather", city="Paris")["text"], full]
    assert turn_ends(events) == [("complete", "It rains in Paris, 12 °C. Take an umbrella.")]


# -- replay under the recording's own profile: nothing differs ------------------------------------

FIDELITY_TURNS = {
    # tool_unavailable, a state transition, a write, a legal finish
    "notes": NOTE_TURN,
    # a preamble cut, an illegal finish, an answer beside an exploration (its lane denied), a finish
    "gates": [
        {"text": "Sure! " + answer("Hi.")["text"]},
        answer("Hi."),
        text_round(thinking("Both."), action(call("demo.weather", city="Paris")), action(complete("Rain."))),
        answer("Rain in Paris."),
    ],
    # a length cut continued: one round, two model calls
    "length": [
        step("demo.weather", city="Paris"),
        {"text": answer("Rain in Paris, take an umbrella.")["text"][:60], "finish_reason": "length"},
        {"text": answer("Rain in Paris, take an umbrella.")["text"][60:]},
    ],
    # an answer that streamed, then a broken tail: salvaged
    "salvage": [
        step("demo.weather", city="Paris"),
        {"text": thinking("Answering.") + '<channel:action>{"action": "complete", "final_answer": "Rain.", }'
                                          "</channel:action>"},
    ],
    # the exploration budget (cap 2): the third call is refused by the pool, the next tool denied
    "budget": [
        text_round(thinking("Two."), action(call("demo.weather", city="Paris")), action(call("demo.weather", city="Paris"))),
        step("demo.weather", city="Paris"),
        step("demo.clock"),
        answer("Rain, three times."),
    ],
}


async def test_replayed_under_its_own_profile_a_conversation_differs_in_nothing(tmp_path: Path) -> None:
    rounds = [r for turn in FIDELITY_TURNS.values() for r in turn]
    rec = await record(tmp_path / "s.db", rounds, *FIDELITY_TURNS)
    events, _ = await rec.load()
    assert [reason for reason, _ in turn_ends(events)] == ["complete", "complete", "complete", "salvaged", "complete"]

    report = await rec.replay(governance(PROFILE_A))

    assert [t.skipped for t in report.turns] == [""] * 5
    assert [(r.round, r.differs, r.notes) for t in report.turns for r in t.rounds if r.differs or r.notes] == []
    assert [t.end_differs for t in report.turns] == [()] * 5
    assert not report.differs
    budget = report.turns[4].rounds
    assert budget[1].replayed.observed == ("demo.weather t5.2.0 error EXPLORATION_BUDGET_REACHED",)
    assert budget[2].replayed.notices == ("exploration_budget.confirmation_required demo.clock",)


async def test_a_turn_the_provider_ended_replays_to_the_same_provider_error(tmp_path: Path) -> None:
    rec = await record(tmp_path / "s.db", [{"error": "auth"}] * 4, "weather?")
    events, _ = await rec.load()
    assert [reason for reason, _ in turn_ends(events)] == ["provider_error"]

    report = await rec.replay(governance(PROFILE_A))
    (turn,) = report.turns
    assert turn.replayed_end == turn.recorded_end and turn.recorded_end.reason == "provider_error"
    assert not report.differs

    (turn,) = (await rec.replay(governance(PROFILE_A.replace("exploration_soft_cap = 2",
                                                             "exploration_soft_cap = 2\nmax_protocol_retries = 1")))).turns
    assert turn.replayed_end == TurnEnd(reason="provider_error", final_answer=GIVE_UP_MESSAGES[EndReason.PROVIDER_ERROR],
                                        finish_ok=False)                # fewer retries: the same cause, sooner
    assert [r.replayed.status for r in turn.rounds][2:] == ["not_reached"] * 2


async def wait_for_event(backend: LocalBackend, cid: str, name: str) -> asyncio.Event:
    """An asyncio.Event set by the first published `name` event of the conversation."""
    seen = asyncio.Event()
    backend.host.listen(cid, lambda batch: [seen.set() for e in batch if e.event == name])
    return seen


async def test_a_steered_round_and_its_finalize_round_replay_as_recorded(tmp_path: Path) -> None:
    slow = {"text": step("demo.weather", say="Checking the forecast for you. " * 10, city="Paris")["text"],
            "chunk_chars": 4, "delay_ms": 10}
    backend = local_backend(tmp_path / "s.db", scripted(PROFILE_A, [slow, answer("Stopping here.")]))
    await backend.start()
    try:
        cid = (await backend.open(OWNER, None, None, None)).conversation_id
        thinking_seen = await wait_for_event(backend, cid, "thinking.delta")
        await backend.command(OWNER, cid, UserMessage(id="m1", text="weather?"))
        await asyncio.wait_for(thinking_seen.wait(), TIMEOUT)
        await backend.command(OWNER, cid, Steer(id="s1", text="never mind, just answer"))
        await asyncio.wait_for(backend.host.idle(cid), TIMEOUT)
    finally:
        await backend.stop()
    rec = Recording(sqlite_url(tmp_path / "s.db"), cid)
    events, outputs = await rec.load()
    assert turn_ends(events) == [("complete", "Stopping here.")]
    assert [(o.round, o.phase) for o in outputs] == [(1, "decision"), (2, "finalize")]
    assert 0 < len(outputs[0].raw) < len(slow["text"])       # what the model wrote until the steer

    report = await rec.replay(governance(PROFILE_A))

    assert [r.replayed.status for r in report.turns[0].rounds] == ["steered", "ran"]
    assert not report.differs


async def test_a_round_continued_after_a_crash_stores_its_rebuilt_text_and_the_continuation(tmp_path: Path) -> None:
    text = "Rain in Paris all day long, twelve degrees, bring an umbrella and a coat. " * 2
    script = {"rounds": [step("demo.weather", city="Paris"), {**answer(text), "chunk_chars": 4, "delay_ms": 10}],
              "continues": True}
    name = f"replay-{next(_names)}"
    register_script(name, parse_script(script))
    agent = load_profile(PROFILE_A, known_tools=demo_registry()).with_script(name)
    backend = local_backend(tmp_path / "s.db", agent)
    await backend.start()
    cid = (await backend.open(OWNER, None, None, None)).conversation_id
    answer_seen = await wait_for_event(backend, cid, "answer.delta")
    await backend.command(OWNER, cid, UserMessage(id="m1", text="weather?"))
    await asyncio.wait_for(answer_seen.wait(), TIMEOUT)
    await backend.stop()                                    # cut mid-answer
    backend = local_backend(tmp_path / "s.db", agent)
    await backend.start()
    try:
        await backend.open(OWNER, cid, None, None)
        await asyncio.wait_for(backend.host.idle(cid), TIMEOUT)
    finally:
        await backend.stop()

    rec = Recording(sqlite_url(tmp_path / "s.db"), cid)
    events, outputs = await rec.load()
    assert turn_ends(events) == [("complete", text)]
    assert [o.round for o in outputs] == [1, 2]
    assert json.dumps(text, ensure_ascii=False)[1:-1] in outputs[1].raw   # rebuilt from the log, then continued
    assert not (await rec.replay(governance(PROFILE_A))).differs


async def test_the_models_of_a_round_are_those_whose_deltas_it_holds(tmp_path: Path) -> None:
    first, second = f"replay-{next(_names)}", f"replay-{next(_names)}"
    register_script(first, parse_script({"rounds": [{"error": "unavailable"}, {"error": "unavailable"}, answer("Rain.")]}))
    register_script(second, parse_script({"rounds": [{"error": "bad_request"}, step("demo.weather", city="Paris")]}))
    text = PROFILE_A.replace('model = "scripted/unused"', f'model = "scripted/{first}"\nfallbacks = ["scripted/{second}"]')
    backend = local_backend(tmp_path / "s.db", load_profile(text, known_tools=demo_registry()))
    await backend.start()
    try:
        cid = (await backend.open(OWNER, None, None, None)).conversation_id
        await backend.command(OWNER, cid, UserMessage(id="m1", text="weather?"))
        await asyncio.wait_for(backend.host.idle(cid), TIMEOUT)
    finally:
        await backend.stop()

    events, outputs = await Recording(sqlite_url(tmp_path / "s.db"), cid).load()
    assert [e.event for e in events].count("fallback") == 1
    assert [o.models for o in outputs] == [(f"scripted/{second}",), (f"scripted/{first}",)]


# -- replay under changed profiles ---------------------------------------------------------------------


async def test_a_tool_absent_from_the_other_profile_is_a_denied_call_and_a_changed_notice(tmp_path: Path) -> None:
    rec = await record(tmp_path / "s.db", NOTE_TURN, "note milk")

    report = await rec.replay(governance(PROFILE_B))

    assert report.differs
    (turn,) = report.turns
    first, _, third, fourth = turn.rounds
    # round 1: refused in both, for another reason
    assert first.differs == ("notices", "denied")
    assert first.recorded.notices == ("tool_unavailable demo.write_note",)
    assert first.replayed.notices == ("protocol_violation.tool_call_invalid demo.write_note",)
    # round 3: the write ran; under B it is denied and observes nothing
    assert third.differs == ("lanes", "notices", "accepted", "denied", "calls", "observed")
    assert (third.recorded.accepted, third.replayed.accepted) == (("0 call_tool demo.write_note",), ())
    assert third.replayed.denied == ("0 demo.write_note protocol_violation.tool_call_invalid",)
    assert (third.recorded.observed, third.replayed.observed) == (("demo.write_note t1.3.0 ok",), ())
    # the focus observed in round 2 keeps the finish legal: same answer
    assert fourth.differs == () and turn.end_differs == ()


async def test_the_mode_each_round_ran_in_is_the_recordings(tmp_path: Path) -> None:
    rec = await record(tmp_path / "s.db", ASK_TURN, "note milk, and the weather?", mode="ask")

    same = await rec.replay(governance(PROFILE_A))            # ask mode, as recorded: the write still refused
    other = await rec.replay(governance(PROFILE_B))

    assert not same.differs
    assert same.turns[0].rounds[1].replayed.notices == ("ASK_MODE_DENIED demo.write_note",)
    assert other.turns[0].rounds[1].replayed.notices == ("protocol_violation.tool_call_invalid demo.write_note",)
    assert [r.round for r in other.turns[0].rounds if r.differs] == [2]


async def test_a_tool_now_declared_write_is_denied_in_ask_mode(tmp_path: Path) -> None:
    # A profile cannot change a tool's safety; its registry can (a tool of one's own, redefined).
    rec = await record(tmp_path / "s.db", ASK_TURN, "note milk, and the weather?", mode="ask")
    writes = ToolRegistry(replace(t, safety=Safety.WRITE) if t.tool_id == "demo.weather" else t for t in demo_tools())

    report = await rec.replay(governance(PROFILE_A, writes))

    weather = report.turns[0].rounds[2]
    assert weather.differs == ("lanes", "notices", "accepted", "denied", "calls", "observed")
    assert weather.replayed.denied == ("0 demo.weather ASK_MODE_DENIED",)
    assert weather.replayed.notices == ("ASK_MODE_DENIED demo.weather",)


async def test_a_finish_the_other_profile_allows_ends_the_turn_before_the_later_rounds(tmp_path: Path) -> None:
    rec = await record(tmp_path / "s.db", [answer("Hi."), step("demo.clock"), answer("Hi, at last.")], "hi")

    report = await rec.replay(governance(PROFILE_A_NO_TOOL))

    (turn,) = report.turns
    assert [(r.recorded.finish, r.replayed.finish) for r in turn.rounds[:1]] == [("denied finish.illegal", "allowed")]
    assert [(r.round, r.replayed.status) for r in turn.rounds] == [(1, "ran"), (2, "not_reached"), (3, "not_reached")]
    assert turn.end_differs == ("final_answer",)
    assert (turn.replayed_end.reason, turn.replayed_end.final_answer) == ("complete", "Hi.")  # type: ignore[union-attr]


async def test_a_turn_the_other_profile_would_not_finish_ends_undetermined(tmp_path: Path) -> None:
    rec = await record(tmp_path / "s.db", [step("demo.weather", city="Paris"), answer("Rain.")], "weather?")
    no_weather = PROFILE_A.replace('[[tools]]\nid = "demo.weather"\n', "")

    report = await rec.replay(governance(no_weather))

    (turn,) = report.turns
    assert turn.rounds[1].replayed.finish == "denied finish.illegal"     # nothing was observed under it
    assert turn.replayed_end == TurnEnd(reason="undetermined")           # the model would be asked again
    assert turn.end_differs == ("reason", "final_answer", "finish_ok")


async def test_a_profile_that_refuses_every_call_runs_out_of_retries(tmp_path: Path) -> None:
    rec = await record(tmp_path / "s.db", NOTE_TURN, "note milk")
    strict = PROFILE_B.replace('[[tools]]\nid = "demo.focus_project"\n', "")

    report = await rec.replay(governance(strict))

    (turn,) = report.turns
    assert [r.replayed.denied for r in turn.rounds] == [
        ("0 demo.write_note protocol_violation.tool_call_invalid",),
        ("0 demo.focus_project protocol_violation.tool_call_invalid",),
        ("0 demo.write_note protocol_violation.tool_call_invalid",),
        ("0 finish.illegal",),                                          # four retries: one too many
    ]
    assert turn.replayed_end == TurnEnd(reason="protocol_violation", final_answer=GIVE_UP_MESSAGES[
        EndReason.PROTOCOL_VIOLATION], finish_ok=False)


async def test_a_call_the_recording_never_ran_observes_unknown(tmp_path: Path) -> None:
    rec = await record(tmp_path / "s.db", FIDELITY_TURNS["budget"], "rain")
    roomier = PROFILE_A.replace("exploration_soft_cap = 2", "exploration_soft_cap = 5")

    report = await rec.replay(governance(roomier))

    second = report.turns[0].rounds[1]
    assert second.differs == ("observed",)
    assert second.replayed.observed == ("demo.weather t1.2.0 unknown",)
    assert "no recorded observation" in second.notes[0]
    assert report.turns[0].rounds[2].replayed.notices == ()           # no budget question owed


# -- databases from before round outputs ----------------------------------------------------------


def drop_round_outputs(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE round_outputs")


async def test_a_conversation_recorded_before_round_outputs_loads_resumes_and_replays_its_new_turns(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    rounds = [*NOTE_TURN, step("demo.clock"), answer("It is 2026.")]
    rec = await record(path, rounds, "note milk")
    drop_round_outputs(path)                       # the database as a version without the table left it

    rec = await record(path, rounds, "what time is it?", conversation_id=rec.conversation_id)

    events, outputs = await rec.load()
    assert turn_ends(events) == [("complete", "Noted: milk."), ("complete", "It is 2026.")]
    assert [(o.turn_id, o.round) for o in outputs] == [("t2", 1), ("t2", 2)]
    report = await rec.replay(governance(PROFILE_A))
    assert [t.skipped for t in report.turns] == [
        "round 1 has no stored raw output (recorded before round outputs were stored)", ""]
    assert not report.differs


async def test_a_turn_cut_mid_round_in_an_old_database_resumes_after_the_upgrade(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    slow = {"text": step("demo.weather", say="Checking the forecast. " * 10, city="Paris")["text"],
            "chunk_chars": 4, "delay_ms": 10}
    rounds = [slow, step("demo.weather", city="Paris"), answer("Rain.")]
    agent = scripted(PROFILE_A, rounds)
    backend = local_backend(path, agent)
    await backend.start()
    opened = await backend.open(OWNER, None, None, None)
    cid = opened.conversation_id
    thinking_seen = await wait_for_event(backend, cid, "thinking.delta")
    await backend.command(OWNER, cid, UserMessage(id="m1", text="weather?"))
    await asyncio.wait_for(thinking_seen.wait(), TIMEOUT)   # round 1 is streaming its thinking
    await backend.stop()                                    # the host goes away mid-round
    drop_round_outputs(path)

    backend = local_backend(path, agent)
    await backend.start()
    try:
        await backend.open(OWNER, cid, None, None)   # re-activation resumes the cut turn
        await asyncio.wait_for(backend.host.idle(cid), TIMEOUT)
    finally:
        await backend.stop()

    rec = Recording(sqlite_url(path), cid)
    events, outputs = await rec.load()
    assert turn_ends(events) == [("complete", "Rain.")]
    interrupted = [e.data.round for e in events if e.event == "round.completed" and e.data.interrupted]  # type: ignore[union-attr]
    assert interrupted == [1]
    assert [o.round for o in outputs] == [2, 3]
    assert not (await rec.replay(governance(PROFILE_A))).differs


# -- the command -------------------------------------------------------------------------------------


def command(*argv: str) -> argparse.Namespace:
    return cli_parser().parse_args(["replay", *argv])


@pytest.fixture
def note_recording(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Recording:
    monkeypatch.setenv("COLUMNS", "160")           # table cells on one line each, for the assertions
    return asyncio.run(record(tmp_path / "s.db", NOTE_TURN, "note milk"))


def test_the_command_exits_0_when_the_profile_changes_nothing(
    note_recording: Recording, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = replay_command.run(command("--store", note_recording.url, "--conversation", note_recording.conversation_id,
                                      "--agent", str(profile(PROFILE_A, tmp_path))))
    out = capsys.readouterr().out
    assert code == 0, out
    assert "turn t1: no differences (4 rounds, ended complete)" in out
    assert out.rstrip().endswith("no differences")


def test_the_command_exits_3_and_names_the_denied_call_and_the_changed_notice(
    note_recording: Recording, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = replay_command.run(command("--store", note_recording.url, "--conversation", note_recording.conversation_id,
                                      "--agent", str(profile(PROFILE_B, tmp_path, "b.toml"))))
    out = capsys.readouterr().out
    assert code == 3, out
    assert "turn t1: round 3" in out and "under b.toml" in out
    assert "0 demo.write_note protocol_violation.tool_call_invalid" in out   # the denied call
    assert "protocol_violation.tool_call_invalid demo.write_note" in out     # the notice it now gets
    assert "tool_unavailable demo.write_note" in out                         # round 1's notice, changed
    assert out.rstrip().endswith("1 of 1 turns differ")


def test_the_command_prints_json_for_machines(
    note_recording: Recording, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = replay_command.run(command("--store", note_recording.url, "--conversation", note_recording.conversation_id,
                                      "--agent", str(profile(PROFILE_B, tmp_path, "b.toml")), "--json"))
    document = json.loads(capsys.readouterr().out)
    assert code == 3
    assert (document["differs"], document["agent"], document["recorded_agent"]) == (True, "notes", "notes")
    (turn,) = document["turns"]
    assert turn["differs"] is True
    third = turn["rounds"][2]
    assert third["round"] == 3 and "denied" in third["differs"]
    assert third["replayed"]["denied"] == ["0 demo.write_note protocol_violation.tool_call_invalid"]


@pytest.mark.parametrize(("case", "message"), [
    ("unknown conversation", "no conversation 'nope'"),
    ("bad profile", "bad.toml: policies.max_iterations"),
    ("missing store", "no SQLite store at"),
    ("bad store url", "unknown store URL"),
])
def test_the_command_exits_2_on_bad_input_naming_the_problem(
    note_recording: Recording, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, message: str
) -> None:
    store, conversation, agent = note_recording.url, note_recording.conversation_id, str(profile(PROFILE_A, tmp_path))
    if case == "unknown conversation":
        conversation = "nope"
    elif case == "bad profile":
        agent = str(profile(PROFILE_A.replace("exploration_soft_cap = 2", "max_iterations = 0"), tmp_path, "bad.toml"))
    elif case == "missing store":
        store = f"sqlite:///{tmp_path / 'absent.db'}"
    else:
        store = "redis://localhost"
    code = replay_command.run(command("--store", store, "--conversation", conversation, "--agent", agent))
    captured = capsys.readouterr()
    assert code == 2
    assert message in captured.err
    assert not (tmp_path / "absent.db").exists()


@pytest.mark.postgres
def test_the_command_reads_a_postgresql_store_too(
    postgres_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    schema = f"test_replay_{uuid.uuid4().hex[:12]}"
    url = f"{postgres_dsn}?schema={schema}"
    try:
        rec = asyncio.run(record(url, NOTE_TURN, "note milk"))
        same = replay_command.run(command("--store", url, "--conversation", rec.conversation_id,
                                          "--agent", str(profile(PROFILE_A, tmp_path))))
        other = replay_command.run(command("--store", url, "--conversation", rec.conversation_id,
                                           "--agent", str(profile(PROFILE_B, tmp_path, "b.toml"))))
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    out = capsys.readouterr().out
    assert (same, other) == (0, 3), out
    assert "0 demo.write_note protocol_violation.tool_call_invalid" in out


def test_a_store_password_is_never_printed() -> None:
    assert replay_command.redacted("postgresql://app:s3cret@db:5432/x") == "postgresql://app:***@db:5432/x"
    assert replay_command.redacted("sqlite:///data/x.db") == "sqlite:///data/x.db"


# -- execute confirmation (docs/design.md#execute-confirmation) ---------------------------------------

PROFILE_CONFIRM = "confirm_writes = true\n" + PROFILE_A
APPROVE_TURN = [step("demo.focus_project", name="groceries"), step("demo.write_note", text="milk"), answer("Noted.")]


async def record_answering(path: Path, rounds: Sequence[Mapping[str, Any]], profile_text: str, consent: str) -> Recording:
    """Under `profile_text`, one turn played to its end, each approval it asks answered `consent`."""
    backend = local_backend(path, scripted(profile_text, rounds))
    await backend.start()
    try:
        cid = (await backend.open(OWNER, None, None, None)).conversation_id

        def answer_approvals(batch: Sequence[Event]) -> None:
            for e in batch:
                if e.event == "ask_user" and e.data.kind == "approval":  # type: ignore[union-attr]
                    asyncio.get_running_loop().create_task(backend.command(
                        OWNER, cid, Answer(id=f"a-{next(_names)}", ask_id=e.data.ask_id, answer=consent)))  # type: ignore[union-attr]

        backend.host.listen(cid, answer_approvals)
        await backend.command(OWNER, cid, UserMessage(id=f"m-{next(_names)}", text="note milk"))
        await asyncio.wait_for(backend.host.idle(cid), TIMEOUT)
    finally:
        await backend.stop()
    return Recording(sqlite_url(path), cid)


async def test_approvals_replay_as_recorded_under_their_own_profile(tmp_path: Path) -> None:
    rec = await record_answering(tmp_path / "s.db", APPROVE_TURN, PROFILE_CONFIRM, "Approve")
    report = await rec.replay(governance(PROFILE_CONFIRM))
    assert not report.differs
    [note_round] = [r for r in report.turns[0].rounds if r.recorded.approvals]
    assert note_round.recorded.approvals == note_round.replayed.approvals == ("demo.write_note t1.2.0 approved",)


async def test_a_profile_without_confirmation_would_run_what_the_user_denied(tmp_path: Path) -> None:
    rec = await record_answering(tmp_path / "s.db", APPROVE_TURN, PROFILE_CONFIRM, "Deny")
    report = await rec.replay(governance(PROFILE_A))
    [note_round] = [r for r in report.turns[0].rounds if r.recorded.approvals]
    assert note_round.recorded.approvals == ("demo.write_note t1.2.0 denied",)
    assert note_round.recorded.observed == ("demo.write_note t1.2.0 error denied_by_user",)
    assert note_round.replayed.approvals == () and note_round.replayed.observed == ("demo.write_note t1.2.0 unknown",)
    assert set(note_round.differs) == {"observed", "approvals"}


async def test_a_profile_that_asks_where_the_recording_did_not_cannot_know_the_answer(tmp_path: Path) -> None:
    rec = await record(tmp_path / "s.db", APPROVE_TURN, "note milk")
    report = await rec.replay(governance(PROFILE_CONFIRM))
    [note_round] = [r for r in report.turns[0].rounds if r.replayed.approvals]
    assert note_round.replayed.approvals == ("demo.write_note t1.2.0 unknown",)
    assert any("approval" in n for n in note_round.notes)


# -- native rounds (docs/design.md#native): recorded as their deltas, replayed as such ------------------------

NATIVE_A = 'decision = "native"\n' + PROFILE_A
NATIVE_B = 'decision = "native"\n' + PROFILE_B


def native_step(function: str, say: str = "", **params: Any) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"text": say}] if say else []
    return {"native": [*parts, {"call": {"name": function, "arguments": params}}]}


NATIVE_NOTE_TURN = [
    native_step("demo_focus_project", say="Let me focus.", name="groceries"),
    native_step("demo_write_note", text="milk"),
    {"native": [{"text": "Noted: milk."}]},
]


async def record_native(path: Path, rounds: Sequence[Mapping[str, Any]]) -> Recording:
    backend = local_backend(path, scripted(NATIVE_A, rounds))
    await backend.start()
    try:
        cid = (await backend.open(OWNER, None, None, None)).conversation_id
        await backend.command(OWNER, cid, UserMessage(id=f"m-{next(_names)}", text="note milk"))
        await asyncio.wait_for(backend.host.idle(cid), TIMEOUT)
    finally:
        await backend.stop()
    return Recording(sqlite_url(path), cid)


async def test_a_native_round_is_stored_as_its_deltas_and_replays_as_recorded(tmp_path: Path) -> None:
    rec = await record_native(tmp_path / "s.db", NATIVE_NOTE_TURN)
    _, outputs = await rec.load()
    assert all(is_native(o.raw) for o in outputs)
    deltas = [type(d).__name__ for d in replayed(outputs[1].raw)]   # the deltas themselves, not flattened text
    assert deltas[0] == "ToolCallStart" and deltas[-1] == "ToolCallEnd" and set(deltas[1:-1]) == {"ToolCallArgs"}

    report = await rec.replay(governance(NATIVE_A))
    assert [t.skipped for t in report.turns] == [""] and not report.differs
    assert report.turns[0].rounds[1].replayed.observed == ("demo.write_note t1.2.0 ok",)


async def test_a_native_call_the_other_profile_lacks_is_denied_on_replay(tmp_path: Path) -> None:
    rec = await record_native(tmp_path / "s.db", NATIVE_NOTE_TURN)
    report = await rec.replay(governance(NATIVE_B))
    second = report.turns[0].rounds[1]
    assert second.recorded.accepted == ("0 call_tool demo.write_note",) and second.replayed.accepted == ()
    # B has no such function: the name the model wrote is refused as it stands
    assert second.replayed.denied == ("0 demo_write_note protocol_violation.tool_call_invalid",)
    assert "calls" in second.differs and "observed" in second.differs
