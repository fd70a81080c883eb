"""The conversation: a logical actor, single writer of its state (docs/design.md#hosting).

It owns the timeline, the step ledger, mode, agent state, the queue of pending user messages and
the event log (where seq is assigned). Commands arrive one at a time from its host's mailbox;
turns run one after another, so two user messages never interleave within one turn
(docs/design.md#follow-ups). No Ray and no sockets here: a host (local or Ray) wraps it, and a
test drives it directly. It is the `TurnContext` its turns run in.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Coroutine,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from actors.catalog import Catalog, Observation, ToolCall, ToolExecutor
from actors.context import PromptCounts, Step, TokenCounter, message_key
from actors.decision import decision_for
from actors.eventlog import EventLog
from actors.external_call import (
    Access,
    ApprovalNeeded,
    ApprovalRoute,
    ExternalCall,
    ExternalReply,
    ExternalRules,
    ExternalSession,
    ExternalView,
    Observed,
    Refused,
)
from actors.gates import Candidate
from actors.identity import Caller
from actors.llm.lite import litellm_module
from actors.llm.stream import ModelDelta, ModelFinished, StreamItem
from actors.profile import AgentProfile, Policies
from actors.quotas import Quota, QuotaLimits, Scope, estimate_tokens, tool_calls_refusal_detail
from actors.store.base import RoundOutput
from actors.tools.registry import ToolRegistry
from actors.turn import Turn
from actors.turn_machine import (
    APPROVAL_OPTIONS,
    DENIED_BY_USER,
    Budget,
    Consent,
    PendingCall,
    TurnMachine,
    TurnProgress,
)
from protocol.actions import ActionType
from protocol.events import (
    Approval,
    AskUser,
    EventData,
    ExternalClient,
    MessageKind,
    ToolCalled,
    ToolResult,
    TurnCompleted,
    UiCommand,
    UserSaid,
)
from protocol.frames import Mode
from protocol.timeline import Block, UserMessageBlock

log = logging.getLogger("reactgate.conversation")
MAX_EXTERNAL_REPLIES = 256   # finished external calls remembered, for a client's retry of one
INTERRUPTED: Final = Observed(ok=False, error="round_interrupted")   # the reply of a call a crash cut
MAX_EXTERNAL_SESSIONS = 64   # external sessions whose budget and approvals a snapshot keeps


def interrupted(call_id: str, tool_id: str) -> Observation:
    """The observation of an external call a crash cut: logged as its result, recorded as its
    durable result, replied as INTERRUPTED (docs/design.md#mcp-face)."""
    return Observation(call_id, tool_id, ok=False, error=INTERRUPTED.error)


class QueuedMessage(msgspec.Struct, frozen=True):
    message_id: str
    text: str
    trace: dict[str, str] = msgspec.field(default_factory=dict)  # its command's trace (docs/design.md#tracing)
    caller: Caller | None = None   # who sent it: its turn's tools may know (docs/design.md#your-tools)


class ConversationState(msgspec.Struct, kw_only=True):
    """Everything a snapshot holds; re-activation on any host starts from it (docs/design.md#passivation)."""

    conversation_id: str
    agent: str
    mode: Mode = Mode.AGENT
    agent_state: str = "default"
    timeline: list[Block] = msgspec.field(default_factory=list)
    ledger: list[Step] = msgspec.field(default_factory=list)
    model_calls: int = 0          # the scripted model's "i-th call" survives a move between hosts
    turns: int = 0
    queue: list[QueuedMessage] = msgspec.field(default_factory=list)
    tools: dict[str, Any] = msgspec.field(default_factory=dict)  # the tool executor's per-conversation state
    current: TurnProgress | None = None   # the running turn, resumed after a crash
    # External clients' sessions (docs/design.md#mcp-face): each one's budget, approvals and backstop
    external: dict[str, ExternalSession] = msgspec.field(default_factory=dict)
    # Their calls a crash cut (the last MAX_EXTERNAL_REPLIES): a retry reaching any later activation
    # gets `round_interrupted` again, and the tool, which may have run in part, does not run again.
    interrupted_calls: list[str] = msgspec.field(default_factory=list)

    def holds_message(self, message_id: str) -> bool:
        """This user message is here: queued, running, or in the timeline."""
        return (any(m.message_id == message_id for m in self.queue)
                or (self.current is not None and self.current.message_id == message_id)
                or any(isinstance(b, UserMessageBlock) and b.message_id == message_id for b in self.timeline))

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @staticmethod
    def decode(data: bytes) -> ConversationState:
        return msgspec.msgpack.decode(data, type=ConversationState)


StreamModel = Callable[..., AsyncGenerator[Any, None]]


def litellm_token_counter(model: str) -> TokenCounter:
    def count(messages: Sequence[Mapping[str, Any]]) -> int:
        if len(messages) == 1:
            return _count_one(model, message_key(messages[0]))
        return int(litellm_module().token_counter(model=model, messages=list(messages)))

    return count


@functools.lru_cache(maxsize=4096)
def _count_one(model: str, message: bytes) -> int:
    """One message's count, kept for every conversation of the process (the same system prompt, a
    history replayed): the context is counted message by message before every model call
    (actors/context.py `assemble`; each conversation keeps its own history's, `PromptCounts`,
    docs/design.md#context), and a message's count never changes. Uncached, this was the largest
    item of a host's CPU at 300 conversations (bench/README.md, `load_300.py`)."""
    return int(litellm_module().token_counter(model=model, messages=[msgspec.json.decode(message)]))


@dataclass
class Runtime:
    """What a host gives every conversation it hosts."""

    registry: ToolRegistry
    tools: ToolExecutor
    stream_model: StreamModel
    count_tokens: TokenCounter | None = None
    model_kwargs: dict[str, Any] = field(default_factory=dict)  # api_base, api_key for `openai/` models
    quotas: QuotaLimits = field(default_factory=QuotaLimits)     # docs/design.md#quotas: the turn reads its tool calls


class Conversation:
    def __init__(self, state: ConversationState, profile: AgentProfile, runtime: Runtime, events: EventLog) -> None:
        self.state = state
        self.profile = profile
        self.runtime = runtime
        self.events = events
        self._catalog = profile.catalog_from(runtime.registry.catalog())
        self.decision = decision_for(profile.decision, self._catalog, profile.policies)
        self._counts = PromptCounts(runtime.count_tokens or litellm_token_counter(profile.model))
        self._model_settings = {m: profile.settings_for(m) for m in profile.models}
        self._answers: dict[str, asyncio.Future[str]] = {}
        self._turn: Turn | None = None
        self._runner: asyncio.Task[None] | None = None
        self._cancel_turn = False
        self.on_checkpoint: Callable[[], Awaitable[None] | None] | None = None
        # The host's quota hooks (docs/design.md#quotas): no turn is left to run (the conversation's
        # concurrent-turn slot is free; called again when the runner ends, harmless), and the tokens
        # one model call used.
        self.on_idle: Callable[[], None] | None = None
        self.on_usage: Callable[[int], None] | None = None
        self._exact_usage = runtime.quotas.limits_tokens
        self._idle = asyncio.Event()
        self._idle.set()
        # External calls running now (docs/design.md#mcp-face): by call id, and per session the
        # candidates the gates see as that session's accepted actions; a few finished replies, so a
        # call sent again (a client's retry) is answered, not run and logged again.
        self._external: dict[str, asyncio.Task[ExternalReply]] = {}
        self._external_in_flight: dict[str, dict[str, Candidate]] = {}
        self._external_done: dict[str, ExternalReply] = {}

    @property
    def conversation_id(self) -> str:
        return self.state.conversation_id

    @property
    def busy(self) -> bool:
        """A turn runs or waits, or an external call runs: not passivated meanwhile."""
        return not self._idle.is_set() or bool(self._external)

    # -- what a turn reads (TurnContext) -------------------------------------------------------

    @property
    def agent_name(self) -> str:
        return self.profile.name

    @property
    def instructions(self) -> str | None:
        return self.profile.instructions

    @property
    def policies(self) -> Policies:
        return self.profile.policies

    @property
    def profile_models(self) -> Sequence[str]:
        return self.profile.models

    @property
    def agent_states(self) -> Collection[str]:
        return self.profile.states

    @property
    def catalog(self) -> Catalog:
        return self._catalog

    @property
    def tools(self) -> ToolExecutor:
        return self.runtime.tools

    @property
    def agent_state(self) -> str:
        return self.state.agent_state

    @property
    def mode(self) -> Mode:
        return self.state.mode

    @property
    def timeline(self) -> Sequence[Block]:
        return self.state.timeline

    @property
    def ledger(self) -> Sequence[Step]:
        return self.state.ledger

    @property
    def max_tool_calls(self) -> int | None:
        return self.runtime.quotas.limit(Quota.TOOL_CALLS_PER_TURN, Scope.TURN)

    @property
    def turn_running(self) -> bool:
        """A turn is running (a steer steers it rather than starting one)."""
        return self._turn is not None

    # -- the mailbox ------------------------------------------------------------------------------

    def user_message(self, message_id: str, text: str, trace: Mapping[str, str] | None = None, *,
                     kind: MessageKind | None = None, caller: Caller | None = None) -> None:
        """Start a turn, or queue it as a follow-up if one is running (docs/design.md#follow-ups).
        The user's words are logged first, so the conversation reads back as both sides wrote it."""
        if kind is None:
            kind = MessageKind.FOLLOW_UP if self.busy else MessageKind.MESSAGE
        self.emit(UserSaid(message_id=message_id, text=text, kind=kind))
        self.state.queue.append(QueuedMessage(message_id, text, dict(trace or {}), caller))
        self._kick()

    def resume(self) -> None:
        """After activation: continue a turn cut by a crash, then anything queued (docs/design.md#recovery)."""
        if self.state.current is not None or self.state.queue:
            self._kick()

    def steer(self, text: str, message_id: str = "", trace: Mapping[str, str] | None = None, *,
              caller: Caller | None = None) -> None:
        message_id = message_id or f"steer-{self.state.turns + 1}"
        if self._turn is not None:
            self.emit(UserSaid(message_id=message_id, text=text, kind=MessageKind.STEER))
            self._turn.steer(text)
        else:  # nothing to steer: the words are a message of their own
            self.user_message(message_id, text, trace, kind=MessageKind.STEER, caller=caller)

    def answer(self, ask_id: str, answer: str) -> bool:
        future = self._answers.get(ask_id)
        if future is None or future.done():
            return False
        future.set_result(answer)
        return True

    def set_mode(self, mode: Mode) -> None:
        """Sticky until changed; the next round's tool list and gates follow it (docs/design.md#ask-mode)."""
        self.state.mode = mode

    def cancel(self) -> None:
        """End the running turn (reason `cancelled`); queued follow-ups still run."""
        if self._runner is not None and self._turn is not None and not self._cancel_turn:
            self._cancel_turn = True
            self._turn.cancelled_by_user = True
            self._runner.cancel()

    async def idle(self) -> None:
        """Wait until no turn runs and nothing is queued, and every event is durable."""
        await self._idle.wait()
        await self.events.flush()

    async def close(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        await self._end_external()
        await self.events.close()

    async def discard(self) -> int:
        """Stop for good, keeping nothing: the conversation is being deleted (docs/design.md#deletion).
        The log is discarded first, so whatever the turn still does is neither stored nor published;
        then the turn is cancelled as a host shutdown cancels it (it emits nothing) and queued
        messages are dropped. No checkpoint is asked for. Returns the last seq the log published."""
        published = await self.events.discard()
        self.on_checkpoint = None
        self.state.queue.clear()
        self._cancel_turn = False  # a user's cancel under way must not let the runner go on
        await self._end_runner()
        await self._end_external()
        return published

    async def _end_runner(self) -> None:
        """Cancel the turn's runner and wait until it is gone."""
        runner = self._runner
        while runner is not None and not runner.done():
            runner.cancel()
            await asyncio.wait({runner})
        if runner is not None and not runner.cancelled():
            runner.exception()  # retrieved: a turn cut this way has nothing left to report

    def halt(self) -> None:
        """Stop at once (the synchronous part of `abandon`): nothing more is kept or checkpointed,
        and the turn is cancelled — before anything it awaits can tell it of the outage."""
        self.on_checkpoint = None
        self.events.halt()
        self._cancel_turn = False  # a user's cancel under way must not let the runner go on
        if self._runner is not None and not self._runner.done():
            self._runner.cancel()

    async def abandon(self) -> None:
        """Leave the host without a checkpoint: the store is unavailable (docs/design.md#store-outage).
        The log stops keeping anything (the append under way is let finish), the turn is cancelled as
        a shutdown cancels it, and nothing is saved: the next activation recovers from the store,
        as after a host crash (docs/design.md#recovery)."""
        self.halt()
        await self.events.abandon()
        await self._end_runner()
        await self._end_external()

    def checkpoint(self) -> Awaitable[None] | None:
        """A consistent point (turn start, round end, tools observed, turn end): the host saves it.
        Returns what to await for the save to be durable (None when nothing saves)."""
        self.state.current = self._turn.progress() if self._turn is not None else None
        return self.save()

    def save(self) -> Awaitable[None] | None:
        """Save the state as it is (recovery saves what it applied before any turn runs again)."""
        if self.on_checkpoint is not None:
            return self.on_checkpoint()
        return None

    def snapshot(self) -> bytes:
        self.state.tools = self.tools.export_conversation(self.conversation_id)
        return self.state.encode()

    # -- what a turn does (TurnContext) ---------------------------------------------------------------

    def emit(self, data: EventData) -> None:
        if type(data) is TurnCompleted and not self.state.queue and self.on_idle is not None:
            # The last queued turn ends: its concurrent-turn slot goes back before this event is
            # appended (the store commits in submission order), so a client that reads the event may
            # start another turn at once (docs/design.md#quotas).
            self.on_idle()
        self.events.emit(data)

    def record_output(self, output: RoundOutput) -> None:
        """A round's raw output: durable with its round.completed, never published (docs/design.md#replay)."""
        self.events.attach(output)

    def record(self, block: Block) -> None:
        self.state.timeline.append(block)

    def add_step(self, step: Step) -> None:
        self.state.ledger.append(step)

    def prompt_counter(self) -> TokenCounter:
        return self._counts.next_prompt()

    def validate_params(self, tool_id: str, params: Mapping[str, object]) -> list[str]:
        return self.runtime.registry.validate_params(tool_id, params)[1]

    def stream(self, messages: list[dict[str, Any]], models: Sequence[str] | None = None,
               tools: Sequence[Mapping[str, Any]] | None = None) -> AsyncIterator[StreamItem]:
        """One model call: the profile's model and fallbacks, or `models` (a continuation that moved
        on); `tools`: the functions a native round offers."""
        # Exact usage costs LiteLLM's end-of-stream rebuild (actors/llm/lite.py): asked for only
        # when a token quota can refuse something; otherwise characters are counted.
        usage = {"include_usage": True} if self._exact_usage else {}
        items: AsyncIterator[StreamItem] = self.runtime.stream_model(
            tuple(models or self.profile.models), messages, conversation_id=self.conversation_id,
            next_call_index=self._next_call_index, idle_timeout_s=self.policies.stream_idle_timeout_s,
            settings=self._model_settings, **usage, **({"tools": tools} if tools else {}), **self.runtime.model_kwargs,
        )
        if self.on_usage is None:
            return items
        return self._metered(items, sum(len(m.get("content") or "") for m in messages))

    async def _metered(self, items: AsyncIterator[StreamItem], prompt_chars: int) -> AsyncIterator[StreamItem]:
        """The call's items, unchanged; once it is over (finished, failed or closed early) its tokens
        are charged: as the provider reported them, else estimated from the characters sent and
        received (docs/design.md#quotas)."""
        completion_chars, reported = 0, None
        try:
            async for item in items:
                if type(item) is ModelDelta:
                    completion_chars += len(item.text)
                elif type(item) is ModelFinished:
                    reported = item.usage
                yield item
        finally:
            try:
                aclose = getattr(items, "aclose", None)
                if aclose is not None:  # an async generator: close the provider now, not when collected
                    await aclose()
            finally:
                tokens = reported.total if reported is not None else estimate_tokens(prompt_chars + completion_chars)
                if self.on_usage is not None:
                    self.on_usage(tokens)

    def _next_call_index(self) -> int:
        index = self.state.model_calls
        self.state.model_calls += 1
        return index

    def set_agent_state(self, state: str) -> None:
        """After a transitions_state tool named one of the profile's states (docs/design.md#states)."""
        self.state.agent_state = state

    def expect_answer(self, ask_id: str) -> asyncio.Future[str]:
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._answers[ask_id] = future
        return future

    def forget_answer(self, ask_id: str) -> None:
        self._answers.pop(ask_id, None)

    def pending_asks(self) -> list[str]:
        """The ask_user questions waiting for an answer (the turn is paused on them)."""
        return [k for k, f in self._answers.items() if not f.done()]

    def log_exception(self, message: str) -> None:
        log.exception("%s (conversation %s)", message, self.conversation_id)

    # -- external calls (docs/design.md#mcp-face) ------------------------------------------------------

    def _session(self, session_id: str, client: ExternalClient, access: Access) -> ExternalRules:
        session = self.state.external.get(session_id)
        if session is None or session.access != access:  # the face fixes the access at its session's start
            while len(self.state.external) >= MAX_EXTERNAL_SESSIONS:  # the snapshot keeps the latest sessions
                del self.state.external[next(iter(self.state.external))]
            session = self.state.external[session_id] = ExternalSession.new(session_id, client, access)
        elif session.client != client:
            # The client names itself at `initialize`, after the session's first view: its calls, and
            # those recovery rebuilds from the snapshot after a crash, are attributed to that name.
            session.client = client
        return ExternalRules.of(session, self.policies, self.agent_states)

    def external_view(self, session_id: str, client: ExternalClient, access: Access | None) -> ExternalView:
        """The tools this session may call now, in this state and mode, as the gates would decide.
        `access` None: the agent profile's (`[mcp_face] access`), for a session not yet bound."""
        if access is None:
            default = Access(self.profile.mcp_face.access)
            rules = ExternalRules.of(ExternalSession.new(session_id, client, default), self.policies, self.agent_states)
        else:
            rules = self._session(session_id, client, access)
        return rules.view(self.profile, self._catalog, state=self.state.agent_state, conversation_mode=self.state.mode)

    async def external_call(self, call: ExternalCall) -> ExternalReply:
        """One call of an external client, decided and run as the agent's own would be. The same
        call id again (a retry) joins the run in flight, or gets the reply it got — `round_interrupted`
        for a call a crash cut (docs/design.md#mcp-face)."""
        running = self._external.get(call.call_id)
        if running is None:
            done = self._external_done.get(call.call_id)
            if done is None and call.call_id in self.state.interrupted_calls:  # cut, then reaped or evicted
                done = INTERRUPTED
            if done is not None:
                return done
            running = self._run_external(call.call_id, self._external_call(call))
        return await asyncio.shield(running)  # the caller may go; only `external_cancel` cuts the call

    def _run_external(self, call_id: str, work: Coroutine[Any, Any, ExternalReply]) -> asyncio.Task[ExternalReply]:
        """`work` as the call's run in flight: the same call id joins it until it ends in `_finished`."""
        running = asyncio.get_running_loop().create_task(work)
        self._external[call_id] = running
        running.add_done_callback(lambda _: self._external.pop(call_id, None))
        return running

    def external_cancel(self, call_id: str) -> bool:
        """The client cancelled the call: it observes `cancelled` (docs/design.md#observations)."""
        running = self._external.get(call_id)
        if running is None or running.done():
            return False
        running.cancel()
        return True

    async def _end_external(self) -> None:
        for running in list(self._external.values()):
            running.cancel()
        if self._external:
            await asyncio.wait(list(self._external.values()))

    async def _external_call(self, call: ExternalCall) -> ExternalReply:
        session = self._session(call.session_id, call.client, call.access)
        rules = session.rules(self._catalog, state=self.state.agent_state, conversation_mode=self.state.mode,
                              validate_params=self.validate_params)
        in_flight = self._external_in_flight.setdefault(call.session_id, {})
        admitted = session.admit(call, rules, list(in_flight.values()))
        if isinstance(admitted, Refused):
            decl = self._catalog.get(call.tool_id)
            self._emit_external_call(call, str(decl.trait) if decl else "unknown")
            notice = admitted.notice
            self._emit_external_result(call, Observation(call.call_id, call.tool_id, ok=False, error=str(notice.code),
                                                         detail={k: v for k, v in notice.to_dict().items() if k != "code"}))
            return await self._finished(call, admitted)
        decl = admitted
        route = session.approval_route(call, decl)
        if route is ApprovalRoute.ELICIT:
            return ApprovalNeeded(call.tool_id, dict(call.params), f"Run {call.tool_id}?")
        self._emit_external_call(call, str(decl.trait))
        in_flight[call.call_id] = Candidate(0, ActionType.CALL_TOOL, call.tool_id, decl.trait)
        machine = session.machine
        # Owed an observation from here: a crash before it is recorded leaves it to recovery (actors/recovery.py).
        machine.progress.pending.append(PendingCall(call.call_id, call.tool_id, dict(call.params)))
        try:
            if not session.admitted(call, decl, self.max_tool_calls):
                limit = self.max_tool_calls or 0
                obs = Observation(call.call_id, call.tool_id, ok=False, error="quota_exceeded",
                                  detail=tool_calls_refusal_detail(limit))
            else:
                if route is ApprovalRoute.DECIDED:
                    consent = Consent(call.consent) if call.consent in set(Consent) else Consent.DENIED
                    machine.consented(call.call_id, consent)
                    self._emit_approval(call, consent)
                elif route is ApprovalRoute.OWNER:
                    answer = await self._ask_owner(call, f"Run {call.tool_id}?", list(APPROVAL_OPTIONS), approval=True)
                    self._emit_approval(call, machine.decide(call.call_id, answer))
                if not machine.may_run(call.call_id, decl):
                    decision = machine.progress.approvals.get(call.call_id, Consent.DENIED)
                    obs = Observation(call.call_id, call.tool_id, ok=False, error=DENIED_BY_USER, detail={
                        "decision": decision, "message": "the user did not approve this call: it did not run"})
                elif session.is_question(decl):
                    obs = await self._external_question(call, machine)
                else:
                    saved = self.checkpoint()  # the call and its approval durable before it runs, as a turn's are
                    if saved is not None:
                        await saved
                    (obs,) = await self.tools.execute_batch(
                        self.conversation_id, call.session_id, [ToolCall(call.call_id, call.tool_id, call.params)],
                        exploration_cap=machine.exploration_cap, timeout_s=self.policies.tool_timeout_s,
                        catalog=self._catalog, caller=call.caller)
        except asyncio.CancelledError:  # the client cancelled it, or the conversation closes
            obs = Observation(call.call_id, call.tool_id, ok=False, error="cancelled")
        finally:
            in_flight.pop(call.call_id, None)
        self._emit_external_result(call, obs)
        state = machine.observe(call.call_id, obs, decl)
        if state is not None:  # the agent's next round, and the face's next list, use it (docs/design.md#states)
            self.set_agent_state(state)
        return await self._finished(call, Observed.of(obs))

    async def _external_question(self, call: ExternalCall, machine: TurnMachine) -> Observation:
        """`react.ask_user` from outside: the conversation's owner is asked (docs/design.md#ask-user);
        the budget question's answer resets or stops the session's exploration."""
        question = str(call.params.get("question", ""))
        answer = await self._ask_owner(call, question, [str(o) for o in call.params.get("options") or []])
        if machine.budget_answer(question, answer) is Budget.RESET:
            await self.tools.reset_exploration(self.conversation_id)
        if answer is None:
            return Observation(call.call_id, call.tool_id, ok=False, error="ask_user_timeout")
        return Observation(call.call_id, call.tool_id, ok=True, result={"answer": answer})

    async def _ask_owner(self, call: ExternalCall, question: str, options: list[str], *,
                         approval: bool = False) -> str | None:
        """Ask the conversation's owner, on /ws and the frontends, as a turn asks; None: no answer in time."""
        future = self.expect_answer(call.call_id)
        self.emit(AskUser(turn_id=call.session_id, ask_id=call.call_id, question=question, options=options,
                          timeout_s=self.policies.ask_user_timeout_s, kind="approval" if approval else None,
                          tool_id=call.tool_id if approval else None, params=dict(call.params) if approval else None,
                          client=call.client))
        try:
            return await asyncio.wait_for(future, self.policies.ask_user_timeout_s)
        except TimeoutError:
            return None
        finally:
            self.forget_answer(call.call_id)

    async def _finished(self, call: ExternalCall, reply: ExternalReply) -> ExternalReply:
        """The reply, once the call's events and the session's state are durable: as an ack waits for
        its checkpoint (docs/design.md#write-ahead), a client never holds a result the log could lose."""
        saved = self.checkpoint()
        if saved is not None:
            await saved
        if len(self._external_done) >= MAX_EXTERNAL_REPLIES:
            self._external_done.pop(next(iter(self._external_done)))
        self._external_done[call.call_id] = reply
        return reply

    def _emit_external_call(self, call: ExternalCall, trait: str) -> None:
        self.emit(ToolCalled(turn_id=call.session_id, round=0, call_id=call.call_id, tool_id=call.tool_id,
                             params=dict(call.params), trait=trait, client=call.client))

    def interrupt_external_calls(self, owed: Sequence[ToolCalled], settled: Sequence[str] = ()) -> None:
        """Recovery (docs/design.md#recovery): external calls a crash cut, each owed its one observation:
        `round_interrupted`. `settled`: calls the log already says were cut (a crash before the
        snapshot that would have listed them). Both stay `interrupted_calls` (the last
        MAX_EXTERNAL_REPLIES; past those, the durable result their host records answers a retry):
        no retry runs them."""
        cut = self.state.interrupted_calls
        cut.extend(c for c in [*settled, *(called.call_id for called in owed)] if c not in cut)
        del cut[:-MAX_EXTERNAL_REPLIES]
        for called in owed:
            assert called.client is not None
            call = ExternalCall(session_id=called.turn_id, client=called.client, access=Access.OBSERVE,
                                call_id=called.call_id, tool_id=called.tool_id, params=dict(called.params))
            self._emit_external_result(call, interrupted(called.call_id, called.tool_id))
            # Its reply, once durable, as a run of the call: the same call sent again (the client's
            # retry; the Ray gateway routing it here after its host died) gets it, and runs nothing.
            self._run_external(called.call_id, self._finished(call, INTERRUPTED))
        for session in self.state.external.values():
            session.progress.pending = []

    def _emit_external_result(self, call: ExternalCall, obs: Observation) -> None:
        self.emit(ToolResult(turn_id=call.session_id, call_id=call.call_id, tool_id=call.tool_id, ok=obs.ok,
                             duration_ms=obs.duration_ms, result=dict(obs.result or {}) if obs.ok else None,
                             error=None if obs.ok else obs.error,
                             detail=dict(obs.detail) if not obs.ok and obs.detail else None, client=call.client))
        for command in obs.ui_commands:
            self.emit(UiCommand(turn_id=call.session_id, command=str(command.get("command")),
                                args=dict(command.get("args", {}))))

    def _emit_approval(self, call: ExternalCall, consent: Consent) -> None:
        self.emit(Approval(turn_id=call.session_id, call_id=call.call_id, tool_id=call.tool_id,
                                decision=consent.value, client=call.client))

    # -- running turns -------------------------------------------------------------------------------

    def _kick(self) -> None:
        if self._runner is None or self._runner.done():
            self._idle.clear()
            self._runner = asyncio.get_running_loop().create_task(self._run_queue())

    async def _run_queue(self) -> None:
        try:
            while self.state.current is not None or self.state.queue:
                resumed = self.state.current is not None
                if self.state.current is not None:
                    turn = Turn(self, self.state.current)
                else:
                    message = self.state.queue.pop(0)
                    self.state.turns += 1
                    turn = Turn.new(self, f"t{self.state.turns}", message.message_id, message.text, message.trace,
                                    message.caller)
                    # The message leaves the queue and its turn runs, in one synchronous moment: a
                    # checkpoint taken before the turn's own first one (a command's, whose ack waits
                    # for it) holds the turn. Taken with a stale `current`, it held the message neither
                    # queued nor running, and a host death lost the turn for good
                    # (docs/design.md#recovery; tests/test_turn_start_window.py).
                    self.state.current = turn.progress()
                self._turn = turn
                try:
                    await turn.run(resumed=resumed)
                except asyncio.CancelledError:
                    self._turn = None
                    if not self._cancel_turn:
                        raise  # closing: the snapshot keeps the turn in progress
                    self._cancel_turn = False
                    asyncio.current_task().uncancel()  # type: ignore[union-attr]  # `cancel` ends one turn only
                self._turn = None
                self.checkpoint()
            if self.on_idle is not None:  # the queue ran dry (not closed mid-turn: that turn resumes later)
                self.on_idle()
        finally:
            self._turn = None
            self._idle.set()
