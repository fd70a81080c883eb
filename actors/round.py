"""One governed round: model deltas in, gated lane output and a verdict out (SPEC §2–§3).

Sans-I/O: `RoundEngine.feed(delta)` returns the events a client may see now; `finish()` returns
the round's outcome. `run_round` is the thin async shell that drives it from any async iterator
of string deltas, so a unit test, the local backend and a Ray actor run the same code.

Data flows one way: delta → prefix policy → channel parser → action decoder → gates → events.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
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
from protocol.actions import ActionType, CallTool, Finish
from protocol.channels import (
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
from protocol.notices import Notice, NoticeCode
from protocol.prefix import PrefixPolicy

# -- what a client may see, as the round streams -------------------------------------------------


@dataclass(frozen=True, slots=True)
class ThinkingDelta:
    text: str


@dataclass(frozen=True, slots=True)
class AnswerDelta:
    index: int
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallReady:
    """An allowed call_tool whose JSON is complete and valid: its `tool.call` may be sent."""

    index: int
    call: ToolCall
    trait: Trait


RoundEvent = ThinkingDelta | AnswerDelta | ToolCallReady


# -- the verdict -----------------------------------------------------------------------------------


class Outcome(StrEnum):
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
    outcome: Outcome
    thinking: str
    streamed_state: dict[str, Any]
    calls: list[AcceptedCall]
    final: Finish | None
    summary: str | None
    notices: list[Notice]
    accepted: list[dict[str, Any]]
    denied: list[dict[str, Any]]
    preamble_aborted: bool = False

    @property
    def answer_text(self) -> str:
        return str(self.streamed_state["answer_text"])


class RoundEngine:
    """Governs one round. Feed it raw deltas (any size); then `finish()`."""

    def __init__(self, rules: RoundRules, *, call_id_prefix: str) -> None:
        self.rules = rules
        self._call_id_prefix = call_id_prefix
        self._prefix = PrefixPolicy()
        self._parser = ChannelParser()
        self._gates: list[Gate] = []
        self._accepted: list[Candidate] = []
        self._ready: dict[int, AcceptedCall] = {}       # index → announced tool call
        self._awaiting_code: list[int] = []             # uses_code calls waiting for the code block
        self._invalid: dict[int, Notice] = {}           # index → why an allowed action cannot run
        self._violations: list[str] = []                # channel-level
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

    def raw_text(self) -> str:
        """What the model wrote so far — only ever shown to a model after a steer (SPEC §4.9)."""
        return "".join(self._raw)

    @property
    def answer_streamed(self) -> bool:
        return any(g.shows_answer and g.emitted_chars > 0 for g in self._gates)

    @property
    def continuable(self) -> bool:
        """A `length` cut-off may be continued only while the text is still a valid prefix."""
        return (
            not self.aborted
            and not self._violations
            and not self._invalid
            and not any(d.failed for d in self._parser.actions)
        )

    def _on(self, event: ParserEvent, out: list[RoundEvent]) -> None:
        # Dispatch on the parser's event kinds; each branch protects one rule of SPEC §3.1.
        if type(event) is AnswerText:
            text = self._gates[event.index].pass_answer(event.text)
            if text:
                out.append(AnswerDelta(event.index, text))
        elif type(event) is BlockText:
            if event.channel is Channel.THINKING:
                out.append(ThinkingDelta(event.text))  # the thinking lane is always allowed
        elif type(event) is ActionTyped:
            self._decide(event.index, out)
        elif type(event) is BlockOpened:
            if event.channel is Channel.ACTION:
                gate = Gate(event.index)
                self._gates.append(gate)
                if event.index >= self.rules.max_actions:  # rule 1 needs nothing but the index
                    verdict = decide(Candidate(event.index, ActionType.CALL_TOOL), self._accepted, self.rules)
                    gate.settle(verdict, None)
        elif type(event) is BlockClosed:
            if event.channel is Channel.ACTION:
                self._action_closed(event.index, out)
            elif event.channel is Channel.CODE:
                self._code_closed(out)
        elif type(event) is ChannelViolation:
            self._violations.append(event.message)

    def _decide(self, index: int, out: list[RoundEvent]) -> None:
        gate = self._gates[index]
        if gate.status is not GateStatus.PENDING:
            return
        decoder = self._parser.actions[index]
        assert decoder.action_type is not None
        decl = self.rules.catalog.get(decoder.tool_id or "")
        candidate = Candidate(
            index,
            decoder.action_type,
            decoder.tool_id,
            decl.trait if decl is not None else Trait.UNKNOWN,
        )
        verdict = decide(candidate, self._accepted, self.rules)
        released = gate.settle(verdict, candidate)
        if verdict.allowed:
            self._accepted.append(candidate)
        if released:
            out.append(AnswerDelta(index, released))

    def _action_closed(self, index: int, out: list[RoundEvent]) -> None:
        gate = self._gates[index]
        action, violations = self._parser.actions[index].result()
        if gate.status is GateStatus.PENDING:
            # Never typed: the JSON never said what it was. Shut it; nothing was shown.
            gate.settle(Verdict(False, NoticeCode.SCHEMA, "the action is not valid"), None)
            self._invalid[index] = Notice(
                code=NoticeCode.SCHEMA, message=f"action {index} is not a valid action",
                index=index, violations=tuple(violations or ["the action type is missing"]),
            )
            return
        if gate.status is GateStatus.DENIED:
            return
        if action is None:
            self._invalid[index] = Notice(
                code=NoticeCode.SCHEMA, message=f"action {index} does not match the action schema",
                index=index, tool_id=gate.candidate.tool_id if gate.candidate else None,
                violations=tuple(violations),
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
        call = AcceptedCall(index, ToolCall(f"{self._call_id_prefix}{index}", action.tool_id, action.params), gate.candidate.trait)
        decl = self.rules.catalog.get(action.tool_id)
        if decl is not None and decl.uses_code:
            self._awaiting_code.append(index)  # its tool.call waits for the code block
            self._ready[index] = call
            return
        self._ready[index] = call
        out.append(ToolCallReady(index, call.call, call.trait))

    def _params_problems(self, tool_id: str, params: Mapping[str, Any]) -> list[str]:
        validate = self.rules.validate_params
        return validate(tool_id, params) if validate is not None else []

    def _confirmation_problem(self, action: CallTool) -> Notice | None:
        if not (self.rules.confirmation_required and action.tool_id == ASK_USER_TOOL):
            return None
        question = str(action.params.get("question", ""))
        options = action.params.get("options") or []
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

    def _code_closed(self, out: list[RoundEvent]) -> None:
        code = "".join(self._parser.code)
        if self._awaiting_code:
            index = self._awaiting_code.pop(0)
            ready = self._ready[index]
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
            return out, self._result(Outcome.RETRY, [notice], preamble=True)
        # What a cut (provider error, crash) leaves unfinished is not the model's mistake: the
        # violations it causes are dropped, the cut notice says what happened (guarantee 4).
        written_violations = len(self._violations)
        cut_action = len(self._parser.actions) - 1 if self._parser.open_block == Channel.ACTION else None
        for event in self._parser.finish():
            self._on(event, out)
        if stopped:
            del self._violations[written_violations:]
        for index in self._awaiting_code:
            self._ready.pop(index)
            self._invalid[index] = Notice(
                code=NoticeCode.CHANNELS,
                message=f"the call at index {index} needs a <channel:code> block; it was not run",
                index=index, tool_id=self._parser.actions[index].tool_id,
            )
        self._awaiting_code.clear()
        for gate in self._gates:  # still pending at the end: never typed, never shown
            if gate.status is GateStatus.PENDING:
                self._action_closed(gate.index, out)
        notices, valid = self._notices(cut, cut_action if stopped else None, stopped=stopped)
        final_gate = next((g for g in self._gates if g.shows_answer), None)
        final_action = self._parser.actions[final_gate.index].result()[0] if final_gate else None
        if final_gate is not None and valid and isinstance(final_action, Finish):
            return out, self._result(Outcome.FINISH, notices, final=final_action)  # type: ignore[arg-type]
        if self.answer_streamed:
            return out, self._result(Outcome.SALVAGE, notices)
        if self._ready:
            return out, self._result(Outcome.TOOLS, notices)
        return out, self._result(Outcome.RETRY, notices)

    def _notices(
        self, cut: Notice | None, cut_action: int | None = None, *, stopped: bool = False
    ) -> tuple[list[Notice], bool]:
        """The round's notices, and whether it passed post-stream validation (SPEC §3.4): every
        block closed, every action's JSON complete and schema-valid, channels consistent. A gate's
        denial is a notice but not a validation failure."""
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
            violations.append("a response needs at least one <channel:action> block")
        if self._parser.code and not any(
            (decl := self.rules.catalog.get(c.call.tool_id)) is not None and decl.uses_code
            for c in self._ready.values()
        ):
            violations.append("a <channel:code> block is only allowed with a tool that uses code")
        if self._parser.summary and not any(g.shows_answer for g in self._gates):
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
            and all(d.result()[0] is not None for d in self._parser.actions)
        )
        return notices, valid

    def _result(self, outcome: Outcome, notices: list[Notice], *, final: Finish | None = None,
                preamble: bool = False) -> RoundResult:
        answer_text = "".join(
            self._parser.actions[g.index].answer_so_far()[: g.emitted_chars] for g in self._gates if g.shows_answer
        )
        lanes = [
            {
                "index": g.index,
                "lane": _lane_name(g),
                "status": str(g.status),
                "emitted_chars": g.emitted_chars,
            }
            for g in self._gates
        ]
        accepted = [
            {"index": c.index, "action": str(c.action), **({"tool_id": c.tool_id} if c.tool_id else {})}
            for c in self._accepted
        ]
        denied = [
            {
                "index": g.index,
                "code": str(g.verdict.code) if g.verdict and g.verdict.code else None,
                **({"tool_id": g.candidate.tool_id} if g.candidate and g.candidate.tool_id else {}),
            }
            for g in self._gates
            if g.status is GateStatus.DENIED
        ]
        summary = "".join(self._parser.summary) if self._parser.summary else None
        return RoundResult(
            outcome=outcome,
            thinking="" if preamble else "".join(self._parser.thinking),
            streamed_state={
                "answer_streamed": self.answer_streamed,
                "answer_text": answer_text,
                "lanes": lanes,
            },
            calls=[self._ready[i] for i in sorted(self._ready)] if outcome is not Outcome.RETRY else [],
            final=final,
            summary=summary,
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


async def run_round(
    deltas: AsyncIterator[str],
    engine: RoundEngine,
    emit: Callable[[RoundEvent], None],
) -> RoundResult:
    """Drive an engine from a delta stream; stops reading (and closes the stream) on a preamble abort."""
    try:
        async for delta in deltas:
            for event in engine.feed(delta):
                emit(event)
            if engine.aborted:
                break
    finally:
        aclose = getattr(deltas, "aclose", None)
        if aclose is not None:
            await aclose()
    events, result = engine.finish()
    for event in events:
        emit(event)
    return result
