"""The turn: the loop of rounds between a user message and its final answer (docs/design.md#turn).

The phases and their transitions are a table (`TRANSITIONS`), and so is the move each round
outcome makes (`OUTCOME_MOVES`); `Turn.run` walks them. tools → tool_execution → decision;
retry → decision (`retry_decision`, never through tool execution); finish or salvage → exit. A
steer moves any phase to `finalize`, one decision in which only complete/exit are available.

A turn knows its conversation only through `TurnContext`: what it reads (policies, catalog, mode,
state, timeline) and what it may do (emit, record, checkpoint, call the model and the tools).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from enum import StrEnum
from typing import Any, Final, Protocol

import msgspec

from actors import tracing
from actors.catalog import ASK_USER_TOOL, Catalog, Observation, ToolCall, ToolExecutor, Trait
from actors.context import Step, assemble, ledger_summary, params_digest, system_prompt
from actors.gates import CONTINUE_EXPLORING, EXPLORATION_MARKER, RoundRules
from actors.llm.stream import ModelDelta, ModelFallback, ModelFinished, ProviderError, StreamItem
from actors.profile import Policies
from actors.quotas import admitted_tool_calls, tool_calls_refusal_detail
from actors.round import (
    AcceptedCall,
    RestartCheck,
    RoundEngine,
    RoundEvent,
    RoundOutcome,
    RoundResult,
    ToolCallReady,
    interrupted_round,
)
from actors.store.base import RoundOutput
from protocol.events import (
    AskUser,
    EndReason,
    EventData,
    EventRef,
    Fallback,
    IllegalFinish,
    IterationLimit,
    NoToolFinish,
    Salvaged,
    ToolCalled,
    ToolResult,
    TurnCompleted,
    TurnStarted,
    UiCommand,
)
from protocol.frames import Mode
from protocol.notices import Notice, NoticeCode
from protocol.timeline import (
    Block,
    FinalBlock,
    NoticeBlock,
    SteerBlock,
    SummaryBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultBlock,
    UserMessageBlock,
)


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


# (phase, move) → next phase. Anything else is a bug, reported with both names.
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


CONTINUE_PROMPT: Final = (
    "[continue] Your previous response was cut at the length limit. Continue exactly where it stopped, "
    "without repeating anything."
)
CUT_PROMPT: Final = (
    "[continue] Your previous response was cut off by a connection failure, not by you. Continue exactly "
    "where it stopped, from the next character, without repeating anything and without starting over."
)


def _continue(base: list[dict[str, str]], raw: str, prompt: str) -> list[dict[str, str]]:
    """The messages that ask for a continuation: the decision's context, the text so far, the ask."""
    return [*base, {"role": "assistant", "content": raw}, {"role": "user", "content": prompt}]


def _cut_notice(kind: str, *, mid_response: bool = True, crashed: bool = False) -> Notice:
    if crashed:
        return Notice(code=NoticeCode.ROUND_INTERRUPTED,
                      message="the response was cut by a server fault and could not be continued")
    return Notice(code=NoticeCode.PROVIDER_ERROR,
                  message=f"the model provider failed ({kind})" + (" in the middle of the response" if mid_response else ""))
