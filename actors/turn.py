"""The turn: the loop of rounds between a user message and its final answer (SPEC §4).

The phases and their transitions are a table (`TRANSITIONS`); `Turn.run` walks it. A round's
verdict picks the transition: tools → tool_execution → decision; retry → decision
(`retry_decision`, never through tool execution); finish or salvage → exit. A steer moves any
phase to `finalize`, one decision in which only complete/exit are available.
"""

from __future__ import annotations

import asyncio
import contextlib
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final

import msgspec

from actors.catalog import ASK_USER_TOOL, Observation, ToolCall, Trait
from actors.context import Step, assemble, ledger_summary, params_digest, system_prompt
from actors.gates import CONTINUE_EXPLORING, EXPLORATION_MARKER, RoundRules
from actors.llm.stream import ModelDelta, ModelFallback, ModelFinished, ProviderError
from actors.round import (
    AcceptedCall,
    AnswerDelta,
    Outcome,
    RoundEngine,
    RoundEvent,
    RoundResult,
    ThinkingDelta,
    ToolCallReady,
)
from protocol.notices import Notice, NoticeCode
from protocol.timeline import (
    FinalBlock,
    NoticeBlock,
    SteerBlock,
    SummaryBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultBlock,
    UserMessageBlock,
)

if TYPE_CHECKING:
    from actors.conversation import Conversation


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


