"""Policy replay: a recorded conversation's model output, governed again by another profile
(docs/design.md#replay).

Sans-I/O: `replay(conversation_id, events, outputs, governance)` takes what the store holds of one
conversation — its durable events and the raw output of each round (`round_outputs`) — and returns,
turn by turn and round by round, what the recording did and what `governance` would have done with
the same model text. No model is called and no tool runs. Each round's raw text goes in one piece
into a fresh `RoundEngine` (the engine is delta-boundary invariant, docs/design.md#one-decoder),
configured by the same turn machine the live turn runs (`actors/turn_machine.py`): the round's
mode and phase as recorded, the state, the retry, iteration and exploration counters, and finish
legality as the machine reaches them from the replayed rounds. A call the other profile accepts observes what the recording observed for that call;
a call it refuses observes nothing. `gateway/replay_command.py` reads the store and prints the report.

The model's text is held fixed. Replay answers "what would these gates have done with what the
model wrote", not "what would the model have written under them": once the two diverge, the later
rounds are the recorded model's answers to a context the other profile would not have built, and
where the other profile would ask the model again, nothing recorded says what it would write (the
turn's end is then `undetermined`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

import msgspec

from actors.catalog import ASK_USER_TOOL, Catalog, Observation, ToolCall, Trait, spend_exploration
from actors.decision import decision_for
from actors.native import is_native
from actors.profile import AgentProfile
from actors.round import RoundResult, ToolCallReady
from actors.store.base import RoundOutput
from actors.tools.registry import ToolRegistry
from actors.turn_machine import (
    BUDGET_REACHED,
    DENIED_BY_USER,
    Budget,
    Consent,
    End,
    Execute,
    TurnMachine,
    TurnProgress,
    provider_failed,
)
from protocol.events import (
    Approval,
    EndReason,
    Event,
    RoundCompleted,
    ThinkingDelta,
    ToolCalled,
    ToolResult,
    TurnCompleted,
)
from protocol.frames import Mode
from protocol.notices import NoticeCode

ParamsCheck = Callable[[str, Mapping[str, object]], list[str]]

# Notices a round gets from outside its engine: the turn passes them to `finish(cut=...)`, so
# replay passes the recorded one again (the provider fails the same way whatever the profile).
CUT_CODES: Final = frozenset({NoticeCode.PROVIDER_ERROR, NoticeCode.OUTPUT_TRUNCATED, NoticeCode.ROUND_INTERRUPTED})
# Ends a profile does not decide — a user's cancel, a server fault, a turn still running: replay
# keeps them as recorded when its own turn gets that far.
EXTERNAL_ENDS: Final = frozenset({str(EndReason.CANCELLED), str(EndReason.ERROR), "running"})


class RoundStatus(StrEnum):
    RAN = "ran"
    STEERED = "steered"            # a steer cut it: the same cut in both (it came from the user)
    INTERRUPTED = "interrupted"    # a crash cut it; no output was stored, it is kept as recorded
    NOT_REACHED = "not_reached"    # the turn had ended before it


class EndStatus(StrEnum):
    RUNNING = "running"            # the recording holds no turn.completed yet (or a paused ask_user)
    UNDETERMINED = "undetermined"  # the profile would ask the model again: no recorded output says what it writes


@dataclass(frozen=True, slots=True)
class Governance:
    """What a profile decides with: the profile (policies, states) and the catalog its
    conversations get. `of(profile, registry)` builds it as `Conversation` does."""

    profile: AgentProfile
    catalog: Catalog
    validate_params: ParamsCheck | None = None

    @classmethod
    def of(cls, profile: AgentProfile, registry: ToolRegistry) -> Governance:
        return cls(profile, profile.catalog_from(registry.catalog()), lambda tool_id, params: registry.validate_params(tool_id, params)[1])


# -- the report --------------------------------------------------------------------------------------


class RoundView(msgspec.Struct, frozen=True, kw_only=True):
    """One round in the terms replay compares: what the gates did and what the user saw.

    `lanes` are "INDEX LANE STATUS"; `notices` "CODE [TOOL]"; `accepted` "INDEX ACTION [TOOL]";
    `denied` "INDEX TOOL CODE"; `calls` the `tool.call`s sent, "TOOL CALL_ID"; `observed` what each
    of them observed, "TOOL CALL_ID ok", "… error CODE" or "… unknown" (it would run, and nothing
    recorded says what it returns); `approvals` the user's consent to each call that asked for it,
    "TOOL CALL_ID approved|approved_all|denied|timeout", or "… unknown" where the profile would ask and
    nothing recorded says what the user answers; `finish` what became of a complete/exit: "" (none), "allowed"
    or "denied CODE"."""

    status: str
    lanes: tuple[str, ...] = ()
    answer_chars: int = 0
    thinking_chars: int = 0
    notices: tuple[str, ...] = ()
    accepted: tuple[str, ...] = ()
    denied: tuple[str, ...] = ()
    calls: tuple[str, ...] = ()
    observed: tuple[str, ...] = ()
    finish: str = ""
    approvals: tuple[str, ...] = ()


COMPARED: Final = ("status", "lanes", "answer_chars", "thinking_chars", "notices", "accepted", "denied", "calls",
                   "observed", "finish", "approvals")


class RoundReplay(msgspec.Struct, frozen=True, kw_only=True):
    round: int
    recorded: RoundView
    replayed: RoundView
    differs: tuple[str, ...] = ()   # the fields of COMPARED whose values differ
    notes: tuple[str, ...] = ()


class TurnEnd(msgspec.Struct, frozen=True, kw_only=True):
    """How a turn ended: an EndReason, or an EndStatus when it had not or cannot be told."""

    reason: str
    final_answer: str | None = None
    finish_ok: bool | None = None


END_COMPARED: Final = ("reason", "final_answer", "finish_ok")


class TurnReplay(msgspec.Struct, frozen=True, kw_only=True):
    turn_id: str
    skipped: str = ""               # why the turn could not be replayed ("" when it was)
    rounds: tuple[RoundReplay, ...] = ()
    recorded_end: TurnEnd
    replayed_end: TurnEnd | None = None   # None when skipped
    end_differs: tuple[str, ...] = ()

    @property
    def differs(self) -> bool:
        return bool(self.end_differs) or any(r.differs for r in self.rounds)


class ReplayReport(msgspec.Struct, frozen=True, kw_only=True):
    conversation_id: str
    agent: str                      # the profile replayed under
    recorded_agent: str = ""        # the profile the conversation was recorded under (its name)
    turns: tuple[TurnReplay, ...] = ()

    @property
    def differs(self) -> bool:
        return any(t.differs for t in self.turns)

    @property
    def replayed_turns(self) -> int:
        return sum(1 for t in self.turns if not t.skipped)


# -- what the recording holds ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Round:
    completed: RoundCompleted | None = None
    thinking: list[str] = field(default_factory=list)
    calls: list[ToolCalled] = field(default_factory=list)


@dataclass(slots=True)
class _Turn:
    turn_id: str
    rounds: dict[int, _Round] = field(default_factory=dict)
    results: dict[str, ToolResult] = field(default_factory=dict)
    approvals: dict[str, str] = field(default_factory=dict)   # call id → the user's consent, as recorded
    completed: TurnCompleted | None = None

    def round(self, number: int) -> _Round:
        return self.rounds.setdefault(number, _Round())


def _recorded_turns(events: Iterable[Event]) -> list[_Turn]:
    """The durable log, by turn and round, in the order the turns started."""
    turns: dict[str, _Turn] = {}
    for event in events:
        data = event.data
        turn_id = getattr(data, "turn_id", None)
        if not isinstance(turn_id, str) or getattr(data, "client", None) is not None:
            continue  # a fallback (no turn), a kind this version does not know, or an external client's
                      # call: not the model's, so nothing to replay (docs/design.md#mcp-face)
        turn = turns.setdefault(turn_id, _Turn(turn_id))
        if isinstance(data, ThinkingDelta):
            turn.round(data.round).thinking.append(data.text)
        elif isinstance(data, ToolCalled):
            turn.round(data.round).calls.append(data)
        elif isinstance(data, RoundCompleted):
            turn.round(data.round).completed = data
        elif isinstance(data, ToolResult):
            turn.results[data.call_id] = data
        elif isinstance(data, Approval):
            turn.approvals[data.call_id] = data.decision
        elif isinstance(data, TurnCompleted):
            turn.completed = data
    # Answer characters are counted from the gates' own counters (streamed_state), not from deltas.
    return list(turns.values())


def view(
    completed: RoundCompleted, thinking: str, calls: Sequence[tuple[str, str]], observed: Mapping[str, str],
    approvals: Mapping[str, str] | None = None,
) -> RoundView:
    """A round as replay compares it, from its `round.completed` (recorded, or built by the engine),
    its thinking, the calls it sent as (tool id, call id), call id → what that call observed, and
    call id → the user's consent to it (docs/design.md#execute-confirmation)."""
    approvals = approvals or {}
    denied = {d.index: d for d in completed.denied}
    finish = []
    for lane in completed.streamed_state.lanes:
        if lane.lane == "answer":
            code = denied[lane.index].code if lane.index in denied else None
            finish.append("allowed" if lane.status == "allowed" else f"denied {code or ''}".strip())
    if completed.interrupted:
        status = RoundStatus.INTERRUPTED
    else:
        status = RoundStatus.STEERED if completed.steered else RoundStatus.RAN
    return RoundView(
        status=status,
        lanes=tuple(f"{lane.index} {lane.lane} {lane.status}" for lane in completed.streamed_state.lanes),
        answer_chars=sum(lane.emitted_chars for lane in completed.streamed_state.lanes),
        thinking_chars=len(thinking),
        notices=tuple(_words(n.code, n.tool_id) for n in completed.notices),
        accepted=tuple(_words(str(a.index), a.action, a.tool_id) for a in completed.accepted),
        denied=tuple(_words(str(d.index), d.tool_id, d.code) for d in completed.denied),
        calls=tuple(f"{tool_id} {call_id}" for tool_id, call_id in calls),
        observed=tuple(f"{tool_id} {call_id} {observed.get(call_id, UNKNOWN)}" for tool_id, call_id in calls),
        finish=", ".join(finish),
        approvals=tuple(f"{tool_id} {call_id} {approvals[call_id]}" for tool_id, call_id in calls if call_id in approvals),
    )


