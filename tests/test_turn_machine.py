"""The turn machine without I/O (docs/design.md#turn): fed round verdicts and observations, it says
what comes next. The live turn (tests/test_turn_*.py) and replay (tests/test_replay.py) are its two
shells; these tests pin the rules themselves, round by round, from real round engines."""

from __future__ import annotations

from typing import Any

import pytest

from actors.catalog import ASK_USER_TOOL, Observation, ToolDecl, Trait
from actors.gates import CONTINUE_EXPLORING, EXPLORATION_MARKER, STOP_EXPLORING
from actors.profile import Policies
from actors.round import RoundEngine, RoundResult
from actors.turn_machine import (
    GIVE_UP_MESSAGES,
    Budget,
    Decide,
    End,
    Execute,
    Holds,
    Move,
    Phase,
    StreamEnd,
    Then,
    TurnMachine,
    TurnProgress,
    continuation_models,
    cut_notice,
    provider_failed,
    transition,
)
from protocol.events import EndReason, IterationLimit, NoToolFinish, Salvaged
from protocol.frames import Mode
from protocol.notices import NoticeCode
from tests.roundkit import CATALOG, action, call, complete, play, rules, thinking

STATES = ("default", "focused")


def machine(phase: Phase = Phase.DECISION, **policies: Any) -> TurnMachine:
    return TurnMachine(TurnProgress(turn_id="t1", message_id="m1", text="hi", phase=phase), Policies(**policies), STATES)


def tools_round(*calls: dict[str, Any]) -> RoundResult:
    return play(thinking() + "".join(action(c) for c in calls))[1]


def answer_round(text: str = "Done.", *, finish_legal: bool = True) -> RoundResult:
    return play(thinking() + action(complete(text)), rules(finish_legal=finish_legal))[1]


def garbage_round() -> RoundResult:
    return play("not the protocol")[1]


def ok(call_id: str, tool_id: str, **result: Any) -> Observation:
    return Observation(call_id, tool_id, ok=True, result=result)


# -- phases --------------------------------------------------------------------------------------


def test_an_illegal_transition_names_the_phase_and_the_move() -> None:
    with pytest.raises(RuntimeError, match="observed in phase decision"):
        transition(Phase.DECISION, Move.OBSERVED)


def test_a_turn_checkpointed_while_its_tools_ran_resumes_deciding() -> None:
    assert machine(Phase.TOOL_EXECUTION).phase is Phase.DECISION
    assert machine(Phase.FINALIZE).phase is Phase.FINALIZE


# -- rounds and their moves ------------------------------------------------------------------------


def test_a_tool_round_executes_its_calls_then_decides_again() -> None:
    m = machine()
    assert m.start_round() == 1
    plan = m.round_ended(tools_round(call("demo.weather", city="Paris")))
    assert isinstance(plan, Execute) and plan.steerable and not plan.then_end
    assert [c.call.tool_id for c in plan.calls] == ["demo.weather"] and m.phase is Phase.TOOL_EXECUTION
    m.observed()
    assert m.phase is Phase.DECISION and m.start_round() == 2


def test_every_retry_counts_and_the_one_past_the_limit_gives_up() -> None:
    m = machine(max_protocol_retries=2)
    plans = [m.round_ended(garbage_round()) for _ in range(3)]
    assert [type(p) for p in plans] == [Decide, Decide, End]
    end = plans[-1]
    assert isinstance(end, End) and end.reason is EndReason.PROTOCOL_VIOLATION and not end.finish_ok
    assert end.answer == GIVE_UP_MESSAGES[EndReason.PROTOCOL_VIOLATION] and m.phase is Phase.EXIT


def provider_cut_round(cause: str = "auth: the variable ACME_LLM_KEY (api_key_env) is not set where this model is called",
                       text: str = "") -> RoundResult:
    """A round every model failed before its first delta (or, with `text`, mid-response), as the
    turn's shell finishes it: the cut notice, and the cause on the result."""
    kind, _, message = cause.partition(": ")
    engine = RoundEngine(rules(), turn_id="t1", round_no=1)
    engine.feed(text)
    notice = cut_notice(StreamEnd.CUT, Holds.TEXT if text else Holds.NOTHING, continuations=0, kind=kind,
                        mid_response=bool(text), cause=message, model="openai/acme-small")
    result = engine.finish(cut=notice)[1]
    result.provider_error = cause
    return result


def test_retries_spent_on_a_provider_failure_end_the_turn_as_provider_error_with_its_cause() -> None:
    m = machine(max_protocol_retries=1)
    plans = [m.round_ended(provider_cut_round()) for _ in range(2)]
    assert isinstance(plans[0], Decide)
    end = plans[1]
    assert isinstance(end, End) and end.reason is EndReason.PROVIDER_ERROR and not end.finish_ok
    assert end.answer == GIVE_UP_MESSAGES[EndReason.PROVIDER_ERROR] and "model provider" in end.answer
    assert end.error == "auth: the variable ACME_LLM_KEY (api_key_env) is not set where this model is called"


