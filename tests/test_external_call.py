"""The rules of an external client's calls (actors/external_call.py, docs/design.md#mcp-face), on the pure
core: the round's gates with the session's calls in flight, the session's turn machine, the access
mode, the approval's route — and what the MCP face lists of it (gateway/mcp_catalog.py). No server."""

from __future__ import annotations

from typing import Any

from actors.catalog import Catalog, Observation
from actors.conversation import Conversation, ConversationState
from actors.eventlog import EventLog
from actors.external_call import (
    Access,
    ApprovalRoute,
    ExternalCall,
    ExternalRules,
    ExternalSession,
    Observed,
    Refused,
    effective_mode,
)
from actors.gates import Candidate
from actors.recovery import cut_external_calls, recover
from actors.tools.demo import demo_registry
from actors.turn_machine import Consent, PendingCall
from gateway.mcp_catalog import SEARCH_TOOL, catalog_digest, listing, policy_digest, search
from protocol.actions import ActionType
from protocol.events import Event, ExternalClient, ToolCalled, ToolResult
from protocol.frames import Mode
from protocol.notices import NoticeCode
from tests.convkit import Harness, answer_round, harness, rounds_script
from tests.mcpkit import big_profile, face_profile

CLIENT = ExternalClient("mcp", "unit")
PROFILE = face_profile()
CATALOG = PROFILE.catalog_from(demo_registry().catalog())


def rules_of(access: Access = Access.EXECUTE) -> ExternalRules:
    return ExternalRules.of(ExternalSession.new("mcp-1", CLIENT, access), PROFILE.policies, PROFILE.states)


def call(tool_id: str, call_id: str = "k1", **params: Any) -> ExternalCall:
    return ExternalCall(session_id="mcp-1", client=CLIENT, access=Access.EXECUTE, call_id=call_id, tool_id=tool_id,
                        params=params)


def admit(session: ExternalRules, c: ExternalCall, *, state: str = "default", mode: Mode = Mode.AGENT,
          in_flight: tuple[Candidate, ...] = ()) -> Any:
    rules = session.rules(CATALOG, state=state, conversation_mode=mode, validate_params=lambda *_: [])
    return session.admit(c, rules, in_flight)


def code_of(verdict: Any) -> NoticeCode:
    assert isinstance(verdict, Refused), verdict
    return verdict.notice.code


def test_a_client_never_raises_the_mode() -> None:
    assert effective_mode(Access.OBSERVE, Mode.AGENT) is Mode.ASK
    assert effective_mode(Access.EXECUTE, Mode.ASK) is Mode.ASK   # the owner put the conversation in ask mode
    assert effective_mode(Access.EXECUTE, Mode.AGENT) is Mode.AGENT


def test_a_write_tool_in_observe_is_ask_mode_denied() -> None:
    assert code_of(admit(rules_of(Access.OBSERVE), call("demo.write_note", text="x"))) is NoticeCode.ASK_MODE_DENIED


def test_an_exploitation_call_waits_for_the_sessions_exploration_in_flight() -> None:
    sleeping = Candidate(0, ActionType.CALL_TOOL, "demo.sleep", CATALOG.get("demo.sleep").trait)  # type: ignore[union-attr]
    render = call("demo.render", source="r", format="pdf")
    assert code_of(admit(rules_of(), render, state="focused", in_flight=(sleeping,))) is NoticeCode.INCOMPATIBLE_TRAITS
    assert not isinstance(admit(rules_of(), render, state="focused"), Refused)


def test_a_tool_of_another_state_is_unavailable() -> None:
    assert code_of(admit(rules_of(), call("demo.render", source="r", format="pdf"))) is NoticeCode.TOOL_UNAVAILABLE


def test_a_uses_code_tool_is_not_offered() -> None:
    assert code_of(admit(rules_of(), call("demo.eval"))) is NoticeCode.TOOL_CALL_INVALID
    assert "demo.eval" not in {d.tool_id for d in rules_of().view(PROFILE, CATALOG, state="default",
                                                                   conversation_mode=Mode.AGENT).tools}