def _words(*parts: str | None) -> str:
    return " ".join(p for p in parts if p)


NOT_REACHED: Final = RoundView(status=RoundStatus.NOT_REACHED)
UNKNOWN: Final = "unknown"


def observation(result: ToolResult | None) -> str:
    if result is None:
        return UNKNOWN
    return "ok" if result.ok else f"error {result.error}"


# -- replay ----------------------------------------------------------------------------------------------


def replay(
    conversation_id: str, events: Sequence[Event], outputs: Sequence[RoundOutput], governance: Governance,
    *, recorded_agent: str = "",
) -> ReplayReport:
    """Every turn of the recording, replayed under `governance` (docs/design.md#replay)."""
    by_round = {(o.turn_id, o.round): o for o in outputs}
    turns = tuple(_TurnReplayer(turn, by_round, governance).run() for turn in _recorded_turns(events))
    return ReplayReport(conversation_id=conversation_id, agent=governance.profile.name,
                        recorded_agent=recorded_agent, turns=turns)


class _TurnReplayer:
    """One turn under the other profile: the turn machine (`actors/turn_machine.py`) fed the
    recorded rounds, as `Turn` feeds it live ones. No rule of the turn is written here."""

    def __init__(self, turn: _Turn, outputs: Mapping[tuple[str, int], RoundOutput], gov: Governance) -> None:
        self.turn = turn
        self.outputs = outputs
        self.gov = gov
        self.machine = TurnMachine(TurnProgress(turn_id=turn.turn_id, message_id="", text=""),
                                   gov.profile.policies, gov.profile.states)
        first = next((outputs[k] for k in sorted(k for k in outputs if k[0] == turn.turn_id)), None)
        # The state the turn began in is the recording's; within the turn, it follows the
        # transitions the replayed observations make (docs/design.md#states).
        self.state = first.agent_state if first is not None else (gov.profile.initial_state or "default")
        self.explored = 0                 # the tool pool's exploration counter, reset at turn start
        self.end: TurnEnd | None = None
        self.notes: list[str] = []            # of the round being replayed
        self.observed: dict[str, str] = {}    # call id → what it observed, in the round being replayed
        self.consents: dict[str, str] = {}    # call id → the user's consent to it, in the round being replayed

    def run(self) -> TurnReplay:
        turn = self.turn
        recorded_end = _recorded_end(turn.completed)
        numbers = sorted(n for n, r in turn.rounds.items() if r.completed is not None)
        missing = [n for n in numbers if not _interrupted(turn.rounds[n]) and (turn.turn_id, n) not in self.outputs]
        if missing:
            return TurnReplay(
                turn_id=turn.turn_id, recorded_end=recorded_end,
                skipped=f"round {missing[0]} has no stored raw output (recorded before round outputs were stored)",
            )
        rounds = [self._round(n) for n in numbers]
        if self.end is None:
            self.end = self._after_last(numbers[-1] if numbers else 0, recorded_end)
        return TurnReplay(
            turn_id=turn.turn_id, rounds=tuple(rounds), recorded_end=recorded_end, replayed_end=self.end,
            end_differs=_differs(recorded_end, self.end, END_COMPARED),
        )

    def _round(self, number: int) -> RoundReplay:
        recorded_round = self.turn.rounds[number]
        completed = recorded_round.completed
        assert completed is not None
        results = self.turn.results
        recorded = view(completed, "".join(recorded_round.thinking), [(c.tool_id, c.call_id) for c in recorded_round.calls],
                        {c.call_id: observation(results.get(c.call_id)) for c in recorded_round.calls},
                        self.turn.approvals)
        self.notes = []
        self.observed = {}
        self.consents = {}
        self.machine.progress.round_no = number - 1  # the recording's numbering: crash-cut rounds count too
        if self.end is not None:
            replayed = NOT_REACHED
        elif completed.interrupted:
            replayed = recorded
            # A crash cut it: the calls it announced got their error observation (docs/design.md#recovery).
            for call_id, result in results.items():
                if call_id.startswith(f"{self.turn.turn_id}.{number}."):
                    self.machine.observe(call_id, _observation(result), None)
        elif isinstance(started := self.machine.start_round(), End):
            self.end = _turn_end(started)
            replayed = NOT_REACHED
        else:
            replayed = self._run_round(number, completed)
        # A round the other profile never reaches differs in that alone; its fields are the recording's.
        differs = ("status",) if replayed is NOT_REACHED else _differs(recorded, replayed, COMPARED)
        return RoundReplay(round=number, recorded=recorded, replayed=replayed, differs=differs, notes=tuple(self.notes))

    def _run_round(self, number: int, recorded: RoundCompleted) -> RoundView:
        turn_id = self.turn.turn_id
        output = self.outputs[turn_id, number]
        # The round's mode and phase are the recording's: no event records a mode (a user's setting),
        # and a steer during tool execution shows only in the next round's phase.
        rules = self.machine.rules(self.gov.catalog, state=self.state, mode=Mode(output.mode),
                                   finalize=output.phase == "finalize", validate_params=self.gov.validate_params)
        # A round replays in the decision protocol it was recorded in: the model's output is held fixed.
        decision = decision_for("native" if is_native(output.raw) else "channels", self.gov.catalog,
                                self.gov.profile.policies)
        engine = decision.engine(rules, turn_id=turn_id, round_no=number)
        cut = next((n for n in reversed(recorded.notices) if n.code in CUT_CODES), None)
        streamed = decision.feed(engine, output.raw)
        tail, result = engine.finish(cut=cut, interrupted=recorded.steered)
        if cut is not None and provider_failed(cut):  # as the live turn marks it: its end may name the provider
            result.provider_error = cut.message
        streamed += tail
        thinking = "".join(e.text for e in streamed if isinstance(e, ThinkingDelta))
        calls = [(e.call.tool_id, e.call.call_id) for e in streamed if isinstance(e, ToolCallReady)]
        if recorded.steered:
            self._steered(result)
        else:
            self._advance(result)
        return view(result.completed(turn_id, number, steered=recorded.steered), thinking, calls, self.observed,
                    self.consents)

    def _steered(self, result: RoundResult) -> None:
        cut = self.machine.round_steered(result)
        for c in cut.calls:
            self.machine.observe(c.call.call_id, Observation(c.call.call_id, c.call.tool_id, ok=False, error="steered"),
                                 self.gov.catalog.get(c.call.tool_id))
            self.observed[c.call.call_id] = "error steered"
        if cut.then_end:
            self.end = _turn_end(self.machine.end(result))

    def _advance(self, result: RoundResult) -> None:
        plan = self.machine.round_ended(result)
        if isinstance(plan, End):
            self.end = _turn_end(plan)
        elif isinstance(plan, Execute):
            regular, asks = self.machine.executing(plan.calls)
            for call in [*regular, *asks]:
                self._observe(call)
            if plan.then_end:
                self.end = _turn_end(self.machine.end(result))
            else:
                self.machine.observed()

    def _observe(self, call: ToolCall) -> None:
        """The call's observation is the recording's, through the tool pool's exploration count:
        a call over the cap observes EXPLORATION_BUDGET_REACHED; a call the recording refused there
        but that would run here has no known result."""
        decl = self.gov.catalog.get(call.tool_id)
        recorded = self.turn.results.get(call.call_id)
        if recorded is not None and recorded.tool_id != call.tool_id:
            recorded = None
        if self.machine.needs_approval(call.call_id, decl):  # docs/design.md#execute-confirmation
            asked = self.turn.approvals.get(call.call_id)
            if asked is None:
                self.consents[call.call_id] = UNKNOWN
                self.observed[call.call_id] = UNKNOWN
                self.machine.observe(call.call_id, None, decl)
                self.notes.append(f"{call.tool_id} ({call.call_id}) would ask the user's approval under this profile; "
                                  "nothing recorded says what they answer")
                return
            consent = Consent(asked)
            self.machine.consented(call.call_id, consent)
            self.consents[call.call_id] = consent.value
            if not consent.runs:
                recorded = ToolResult(turn_id=self.turn.turn_id, call_id=call.call_id, tool_id=call.tool_id, ok=False,
                                      duration_ms=0, error=DENIED_BY_USER)
                self.observed[call.call_id] = observation(recorded)
                self.machine.observe(call.call_id, _observation(recorded), decl)
                return
        elif self.machine.may_run(call.call_id, decl) and recorded is not None and recorded.error == DENIED_BY_USER:
            recorded = None  # the user refused it there; here it runs unasked: its result is unknown
        if decl is not None and decl.trait is Trait.EXPLORATION:
            spent = spend_exploration(self.explored, self.machine.exploration_cap)
            if spent is None:
                recorded = ToolResult(turn_id=self.turn.turn_id, call_id=call.call_id, tool_id=call.tool_id, ok=False,
                                      duration_ms=0, error=BUDGET_REACHED)
            else:
                self.explored = spent
                if recorded is not None and recorded.error == BUDGET_REACHED:
                    recorded = None  # refused in the recording, would run here: its result is unknown
        self.observed[call.call_id] = observation(recorded)
        if recorded is None:
            self.machine.observe(call.call_id, None, decl)
            self.notes.append(
                f"{call.tool_id} ({call.call_id}) has no recorded observation: it would run under this profile; "
                "replay goes on as if it answered, without a state change"
            )
            return
        obs = _observation(recorded)
        if call.tool_id == ASK_USER_TOOL:
            answer = (recorded.result or {}).get("answer") if recorded.ok else None
            budget = self.machine.budget_answer(str(call.params.get("question", "")), answer)
            if budget is Budget.RESET:
                self.explored = 0
        new_state = self.machine.observe(call.call_id, obs, decl)
        if new_state is not None:
            self.state = new_state

    def _after_last(self, last: int, recorded: TurnEnd) -> TurnEnd:
        """The turn is still going after the last recorded round: what would come next."""
        self.machine.progress.round_no = last
        started = self.machine.start_round()
        if isinstance(started, End):
            return _turn_end(started)
        if recorded.reason in EXTERNAL_ENDS:
            return recorded
        return TurnEnd(reason=EndStatus.UNDETERMINED)


def _observation(result: ToolResult) -> Observation:
    return Observation(result.call_id, result.tool_id, result.ok, result.result, result.error, result.detail or {})


def _turn_end(end: End) -> TurnEnd:
    return TurnEnd(reason=str(end.reason), final_answer=end.answer, finish_ok=end.finish_ok)


def _interrupted(recorded: _Round) -> bool:
    return recorded.completed is not None and recorded.completed.interrupted


def _recorded_end(completed: TurnCompleted | None) -> TurnEnd:
    if completed is None:
        return TurnEnd(reason=EndStatus.RUNNING)
    return TurnEnd(reason=str(completed.reason), final_answer=completed.final_answer, finish_ok=completed.finish_ok)


def _differs(recorded: msgspec.Struct, replayed: msgspec.Struct, fields: Sequence[str]) -> tuple[str, ...]:
    return tuple(f for f in fields if getattr(recorded, f) != getattr(replayed, f))
