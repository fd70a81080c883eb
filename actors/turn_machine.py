"""The turn machine: every rule of a turn, sans-I/O (docs/design.md#turn).

A turn is the loop of rounds between a user message and its final answer. This module decides it;
it calls no model, runs no tool and emits nothing. Its shells do the I/O: `actors/turn.py` (`Turn`)
streams the model into a round engine, runs the tools and emits the events; `actors/replay.py`
feeds it recorded rounds under another profile (docs/design.md#replay). With one machine, a rule
exists once, and the two shells cannot drift apart.

The machine's whole state is a `TurnProgress`, the struct the snapshot keeps (docs/design.md#recovery):
a turn re-activated elsewhere is the same machine again. It takes what a shell reports — a round's
verdict, each observation, a steer, an answer to the budget question — and says what comes next:

- `start_round()` → the next round's number, or the `End` the iteration limit makes;
- `rules(...)` → the round's `RoundRules` (finish legality, the exploration budget, finalize);
- `continuation(...)` → after a round's model stream ended: `CONTINUATION`, a table;
- `round_ended(result)` → a `Plan`: execute these calls, decide again, or end; `round_steered`
  → the calls a steer cut, and whether the turn ends or finalizes;
- `executing(calls)` → the order calls are observed in: the regular batch, then each `react.ask_user`;
- `admit(calls)` → the tool-calls-per-turn backstop (docs/design.md#quotas);
- `observe(...)` → counts the observation; says the state a transition moved to;
- `budget_answer(...)` → what the answer to the budget question does;
- `end(result)` → reason, final answer, `finish_ok`, and the traces that go with them.

The phases and transitions are a table (`TRANSITIONS`), and so is the move each round outcome
makes (`OUTCOME_MOVES`). Any other (phase, move) is a bug, reported with both names.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

import msgspec

from actors.catalog import ASK_USER_TOOL, Catalog, Observation, ToolCall, ToolDecl, Trait
from actors.gates import CONTINUE_EXPLORING, EXPLORATION_MARKER, RoundRules
from actors.identity import Caller
from actors.profile import Policies
from actors.quotas import admitted_tool_calls
from actors.round import AcceptedCall, RoundOutcome, RoundResult
from protocol.events import EndReason, EventData, IterationLimit, NoToolFinish, Salvaged
from protocol.frames import Mode
from protocol.notices import Notice, NoticeCode

# -- phases and moves ------------------------------------------------------------------------------


class Phase(StrEnum):
    DECISION = "decision"
    TOOL_EXECUTION = "tool_execution"
    FINALIZE = "finalize"
    EXIT = "exit"


class Move(StrEnum):
    TOOLS = "tools"
    RETRY = "retry_decision"
    FINISH = "finish"
    OBSERVED = "observed"
    STEER = "steer"
    GIVE_UP = "give_up"     # retries or iterations exhausted


# (phase, move) → next phase (docs/design.md#turn). Anything else is a bug.
TRANSITIONS: Final[Mapping[tuple[Phase, Move], Phase]] = {
    (Phase.DECISION, Move.TOOLS): Phase.TOOL_EXECUTION,
    (Phase.DECISION, Move.RETRY): Phase.DECISION,
    (Phase.DECISION, Move.FINISH): Phase.EXIT,
    (Phase.DECISION, Move.STEER): Phase.FINALIZE,
    (Phase.DECISION, Move.GIVE_UP): Phase.EXIT,
    (Phase.TOOL_EXECUTION, Move.OBSERVED): Phase.DECISION,
    (Phase.TOOL_EXECUTION, Move.STEER): Phase.FINALIZE,
    (Phase.FINALIZE, Move.RETRY): Phase.FINALIZE,
    (Phase.FINALIZE, Move.TOOLS): Phase.FINALIZE,  # cannot happen: tools are denied; kept total
    (Phase.FINALIZE, Move.FINISH): Phase.EXIT,
    (Phase.FINALIZE, Move.GIVE_UP): Phase.EXIT,
    (Phase.FINALIZE, Move.STEER): Phase.FINALIZE,
}

# What a round's verdict makes the turn do. A salvage finishes like a finish: the user keeps
# exactly what streamed, and the model is not asked again (docs/design.md#salvage).
OUTCOME_MOVES: Final[Mapping[RoundOutcome, Move]] = {
    RoundOutcome.FINISH: Move.FINISH,
    RoundOutcome.SALVAGE: Move.FINISH,
    RoundOutcome.TOOLS: Move.TOOLS,
    RoundOutcome.RETRY: Move.RETRY,
}

# A checkpoint taken while tools ran resumes at its pending calls, then decides again.
RESUME_PHASE: Final[Mapping[Phase, Phase]] = {
    Phase.DECISION: Phase.DECISION,
    Phase.TOOL_EXECUTION: Phase.DECISION,
    Phase.FINALIZE: Phase.FINALIZE,
    Phase.EXIT: Phase.EXIT,
}


def transition(phase: Phase, move: Move) -> Phase:
    try:
        return TRANSITIONS[phase, move]
    except KeyError:
        raise RuntimeError(f"illegal turn transition: {move} in phase {phase}") from None


# -- what the turn tells the user and the model ----------------------------------------------------------

GIVE_UP_MESSAGES: Final[Mapping[EndReason, str]] = {
    EndReason.PROTOCOL_VIOLATION: "Sorry — I could not produce a valid response this time. Please try again.",
    EndReason.PROVIDER_ERROR: "Sorry — the model provider failed, so I have no answer this time. Please try again later.",
    EndReason.ITERATION_LIMIT: "Sorry — I reached my step limit for this request before finishing.",
    EndReason.ERROR: "Sorry — something went wrong on our side.",
}
FINISH_ILLEGAL_REASON: Final = (
    "finishing is not legal yet: this turn holds no tool observation. Call a tool first and answer after its "
    "observation."
)
ROUND_INTERRUPTED: Final = Notice(
    code=NoticeCode.ROUND_INTERRUPTED,
    message="the previous response was cut by a server fault before it finished; decide again",
)
BUDGET_REACHED: Final = "EXPLORATION_BUDGET_REACHED"


# -- the state the snapshot keeps ------------------------------------------------------------------------


class PendingCall(msgspec.Struct, frozen=True):
    call_id: str
    tool_id: str
    params: dict[str, Any]
    code: str | None = None

    def as_call(self) -> ToolCall:
        return ToolCall(self.call_id, self.tool_id, self.params, self.code)


class CutRound(msgspec.Struct, frozen=True):
    """A round a crash cut while its answer streamed, rebuilt from the durable log: it goes on with
    a continuation (docs/design.md#recovery)."""

    round_no: int
    raw: str                     # the response so far, as the durable events tell it
    continuations: int = 0


class TurnProgress(msgspec.Struct, kw_only=True):
    """A running turn: the machine's state, as the snapshot keeps it, so a re-activation elsewhere
    resumes it (docs/design.md#recovery)."""

    turn_id: str
    message_id: str
    text: str
    phase: Phase = Phase.DECISION
    round_no: int = 0
    retries: int = 0
    observations: int = 0
    confirmation_required: bool = False
    exploration_stopped: bool = False
    pending: list[PendingCall] = msgspec.field(default_factory=list)  # calls being executed
    cut: CutRound | None = None   # recovery found this round cut mid-answer: continue it first
    streaming: bool = False       # taken while round `round_no` was streaming (a command's save)
    tool_calls: int = 0           # calls admitted to run (the tool-calls-per-turn quota)
    trace: dict[str, str] = msgspec.field(default_factory=dict)  # its message's trace (docs/design.md#tracing)
    caller: Caller | None = None  # who sent its message: what its tools know of who calls (docs/design.md#your-tools)
    approvals: dict[str, str] = msgspec.field(default_factory=dict)  # call id → the user's Consent
    approve_all: bool = False     # "Approve all": the rest of this turn's confirm calls run unasked


# -- continuation: how a round's model stream ended, and what follows --------------------------------------


class StreamEnd(StrEnum):
    """How one model stream of a round ended (docs/design.md#continuation)."""

    ENDED = "ended"          # on its own (stop, content_filter, …), or the prefix policy stopped it
    LENGTH = "length"        # the output limit cut it (finish_reason "length")
    CUT = "cut"              # a provider failed, went silent or dropped the stream
    CRASH = "crash"          # a crash cut it; recovery rebuilt it from the durable log
    RESTARTED = "restarted"  # a continuation started over instead of continuing


class Holds(StrEnum):
    """What the round's engine holds when its stream ends."""

    NOTHING = "nothing"      # no text at all
    TEXT = "text"            # text, but no answer character reached the user
    ANSWER = "answer"        # answer characters reached the user


class Then(StrEnum):
    END = "end"              # the engine decides the round as it stands
    CONTINUE = "continue"    # ask the model to go on from the exact character
    CUT = "cut"              # end the round as cut, with a notice saying why; a streamed answer is partial


# (how the stream ended, what the engine holds) → what follows. CONTINUE stands only while the
# text is a valid prefix and the round's `auto_continue_max` is not spent; else it is CUT.
# A cut before any answer character is not continued: the round retries (docs/design.md#fallback).
CONTINUATION: Final[Mapping[tuple[StreamEnd, Holds], Then]] = {
    (StreamEnd.ENDED, Holds.NOTHING): Then.END,
    (StreamEnd.ENDED, Holds.TEXT): Then.END,
    (StreamEnd.ENDED, Holds.ANSWER): Then.END,
    (StreamEnd.LENGTH, Holds.NOTHING): Then.CUT,
    (StreamEnd.LENGTH, Holds.TEXT): Then.CONTINUE,
    (StreamEnd.LENGTH, Holds.ANSWER): Then.CONTINUE,
    (StreamEnd.CUT, Holds.NOTHING): Then.CUT,
    (StreamEnd.CUT, Holds.TEXT): Then.CUT,
    (StreamEnd.CUT, Holds.ANSWER): Then.CONTINUE,
    (StreamEnd.CRASH, Holds.NOTHING): Then.CONTINUE,
    (StreamEnd.CRASH, Holds.TEXT): Then.CONTINUE,
    (StreamEnd.CRASH, Holds.ANSWER): Then.CONTINUE,
    (StreamEnd.RESTARTED, Holds.NOTHING): Then.CUT,
    (StreamEnd.RESTARTED, Holds.TEXT): Then.CUT,
    (StreamEnd.RESTARTED, Holds.ANSWER): Then.CUT,
}


# Every notice of a round the provider cut opens with this (replay tells them by it, from the
# recording: a restarted continuation's notice shares the code, not the words).
PROVIDER_FAILED: Final = "the model provider failed"


def provider_failed(notice: Notice) -> bool:
    """Whether a round's cut notice says the provider failed (not a continuation that started over)."""
    return notice.code is NoticeCode.PROVIDER_ERROR and notice.message.startswith(PROVIDER_FAILED)


def cut_notice(end: StreamEnd, holds: Holds, *, continuations: int, kind: str = "", mid_response: bool = True,
               cause: str = "", model: str = "") -> Notice:
    """Why a round ended cut: a fact of the stream, never the model's mistake (guarantee 4). A
    provider failure says so to the model in as many words, with the provider's own words `cause`
    (`ProviderError.detail`: one line, keys scrubbed) and the `model` that failed."""
    if end is StreamEnd.RESTARTED:
        return Notice(code=NoticeCode.PROVIDER_ERROR,
                      message="the response was cut, and the continuation started over instead of continuing")
    if end is StreamEnd.CRASH:
        return Notice(code=NoticeCode.ROUND_INTERRUPTED,
                      message="the response was cut by a server fault and could not be continued")
    if end is StreamEnd.LENGTH:
        if holds is Holds.NOTHING:
            return Notice(code=NoticeCode.OUTPUT_TRUNCATED, message="the response was empty and cut at the length limit")
        return Notice(code=NoticeCode.OUTPUT_TRUNCATED,
                      message=f"the response was cut at the length limit after {continuations} continuations")
    where = " in the middle of the response" if mid_response else ""
    which = f" for model {model!r}" if model else ""
    detail = f": {cause}" if cause else ""
    return Notice(code=NoticeCode.PROVIDER_ERROR,
                  message=f"{PROVIDER_FAILED} ({kind}){where}{which}{detail}. This is not your mistake.")


def continuation_models(models: Sequence[str], failed: str) -> tuple[list[str], str | None]:
    """A provider that failed mid-answer hands the continuation to the next fallback, if any (the
    second value: the model it falls back to, for the `fallback` event); with none left, the same
    model is asked to continue (docs/design.md#fallback)."""
    position = list(models).index(failed) if failed in models else 0
    if position + 1 < len(models):
        return list(models[position + 1:]), models[position + 1]
    return list(models[position:]), None


# -- what comes next ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class End:
    """The turn ends: its reason, final answer, `finish_ok`, and the traces that say how."""

    reason: EndReason
    answer: str
    finish_ok: bool
    partial: bool = False
    traces: tuple[EventData, ...] = ()
    error: str | None = None      # provider_error: the failure (`ProviderError.cause`), for `turn.completed.error`


@dataclass(frozen=True, slots=True)
class Execute:
    """Run these accepted calls (in call order). `steerable`: a steer may cut them (a tool round);
    `then_end`: the round finished, the turn ends once they are observed (`end(result)`)."""

    calls: list[AcceptedCall]
    steerable: bool
    then_end: bool


@dataclass(frozen=True, slots=True)
class Decide:
    """Decide again: a retry, or the finalize round after a steer."""


@dataclass(frozen=True, slots=True)
class SteerCut:
    """A steer cut the round's stream: these announced calls observe `steered`; `then_end`: an answer
    streamed and is kept (`end(result)`), else the turn finalizes (docs/design.md#steer)."""

    calls: list[AcceptedCall]
    then_end: bool


Plan = End | Execute | Decide


class Consent(StrEnum):
    """The user's consent to a call: the answer to an approval request (docs/design.md#execute-confirmation)."""

    APPROVED = "approved"
    APPROVED_ALL = "approved_all"   # this call and the rest of the turn's
    DENIED = "denied"
    TIMEOUT = "timeout"

    @property
    def runs(self) -> bool:
        return self in (Consent.APPROVED, Consent.APPROVED_ALL)


# The options an approval request offers, and what each one decides.
APPROVE: Final = "Approve"
DENY: Final = "Deny"
APPROVE_ALL: Final = "Approve all"
APPROVAL_OPTIONS: Final = (APPROVE, DENY, APPROVE_ALL)
APPROVAL_ANSWERS: Final[Mapping[str, Consent]] = {
    APPROVE: Consent.APPROVED, DENY: Consent.DENIED, APPROVE_ALL: Consent.APPROVED_ALL,
}
DENIED_BY_USER: Final = "denied_by_user"


class Budget(StrEnum):
    """What an answer to the exploration-budget question does (docs/design.md#exploration-budget)."""

    RESET = "reset"   # "Continue exploring": the tool pool's counter starts again
    STOP = "stop"     # anything else: no more exploration this turn


# -- the machine --------------------------------------------------------------------------------------------


class TurnMachine:
    """One turn's rules over its `TurnProgress`. `states`: the profile's states, which a transition
    may move to (docs/design.md#states)."""

    __slots__ = ("policies", "progress", "states")

    def __init__(self, progress: TurnProgress, policies: Policies, states: Collection[str]) -> None:
        self.progress = progress
        self.policies = policies
        self.states = states
        progress.phase = RESUME_PHASE[progress.phase]

    @property
    def phase(self) -> Phase:
        return self.progress.phase

    @property
    def round_no(self) -> int:
        return self.progress.round_no

    def _move(self, move: Move) -> None:
        self.progress.phase = transition(self.progress.phase, move)

    # -- deciding -------------------------------------------------------------------------------

    def start_round(self) -> int | End:
        """The next round's number, or the end `max_iterations` makes (docs/design.md#limits)."""
        p = self.progress
        if p.round_no >= self.policies.max_iterations:
            return End(EndReason.ITERATION_LIMIT, GIVE_UP_MESSAGES[EndReason.ITERATION_LIMIT], False,
                       traces=(IterationLimit(turn_id=p.turn_id, rounds=p.round_no),))
        p.round_no += 1
        return p.round_no

    def take_cut(self) -> CutRound | None:
        """The round a crash cut mid-answer, which goes on before anything else (docs/design.md#recovery)."""
        cut, self.progress.cut = self.progress.cut, None
        if cut is not None:
            self.progress.round_no = cut.round_no
        return cut

    @property
    def exploration_cap(self) -> int:
        """The tool pool's cap on exploration calls per turn (docs/design.md#exploration-budget)."""
        return self.policies.exploration_soft_cap

    @property
    def allows_no_tool(self) -> bool:
        """The agent may finish without an observation (`finish_policy = "allow_no_tool"`)."""
        return self.policies.finish_policy == "allow_no_tool"

    @property
    def finish_legal(self) -> bool:
        """docs/design.md#observe-before-finish: an observation first, unless the policy allows none."""
        return self.allows_no_tool or self.progress.observations > 0

    def rules(
        self, catalog: Catalog, *, state: str, mode: Mode, finalize: bool | None = None,
        validate_params: Any = None,
    ) -> RoundRules:
        """The next round's rules from where the turn stands. `finalize` defaults to the phase; replay
        passes the recorded one (a steer during tools is seen only in the next round's phase)."""
        p = self.progress
        finalize = p.phase is Phase.FINALIZE if finalize is None else finalize
        return RoundRules(
            catalog=catalog,
            state=state,
            mode=mode,
            max_actions=self.policies.max_actions_per_round,
            finish_legal=self.finish_legal or finalize,
            finish_illegal_reason=FINISH_ILLEGAL_REASON,
            confirmation_required=p.confirmation_required,
            exploration_stopped=p.exploration_stopped,
            finalize_only=finalize,
            validate_params=validate_params,
        )

    def continuation(self, end: StreamEnd, holds: Holds, *, continuable: bool, continuations: int) -> Then:
        """What follows a round's model stream (`CONTINUATION`)."""
        then = CONTINUATION[end, holds]
        if then is Then.CONTINUE and not (continuable and continuations < self.policies.auto_continue_max):
            return Then.CUT
        return then

    def round_steered(self, result: RoundResult) -> SteerCut:
        """A steer cut the round's stream. What it cut is not the model's doing: announced calls
        observe `steered`, an answer the user saw is kept, never regenerated; otherwise the turn
        finalizes (docs/design.md#steer)."""
        salvaged = result.streamed_state.answer_streamed
        if not salvaged:
            self._move(Move.STEER)
        return SteerCut(result.calls, then_end=salvaged)

    def round_ended(self, result: RoundResult) -> Plan:
        """A round's verdict → what the turn does next (`OUTCOME_MOVES`)."""
        move = OUTCOME_MOVES[result.outcome]
        if move is Move.FINISH:  # neutral calls accepted beside the answer still run, unsteerable
            return Execute(result.calls, steerable=False, then_end=True)
        if move is Move.TOOLS:
            self._move(move)
            return Execute(result.calls, steerable=True, then_end=False)
        # Move.RETRY: decision → decision, never through tool execution. Every retry counts.
        self.progress.retries += 1
        if self.progress.retries > self.policies.max_protocol_retries:
            self._move(Move.GIVE_UP)
            # The round that spent the last retry names the cause: the provider's failure is not the
            # model's mistake, and is never reported as one (guarantee 4, docs/design.md#validation).
            reason = EndReason.PROVIDER_ERROR if result.provider_error is not None else EndReason.PROTOCOL_VIOLATION
            return End(reason, GIVE_UP_MESSAGES[reason], False, error=result.provider_error)
        self._move(move)
        return Decide()

    def steered(self) -> None:
        """A steer cut the tool execution: the turn finalizes (docs/design.md#steer)."""
        self._move(Move.STEER)

    def crash_cut(self, *, answer_shown: bool, raw: str) -> bool:
        """The round after the checkpoint was cut by a crash (docs/design.md#recovery). Returns
        whether it goes on: it does when the user saw part of its answer (rebuilt as `raw`); else
        its announced calls observe `round_interrupted` and the turn decides again after a notice."""
        p = self.progress
        if p.cut is not None:  # the round resumed after a crash was cut again: go on from here
            p.cut = CutRound(p.cut.round_no, raw, p.cut.continuations + 1)
            return True
        p.round_no += 1
        if answer_shown:
            p.cut = CutRound(p.round_no, raw)
            return True
        return False

    # -- tools ------------------------------------------------------------------------------------

    def admit(self, calls: Sequence[AcceptedCall], limit: int | None) -> tuple[list[AcceptedCall], list[AcceptedCall]]:
        """The tool-calls-per-turn backstop (docs/design.md#quotas): (admitted, refused). The refused
        are not run; each observes `quota_exceeded`, and the turn goes on. The count is in the
        checkpoint taken before any tool runs."""
        admitted = admitted_tool_calls(self.progress.tool_calls, len(calls), limit)
        self.progress.tool_calls += admitted
        return list(calls[:admitted]), list(calls[admitted:])

    def executing(self, calls: Sequence[AcceptedCall]) -> tuple[list[ToolCall], list[ToolCall]]:
        """The calls now running, as the checkpoint keeps them; returned in the order they are
        observed: the regular calls as one batch, then each `react.ask_user` (docs/design.md#observations)."""
        self.progress.pending = [PendingCall(c.call.call_id, c.call.tool_id, dict(c.call.params), c.call.code)
                                 for c in calls]
        regular = [c.call for c in calls if c.call.tool_id != ASK_USER_TOOL]
        asks = [c.call for c in calls if c.call.tool_id == ASK_USER_TOOL]
        return regular, asks

    def pending_calls(self, catalog: Catalog) -> list[AcceptedCall]:
        """The batch a crash cut while it ran: re-submitted as it was (durable results answer from the store)."""
        calls: list[AcceptedCall] = []
        for p in self.progress.pending:
            decl = catalog.get(p.tool_id)
            calls.append(AcceptedCall(len(calls), p.as_call(), decl.trait if decl is not None else Trait.UNKNOWN))
        return calls

    def observe(self, call_id: str, obs: Observation | None, decl: ToolDecl | None) -> str | None:
        """One call's observation (None: replay knows nothing of it). Every call gets exactly one
        (docs/design.md#observations). Returns the state a `transitions_state` tool moved to, if its
        result names a profile state (docs/design.md#states)."""
        p = self.progress
        p.observations += 1
        if p.pending:
            p.pending = [c for c in p.pending if c.call_id != call_id]
        if obs is None:
            return None
        if obs.error == BUDGET_REACHED:
            p.confirmation_required = True  # the next tool call must be the budget question
        if obs.ok and decl is not None and decl.transitions_state:
            new = (obs.result or {}).get("state")
            if isinstance(new, str) and new in self.states:
                return new
        return None

    def budget_answer(self, question: str, answer: str | None) -> Budget | None:
        """The answer to an ask_user (None: it timed out). For the budget question, "Continue
        exploring" resets the count; anything else stops exploration for the turn."""
        p = self.progress
        if EXPLORATION_MARKER not in question or not p.confirmation_required:
            return None
        p.confirmation_required = False
        if answer == CONTINUE_EXPLORING:
            return Budget.RESET
        p.exploration_stopped = True
        return Budget.STOP

    # -- execute confirmation (docs/design.md#execute-confirmation) ---------------------------------

    def needs_approval(self, call_id: str, decl: ToolDecl | None) -> bool:
        """A call of a `confirm` tool waits for the user, unless they approved all for this turn or
        already decided on this very call (a batch a crash cut is resumed with its decisions)."""
        p = self.progress
        return decl is not None and decl.confirm and not p.approve_all and call_id not in p.approvals

    def decide(self, call_id: str, answer: str | None) -> Consent:
        """The user's answer (None: none came in time) to the approval of `call_id`. Anything but an
        offered approval denies: a call runs only on a yes."""
        consent = Consent.TIMEOUT if answer is None else APPROVAL_ANSWERS.get(answer, Consent.DENIED)
        self.consented(call_id, consent)
        return consent

    def consented(self, call_id: str, consent: Consent) -> None:
        """Record the user's consent to `call_id` (replay passes the recorded one)."""
        self.progress.approvals[call_id] = consent.value
        if consent is Consent.APPROVED_ALL:
            self.progress.approve_all = True

    def may_run(self, call_id: str, decl: ToolDecl | None) -> bool:
        """Whether a call may run now: no approval needed, or one given."""
        if decl is None or not decl.confirm:
            return True
        decided = self.progress.approvals.get(call_id)
        return Consent(decided).runs if decided is not None else self.progress.approve_all

    def observed(self) -> None:
        """The round's calls are all observed: decide again."""
        if self.progress.phase is Phase.TOOL_EXECUTION:
            self._move(Move.OBSERVED)

    # -- ending -----------------------------------------------------------------------------------

    def end(self, result: RoundResult) -> End:
        """The round finished (or salvaged) the turn. finish_ok is true only for a legal finish
        (docs/design.md#observe-before-finish); an unobserved one is flagged."""
        p = self.progress
        self._move(Move.FINISH)
        legal = self.finish_legal
        if result.outcome is RoundOutcome.SALVAGE or result.final is None:
            answer = result.answer_text
            trace = Salvaged(turn_id=p.turn_id, round=p.round_no, answer_chars=len(answer), partial=result.partial)
            return End(EndReason.SALVAGED, answer, legal, partial=result.partial, traces=(trace,))
        final = result.final
        traces: tuple[EventData, ...] = () if p.observations > 0 else (NoToolFinish(turn_id=p.turn_id, round=p.round_no),)
        return End(EndReason(final.type.value), final.final_answer, legal, traces=traces)