def test_after_the_budget_is_reached_only_the_well_formed_question_is_admitted() -> None:
    session = rules_of()
    decl = CATALOG.get("demo.weather")
    session.machine.observe("k0", Observation("k0", "demo.weather", ok=False, error="EXPLORATION_BUDGET_REACHED"), decl)
    assert code_of(admit(session, call("demo.clock"))) is NoticeCode.CONFIRMATION_REQUIRED
    assert code_of(admit(session, call("react.ask_user", question="more?"))) is NoticeCode.CONFIRMATION_REQUIRED
    question = call("react.ask_user", question="[[EXPLORATION_BUDGET]] more?",
                    options=["Continue exploring", "Stop for now"])
    assert not isinstance(admit(session, question), Refused)
    session.machine.budget_answer("[[EXPLORATION_BUDGET]] more?", "Stop for now")
    assert code_of(admit(session, call("demo.weather", city="Paris"))) is NoticeCode.TOOL_UNAVAILABLE
    view = session.view(PROFILE, CATALOG, state="default", conversation_mode=Mode.AGENT)
    assert not {"demo.weather", "demo.search", "demo.sleep"} & {d.tool_id for d in view.tools}


def test_a_confirm_call_asks_the_client_when_it_can_else_the_owner() -> None:
    session, decl = rules_of(), CATALOG.get("demo.write_note")
    assert decl is not None and decl.confirm
    note = call("demo.write_note", text="x")
    assert session.approval_route(note, decl) is ApprovalRoute.OWNER
    assert session.approval_route(ExternalCall(**{**_fields(note), "elicit": True}), decl) is ApprovalRoute.ELICIT
    assert session.approval_route(ExternalCall(**{**_fields(note), "consent": "approved"}), decl) is ApprovalRoute.DECIDED
    session.machine.consented("k9", Consent.APPROVED_ALL)       # "Approve all": the rest of the session runs unasked
    assert session.approval_route(call("demo.write_note", call_id="k10", text="y"), decl) is ApprovalRoute.NONE


def test_the_tool_calls_backstop_counts_over_the_session() -> None:
    session, decl = rules_of(), CATALOG.get("demo.clock")
    assert decl is not None
    assert [session.admitted(call("demo.clock", call_id=f"k{i}"), decl, 2) for i in range(3)] == [True, True, False]


def _fields(c: ExternalCall) -> dict[str, Any]:
    return {f: getattr(c, f) for f in c.__struct_fields__}


# -- what the face lists -----------------------------------------------------------------------------------


def test_the_list_is_compact_past_the_catalog_size() -> None:
    big = big_profile()
    view = rules_of().view(big, CATALOG, state="default", conversation_mode=Mode.AGENT)
    assert {t["name"] for t in listing(view).tools} == {"react.ask_user", "demo.clock", SEARCH_TOOL}
    whole = rules_of().view(PROFILE, CATALOG, state="default", conversation_mode=Mode.AGENT)
    assert SEARCH_TOOL not in {t["name"] for t in listing(whole).tools}


def test_search_finds_by_words_and_runs_nothing() -> None:
    view = rules_of().view(PROFILE, CATALOG, state="default", conversation_mode=Mode.AGENT)
    found = search(view, "current weather for a city")
    assert found[0]["id"] == "demo.weather" and found[0]["route"] == "read"
    assert search(view, "zzz") == []


def test_a_state_transition_changes_the_catalog_digest() -> None:
    session = rules_of()
    before = catalog_digest(session.view(PROFILE, CATALOG, state="default", conversation_mode=Mode.AGENT))
    after = catalog_digest(session.view(PROFILE, CATALOG, state="focused", conversation_mode=Mode.AGENT))
    assert before != after


def test_the_policy_digest_follows_the_policy() -> None:
    note = CATALOG.get("demo.write_note")
    assert note is not None
    unconfirmed = Catalog([note]).with_overrides(confirm={"demo.write_note": False}).get("demo.write_note")
    assert unconfirmed is not None and policy_digest(note) != policy_digest(unconfirmed)
    assert policy_digest(note) == policy_digest(CATALOG.get("demo.write_note"))  # type: ignore[arg-type]


# -- recovery: a call a crash cut still gets its one observation ---------------------------------------------