def test_a_provider_failure_mid_response_before_any_answer_counts_too() -> None:
    m = machine(max_protocol_retries=0)
    end = m.round_ended(provider_cut_round("server_error: upstream reset", text=thinking("Looking")))
    assert isinstance(end, End) and end.reason is EndReason.PROVIDER_ERROR and end.error == "server_error: upstream reset"


def test_the_round_that_spends_the_last_retry_names_the_cause() -> None:
    # The model's own mistakes first, then the provider: the provider's; and the other way round.
    m = machine(max_protocol_retries=1)
    m.round_ended(garbage_round())
    end = m.round_ended(provider_cut_round())
    assert isinstance(end, End) and end.reason is EndReason.PROVIDER_ERROR
    m = machine(max_protocol_retries=1)
    m.round_ended(provider_cut_round())
    end = m.round_ended(garbage_round())
    assert isinstance(end, End) and end.reason is EndReason.PROTOCOL_VIOLATION and end.error is None


def test_a_provider_notice_names_the_cause_and_says_it_is_not_the_models_mistake() -> None:
    notice = provider_cut_round().notices[-1]
    assert notice.code is NoticeCode.PROVIDER_ERROR and provider_failed(notice)
    assert notice.message == (
        "the model provider failed (auth) for model 'openai/acme-small': the variable ACME_LLM_KEY (api_key_env) "
        "is not set where this model is called. This is not your mistake.")
    restarted = cut_notice(StreamEnd.RESTARTED, Holds.TEXT, continuations=1)
    assert restarted.code is NoticeCode.PROVIDER_ERROR and not provider_failed(restarted)


def test_no_retry_at_all_when_the_limit_is_zero() -> None:
    assert isinstance(machine(max_protocol_retries=0).round_ended(garbage_round()), End)


def test_the_iteration_limit_ends_the_turn_with_its_trace() -> None:
    m = machine(max_iterations=2)
    assert [m.start_round(), m.start_round()] == [1, 2]
    end = m.start_round()
    assert isinstance(end, End) and end.reason is EndReason.ITERATION_LIMIT
    assert end.traces == (IterationLimit(turn_id="t1", rounds=2),)


def test_finishing_is_legal_only_after_an_observation_under_observe() -> None:
    m = machine()
    assert not m.rules(CATALOG, state="default", mode=Mode.AGENT).finish_legal
    m.observe("t1.1.0", ok("t1.1.0", "demo.clock", now="x"), CATALOG.get("demo.clock"))
    assert m.rules(CATALOG, state="default", mode=Mode.AGENT).finish_legal
    assert machine(finish_policy="allow_no_tool").rules(CATALOG, state="default", mode=Mode.AGENT).finish_legal
    assert machine(Phase.FINALIZE).rules(CATALOG, state="default", mode=Mode.AGENT).finish_legal  # after a steer


def test_a_finish_runs_the_calls_beside_it_then_ends_with_the_answer() -> None:
    m = machine()
    m.observe("t0", ok("t0", "demo.clock"), None)
    result = play(thinking() + action(call("demo.clock")) + action(complete("It is noon.")))[1]
    plan = m.round_ended(result)
    assert isinstance(plan, Execute) and plan.then_end and not plan.steerable
    end = m.end(result)
    assert (end.reason, end.answer, end.finish_ok, end.traces) == (EndReason.COMPLETE, "It is noon.", True, ())


def test_an_unobserved_finish_is_flagged_and_not_ok() -> None:
    end = machine(finish_policy="allow_no_tool").end(answer_round())
    assert end.finish_ok and end.traces == (NoToolFinish(turn_id="t1", round=0),)
    # In a finalize round after a steer the finish is allowed, and still not a legal one.
    finalize = machine(Phase.FINALIZE)
    assert not finalize.end(answer_round()).finish_ok


def test_a_salvaged_answer_keeps_exactly_what_streamed() -> None:
    # The answer streams, then the round breaks: the user keeps what they saw (docs/design.md#salvage).
    result = play(thinking() + action(complete("Half an ans")) + "trailing junk")[1]
    assert result.outcome == "salvage"
    m = machine()
    assert isinstance(m.round_ended(result), Execute)
    end = m.end(result)
    assert end.reason is EndReason.SALVAGED and end.answer == "Half an ans"
    assert end.traces == (Salvaged(turn_id="t1", round=0, answer_chars=11, partial=False),)


def test_a_steered_round_finalizes_unless_an_answer_streamed() -> None:
    m = machine()
    cut = m.round_steered(tools_round(call("demo.weather", city="Paris")))
    assert [c.call.tool_id for c in cut.calls] == ["demo.weather"] and not cut.then_end
    assert m.phase is Phase.FINALIZE
    shown = machine()
    assert shown.round_steered(answer_round()).then_end and shown.phase is Phase.DECISION


# -- tools -----------------------------------------------------------------------------------------


