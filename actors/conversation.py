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
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from actors.catalog import Catalog, ToolExecutor
from actors.context import Step, TokenCounter
from actors.decision import decision_for
from actors.eventlog import EventLog
from actors.identity import Caller
from actors.llm.lite import litellm_module
from actors.llm.stream import ModelDelta, ModelFinished, StreamItem
from actors.profile import AgentProfile, Policies
from actors.quotas import Quota, QuotaLimits, Scope, estimate_tokens
from actors.store.base import RoundOutput
from actors.tools.registry import ToolRegistry
from actors.turn import Turn
from actors.turn_machine import TurnProgress
from protocol.events import EventData, MessageKind, TurnCompleted, UserSaid
from protocol.frames import Mode
from protocol.timeline import Block

log = logging.getLogger("reactgate.conversation")


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

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @staticmethod
    def decode(data: bytes) -> ConversationState:
        return msgspec.msgpack.decode(data, type=ConversationState)


StreamModel = Callable[..., AsyncGenerator[Any, None]]


def litellm_token_counter(model: str) -> TokenCounter:
    def count(messages: Sequence[Mapping[str, Any]]) -> int:
        if len(messages) == 1:
            return _count_one(model, _ENCODE(messages[0]))
        return int(litellm_module().token_counter(model=model, messages=list(messages)))

    return count


_ENCODE = msgspec.json.Encoder().encode


@functools.lru_cache(maxsize=4096)
def _count_one(model: str, message: bytes) -> int:
    """One message's count, kept: the context is counted message by message before every model call
    (actors/context.py `assemble`), and a message's count never changes. Uncached, this was the
    largest item of a host's CPU at 300 conversations (bench/README.md, `load_300.py`). The key is
    the message's JSON: a native one holds lists and objects (its `tool_calls`)."""
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
        self._count_tokens = runtime.count_tokens or litellm_token_counter(profile.model)
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

    @property
    def conversation_id(self) -> str:
        return self.state.conversation_id

    @property
    def busy(self) -> bool:
        return not self._idle.is_set()

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

    def count_tokens(self, messages: Sequence[Mapping[str, str]]) -> int:
        return self._count_tokens(messages)

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