async def test_an_external_call_a_crash_cut_observes_round_interrupted() -> None:
    h = harness(rounds_script(answer_round("unused")))
    session = ExternalSession.new("mcp-1", CLIENT, Access.EXECUTE)
    session.progress.pending.append(PendingCall("mcp-1.7", "demo.sleep", {"seconds": 60}))   # in the snapshot
    h.conv.state.external["mcp-1"] = session
    announced = Event.of(h.conv.conversation_id, 1, ToolCalled(turn_id="mcp-1", round=0, call_id="mcp-1.8",
                                                               tool_id="demo.clock", params={}, trait="neutral",
                                                               client=CLIENT), 0.0)
    # what the host records as the calls' durable results before it recovers (actors/hosting/host.py)
    assert cut_external_calls(h.conv.state, [announced]) == [
        Observation("mcp-1.7", "demo.sleep", ok=False, error="round_interrupted"),
        Observation("mcp-1.8", "demo.clock", ok=False, error="round_interrupted")]
    recover(h.conv, [announced])                                                            # the tail: one more
    await h.idle()
    results = [e.data for e in h.events if isinstance(e.data, ToolResult)]
    assert [(r.call_id, r.error, r.client) for r in results] == [("mcp-1.7", "round_interrupted", CLIENT),
                                                                 ("mcp-1.8", "round_interrupted", CLIENT)]
    assert h.conv.state.external["mcp-1"].progress.pending == []

    # the same call sent again (a retry; a Ray gateway re-routing it after its host died) gets that
    # observation, once durable, and runs nothing: no second tool.call or tool.result
    logged = len(h.events)
    again = await h.conv.external_call(call("demo.sleep", "mcp-1.7", seconds=60))
    assert again == Observed(ok=False, error="round_interrupted")
    await h.idle()
    assert len(h.events) == logged

    # the conversation reaped and activated again from its snapshot, nothing of the first activation
    # in memory: a retry still gets round_interrupted, and nothing runs or is logged
    later, events = reactivated(h)
    for call_id in ("mcp-1.7", "mcp-1.8"):
        assert await later.external_call(call("demo.sleep", call_id, seconds=60)) == Observed(ok=False, error="round_interrupted")
    await later.events.flush()
    assert events == []                        # no tool.call: the sleep never started


async def test_a_call_the_log_says_was_cut_is_not_run_by_a_later_retry() -> None:
    """A crash after recovery logged `round_interrupted` but before its snapshot: the next recovery
    finds the call settled in the tail, and a retry still runs nothing."""
    h = harness(rounds_script(answer_round("unused")))
    h.conv.state.external["mcp-1"] = ExternalSession.new("mcp-1", CLIENT, Access.EXECUTE)
    cid = h.conv.conversation_id
    tail = [Event.of(cid, 1, ToolCalled(turn_id="mcp-1", round=0, call_id="mcp-1.7", tool_id="demo.sleep",
                                        params={"seconds": 60}, trait="neutral", client=CLIENT), 0.0),
            Event.of(cid, 2, ToolResult(turn_id="mcp-1", call_id="mcp-1.7", tool_id="demo.sleep", ok=False, duration_ms=0,
                                        error="round_interrupted", client=CLIENT), 0.0)]
    # recorded again as its durable result (the crash may have come before that): the first write wins
    assert cut_external_calls(h.conv.state, tail) == [Observation("mcp-1.7", "demo.sleep", ok=False, error="round_interrupted")]
    recover(h.conv, tail)
    await h.idle()
    later, events = reactivated(h)
    assert await later.external_call(call("demo.sleep", "mcp-1.7", seconds=60)) == Observed(ok=False, error="round_interrupted")
    await later.events.flush()
    assert events == []


def reactivated(h: Harness) -> tuple[Conversation, list[Event]]:
    """The conversation as an activation after a reap makes it: from its snapshot, with a log of its own."""
    log = EventLog(h.conv.conversation_id)
    events: list[Event] = []
    log.subscribe(events.extend)
    return Conversation(ConversationState.decode(h.conv.state.encode()), h.conv.profile, h.conv.runtime, log), events


def test_a_session_takes_the_name_its_client_gives_at_initialize() -> None:
    """The face reads the session's first view before `initialize` names the client: the session the
    snapshot keeps must carry the name, or a call recovery rebuilds from it is attributed to "unknown"."""
    h = harness(rounds_script(answer_round("unused")))
    h.conv.external_view("mcp-1", ExternalClient("mcp", "unknown"), Access.EXECUTE)
    h.conv.external_view("mcp-1", CLIENT, Access.EXECUTE)
    assert h.conv.state.external["mcp-1"].client == CLIENT