GIVE_UP_MESSAGES: Final[Mapping[EndReason, str]] = {
    EndReason.PROTOCOL_VIOLATION: "Sorry — I could not produce a valid response this time. Please try again.",
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


def round_rules(
    catalog: Catalog, pol: Policies, *, state: str, mode: Mode, observations: int, finalize: bool,
    confirmation_required: bool, exploration_stopped: bool,
    validate_params: Callable[[str, Mapping[str, object]], list[str]] | None,
) -> RoundRules:
    """A round's rules from where its turn stands: the turn's and replay's one recipe (docs/design.md#replay)."""
    legal = pol.finish_policy == "allow_no_tool" or observations > 0
    return RoundRules(
        catalog=catalog,
        state=state,
        mode=mode,
        max_actions=pol.max_actions_per_round,
        finish_legal=legal or finalize,
        finish_illegal_reason=FINISH_ILLEGAL_REASON,
        confirmation_required=confirmation_required,
        exploration_stopped=exploration_stopped,
        finalize_only=finalize,
        validate_params=validate_params,
    )


class TurnContext(Protocol):
    """What a turn needs from its conversation (`actors.conversation.Conversation` provides it)."""

    @property
    def conversation_id(self) -> str: ...
    @property
    def agent_name(self) -> str: ...
    @property
    def instructions(self) -> str | None: ...
    @property
    def policies(self) -> Policies: ...
    @property
    def profile_models(self) -> Sequence[str]: ...
    @property
    def catalog(self) -> Catalog: ...
    @property
    def tools(self) -> ToolExecutor: ...
    @property
    def agent_state(self) -> str: ...
    @property
    def mode(self) -> Mode: ...
    @property
    def timeline(self) -> Sequence[Block]: ...
    @property
    def ledger(self) -> Sequence[Step]: ...
    @property
    def max_tool_calls(self) -> int | None: ...   # the tool-calls-per-turn quota (docs/design.md#quotas)

    def emit(self, data: EventData) -> None: ...
    def record_output(self, output: RoundOutput) -> None: ...
    def record(self, block: Block) -> None: ...
    def add_step(self, step: Step) -> None: ...
    def checkpoint(self) -> Awaitable[None] | None: ...
    def validate_params(self, tool_id: str, params: Mapping[str, object]) -> list[str]: ...
    def count_tokens(self, messages: Sequence[Mapping[str, str]]) -> int: ...
    def stream(self, messages: list[dict[str, str]], models: Sequence[str] | None = None) -> AsyncIterator[StreamItem]: ...
    def resolve_state(self, result: Mapping[str, Any]) -> None: ...
    def expect_answer(self, ask_id: str) -> asyncio.Future[str]: ...
    def forget_answer(self, ask_id: str) -> None: ...
    def log_exception(self, message: str) -> None: ...


class _Steered(Exception):
    pass


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
    """A running turn as the snapshot keeps it, so a re-activation elsewhere resumes it
    (docs/design.md#recovery)."""

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


class Turn:
    """One turn of one conversation. The conversation is its single writer's state."""

    def __init__(self, ctx: TurnContext, progress: TurnProgress) -> None:
        self.ctx = ctx
        self.turn_id = progress.turn_id
        self.message_id = progress.message_id
        self.text = progress.text
        self.phase = RESUME_PHASE[progress.phase]
        self.round_no = progress.round_no
        self.retries = progress.retries
        self.observations = progress.observations
        self.confirmation_required = progress.confirmation_required
        self.exploration_stopped = progress.exploration_stopped
        self.pending: list[PendingCall] = list(progress.pending)
        self.cut = progress.cut
        self.tool_calls = progress.tool_calls
        self.trace_parent = progress.trace
        self._trace = tracing.TurnTrace(ctx.conversation_id, self.turn_id)
        self._partial = False      # the turn ends with an answer that was cut short
        self._streaming = False    # a round's model stream is open
        self._models: list[str] = []  # the models whose deltas the round's engine got
        self.cancelled_by_user = False
        self._steer_text: str | None = None
        self._inner: asyncio.Task[Any] | None = None
        self._events: list[EventRef] = []           # this turn's events, for trace evidence
        self._unobserved: dict[str, ToolCall] = {}  # announced calls still owed an observation

    @classmethod
    def new(cls, ctx: TurnContext, turn_id: str, message_id: str, text: str,
            trace: Mapping[str, str] | None = None) -> Turn:
        return cls(ctx, TurnProgress(turn_id=turn_id, message_id=message_id, text=text, trace=dict(trace or {})))

    def progress(self) -> TurnProgress:
        return TurnProgress(
            turn_id=self.turn_id, message_id=self.message_id, text=self.text, phase=self.phase,
            round_no=self.round_no, retries=self.retries, observations=self.observations,
            confirmation_required=self.confirmation_required, exploration_stopped=self.exploration_stopped,
            pending=list(self.pending), cut=self.cut, streaming=self._streaming, tool_calls=self.tool_calls,
            trace=self.trace_parent,
        )

    # -- control from the mailbox -----------------------------------------------------------------

    def steer(self, text: str) -> None:
        """Cancel the in-flight generation or tool wait; the next decision finalizes (docs/design.md#steer)."""
        if self.phase is Phase.FINALIZE:  # already finalizing: keep the words, interrupt nothing
            self.ctx.record(SteerBlock(self.turn_id, text, ""))
            return
        self._steer_text = text
        if self._inner is not None and not self._inner.done():
            self._inner.cancel()

    # -- recovery: what a crash left in the durable log, applied before the turn runs again --------

    def apply_durable_result(self, result: ToolResult) -> None:
        """A result the log holds but the checkpoint does not: record it, as its emitter would have."""
        if result.call_id not in {p.call_id for p in self.pending}:
            return
        self.ctx.record(ToolResultBlock(self.turn_id, result.call_id, result.tool_id, result.ok, result.payload()))
        self.pending = [p for p in self.pending if p.call_id != result.call_id]
        self.observations += 1

    def apply_cut_round(self, thinking: str, announced: Sequence[ToolCalled], answer: str) -> None:
        """The round after the checkpoint was cut by a crash mid-stream (docs/design.md#recovery).
        If the user saw part of an answer, the round goes on: it is rebuilt from the durable events
        and continued from exactly what streamed (never regenerated, never cut short). Else every
        announced call gets an error observation and the turn decides again after a notice."""
        if self.cut is not None:  # the round resumed after a crash was cut again: go on from here
            raw = self.cut.raw + json.dumps(answer, ensure_ascii=False)[1:-1]
            self.cut = CutRound(self.cut.round_no, raw, self.cut.continuations + 1)
            return
        self.round_no += 1
        if answer:
            self.cut = CutRound(self.round_no, _rebuilt_response(thinking, announced, answer))
            return
        if thinking:
            self.ctx.record(ThinkingBlock(self.turn_id, self.round_no, thinking))
        for call in announced:  # announced, never executed: each still gets an observation
            self.ctx.record(ToolCallBlock(self.turn_id, self.round_no, call.call_id, call.tool_id, dict(call.params)))
            self._observe(ToolCall(call.call_id, call.tool_id, {}),
                          Observation(call.call_id, call.tool_id, ok=False, error="round_interrupted"))
        self.ctx.record(NoticeBlock(self.turn_id, self.round_no, ROUND_INTERRUPTED.to_dict()))
        self._emit(interrupted_round(self.turn_id, self.round_no, ROUND_INTERRUPTED))

    def complete_from_log(self, completed: TurnCompleted) -> None:
        """The turn ended before its last checkpoint: keep its final answer in the timeline."""
        if completed.final_answer:
            self.ctx.record(FinalBlock(self.turn_id, completed.final_answer, completed.reason))

    # -- the loop -----------------------------------------------------------------------------------

    async def run(self, *, resumed: bool = False) -> None:
        """The turn, traced as one span in its message's trace (docs/design.md#tracing)."""
        self._trace.start(self.trace_parent, message_id=self.message_id, resumed=resumed)
        try:
            await self._run(resumed=resumed)
        finally:
            self._trace.end()

    async def _run(self, *, resumed: bool) -> None:
        ctx = self.ctx
        if not resumed:
            self._emit(TurnStarted(turn_id=self.turn_id, user_message_id=self.message_id))
            ctx.record(UserMessageBlock(self.turn_id, self.message_id, self.text))
            await ctx.tools.reset_exploration(ctx.conversation_id)
            ctx.checkpoint()
        try:
            if resumed and self.pending:  # the batch a crash cut: durable results are not re-run
                await self._resume_pending()
            reason, answer, finish_ok = await self._loop()
        except asyncio.CancelledError:
            if self.cancelled_by_user:  # a host shutting down leaves the turn to its checkpoint
                self._observe_cancelled()
                self._complete(EndReason.CANCELLED, "", finish_ok=False)
            raise
        except Exception:
            ctx.log_exception("turn failed")
            reason, answer, finish_ok = EndReason.ERROR, GIVE_UP_MESSAGES[EndReason.ERROR], False
        self._complete(reason, answer, finish_ok=finish_ok)

    async def _loop(self) -> tuple[EndReason, str, bool]:
        pol = self.ctx.policies
        while True:
            if self.cut is not None:
                cut, self.cut = self.cut, None
                engine = self._replay(cut)
                work = self._generate(engine, resumed=cut)
            else:
                if self.round_no >= pol.max_iterations:
                    self._emit(IterationLimit(turn_id=self.turn_id, rounds=self.round_no))
                    return EndReason.ITERATION_LIMIT, GIVE_UP_MESSAGES[EndReason.ITERATION_LIMIT], False
                self.round_no += 1
                engine = RoundEngine(self._rules(), turn_id=self.turn_id, round_no=self.round_no)
                work = self._generate(engine)
            self._trace.round(self.round_no, str(self.phase))
            try:
                result = await self._inner_task(work)
            except _Steered:
                result = self._interrupted(engine)
                if result.outcome is not RoundOutcome.SALVAGE:
                    self.phase = transition(self.phase, Move.STEER)
                    continue
            else:
                self._round_completed(result, engine)
            self.ctx.checkpoint()

            move = OUTCOME_MOVES[result.outcome]
            if move is Move.FINISH:
                if result.calls:  # neutral calls accepted beside the answer still run
                    await self._execute(result.calls, allow_steer=False)
                self.phase = transition(self.phase, move)
                return self._finish(result)
            if move is Move.TOOLS:
                self.phase = transition(self.phase, move)
                try:
                    await self._execute(result.calls, allow_steer=True)
                except _Steered:
                    self.phase = transition(self.phase, Move.STEER)
                    continue
                if self.phase is Phase.TOOL_EXECUTION:
                    self.phase = transition(self.phase, Move.OBSERVED)
                self.ctx.checkpoint()
                continue
            # Move.RETRY: decision → decision, never through tool execution.
            self.retries += 1
            if self.retries > pol.max_protocol_retries:
                self.phase = transition(self.phase, Move.GIVE_UP)
                return EndReason.PROTOCOL_VIOLATION, GIVE_UP_MESSAGES[EndReason.PROTOCOL_VIOLATION], False
            self.phase = transition(self.phase, move)

    def _replay(self, cut: CutRound) -> RoundEngine:
        """The cut round's engine, fed what the durable log holds. Its events already reached the
        clients: nothing is emitted again; announced calls are owed their observation as before."""
        self.round_no = cut.round_no
        engine = RoundEngine(self._rules(), turn_id=self.turn_id, round_no=cut.round_no)
        for event in engine.feed(cut.raw):
            if type(event) is ToolCallReady:
                self._unobserved[event.call.call_id] = event.call
        return engine

    async def _resume_pending(self) -> None:
        calls: list[AcceptedCall] = []
        for p in self.pending:
            decl = self.ctx.catalog.get(p.tool_id)
            trait = decl.trait if decl is not None else Trait.UNKNOWN
            calls.append(AcceptedCall(len(calls), p.as_call(), trait))
        try:
            await self._execute(calls, allow_steer=True, record_calls=False)
        except _Steered:
            self.phase = transition(self.phase, Move.STEER)
        self.ctx.checkpoint()

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
        ctx = self.ctx
        return round_rules(
            ctx.catalog, ctx.policies, state=ctx.agent_state, mode=ctx.mode, observations=self.observations,
            finalize=self.phase is Phase.FINALIZE, confirmation_required=self.confirmation_required,
            exploration_stopped=self.exploration_stopped, validate_params=ctx.validate_params,
        )

    def _messages(self, rules: RoundRules) -> list[dict[str, str]]:
        ctx, pol = self.ctx, self.ctx.policies
        tools = [d for d in ctx.catalog if rules.tool_available(d.tool_id)] if not rules.finalize_only else []
        system = system_prompt(
            agent=ctx.agent_name, state=rules.state, mode=rules.mode, tools=tools,
            max_actions=pol.max_actions_per_round, exploration_cap=pol.exploration_soft_cap,
            allow_no_tool=pol.finish_policy == "allow_no_tool", ledger=ledger_summary(ctx.ledger),
            instructions=ctx.instructions,
        )
        return assemble(
            system, ctx.timeline, turn_id=self.turn_id,
            budget_tokens=pol.context_budget_tokens, count_tokens=ctx.count_tokens,
        )

    async def _generate(self, engine: RoundEngine, resumed: CutRound | None = None) -> RoundResult:
        """The one round driver: the model stream into the engine, with continuations after a
        length cut-off or a connection cut (docs/design.md#continuation) and the prefix policy's
        early stop. `resumed`: the round a crash cut mid-answer, replayed into `engine`; it goes on
        from its durable text with a continuation."""
        self._streaming = True
        self._models = []
        try:
            return await self._stream_round(engine, resumed)
        finally:
            self._streaming = False

    async def _stream_round(self, engine: RoundEngine, resumed: CutRound | None) -> RoundResult:
        pol = self.ctx.policies
        base = self._messages(engine.rules)
        messages, models = base, None
        continuations, restart = 0, None
        if resumed is not None:
            continuations = resumed.continuations
            if continuations >= pol.auto_continue_max:
                return self._finish_cut(engine, _cut_notice("timeout", crashed=True), partial=True)
            continuations += 1
            messages, restart = _continue(base, engine.raw_text(), CUT_PROMPT), RestartCheck(engine.answer_text())
        while True:
            finish_reason: str | None = None
            cut: ProviderError | None = None
            restarted = False
            model = (models or self.ctx.profile_models)[0]  # the one streaming; a fallback moves it on
            try:
                call = self._trace.model_call(self.ctx.stream(messages, models), model)
                async with contextlib.aclosing(call) as stream:  # type: ignore[type-var]
                    async for item in stream:
                        if type(item) is ModelDelta:
                            text = item.text if restart is None else restart.admit(item.text)
                            if text is None:
                                restarted = True
                                break  # the model started over: nothing of it reaches the user
                            if text and model not in self._models:
                                self._models.append(model)
                            for event in engine.feed(text):
                                self._stream_event(event)
                            if engine.aborted:
                                break  # the prefix policy closes the provider stream
                        elif type(item) is ModelFallback:
                            model = item.to_model
                            self._emit(Fallback(from_model=item.from_model, to_model=item.to_model, error=item.error))
                        elif type(item) is ModelFinished:
                            finish_reason = item.finish_reason
            except ProviderError as exc:
                cut = exc
            if restart is not None and not restarted and cut is None:
                rest = restart.finish()
                if rest is None:
                    restarted = True
                elif rest:
                    for event in engine.feed(rest):
                        self._stream_event(event)
            restart = None
            if restarted:
                return self._finish_cut(engine, Notice(
                    code=NoticeCode.PROVIDER_ERROR,
                    message="the response was cut, and the continuation started over instead of continuing",
                ), partial=True)
            if cut is not None:
                notice = _cut_notice(cut.kind, mid_response=cut.after_first_delta)
                if not engine.answer_streamed:
                    return self._finish_engine(engine, notice)  # nothing shown yet: decide again
                if not engine.continuable or continuations >= pol.auto_continue_max:
                    return self._finish_cut(engine, notice, partial=True)
                continuations += 1
                models = self._continuation_models(cut)
                messages = _continue(base, engine.raw_text(), CUT_PROMPT)
                restart = RestartCheck(engine.answer_text())
                continue
            if engine.aborted or finish_reason != "length":
                return self._finish_engine(engine)
            if not engine.raw_text():
                return self._finish_engine(engine, Notice(
                    code=NoticeCode.OUTPUT_TRUNCATED, message="the response was empty and cut at the length limit",
                ))
            if not engine.continuable or continuations >= pol.auto_continue_max:
                return self._finish_cut(engine, Notice(
                    code=NoticeCode.OUTPUT_TRUNCATED,
                    message=f"the response was cut at the length limit after {continuations} continuations",
                ), partial=engine.answer_streamed)
            continuations += 1
            messages = _continue(base, engine.raw_text(), CONTINUE_PROMPT)

    def _continuation_models(self, cut: ProviderError) -> list[str]:
        """A provider that failed mid-answer hands the continuation to the next fallback, if any
        (the `fallback` event says so); with none left, the same model is asked to continue."""
        models = list(self.ctx.profile_models)
        position = models.index(cut.model) if cut.model in models else 0
        if position + 1 < len(models):
            self._emit(Fallback(from_model=cut.model, to_model=models[position + 1], error=f"{cut.kind}: {cut.message}"))
            return models[position + 1:]
        return models[position:]

    def _finish_cut(self, engine: RoundEngine, cut: Notice, *, partial: bool) -> RoundResult:
        """End a round whose stream was cut and not continued; a streamed answer is then partial."""
        result = self._finish_engine(engine, cut)
        result.partial = partial and result.outcome is RoundOutcome.SALVAGE
        return result

    def _finish_engine(self, engine: RoundEngine, cut: Notice | None = None, *, interrupted: bool = False) -> RoundResult:
        events, result = engine.finish(cut=cut, interrupted=interrupted)
        for event in events:
            self._stream_event(event)
        return result

    def _stream_event(self, event: RoundEvent) -> None:
        if type(event) is ToolCallReady:
            call = event.call
            self._unobserved[call.call_id] = call
            self._emit(ToolCalled(
                turn_id=self.turn_id, round=self.round_no, call_id=call.call_id, tool_id=call.tool_id,
                params=dict(call.params), trait=str(event.trait),
            ))
        else:  # thinking.delta, answer.delta: the engine built them for this turn and round
            self._emit(event)  # type: ignore[arg-type]

    def _interrupted(self, engine: RoundEngine) -> RoundResult:
        """A steer cut the generation: salvage a streamed answer, else record the steer and finalize."""
        raw = engine.raw_text()
        result = self._finish_engine(engine, interrupted=True)  # what the steer cut is not the model's error
        cut_calls, result.calls = result.calls, []
        if engine.answer_streamed:
            result.outcome = RoundOutcome.SALVAGE  # an answer the user saw is kept, never regenerated
        self._round_completed(result, engine, steered=True)
        self._record_calls(cut_calls)
        for c in cut_calls:  # announced calls the steer cut: each still gets an observation
            self._observe(c.call, _steered(c.call))
        self.ctx.record(SteerBlock(self.turn_id, self._take_steer(), raw))
        return result

    def _take_steer(self) -> str:
        text, self._steer_text = self._steer_text or "", None
        return text

    def _round_completed(self, result: RoundResult, engine: RoundEngine, *, steered: bool = False) -> None:
        # Durable with this round.completed, never shown: what the model wrote, before any gate
        # (docs/design.md#replay).
        self.ctx.record_output(RoundOutput(
            turn_id=self.turn_id, round=self.round_no, raw=engine.raw_text(), models=tuple(self._models),
            mode=str(engine.rules.mode), agent_state=engine.rules.state, phase=str(self.phase),
        ))
        self._trace.round_outcome(str(result.outcome))
        if result.thinking:
            self.ctx.record(ThinkingBlock(self.turn_id, self.round_no, result.thinking))
        for notice in result.notices:
            self.ctx.record(NoticeBlock(self.turn_id, self.round_no, notice.to_dict()))
            if notice.code is NoticeCode.FINISH_ILLEGAL:
                self._emit(IllegalFinish(turn_id=self.turn_id, round=self.round_no, events=list(self._events)))
        self._emit(result.completed(self.turn_id, self.round_no, steered=steered))

    # -- tool execution -------------------------------------------------------------------------------

    async def _execute(self, calls: list[AcceptedCall], *, allow_steer: bool, record_calls: bool = True) -> None:
        ctx, pol = self.ctx, self.ctx.policies
        if record_calls:  # new calls (a resumed batch was recorded, and admitted, before the crash)
            self._record_calls(calls)
            calls = self._admit(calls)
        for c in calls:
            self._trace.tool_call(c.call.call_id, c.call.tool_id, str(c.trait))
        self.pending = [PendingCall(c.call.call_id, c.call.tool_id, dict(c.call.params), c.call.code) for c in calls]
        saved = ctx.checkpoint()
        if saved is not None:  # durable before any tool runs: a crash from here re-submits these calls,
            await saved        # and the executor answers a call whose result is durable from the store
        regular = [c.call for c in calls if c.call.tool_id != ASK_USER_TOOL]
        asks = [c.call for c in calls if c.call.tool_id == ASK_USER_TOOL]
        pending = list(regular) + list(asks)
        try:
            if regular:
                batch = ctx.tools.execute_batch(
                    ctx.conversation_id, self.turn_id, regular,
                    exploration_cap=pol.exploration_soft_cap, timeout_s=pol.tool_timeout_s, catalog=ctx.catalog,
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
            self.ctx.record(SteerBlock(self.turn_id, self._take_steer(), ""))
            raise

    def _admit(self, calls: list[AcceptedCall]) -> list[AcceptedCall]:
        """The tool-calls-per-turn backstop (docs/design.md#quotas): calls past it are not run; each
        gets the failed observation `quota_exceeded`, which tells the model, and the turn goes on so
        it can still answer. The count is in the checkpoint taken before any tool runs."""
        limit = self.ctx.max_tool_calls
        admitted = admitted_tool_calls(self.tool_calls, len(calls), limit)
        self.tool_calls += admitted
        for c in calls[admitted:]:
            assert limit is not None
            self._observe(c.call, Observation(c.call.call_id, c.call.tool_id, ok=False, error="quota_exceeded",
                                              detail=tool_calls_refusal_detail(limit)))
        return calls[:admitted]

    def _record_calls(self, calls: list[AcceptedCall]) -> None:
        for c in calls:
            self.ctx.record(ToolCallBlock(self.turn_id, self.round_no, c.call.call_id, c.call.tool_id,
                                          dict(c.call.params), c.call.code))

    async def _ask(self, call: ToolCall) -> Observation:
        ctx, pol = self.ctx, self.ctx.policies
        question = str(call.params.get("question", ""))
        options = [str(o) for o in call.params.get("options") or []]
        future = ctx.expect_answer(call.call_id)
        self._emit(AskUser(turn_id=self.turn_id, ask_id=call.call_id, question=question, options=options,
                           timeout_s=pol.ask_user_timeout_s))
        try:
            answer = await asyncio.wait_for(future, pol.ask_user_timeout_s)
        except TimeoutError:
            await self._budget_answer(question, None)
            return Observation(call.call_id, call.tool_id, ok=False, error="ask_user_timeout")
        finally:
            ctx.forget_answer(call.call_id)
        await self._budget_answer(question, answer)
        return Observation(call.call_id, call.tool_id, ok=True, result={"answer": answer})

    async def _budget_answer(self, question: str, answer: str | None) -> None:
        """The exploration-budget confirmation (docs/design.md#exploration-budget): continue resets,
        anything else stops."""
        if EXPLORATION_MARKER not in question or not self.confirmation_required:
            return
        self.confirmation_required = False
        if answer == CONTINUE_EXPLORING:
            await self.ctx.tools.reset_exploration(self.ctx.conversation_id)
        else:
            self.exploration_stopped = True

    def _observe(self, call: ToolCall, obs: Observation) -> None:
        ctx = self.ctx
        self.observations += 1
        self.pending = [p for p in self.pending if p.call_id != call.call_id]
        self._unobserved.pop(call.call_id, None)
        self._trace.tool_observed(call.call_id, None if obs.ok else obs.error or "error", obs.duration_ms)
        result = ToolResult(
            turn_id=self.turn_id, call_id=call.call_id, tool_id=call.tool_id, ok=obs.ok, duration_ms=obs.duration_ms,
            result=dict(obs.result or {}) if obs.ok else None,
            error=None if obs.ok else obs.error,
            detail=dict(obs.detail) if not obs.ok and obs.detail else None,
        )
        self._emit(result)
        for command in obs.ui_commands:
            self._emit(UiCommand(turn_id=self.turn_id, command=str(command.get("command")),
                                 args=dict(command.get("args", {}))))
        ctx.record(ToolResultBlock(self.turn_id, call.call_id, call.tool_id, obs.ok, result.payload()))
        ctx.add_step(Step(call.tool_id, params_digest(dict(call.params)), obs.ok))
        if obs.error == "EXPLORATION_BUDGET_REACHED":
            self.confirmation_required = True
        decl = ctx.catalog.get(call.tool_id)
        if obs.ok and decl is not None and decl.transitions_state:
            ctx.resolve_state(obs.result or {})

    def _observe_cancelled(self) -> None:
        """A cancel cut the turn: every announced call still gets its one observation
        (docs/design.md#observations)."""
        owed = dict(self._unobserved)  # announced while streaming, or being executed (maybe resumed)
        for p in self.pending:
            owed.setdefault(p.call_id, p.as_call())
        recorded = {b.call_id for b in self.ctx.timeline if isinstance(b, ToolCallBlock)}
        for call in owed.values():
            if call.call_id not in recorded:
                self.ctx.record(ToolCallBlock(self.turn_id, self.round_no, call.call_id, call.tool_id,
                                              dict(call.params), call.code))
            self._observe(call, Observation(call.call_id, call.tool_id, ok=False, error="cancelled"))

    # -- ending ---------------------------------------------------------------------------------------

    def _finish(self, result: RoundResult) -> tuple[EndReason, str, bool]:
        """(reason, final answer, finish_ok). finish_ok is true only for a legal finish
        (docs/design.md#observe-before-finish)."""
        used_tools = self.observations > 0
        legal = used_tools or self.ctx.policies.finish_policy == "allow_no_tool"
        if result.summary:
            self.ctx.record(SummaryBlock(self.turn_id, result.summary))
        if result.outcome is RoundOutcome.SALVAGE:
            self._partial = result.partial
            self._salvage(result.answer_text)
            return EndReason.SALVAGED, result.answer_text, legal
        final = result.final
        assert final is not None
        if not used_tools:
            self._emit(NoToolFinish(turn_id=self.turn_id, round=self.round_no))
        return EndReason(final.type.value), final.final_answer, legal

    def _salvage(self, answer: str) -> None:
        self._emit(Salvaged(turn_id=self.turn_id, round=self.round_no, answer_chars=len(answer), partial=self._partial))

    def _complete(self, reason: EndReason, answer: str, *, finish_ok: bool) -> None:
        self._trace.ended(str(reason))
        if answer:
            self.ctx.record(FinalBlock(self.turn_id, answer, reason))
        self._emit(TurnCompleted(
            turn_id=self.turn_id, reason=reason, final_answer=answer, used_tools=self.observations > 0,
            finish_ok=finish_ok, partial=self._partial,
        ))

    def _emit(self, data: EventData) -> None:
        self._events.append(EventRef(data.KIND, getattr(data, "call_id", None)))
        self.ctx.emit(data)


def _rebuilt_response(thinking: str, announced: Sequence[ToolCalled], answer: str) -> str:
    """A cut round's response as the durable events tell it: the thinking, the calls announced, and
    an answer action open right after the last character the user saw."""
    parts = [f"<channel:thinking>{thinking}</channel:thinking>"]
    for call in announced:
        action = {"action": "call_tool", "tool_call": {"tool_id": call.tool_id, "params": call.params}}
        parts.append(f"<channel:action>{json.dumps(action, ensure_ascii=False)}</channel:action>")
    parts.append('<channel:action>{"action": "complete", "final_answer": "' + json.dumps(answer, ensure_ascii=False)[1:-1])
    return "".join(parts)


def _steered(call: ToolCall) -> Observation:
    return Observation(call.call_id, call.tool_id, ok=False, error="steered")


def _current_cancelling() -> int:
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0
