"""One governed round: model deltas in, gated lane output and a verdict out (docs/design.md#round).

Sans-I/O: `RoundEngine.feed(delta)` returns the events a client may see now; `finish()` returns
the round's outcome. The turn drives it from the model stream (`actors/turn.py`); a unit test
drives it from a list of strings; both run the same code.

Data flows one way: delta → prefix policy → channel parser → action decoder → gates → events.
The engine knows the parser only through the events it emits (`protocol/channels.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from actors.catalog import ASK_USER_TOOL, ToolCall, Trait
from actors.gates import (
    CONTINUE_EXPLORING,
    EXPLORATION_MARKER,
    STOP_EXPLORING,
    Candidate,
    Gate,
    GateStatus,
    RoundRules,
    Verdict,
    decide,
)
from protocol.actions import Action, ActionType, CallTool, Finish
from protocol.channels import (
    ActionClosed,
    ActionFailed,
    ActionTyped,
    AnswerText,
    BlockClosed,
    BlockOpened,
    BlockText,
    Channel,
    ChannelParser,
    ChannelViolation,
    ParserEvent,
)
from protocol.deltas import ModelDelta, ModelOutput
from protocol.events import (
    AcceptedAction,
    AnswerDelta,
    DeniedAction,
    Lane,
    RoundCompleted,
    StreamedState,
    ThinkingDelta,
)
from protocol.native import NativeDecoder
from protocol.notices import Notice, NoticeCode
from protocol.prefix import PrefixPolicy

# -- what a client may see, as the round streams -------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolCallReady:
    """An allowed call_tool whose JSON is complete and valid: its `tool.call` may be sent."""

    index: int
    call: ToolCall
    trait: Trait


RoundEvent = ThinkingDelta | AnswerDelta | ToolCallReady

# The violation of a response with nothing to act on, in each decision protocol's terms.
CHANNELS_EMPTY = "a response needs at least one <channel:action> block"
NATIVE_EMPTY = "a response needs an answer or a tool call"

# -- the verdict -----------------------------------------------------------------------------------


class RoundOutcome(StrEnum):
    FINISH = "finish"      # a legal, valid complete/exit: the turn ends with it
    SALVAGE = "salvage"    # an answer streamed, then validation failed: keep exactly what streamed
    TOOLS = "tools"        # valid accepted tool calls to execute
    RETRY = "retry"        # nothing to act on: retry_decision with the notices


@dataclass(frozen=True, slots=True)
class AcceptedCall:
    index: int
    call: ToolCall
    trait: Trait


@dataclass(slots=True)
class RoundResult:
    outcome: RoundOutcome
    thinking: str
    streamed_state: StreamedState
    calls: list[AcceptedCall]
    final: Finish | None
    summary: str | None
    notices: list[Notice]
    accepted: list[AcceptedAction]
    denied: list[DeniedAction]
    preamble_aborted: bool = False
    partial: bool = False          # salvaged from a cut that could not be continued (#continuation)
    provider_error: str | None = None  # the provider failure that cut it ("kind: message", ProviderError.cause)

    @property
    def answer_text(self) -> str:
        return self.streamed_state.answer_text

    def completed(self, turn_id: str, round_no: int, *, steered: bool = False) -> RoundCompleted:
        """The `round.completed` event of this result."""
        return RoundCompleted(
            turn_id=turn_id, round=round_no, streamed_state=self.streamed_state, accepted=self.accepted,
            denied=self.denied, notices=self.notices, steered=steered,
        )


def interrupted_round(turn_id: str, round_no: int, notice: Notice) -> RoundCompleted:
    """`round.completed` for a round a crash cut before it could finish (docs/design.md#recovery)."""
    return RoundCompleted(
        turn_id=turn_id, round=round_no, streamed_state=StreamedState(False, "", []), accepted=[], denied=[],
        notices=[notice], interrupted=True,
    )


def budget_question_problem(rules: RoundRules, tool_id: str, params: Mapping[str, Any]) -> Notice | None:
    """While the exploration budget awaits confirmation, the one call allowed is the budget question,
    well formed (docs/design.md#exploration-budget): checked once its params are known. A round's
    engine and the MCP face (actors/external_call.py) ask the same question here."""
    if not (rules.confirmation_required and tool_id == ASK_USER_TOOL):
        return None
    question = str(params.get("question", ""))
    options = params.get("options") or []
    if EXPLORATION_MARKER in question and list(options) == [CONTINUE_EXPLORING, STOP_EXPLORING]:
        return None
    return Notice(
        code=NoticeCode.CONFIRMATION_REQUIRED,
        message=(
            f"the budget question must contain {EXPLORATION_MARKER} and offer exactly the options "
            f"{CONTINUE_EXPLORING!r} and {STOP_EXPLORING!r}"
        ),
        tool_id=ASK_USER_TOOL,
    )


class RoundEngine:
    """Governs one round. Feed it raw deltas (any size); then `finish()`."""

    def __init__(self, rules: RoundRules, *, turn_id: str, round_no: int, native: NativeDecoder | None = None) -> None:
        self.rules = rules
        self.turn_id = turn_id
        self.round_no = round_no
        self._prefix = PrefixPolicy()
        self._parser = ChannelParser()
        self._native = native                           # the native decoder, in a native round (docs/design.md#native)
        self._deltas: list[ModelOutput] = []            # ... and what it was fed
        self._gates: list[Gate] = []
        self._accepted: list[Candidate] = []
        self._answers: dict[int, list[str]] = {}        # index → every decoded final_answer piece
        self._closed: dict[int, tuple[Action | None, tuple[str, ...]]] = {}  # index → its verdict
        self._ready: dict[int, AcceptedCall] = {}       # index → announced tool call
        self._awaiting_code: list[int] = []             # uses_code calls waiting for the code block
        self._invalid: dict[int, Notice] = {}           # index → why an allowed action cannot run
        self._failed: set[int] = set()                  # actions that can no longer be valid
        self._cut_action: int | None = None             # the action block the stream ended inside
        self._violations: list[str] = []                # channel-level
        self._texts: dict[Channel, list[str]] = {Channel.THINKING: [], Channel.CODE: [], Channel.SUMMARY: []}
        self._raw: list[str] = []
        self.aborted = False
        self.finished = False

    # -- live ----------------------------------------------------------------------------------

    def feed(self, delta: str) -> list[RoundEvent]:
        if self.aborted or self.finished:
            return []
        self._raw.append(delta)
        if not self._prefix.admit(delta):
            self.aborted = True  # the driver closes the provider stream
            return []
        out: list[RoundEvent] = []
        for event in self._parser.feed(delta):
            self._on(event, out)
        return out

    def feed_delta(self, delta: ModelOutput) -> list[RoundEvent]:
        """A typed model delta: the channel protocol reads its text; a native round reads all of it."""
        native = self._native
        if native is None:
            return self.feed(delta.text) if type(delta) is ModelDelta else []  # type: ignore[union-attr]
        if self.finished:
            return []
        self._deltas.append(delta)
        if type(delta) is ModelDelta:
            self._raw.append(delta.text)  # type: ignore[union-attr]
        out: list[RoundEvent] = []
        for event in native.feed(delta):
            self._on(event, out)
        return out

    @property
    def native(self) -> bool:
        return self._native is not None

    @property
    def has_output(self) -> bool:
        """The model wrote something this round: text, reasoning or a call."""
        return bool(self._raw) or bool(self._deltas)

    def raw_text(self) -> str:
        """What the model wrote so far (natively: its content) — only ever shown to a model after a
        steer (docs/design.md#steer) or to be continued."""
        return "".join(self._raw)

    def native_calls(self) -> Mapping[int, str]:
        """A native round's calls, refused ones included: action index → tool id."""
        return self._native.calls if self._native is not None else {}

    def raw_deltas(self) -> list[ModelOutput]:
        """A native round's output as the deltas it came in (docs/design.md#replay)."""
        return list(self._deltas)

    def answer_text(self) -> str:
        """The answer characters the user has seen so far in this round."""
        return "".join(
            "".join(self._answers.get(g.index, ()))[: g.emitted_chars] for g in self._gates if g.shows_answer
        )

    @property
    def answer_streamed(self) -> bool:
        return any(g.shows_answer and g.emitted_chars > 0 for g in self._gates)

    @property
    def continuable(self) -> bool:
        """A `length` cut-off may be continued only while the text is still a valid prefix; a native
        round only while its answer streams, with no call half-received (docs/design.md#native)."""
        native = self._native
        if native is not None and (not native.answer_open or native.calls_open):
            return False
        return not self.aborted and not self._violations and not self._invalid and not self._failed

    def _on(self, event: ParserEvent, out: list[RoundEvent]) -> None:
        # Dispatch on the parser's event kinds; each branch protects one rule of docs/design.md#gates.
        kind = type(event)
        if kind is AnswerText:
            assert isinstance(event, AnswerText)
            self._answers.setdefault(event.index, []).append(event.text)
            text = self._gates[event.index].pass_answer(event.text)
            if text:
                out.append(AnswerDelta(turn_id=self.turn_id, round=self.round_no, text=text))
        elif kind is BlockText:
            assert isinstance(event, BlockText)
            self._texts[event.channel].append(event.text)
            if event.channel is Channel.THINKING:  # the thinking lane is always allowed
                out.append(ThinkingDelta(turn_id=self.turn_id, round=self.round_no, text=event.text))
        elif kind is ActionTyped:
            assert isinstance(event, ActionTyped)
            self._decide(event, out)
        elif kind is BlockOpened:
            assert isinstance(event, BlockOpened)
            if event.channel is Channel.ACTION:
                gate = Gate(event.index)
                self._gates.append(gate)
                if event.index >= self.rules.max_actions:  # rule 1 needs nothing but the index
                    gate.settle(decide(Candidate(event.index, ActionType.CALL_TOOL), self._accepted, self.rules), None)
        elif kind is ActionClosed:
            assert isinstance(event, ActionClosed)
            self._closed[event.index] = (event.action, event.violations)
            if event.cut:
                self._cut_action = event.index
                if self._gates[event.index].status is not GateStatus.PENDING:
                    return  # a block the stream ended inside never runs: every block must close
            self._action_closed(event.index, out, event.code)
        elif kind is BlockClosed:
            assert isinstance(event, BlockClosed)
            if event.channel is Channel.CODE:
                self._code_closed(out)
        elif kind is ActionFailed:
            assert isinstance(event, ActionFailed)
            self._failed.add(event.index)
        elif kind is ChannelViolation:
            assert isinstance(event, ChannelViolation)
            self._violations.append(event.message)

    def _decide(self, typed: ActionTyped, out: list[RoundEvent]) -> None:
        gate = self._gates[typed.index]
        if gate.status is not GateStatus.PENDING:
            return
        decl = self.rules.catalog.get(typed.tool_id or "")
        candidate = Candidate(
            typed.index, typed.action, typed.tool_id, decl.trait if decl is not None else Trait.UNKNOWN,
        )
        verdict = decide(candidate, self._accepted, self.rules)
        released = gate.settle(verdict, candidate)
        if verdict.allowed:
            self._accepted.append(candidate)
        if released:
            out.append(AnswerDelta(turn_id=self.turn_id, round=self.round_no, text=released))

    def _action_closed(self, index: int, out: list[RoundEvent], code: str | None = None) -> None:
        gate = self._gates[index]
        action, violations = self._closed[index]
        if gate.status is GateStatus.PENDING:
            # Never typed: the JSON never said what it was. Shut it; nothing was shown.
            gate.settle(Verdict(False, NoticeCode.SCHEMA, "the action is not valid"), None)
            self._invalid[index] = Notice(
                code=NoticeCode.SCHEMA, message=f"action {index} is not a valid action",
                index=index, violations=violations or ("the action type is missing",),
            )
            return
        if gate.status is GateStatus.DENIED:
            return
        if action is None:
            tool_id = gate.candidate.tool_id if gate.candidate else None
            if code == NoticeCode.TOOL_CALL_INVALID:  # a native call whose arguments are not an object
                self._invalid[index] = Notice(
                    code=NoticeCode.TOOL_CALL_INVALID, message=f"the call to {tool_id} was not run: its arguments are invalid",
                    index=index, tool_id=tool_id, violations=violations,
                )
                return
            self._invalid[index] = Notice(
                code=NoticeCode.SCHEMA, message=f"action {index} does not match the action schema",
                index=index, tool_id=tool_id, violations=violations,
            )
            return
        if isinstance(action, CallTool):
            self._tool_call_closed(index, action, gate, out)

    def _tool_call_closed(self, index: int, action: CallTool, gate: Gate, out: list[RoundEvent]) -> None:
        problems = self._params_problems(action.tool_id, action.params)
        if problems:
            self._invalid[index] = Notice(
                code=NoticeCode.TOOL_CALL_INVALID,
                message=f"the call to {action.tool_id} was not run: its parameters are invalid",
                index=index, tool_id=action.tool_id, violations=tuple(problems),
            )
            return
        confirmation = self._confirmation_problem(action)
        if confirmation:
            self._invalid[index] = confirmation
            return
        assert gate.candidate is not None
        call_id = f"{self.turn_id}.{self.round_no}.{index}"
        call = AcceptedCall(index, ToolCall(call_id, action.tool_id, action.params), gate.candidate.trait)
        self._ready[index] = call
        decl = self.rules.catalog.get(action.tool_id)
        if decl is not None and decl.uses_code:
            self._awaiting_code.append(index)  # its tool.call waits for the code block
            return
        out.append(ToolCallReady(index, call.call, call.trait))

    def _params_problems(self, tool_id: str, params: Mapping[str, Any]) -> list[str]:
        validate = self.rules.validate_params
        return validate(tool_id, params) if validate is not None else []

    def _confirmation_problem(self, action: CallTool) -> Notice | None:
        return budget_question_problem(self.rules, action.tool_id, action.params)

    def _code_closed(self, out: list[RoundEvent]) -> None:
        if self._awaiting_code:
            index = self._awaiting_code.pop(0)
            ready = self._ready[index]
            code = "".join(self._texts[Channel.CODE])
            call = ToolCall(ready.call.call_id, ready.call.tool_id, ready.call.params, code)
            self._ready[index] = AcceptedCall(index, call, ready.trait)
            out.append(ToolCallReady(index, call, ready.trait))

    # -- the verdict ------------------------------------------------------------------------------

    def finish(self, *, cut: Notice | None = None, interrupted: bool = False) -> tuple[list[RoundEvent], RoundResult]:
        """End of the stream. `cut` says why it ended early (provider error, crash), if it did;
        `interrupted`: it was stopped on purpose (a steer), which the timeline records itself."""
        stopped = interrupted or cut is not None
        self.finished = True
        out: list[RoundEvent] = []
        if self.aborted:
            notice = Notice(
                code=NoticeCode.PREAMBLE,
                message="the response must start with <channel:thinking>; it was stopped at the first "
                "character that made that impossible. It began: " + repr(self._prefix.preview()),
            )
            return out, self._result(RoundOutcome.RETRY, [notice], preamble=True)
        # What a cut (provider error, crash) leaves unfinished is not the model's mistake: the
        # violations it causes are dropped, the cut notice says what happened (guarantee 4,
        # docs/design.md#guarantees).
        written_violations = len(self._violations)
        tail = self._parser.finish() if self._native is None else self._native.finish(stopped=stopped)
        for event in tail:
            self._on(event, out)
        if stopped:
            del self._violations[written_violations:]
        for index in self._awaiting_code:
            ready = self._ready.pop(index)
            self._invalid[index] = Notice(
                code=NoticeCode.CHANNELS,
                message=f"the call at index {index} needs a <channel:code> block; it was not run",
                index=index, tool_id=ready.call.tool_id,
            )
        self._awaiting_code.clear()
        notices, valid = self._notices(cut, self._cut_action if stopped else None, stopped=stopped)
        final_gate = next((g for g in self._gates if g.shows_answer), None)
        final_action = self._closed[final_gate.index][0] if final_gate is not None else None
        if valid and isinstance(final_action, Finish):
            return out, self._result(RoundOutcome.FINISH, notices, final=final_action)
        if self.answer_streamed:
            return out, self._result(RoundOutcome.SALVAGE, notices)
        if self._ready:
            return out, self._result(RoundOutcome.TOOLS, notices)
        return out, self._result(RoundOutcome.RETRY, notices)

    def _notices(
        self, cut: Notice | None, cut_action: int | None = None, *, stopped: bool = False
    ) -> tuple[list[Notice], bool]:
        """The round's notices, and whether it passed post-stream validation (docs/design.md#validation):
        every block closed, every action's JSON complete and schema-valid, channels consistent. A
        gate's denial is a notice but not a validation failure."""
        notices: list[Notice] = []
        for gate in self._gates:
            if gate.index == cut_action and verdict_code(gate) in (None, NoticeCode.SCHEMA):
                continue  # the action the cut left unfinished: only a rule's denial is worth saying
            verdict = gate.verdict
            if gate.status is GateStatus.DENIED and gate.index not in self._invalid and verdict and verdict.code:
                notices.append(
                    Notice(
                        code=verdict.code, message=verdict.message, index=gate.index,
                        tool_id=gate.candidate.tool_id if gate.candidate else None,
                    )
                )
            if gate.index in self._invalid:
                notices.append(self._invalid[gate.index])
        violations = list(dict.fromkeys(self._violations))
        if not self._gates and not self._violations and not stopped:
            violations.append(NATIVE_EMPTY if self._native is not None else CHANNELS_EMPTY)
        if self._texts[Channel.CODE] and not any(
            (decl := self.rules.catalog.get(c.call.tool_id)) is not None and decl.uses_code
            for c in self._ready.values()
        ):
            violations.append("a <channel:code> block is only allowed with a tool that uses code")
        if self._texts[Channel.SUMMARY] and not any(g.shows_answer for g in self._gates):
            violations.append("a <channel:summary> block is only allowed with complete or exit")
        if violations:
            notices.append(
                Notice(
                    code=NoticeCode.CHANNELS, message="the response's channel blocks are not well-formed",
                    violations=tuple(violations),
                )
            )
        if cut is not None:
            notices.append(cut)
        valid = (
            not violations
            and not stopped
            and not self._invalid
            and all(action is not None for action, _ in self._closed.values())
        )
        return notices, valid

    def _result(self, outcome: RoundOutcome, notices: list[Notice], *, final: Finish | None = None,
                preamble: bool = False) -> RoundResult:
        answer_text = self.answer_text()
        lanes = [Lane(g.index, _lane_name(g), str(g.status), g.emitted_chars) for g in self._gates]
        accepted = [AcceptedAction(c.index, str(c.action), c.tool_id) for c in self._accepted]
        denied = [
            DeniedAction(g.index, verdict_code(g), g.candidate.tool_id if g.candidate else None)
            for g in self._gates
            if g.status is GateStatus.DENIED
        ]
        summary = self._texts[Channel.SUMMARY]
        return RoundResult(
            outcome=outcome,
            thinking="" if preamble else "".join(self._texts[Channel.THINKING]),
            streamed_state=StreamedState(self.answer_streamed, answer_text, lanes),
            calls=[self._ready[i] for i in sorted(self._ready)] if outcome is not RoundOutcome.RETRY else [],
            final=final,
            summary="".join(summary) if summary else None,
            notices=notices,
            accepted=accepted,
            denied=denied,
            preamble_aborted=preamble,
        )


def verdict_code(gate: Gate) -> NoticeCode | None:
    return gate.verdict.code if gate.status is GateStatus.DENIED and gate.verdict is not None else None


def _lane_name(gate: Gate) -> str:
    if gate.candidate is None:
        return "unknown"
    return "answer" if gate.candidate.action.is_final else "tool"
