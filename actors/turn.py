"""The turn's async shell: model calls, the tool pool, events (docs/design.md#turn).

Every rule of a turn is in the turn machine (`actors/turn_machine.py`): phases, counters, retries,
finish legality, the order calls are observed in, the exploration budget, continuation. `Turn`
carries out what the machine says — streams the model into this round's engine (`RoundStreams`,
`actors/round_streams.py`), runs the calls, waits for the user, emits the events and records the
timeline — and reports back what happened.
A steer cancels the in-flight generation or tool wait (`_inner_task`).

A turn knows its conversation only through `TurnContext`: what it reads (policies, catalog, mode,
state, timeline) and what it may do (emit, record, checkpoint, call the model and the tools).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Collection, Mapping, Sequence
from typing import Any, Protocol

import msgspec

from actors import tracing
from actors.catalog import Catalog, Observation, ToolCall, ToolExecutor
from actors.context import Step, params_digest
from actors.gates import RoundRules
from actors.identity import Caller
from actors.quotas import tool_calls_refusal_detail
from actors.round import (
    AcceptedCall,
    RoundEngine,
    RoundEvent,
    RoundResult,
    ToolCallReady,
    interrupted_round,
)
from actors.round_streams import RoundContext, RoundStreams
from actors.store.base import RoundOutput
from actors.turn_machine import (
    APPROVAL_OPTIONS,
    DENIED_BY_USER,
    GIVE_UP_MESSAGES,
    ROUND_INTERRUPTED,
    Budget,
    Consent,
    CutRound,
    Decide,
    End,
    Execute,
    Phase,
    TurnMachine,
    TurnProgress,
)
from protocol.events import (
    Approval,
    AskUser,
    EndReason,
    EventData,
    EventRef,
    IllegalFinish,
    ToolCalled,
    ToolResult,
    TurnCompleted,
    TurnStarted,
    UiCommand,
)
from protocol.frames import Mode
from protocol.notices import NoticeCode
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


class TurnContext(RoundContext, Protocol):
    """What a turn needs from its conversation (`actors.conversation.Conversation` provides it): what
    its rounds' model streams need (`RoundContext`: the prompt, the models, the model call), and this."""

    @property
    def conversation_id(self) -> str: ...
    @property
    def agent_states(self) -> Collection[str]: ...
    @property
    def catalog(self) -> Catalog: ...
    @property
    def tools(self) -> ToolExecutor: ...
    @property
    def agent_state(self) -> str: ...
    @property
    def mode(self) -> Mode: ...
    @property
    def max_tool_calls(self) -> int | None: ...   # the tool-calls-per-turn quota (docs/design.md#quotas)

    def emit(self, data: EventData) -> None: ...
    def record_output(self, output: RoundOutput) -> None: ...
    def record(self, block: Block) -> None: ...
    def add_step(self, step: Step) -> None: ...
    def checkpoint(self) -> Awaitable[None] | None: ...
    def validate_params(self, tool_id: str, params: Mapping[str, object]) -> list[str]: ...
    def set_agent_state(self, state: str) -> None: ...
    def expect_answer(self, ask_id: str) -> asyncio.Future[str]: ...
    def forget_answer(self, ask_id: str) -> None: ...
    def log_exception(self, message: str) -> None: ...


class _Steered(Exception):
    pass