# (phase, step) → next phase. Anything else is a bug, reported with both names.
TRANSITIONS: Final[dict[tuple[Phase, Move], Phase]] = {
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


def transition(phase: Phase, step: Move) -> Phase:
    try:
        return TRANSITIONS[phase, step]
    except KeyError:
        raise RuntimeError(f"illegal turn transition: {step} in phase {phase}") from None


CONTINUE_PROMPT: Final = (
    "[continue] Your previous response was cut at the length limit. Continue exactly where it stopped, "
    "without repeating anything."
)
GIVE_UP_MESSAGES: Final = {
    "protocol_violation": "Sorry — I could not produce a valid response this time. Please try again.",
    "iteration_limit": "Sorry — I reached my step limit for this request before finishing.",
    "error": "Sorry — something went wrong on our side.",
}


class _Steered(Exception):
    pass


class PendingCall(msgspec.Struct, frozen=True):
    call_id: str
    tool_id: str
    params: dict[str, Any]
    code: str | None = None


class TurnProgress(msgspec.Struct, kw_only=True):
    """A running turn as the snapshot keeps it, so a re-activation elsewhere resumes it (SPEC §5 Faults)."""

    turn_id: str
    message_id: str
    text: str
    phase: str = "decision"
    round_no: int = 0
    retries: int = 0
    observations: int = 0
    confirmation_required: bool = False
    exploration_stopped: bool = False
    pending: list[PendingCall] = msgspec.field(default_factory=list)  # calls being executed


class Turn:
    """One turn of one conversation. The conversation is its single writer's state."""

    def __init__(self, conv: Conversation, turn_id: str, message_id: str, text: str) -> None:
        self.conv = conv
        self.turn_id = turn_id
        self.message_id = message_id
        self.text = text
        self.phase = Phase.DECISION
        self.round_no = 0
        self.retries = 0
        self.observations = 0
        self.confirmation_required = False
        self.exploration_stopped = False
        self._steer_text: str | None = None
        self._inner: asyncio.Task[Any] | None = None
        self._events: list[dict[str, Any]] = []  # this turn's events, for trace evidence
        self._unobserved: dict[str, ToolCall] = {}  # announced calls still owed an observation (§4.2)
        self.pending: list[PendingCall] = []
        self.cancelled_by_user = False

    def progress(self) -> TurnProgress:
        return TurnProgress(
            turn_id=self.turn_id, message_id=self.message_id, text=self.text, phase=str(self.phase),
            round_no=self.round_no, retries=self.retries, observations=self.observations,
            confirmation_required=self.confirmation_required, exploration_stopped=self.exploration_stopped,
            pending=list(self.pending),
        )

    @classmethod
    def resume(cls, conv: Conversation, p: TurnProgress) -> Turn:
        """A turn cut by a crash, continued from its checkpoint (recovery has applied the log tail)."""
        turn = cls(conv, p.turn_id, p.message_id, p.text)
        turn.phase = Phase(p.phase) if p.phase != str(Phase.TOOL_EXECUTION) else Phase.DECISION
        turn.round_no, turn.retries, turn.observations = p.round_no, p.retries, p.observations
        turn.confirmation_required, turn.exploration_stopped = p.confirmation_required, p.exploration_stopped
        turn.pending = list(p.pending)
        return turn

    # -- control from the mailbox -----------------------------------------------------------------

    def steer(self, text: str) -> None:
        """Cancel the in-flight generation or tool wait; the next decision finalizes (SPEC §4.9)."""
        if self.phase is Phase.FINALIZE:  # already finalizing: keep the words, interrupt nothing
            self.conv.record(SteerBlock(self.turn_id, text, ""))
            return
        self._steer_text = text
        if self._inner is not None and not self._inner.done():
            self._inner.cancel()

    # -- the loop -----------------------------------------------------------------------------------

    async def run(self, *, resumed: bool = False) -> None:
        conv = self.conv
        if not resumed:
            self._emit("turn.started", {"turn_id": self.turn_id, "user_message_id": self.message_id})
            conv.record(UserMessageBlock(self.turn_id, self.message_id, self.text))
            await conv.tools.reset_exploration(conv.conversation_id)
            conv.checkpoint()
        try:
            if resumed and self.pending:  # the batch a crash cut: durable results are not re-run
                await self._resume_pending()
            reason, answer, finish_ok = await self._loop()
        except asyncio.CancelledError:
            if self.cancelled_by_user:  # a host shutting down leaves the turn to its checkpoint
                self._observe_cancelled()
                self._complete("cancelled", "", finish_ok=False)
            raise
        except Exception:
            conv.log_exception("turn failed")
            reason, answer, finish_ok = "error", GIVE_UP_MESSAGES["error"], False
        self._complete(reason, answer, finish_ok=finish_ok)

    async def _loop(self) -> tuple[str, str, bool]:
        pol = self.conv.policies
        while True:
            if self.round_no >= pol.max_iterations:
                self._emit("trace", {"kind": "iteration_limit", "turn_id": self.turn_id, "rounds": self.round_no})
                return "iteration_limit", GIVE_UP_MESSAGES["iteration_limit"], False
            self.round_no += 1
            engine = RoundEngine(self._rules(), call_id_prefix=f"{self.turn_id}.{self.round_no}.")
            try:
                result = await self._inner_task(self._generate(engine))
            except _Steered:
                result = self._interrupted(engine)
                if result.outcome is not Outcome.SALVAGE:
                    self.phase = transition(self.phase, Move.STEER)
                    continue
            else:
                self._round_completed(result)
            self.conv.checkpoint()

            if result.outcome is Outcome.FINISH or result.outcome is Outcome.SALVAGE:
                if result.calls:
                    await self._execute(result.calls, allow_steer=False)
                self.phase = transition(self.phase, Move.FINISH)
                return self._finish(result)

            if result.outcome is Outcome.TOOLS:
                self.phase = transition(self.phase, Move.TOOLS)
                try:
                    await self._execute(result.calls, allow_steer=True)
                except _Steered:
                    self.phase = transition(self.phase, Move.STEER)
                    continue
                if self.phase is Phase.TOOL_EXECUTION:
                    self.phase = transition(self.phase, Move.OBSERVED)
                self.conv.checkpoint()
                continue

            # RETRY: decision → decision, never through tool execution.
            self.retries += 1
            if self.retries > pol.max_protocol_retries:
                self.phase = transition(self.phase, Move.GIVE_UP)
                return "protocol_violation", GIVE_UP_MESSAGES["protocol_violation"], False
            self.phase = transition(self.phase, Move.RETRY)

    async def _resume_pending(self) -> None:
        calls: list[AcceptedCall] = []
        for p in self.pending:
            decl = self.conv.catalog.get(p.tool_id)
            trait = decl.trait if decl is not None else Trait.UNKNOWN
            calls.append(AcceptedCall(len(calls), ToolCall(p.call_id, p.tool_id, p.params, p.code), trait))
        try:
            await self._execute(calls, allow_steer=True, record_calls=False)
        except _Steered:
            self.phase = transition(self.phase, Move.STEER)
        self.conv.checkpoint()

    async def _inner_task(self, coro: Any) -> Any:
        """Run a cancellable piece (generation, tool wait); a steer cancels it and raises _Steered."""
        if self._steer_text is not None and self.phase is not Phase.FINALIZE:
            coro.close()
            raise _Steered
        self._inner = asyncio.get_running_loop().create_task(coro)
        try:
            return await self._inner
        except asyncio.CancelledError:
            if self._steer_text is not None and self.phase is not Phase.FINALIZE and not _current_cancelling():
                raise _Steered from None
            raise
        finally:
            self._inner = None

    # -- decision -----------------------------------------------------------------------------------

    def _rules(self) -> RoundRules:
        conv, pol = self.conv, self.conv.policies
        finalize = self.phase is Phase.FINALIZE
        legal = pol.finish_policy == "allow_no_tool" or self.observations > 0
        return RoundRules(
            catalog=conv.catalog,
            state=conv.state.agent_state,
            mode=conv.state.mode,
            max_actions=pol.max_actions_per_round,
            finish_legal=legal or finalize,
            finish_illegal_reason=(
                "finishing is not legal yet: this turn holds no tool observation. Call a tool first and "
                "answer after its observation."
            ),
            confirmation_required=self.confirmation_required,
            exploration_stopped=self.exploration_stopped,
            finalize_only=finalize,
            validate_params=conv.validate_params,
        )

    def _messages(self, rules: RoundRules) -> list[dict[str, str]]:
        conv, pol = self.conv, self.conv.policies
        tools = [d for d in conv.catalog if rules.tool_available(d.tool_id)] if not rules.finalize_only else []
        system = system_prompt(
            agent=conv.profile.name, state=rules.state, mode=rules.mode, tools=tools,
            max_actions=pol.max_actions_per_round, exploration_cap=pol.exploration_soft_cap,
            allow_no_tool=pol.finish_policy == "allow_no_tool", ledger=ledger_summary(conv.state.ledger),
        )
        return assemble(
            system, conv.state.timeline, turn_id=self.turn_id,
            budget_tokens=pol.context_budget_tokens, count_tokens=conv.count_tokens,
        )

    async def _generate(self, engine: RoundEngine) -> RoundResult:
        conv, pol = self.conv, self.conv.policies
        messages = self._messages(engine.rules)
        continuations = 0
        while True:
            finish_reason: str | None = None
            try:
                async with contextlib.aclosing(conv.stream(messages)) as stream:
                    async for item in stream:
                        if type(item) is ModelDelta:
                            for event in engine.feed(item.text):
                                self._stream_event(event)
                            if engine.aborted:
                                break  # the prefix policy closes the provider stream
                        elif type(item) is ModelFallback:
                            self._emit("fallback", {"from": item.from_model, "to": item.to_model, "error": item.error})
                        elif type(item) is ModelFinished:
                            finish_reason = item.finish_reason
            except ProviderError as exc:
                return self._finish_engine(engine, Notice(
                    code=NoticeCode.PROVIDER_ERROR,
                    message=f"the model provider failed ({exc.kind})"
                    + (" in the middle of the response" if exc.after_first_delta else ""),
                ))
            if engine.aborted or finish_reason != "length":
                return self._finish_engine(engine)
            if not engine.raw_text():
                return self._finish_engine(engine, Notice(
                    code=NoticeCode.OUTPUT_TRUNCATED, message="the response was empty and cut at the length limit",
                ))
            if not engine.continuable or continuations >= pol.auto_continue_max:
                return self._finish_engine(engine, Notice(
                    code=NoticeCode.OUTPUT_TRUNCATED,
                    message=f"the response was cut at the length limit after {continuations} continuations",
                ))
            continuations += 1
            messages = [
                *messages[: len(messages) - (2 if continuations > 1 else 0)],
                {"role": "assistant", "content": engine.raw_text()},
                {"role": "user", "content": CONTINUE_PROMPT},
            ]

    def _finish_engine(self, engine: RoundEngine, cut: Notice | None = None, *, interrupted: bool = False) -> RoundResult:
        events, result = engine.finish(cut=cut, interrupted=interrupted)
        for event in events:
            self._stream_event(event)
        return result

    def _stream_event(self, event: RoundEvent) -> None:
        if type(event) is ThinkingDelta:
            self._emit("thinking.delta", {"turn_id": self.turn_id, "round": self.round_no, "text": event.text})
        elif type(event) is AnswerDelta:
            self._emit("answer.delta", {"turn_id": self.turn_id, "round": self.round_no, "text": event.text})
        elif type(event) is ToolCallReady:
            call = event.call
            self._unobserved[call.call_id] = call
            self._emit("tool.call", {
                "turn_id": self.turn_id, "round": self.round_no, "call_id": call.call_id,
                "tool_id": call.tool_id, "params": dict(call.params), "trait": str(event.trait),
            })

    def _interrupted(self, engine: RoundEngine) -> RoundResult:
        """A steer cut the generation: salvage a streamed answer, else record the steer and finalize."""
        raw = engine.raw_text()
        result = self._finish_engine(engine, interrupted=True)  # what the steer cut is not the model's error
        cut_calls, result.calls = result.calls, []
        if engine.answer_streamed:
            result.outcome = Outcome.SALVAGE  # an answer the user saw is kept, never regenerated
        self._round_completed(result, steered=True)
        self._record_calls(cut_calls)
        for c in cut_calls:  # announced calls the steer cut: each still gets an observation
            self._observe(c.call, _steered(c.call))
        self.conv.record(SteerBlock(self.turn_id, self._take_steer(), raw))
        return result

    def _take_steer(self) -> str:
        text, self._steer_text = self._steer_text or "", None
        return text

    def _round_completed(self, result: RoundResult, *, steered: bool = False) -> None:
        if result.thinking:
            self.conv.record(ThinkingBlock(self.turn_id, self.round_no, result.thinking))
        for notice in result.notices:
            self.conv.record(NoticeBlock(self.turn_id, self.round_no, notice.to_dict()))
            if notice.code is NoticeCode.FINISH_ILLEGAL:
                self._emit("trace", {
                    "kind": "illegal_finish", "turn_id": self.turn_id, "round": self.round_no,
                    "events": list(self._events),
                })
        self._emit("round.completed", {
            "turn_id": self.turn_id, "round": self.round_no, "streamed_state": result.streamed_state,
            "accepted": result.accepted, "denied": result.denied,
            "notices": [n.to_dict() for n in result.notices],
            **({"steered": True} if steered else {}),
        })

    # -- tool execution -------------------------------------------------------------------------------

    async def _execute(self, calls: list[AcceptedCall], *, allow_steer: bool, record_calls: bool = True) -> None:
        conv, pol = self.conv, self.conv.policies
        if record_calls:
            self._record_calls(calls)
        self.pending = [PendingCall(c.call.call_id, c.call.tool_id, dict(c.call.params), c.call.code) for c in calls]
        saved = conv.checkpoint()
        if saved is not None:  # durable before any tool runs: a crash from here re-submits these calls,
            await saved        # and the executor answers a call whose result is durable from the store
        regular = [c.call for c in calls if c.call.tool_id != ASK_USER_TOOL]
        asks = [c.call for c in calls if c.call.tool_id == ASK_USER_TOOL]
        pending = list(regular) + list(asks)
        try:
            if regular:
                batch = conv.tools.execute_batch(
                    conv.conversation_id, self.turn_id, regular,
                    exploration_cap=pol.exploration_soft_cap, timeout_s=pol.tool_timeout_s, catalog=conv.catalog,
                )
                observations = await (self._inner_task(batch) if allow_steer else batch)
                for call, obs in zip(regular, observations, strict=True):
                    self._observe(call, obs)
                    pending.remove(call)
            for call in asks:
                obs = await (self._inner_task(self._ask(call)) if allow_steer else self._ask(call))
                self._observe(call, obs)
                pending.remove(call)
        except _Steered:
            for call in pending:  # a tool call cut by the steer gets {"error": "steered"}
                self._observe(call, _steered(call))
            self.conv.record(SteerBlock(self.turn_id, self._take_steer(), ""))
            raise

    def observe_error(self, call_id: str, tool_id: str, error: str) -> None:
        """An error observation for a call that will never run (steered, or cut by a crash)."""
        self._observe(ToolCall(call_id, tool_id, {}), Observation(call_id, tool_id, ok=False, error=error))

    def emit_salvage(self, answer: str) -> None:
        """End the turn with exactly the answer text the user already saw."""
        self._emit("trace", {"kind": "salvaged", "turn_id": self.turn_id, "round": self.round_no,
                             "answer_chars": len(answer)})
        self._complete("salvaged", answer, finish_ok=True)

    def _record_calls(self, calls: list[AcceptedCall]) -> None:
        for c in calls:
            self.conv.record(ToolCallBlock(self.turn_id, self.round_no, c.call.call_id, c.call.tool_id,
                                           dict(c.call.params), c.call.code))

    async def _ask(self, call: ToolCall) -> Observation:
        conv, pol = self.conv, self.conv.policies
        question = str(call.params.get("question", ""))
        options = list(call.params.get("options") or [])
        future = conv.expect_answer(call.call_id)
        self._emit("ask_user", {
            "turn_id": self.turn_id, "ask_id": call.call_id, "question": question,
            "options": options, "timeout_s": pol.ask_user_timeout_s,
        })
        try:
            answer = await asyncio.wait_for(future, pol.ask_user_timeout_s)
        except TimeoutError:
            await self._budget_answer(question, None)
            return Observation(call.call_id, call.tool_id, ok=False, error="ask_user_timeout")
        finally:
            conv.forget_answer(call.call_id)
        await self._budget_answer(question, answer)
        return Observation(call.call_id, call.tool_id, ok=True, result={"answer": answer})

    async def _budget_answer(self, question: str, answer: str | None) -> None:
        """The exploration-budget confirmation (SPEC §4.3): continue resets, anything else stops."""
        if EXPLORATION_MARKER not in question or not self.confirmation_required:
            return
        self.confirmation_required = False
        if answer == CONTINUE_EXPLORING:
            await self.conv.tools.reset_exploration(self.conv.conversation_id)
        else:
            self.exploration_stopped = True

    def _observe(self, call: ToolCall, obs: Observation) -> None:
        conv = self.conv
        self.observations += 1
        self.pending = [p for p in self.pending if p.call_id != call.call_id]
        payload = obs.payload()
        data: dict[str, Any] = {
            "turn_id": self.turn_id, "call_id": call.call_id, "tool_id": call.tool_id,
            "ok": obs.ok, "duration_ms": obs.duration_ms,
        }
        if obs.ok:
            data["result"] = dict(obs.result or {})
        else:
            data["error"] = obs.error
            if obs.detail:
                data["detail"] = dict(obs.detail)
        self._emit("tool.result", data)
        for command in obs.ui_commands:
            self._emit("ui_command", {
                "turn_id": self.turn_id, "command": command.get("command"), "args": command.get("args", {}),
            })
        conv.record(ToolResultBlock(self.turn_id, call.call_id, call.tool_id, obs.ok, payload))
        conv.state.ledger.append(Step(call.tool_id, params_digest(dict(call.params)), obs.ok))
        if obs.error == "EXPLORATION_BUDGET_REACHED":
            self.confirmation_required = True
        decl = conv.catalog.get(call.tool_id)
        if obs.ok and decl is not None and decl.transitions_state:
            conv.resolve_state(obs.result or {})

    def _observe_cancelled(self) -> None:
        """A cancel cut the turn: every announced call still gets its one observation (SPEC §4.2)."""
        owed = dict(self._unobserved)  # announced while streaming, or being executed (maybe resumed)
        for p in self.pending:
            owed.setdefault(p.call_id, ToolCall(p.call_id, p.tool_id, p.params, p.code))
        recorded = {b.call_id for b in self.conv.state.timeline if isinstance(b, ToolCallBlock)}
        for call in owed.values():
            if call.call_id not in recorded:
                self.conv.record(ToolCallBlock(self.turn_id, self.round_no, call.call_id, call.tool_id,
                                               dict(call.params), call.code))
            self._observe(call, Observation(call.call_id, call.tool_id, ok=False, error="cancelled"))

    # -- ending ---------------------------------------------------------------------------------------

    def _finish(self, result: RoundResult) -> tuple[str, str, bool]:
        """(reason, final answer, finish_ok). finish_ok is true only for a legal finish (SPEC §4.1)."""
        used_tools = self.observations > 0
        legal = used_tools or self.conv.policies.finish_policy == "allow_no_tool"
        if result.summary:
            self.conv.record(SummaryBlock(self.turn_id, result.summary))
        if result.outcome is Outcome.SALVAGE:
            self._emit("trace", {"kind": "salvaged", "turn_id": self.turn_id, "round": self.round_no,
                                 "answer_chars": len(result.answer_text)})
            return "salvaged", result.answer_text, legal
        final = result.final
        assert final is not None
        if not used_tools:
            self._emit("trace", {"kind": "no_tool_finish", "turn_id": self.turn_id, "round": self.round_no})
        return str(final.type), final.final_answer, legal

    def _complete(self, reason: str, answer: str, *, finish_ok: bool) -> None:
        if answer:
            self.conv.record(FinalBlock(self.turn_id, answer, reason))
        self._emit("turn.completed", {
            "turn_id": self.turn_id, "reason": reason, "final_answer": answer,
            "used_tools": self.observations > 0, "finish_ok": finish_ok,
        })

    def _emit(self, name: str, data: dict[str, Any]) -> None:
        self._events.append({"event": name, **({"call_id": data["call_id"]} if "call_id" in data else {})})
        self.conv.emit(name, data)


def _steered(call: ToolCall) -> Observation:
    return Observation(call.call_id, call.tool_id, ok=False, error="steered")


def _current_cancelling() -> int:
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0