def test_asks_are_observed_after_the_regular_batch_and_pending_until_observed() -> None:
    m = machine()
    plan = m.round_ended(tools_round(call(ASK_USER_TOOL, question="Which city?"), call("demo.clock")))
    assert isinstance(plan, Execute)
    regular, asks = m.executing(plan.calls)
    assert [c.tool_id for c in regular] == ["demo.clock"] and [c.tool_id for c in asks] == [ASK_USER_TOOL]
    assert [p.tool_id for p in m.progress.pending] == [ASK_USER_TOOL, "demo.clock"]
    m.observe(regular[0].call_id, ok(regular[0].call_id, "demo.clock"), None)
    assert [p.tool_id for p in m.progress.pending] == [ASK_USER_TOOL]


def test_the_tool_calls_backstop_admits_up_to_the_limit_across_rounds() -> None:
    m = machine()
    calls = tools_round(call("demo.clock"), call("demo.clock")).calls
    assert [len(x) for x in m.admit(calls, 3)] == [2, 0]
    assert [len(x) for x in m.admit(calls, 3)] == [1, 1]
    assert [len(x) for x in m.admit(calls, None)] == [2, 0]


def test_a_transition_moves_only_to_a_state_of_the_profile() -> None:
    decl = ToolDecl("demo.focus_project", Trait.NEUTRAL, transitions_state=True)
    m = machine()
    assert m.observe("a", ok("a", decl.tool_id, state="focused"), decl) == "focused"
    assert m.observe("b", ok("b", decl.tool_id, state="nowhere"), decl) is None
    assert m.observe("c", ok("c", "demo.clock", state="focused"), CATALOG.get("demo.clock")) is None


def test_the_budget_question_after_the_cap_continues_or_stops_exploring() -> None:
    question = f"{EXPLORATION_MARKER} Go on?"
    m = machine()
    assert m.budget_answer(question, CONTINUE_EXPLORING) is None  # no budget question is owed yet
    m.observe("x", Observation("x", "demo.search", ok=False, error="EXPLORATION_BUDGET_REACHED"), None)
    assert m.rules(CATALOG, state="default", mode=Mode.AGENT).confirmation_required
    assert m.budget_answer("Something else?", CONTINUE_EXPLORING) is None
    assert m.budget_answer(question, CONTINUE_EXPLORING) is Budget.RESET
    assert not m.rules(CATALOG, state="default", mode=Mode.AGENT).confirmation_required
    m.observe("y", Observation("y", "demo.search", ok=False, error="EXPLORATION_BUDGET_REACHED"), None)
    assert m.budget_answer(question, STOP_EXPLORING) is Budget.STOP
    assert m.rules(CATALOG, state="default", mode=Mode.AGENT).exploration_stopped
    m.observe("z", Observation("z", "demo.search", ok=False, error="EXPLORATION_BUDGET_REACHED"), None)
    assert m.budget_answer(question, None) is Budget.STOP  # a timeout stops too


# -- continuation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("end", "holds", "continuable", "used", "then"), [
    (StreamEnd.ENDED, Holds.ANSWER, True, 0, Then.END),
    (StreamEnd.LENGTH, Holds.NOTHING, True, 0, Then.CUT),       # an empty response is not continued
    (StreamEnd.LENGTH, Holds.TEXT, True, 0, Then.CONTINUE),
    (StreamEnd.LENGTH, Holds.TEXT, False, 0, Then.CUT),         # no longer a valid prefix
    (StreamEnd.LENGTH, Holds.ANSWER, True, 2, Then.CUT),        # auto_continue_max spent
    (StreamEnd.CUT, Holds.TEXT, True, 0, Then.CUT),             # nothing shown: retry, never continue
    (StreamEnd.CUT, Holds.ANSWER, True, 1, Then.CONTINUE),
    (StreamEnd.CRASH, Holds.ANSWER, True, 1, Then.CONTINUE),
    (StreamEnd.CRASH, Holds.ANSWER, True, 2, Then.CUT),
    (StreamEnd.RESTARTED, Holds.ANSWER, True, 0, Then.CUT),     # a restart never reaches the user
])
def test_what_follows_a_round_stream(end: StreamEnd, holds: Holds, continuable: bool, used: int, then: Then) -> None:
    assert machine(auto_continue_max=2).continuation(end, holds, continuable=continuable, continuations=used) is then


def test_nothing_is_ever_continued_with_a_zero_budget() -> None:
    m = machine(auto_continue_max=0)
    assert {m.continuation(e, Holds.ANSWER, continuable=True, continuations=0) for e in StreamEnd} <= {Then.END, Then.CUT}


def test_a_cut_notice_never_blames_the_model() -> None:
    assert cut_notice(StreamEnd.CUT, Holds.ANSWER, continuations=0, kind="timeout").code is NoticeCode.PROVIDER_ERROR
    assert cut_notice(StreamEnd.CRASH, Holds.ANSWER, continuations=2).code is NoticeCode.ROUND_INTERRUPTED
    assert "after 2 continuations" in cut_notice(StreamEnd.LENGTH, Holds.TEXT, continuations=2).message


def test_a_continuation_moves_to_the_next_fallback_while_there_is_one() -> None:
    assert continuation_models(["a", "b", "c"], "a") == (["b", "c"], "b")
    assert continuation_models(["a", "b"], "b") == (["b"], None)