class Turn:
    """One turn of one conversation. The conversation is its single writer's state."""

    def __init__(self, ctx: TurnContext, progress: TurnProgress) -> None:
        self.ctx = ctx
        # The machine holds the turn's progress; the snapshot keeps a copy taken at each checkpoint.
        self.machine = TurnMachine(msgspec.structs.replace(progress, pending=list(progress.pending)),
                                   ctx.policies, ctx.agent_states)
        self.turn_id = progress.turn_id
        self._trace = tracing.TurnTrace(ctx.conversation_id, self.turn_id)
        self._streams = RoundStreams(ctx, self.machine, self._trace, turn_id=self.turn_id,
                                     stream_event=self._stream_event, emit=self._emit)
        self.cancelled_by_user = False
        self._steer_text: str | None = None
        self._inner: asyncio.Task[Any] | None = None
        self._events: list[EventRef] = []           # this turn's events, for trace evidence
        self._unobserved: dict[str, ToolCall] = {}  # announced calls still owed an observation

    @classmethod
    def new(cls, ctx: TurnContext, turn_id: str, message_id: str, text: str,
            trace: Mapping[str, str] | None = None, caller: Caller | None = None) -> Turn:
        return cls(ctx, TurnProgress(turn_id=turn_id, message_id=message_id, text=text, trace=dict(trace or {}),
                                     caller=caller))

    def progress(self) -> TurnProgress:
        """The turn as a checkpoint keeps it."""
        p = self.machine.progress
        return msgspec.structs.replace(p, pending=list(p.pending), streaming=self._streams.streaming)

    @property
    def _round_no(self) -> int:
        return self.machine.round_no

    # -- control from the mailbox -----------------------------------------------------------------

    def steer(self, text: str) -> None:
        """Cancel the in-flight generation or tool wait; the next decision finalizes (docs/design.md#steer)."""
        if self.machine.phase is Phase.FINALIZE:  # already finalizing: keep the words, interrupt nothing
            self.ctx.record(SteerBlock(self.turn_id, text, ""))
            return
        self._steer_text = text
        if self._inner is not None and not self._inner.done():
            self._inner.cancel()

    # -- recovery: what a crash left in the durable log, applied before the turn runs again --------

    def apply_durable_result(self, result: ToolResult) -> None:
        """A result the log holds but the checkpoint does not: record it, as its emitter would have."""
        if result.call_id not in {p.call_id for p in self.machine.progress.pending}:
            return
        self.ctx.record(ToolResultBlock(self.turn_id, result.call_id, result.tool_id, result.ok, result.payload()))
        obs = Observation(result.call_id, result.tool_id, result.ok, result.result, result.error, result.detail or {})
        self._apply_state(self.machine.observe(result.call_id, obs, self.ctx.catalog.get(result.tool_id)))

    def apply_cut_round(self, thinking: str, announced: Sequence[ToolCalled], answer: str) -> None:
        """The round after the checkpoint was cut by a crash mid-stream (docs/design.md#recovery).
        If the user saw part of an answer, the round goes on: it is rebuilt from the durable events
        and continued from exactly what streamed (never regenerated, never cut short). Else every
        announced call gets an error observation and the turn decides again after a notice."""
        cut, decision = self.machine.progress.cut, self.ctx.decision
        raw = decision.extended(cut.raw, answer) if cut is not None else decision.rebuilt(thinking, announced, answer)
        if self.machine.crash_cut(answer_shown=bool(answer), raw=raw):
            return
        round_no = self._round_no
        if thinking:
            self.ctx.record(ThinkingBlock(self.turn_id, round_no, thinking))
        for call in announced:  # announced, never executed: each still gets an observation
            self.ctx.record(ToolCallBlock(self.turn_id, round_no, call.call_id, call.tool_id, dict(call.params)))
            self._observe(ToolCall(call.call_id, call.tool_id, {}),
                          Observation(call.call_id, call.tool_id, ok=False, error="round_interrupted"))
        self.ctx.record(NoticeBlock(self.turn_id, round_no, ROUND_INTERRUPTED.to_dict()))
        self._emit(interrupted_round(self.turn_id, round_no, ROUND_INTERRUPTED))

    def complete_from_log(self, completed: TurnCompleted) -> None:
        """The turn ended before its last checkpoint: keep its final answer in the timeline."""
        if completed.final_answer:
            self.ctx.record(FinalBlock(self.turn_id, completed.final_answer, completed.reason))

    # -- the loop -----------------------------------------------------------------------------------

    async def run(self, *, resumed: bool = False) -> None:
        """The turn, traced as one span in its message's trace (docs/design.md#tracing)."""
        p = self.machine.progress
        self._trace.start(p.trace, message_id=p.message_id, resumed=resumed)
        try:
            await self._run(resumed=resumed)
        finally:
            self._trace.end()

    async def _run(self, *, resumed: bool) -> None:
        ctx, p = self.ctx, self.machine.progress
        if not resumed:
            self._emit(TurnStarted(turn_id=self.turn_id, user_message_id=p.message_id))
            ctx.record(UserMessageBlock(self.turn_id, p.message_id, p.text))
            await ctx.tools.reset_exploration(ctx.conversation_id)
            ctx.checkpoint()
        elif p.round_no == 0 and p.cut is None:
            # Resumed before its first round: the host may have died before the reset above ran (a
            # command's checkpoint in that window holds the turn: tests/test_turn_start_window.py).
            # A reset is idempotent, and nothing of this turn has explored yet.
            await ctx.tools.reset_exploration(ctx.conversation_id)
        try:
            if resumed and p.pending:  # the batch a crash cut: durable results are not re-run
                await self._resume_pending()
            end = await self._loop()
        except asyncio.CancelledError:
            if self.cancelled_by_user:  # a host shutting down leaves the turn to its checkpoint
                self._observe_cancelled()
                self._complete(End(EndReason.CANCELLED, "", False))
            raise
        except Exception:
            ctx.log_exception("turn failed")
            end = End(EndReason.ERROR, GIVE_UP_MESSAGES[EndReason.ERROR], False)
        self._complete(end)

    async def _loop(self) -> End:
        m = self.machine
        while True:
            cut = m.take_cut()
            if cut is not None:
                engine = self._replay(cut)
            else:
                started = m.start_round()
                if isinstance(started, End):
                    return started
                engine = self.ctx.decision.engine(self._rules(), turn_id=self.turn_id, round_no=started)
            self._trace.round(self._round_no, str(m.phase))
            try:
                result = await self._inner_task(self._streams.run(engine, resumed=cut))
            except _Steered:
                result = self._interrupted(engine)
                cut_by_steer = m.round_steered(result)
                for c in cut_by_steer.calls:
                    self._record_call(c)
                for c in cut_by_steer.calls:  # announced calls the steer cut: each still gets an observation
                    self._observe(c.call, _steered(c.call))
                self.ctx.record(SteerBlock(self.turn_id, self._take_steer(), engine.raw_text()))
                if not cut_by_steer.then_end:
                    continue
                self.ctx.checkpoint()
                return self._end(result)
            self._round_completed(result, engine)
            self.ctx.checkpoint()
            plan = m.round_ended(result)
            if isinstance(plan, End):
                return plan
            if isinstance(plan, Decide):
                continue
            assert isinstance(plan, Execute)
            if plan.then_end:
                if plan.calls:  # neutral calls accepted beside the answer still run
                    await self._execute(plan.calls, allow_steer=False)
                return self._end(result)
            try:
                await self._execute(plan.calls, allow_steer=True)
            except _Steered:
                m.steered()
                continue
            m.observed()
            self.ctx.checkpoint()

    def _replay(self, cut: CutRound) -> RoundEngine:
        """The cut round's engine, fed what the durable log holds. Its events already reached the
        clients: nothing is emitted again; announced calls are owed their observation as before."""
        decision = self.ctx.decision
        engine = decision.engine(self._rules(), turn_id=self.turn_id, round_no=cut.round_no, rebuilt=True)
        for event in decision.feed(engine, cut.raw):
            if type(event) is ToolCallReady:
                self._unobserved[event.call.call_id] = event.call
        return engine

    async def _resume_pending(self) -> None:
        try:
            await self._execute(self.machine.pending_calls(self.ctx.catalog), allow_steer=True, record_calls=False)
        except _Steered:
            self.machine.steered()
        self.ctx.checkpoint()

    async def _inner_task(self, coro: Any) -> Any:
        """Run a cancellable piece (generation, tool wait); a steer cancels it and raises _Steered."""
        if self._steer_text is not None and self.machine.phase is not Phase.FINALIZE:
            coro.close()
            raise _Steered
        self._inner = asyncio.get_running_loop().create_task(coro)
        try:
            return await self._inner
        except asyncio.CancelledError:
            if self._steer_text is not None and self.machine.phase is not Phase.FINALIZE and not _current_cancelling():
                raise _Steered from None
            raise
        finally:
            self._inner = None

    # -- decision -----------------------------------------------------------------------------------

    def _rules(self) -> RoundRules:
        ctx = self.ctx
        return self.machine.rules(ctx.catalog, state=ctx.agent_state, mode=ctx.mode, validate_params=ctx.validate_params)

    def _stream_event(self, event: RoundEvent) -> None:
        if type(event) is ToolCallReady:
            call = event.call
            self._unobserved[call.call_id] = call
            self._emit(ToolCalled(
                turn_id=self.turn_id, round=self._round_no, call_id=call.call_id, tool_id=call.tool_id,
                params=dict(call.params), trait=str(event.trait),
            ))
        else:  # thinking.delta, answer.delta: the engine built them for this turn and round
            self._emit(event)  # type: ignore[arg-type]

    def _interrupted(self, engine: RoundEngine) -> RoundResult:
        """A steer cut the generation: what it cut is not the model's error (docs/design.md#steer)."""
        result = self._streams.finish(engine, interrupted=True)
        self._round_completed(result, engine, steered=True)
        return result

    def _take_steer(self) -> str:
        text, self._steer_text = self._steer_text or "", None
        return text

    def _round_completed(self, result: RoundResult, engine: RoundEngine, *, steered: bool = False) -> None:
        # Durable with this round.completed, never shown: what the model wrote, before any gate
        # (docs/design.md#replay).
        round_no = self._round_no
        decision = self.ctx.decision
        self.ctx.record_output(RoundOutput(
            turn_id=self.turn_id, round=round_no, raw=decision.output(engine), models=tuple(self._streams.models),
            mode=str(engine.rules.mode), agent_state=engine.rules.state, phase=str(self.machine.phase),
        ))
        self._trace.round_outcome(str(result.outcome))
        if result.thinking:
            self.ctx.record(ThinkingBlock(self.turn_id, round_no, result.thinking))
        message = decision.message(engine, result, turn_id=self.turn_id, round_no=round_no)
        if message is not None:
            self.ctx.record(message)
        for notice in result.notices:
            self.ctx.record(NoticeBlock(self.turn_id, round_no, notice.to_dict()))
            if notice.code is NoticeCode.FINISH_ILLEGAL:
                self._emit(IllegalFinish(turn_id=self.turn_id, round=round_no, events=list(self._events)))
        self._emit(result.completed(self.turn_id, round_no, steered=steered))

    # -- tool execution -------------------------------------------------------------------------------

    async def _execute(self, calls: list[AcceptedCall], *, allow_steer: bool, record_calls: bool = True) -> None:
        ctx, pol, m = self.ctx, self.ctx.policies, self.machine
        if record_calls:  # new calls (a resumed batch was recorded, and admitted, before the crash)
            for c in calls:
                self._record_call(c)
            calls, refused = m.admit(calls, ctx.max_tool_calls)
            for c in refused:
                self._observe(c.call, Observation(c.call.call_id, c.call.tool_id, ok=False, error="quota_exceeded",
                                                  detail=tool_calls_refusal_detail(ctx.max_tool_calls or 0)))
        for c in calls:
            self._trace.tool_call(c.call.call_id, c.call.tool_id, str(c.trait))
        regular, asks = m.executing(calls)
        saved = ctx.checkpoint()
        if saved is not None:  # durable before any tool runs: a crash from here re-submits these calls,
            await saved        # and the executor answers a call whose result is durable from the store
        pending = [*regular, *asks]
        try:
            regular = await self._approvals(regular, pending, allow_steer=allow_steer)
            if regular:
                batch = ctx.tools.execute_batch(
                    ctx.conversation_id, self.turn_id, regular,
                    exploration_cap=m.exploration_cap, timeout_s=pol.tool_timeout_s, catalog=ctx.catalog,
                    caller=m.progress.caller,
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

    async def _approvals(self, calls: list[ToolCall], pending: list[ToolCall], *, allow_steer: bool) -> list[ToolCall]:
        """Execute confirmation (docs/design.md#execute-confirmation): each call of a `confirm` tool
        waits for the user's decision, through the ask_user protocol. The decisions are durable
        before any call runs or is refused, so a crash never runs a call twice nor one never
        approved; a batch resumed after a crash asks only what was not decided. Returns the calls
        that may run; the others observe `denied_by_user`."""
        ctx, m = self.ctx, self.machine
        for call in calls:
            if m.needs_approval(call.call_id, ctx.catalog.get(call.tool_id)):
                ask = self._approve(call)
                await (self._inner_task(ask) if allow_steer else ask)
                saved = ctx.checkpoint()  # each decision durable at once: a crash never asks it again
                if saved is not None:
                    await saved
        runnable = []
        for call in calls:
            if m.may_run(call.call_id, ctx.catalog.get(call.tool_id)):
                runnable.append(call)
                continue
            decision = m.progress.approvals.get(call.call_id, Consent.DENIED)
            self._observe(call, Observation(call.call_id, call.tool_id, ok=False, error=DENIED_BY_USER, detail={
                "decision": decision, "message": "the user did not approve this call: it did not run"}))
            pending.remove(call)
        return runnable

    async def _approve(self, call: ToolCall) -> None:
        ctx, pol = self.ctx, self.ctx.policies
        future = ctx.expect_answer(call.call_id)
        self._emit(AskUser(turn_id=self.turn_id, ask_id=call.call_id, question=f"Run {call.tool_id}?",
                           options=list(APPROVAL_OPTIONS), timeout_s=pol.ask_user_timeout_s, kind="approval",
                           tool_id=call.tool_id, params=dict(call.params)))
        try:
            answer: str | None = await asyncio.wait_for(future, pol.ask_user_timeout_s)
        except TimeoutError:
            answer = None
        finally:
            ctx.forget_answer(call.call_id)
        decision = self.machine.decide(call.call_id, answer)
        self._emit(Approval(turn_id=self.turn_id, call_id=call.call_id, tool_id=call.tool_id, decision=decision.value))

    def _record_call(self, c: AcceptedCall) -> None:
        self.ctx.record(ToolCallBlock(self.turn_id, self._round_no, c.call.call_id, c.call.tool_id,
                                      dict(c.call.params), c.call.code))

    async def _ask(self, call: ToolCall) -> Observation:
        ctx, pol = self.ctx, self.ctx.policies
        question = str(call.params.get("question", ""))
        options = [str(o) for o in call.params.get("options") or []]
        future = ctx.expect_answer(call.call_id)
        self._emit(AskUser(turn_id=self.turn_id, ask_id=call.call_id, question=question, options=options,
                           timeout_s=pol.ask_user_timeout_s))
        try:
            answer: str | None = await asyncio.wait_for(future, pol.ask_user_timeout_s)
        except TimeoutError:
            answer = None
        finally:
            ctx.forget_answer(call.call_id)
        if self.machine.budget_answer(question, answer) is Budget.RESET:
            await ctx.tools.reset_exploration(ctx.conversation_id)
        if answer is None:
            return Observation(call.call_id, call.tool_id, ok=False, error="ask_user_timeout")
        return Observation(call.call_id, call.tool_id, ok=True, result={"answer": answer})

    def _observe(self, call: ToolCall, obs: Observation) -> None:
        ctx = self.ctx
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
        self._apply_state(self.machine.observe(call.call_id, obs, ctx.catalog.get(call.tool_id)))

    def _apply_state(self, state: str | None) -> None:
        if state is not None:  # the next round of the same turn already uses it (docs/design.md#states)
            self.ctx.set_agent_state(state)

    def _observe_cancelled(self) -> None:
        """A cancel cut the turn: every announced call still gets its one observation
        (docs/design.md#observations)."""
        owed = dict(self._unobserved)  # announced while streaming, or being executed (maybe resumed)
        for p in self.machine.progress.pending:
            owed.setdefault(p.call_id, p.as_call())
        recorded = {b.call_id for b in self.ctx.timeline if isinstance(b, ToolCallBlock)}
        for call in owed.values():
            if call.call_id not in recorded:
                self.ctx.record(ToolCallBlock(self.turn_id, self._round_no, call.call_id, call.tool_id,
                                              dict(call.params), call.code))
            self._observe(call, Observation(call.call_id, call.tool_id, ok=False, error="cancelled"))

    # -- ending ---------------------------------------------------------------------------------------

    def _end(self, result: RoundResult) -> End:
        if result.summary:
            self.ctx.record(SummaryBlock(self.turn_id, result.summary))
        return self.machine.end(result)

    def _complete(self, end: End) -> None:
        for trace in end.traces:
            self._emit(trace)
        self._trace.ended(str(end.reason))
        if end.answer:
            self.ctx.record(FinalBlock(self.turn_id, end.answer, end.reason))
        self._emit(TurnCompleted(
            turn_id=self.turn_id, reason=end.reason, final_answer=end.answer,
            used_tools=self.machine.progress.observations > 0, finish_ok=end.finish_ok, partial=end.partial,
            error=end.error,
        ))

    def _emit(self, data: EventData) -> None:
        self._events.append(EventRef(data.KIND, getattr(data, "call_id", None)))
        self.ctx.emit(data)


def _steered(call: ToolCall) -> Observation:
    return Observation(call.call_id, call.tool_id, ok=False, error="steered")


def _current_cancelling() -> int:
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0
