"""Hosting many conversations in one process: activation, mailbox, checkpoints, passivation.

`HostCore` is the plain class the ConversationHost Ray actor (`actors/ray/host.py`) wraps, and that
the local backend uses directly (docs/design.md#hosting): the same lines run in both. It
guarantees, per conversation:
- single writer: one `Conversation` object per activation, commands applied in arrival order;
- write-ahead: the event log persists through the store before anything is published;
- idempotency: `user_message`, `steer` and `answer` are keyed by (conversation_id, id), durably;
- checkpoints: a snapshot whose seq is durable, saved at round and turn boundaries, so a
  re-activation on any host resumes from the store;
- deletion: the conversation is stopped, writing and publishing nothing more, before the store
  deletes it; its listeners then get `conversation.deleted` (docs/design.md#deletion);
- quotas (docs/design.md#quotas): a message that starts a turn is admitted here, whichever gateway
  sent it (turns per minute, tokens per day, and a concurrent-turn slot held while the conversation
  is busy), and every model call's tokens are charged here;
- the conversation list (docs/design.md#conversation-list): each accepted message, steer or answer
  and each end of the last queued turn is noted in the store — running or not, when, the title;
- its agent (docs/design.md#several-agents): a conversation runs the profile of the agent it was
  created with; one whose agent is not served here is `AgentNotServed`, never activated;
- store outages (docs/design.md#store-outage): a command to a conversation whose log waits for the
  store is refused with `StoreUnavailable` (retryable), as is one the store refuses, and one whose
  checkpoint the outage holds up; a command whose key the outage left uncertain is recognised when
  sent again, neither lost nor applied twice. A conversation whose log gave up (`store_outage_s`)
  is deactivated without a checkpoint and re-activated from the store once it answers, if it had
  work in flight or watchers — the recovery of a host crash (docs/design.md#recovery).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from actors.conversation import Conversation, ConversationState, Runtime
from actors.eventlog import EventLog, EventLogStopped
from actors.external_call import Access, ExternalCall, ExternalReply, ExternalView
from actors.hosting.backend import (
    AgentNotServed,
    Answer,
    Cancel,
    Command,
    Forbidden,
    SetMode,
    Steer,
    UnknownAsk,
    UserMessage,
)
from actors.hosting.meter import Meter
from actors.identity import Caller, Owner
from actors.profile import AgentProfile
from actors.quotas import QuotaExceeded, QuotaLimits
from actors.recovery import cut_external_calls, recover
from actors.store import IDEMPOTENCY_TTL_S, Store, Tombstoned
from actors.store.base import StoreUnavailable
from actors.store.outage import BATCH, DEFAULT_STORE_OUTAGE_S, RETRY_STATS, REVIVE, Backoff, retry_unavailable
from actors.tools.durable import encode_result
from protocol.events import ConversationDeleted, Event, ExternalClient
from protocol.frames import title_of
from protocol.timeline import UserMessageBlock

log = logging.getLogger("reactgate.host")

Listener = Callable[[Sequence[Event]], None]
KEY_PRUNE_INTERVAL_S = 3600.0
MAX_DELETED_REMEMBERED = 10_000
MAX_UNSETTLED_REMEMBERED = 10_000
SETTLE_POLL_S = 0.05    # how often a command waiting for its checkpoint looks whether an outage holds it


class UnknownConversation(Forbidden):
    """The store has no such conversation: the backend checked ownership before, so it was deleted
    since (or concurrently). To the caller it is `forbidden`, like any conversation not theirs."""


@dataclass(slots=True)
class _Active:
    conversation: Conversation
    last_activity: float
    owner: Owner
    saving: asyncio.Task[None] | None = None
    pending_snapshot: tuple[int, bytes] | None = None
    turn_slot: bool = False                        # holds a concurrent-turn slot (busy since it took it)
    releasing: asyncio.Task[Any] | None = None     # the slot's release, committed before it is taken again
    admission: asyncio.Lock = field(default_factory=asyncio.Lock)  # one turn-starting command at a time
    listed_running: bool = False                   # what the list row says of it, as last noted here
    titled: bool = False                           # its title was noted by this activation
    save_outage: Backoff | None = None             # a checkpoint's save waits for the store

    def stalled(self) -> StoreUnavailable | None:
        """What holds this conversation's durability up now, as a command refused meanwhile is told:
        its log, or a checkpoint's save, waiting for the store (docs/design.md#store-outage)."""
        refused = self.conversation.events.unavailable()
        if refused is None and self.save_outage is not None:
            refused = self.save_outage.unavailable()
        return refused


_NOT_UNSETTLED: Any = object()


def _consume(future: asyncio.Future[Any]) -> None:
    # A checkpoint nobody awaits that failed: its failure is logged where it happened.
    if not future.cancelled():
        future.exception()


def first_message(state: ConversationState) -> str | None:
    """The conversation's first user message, as its state holds it (docs/design.md#conversation-list):
    the timeline's first `user.message` block, else the running turn's message, else the first queued
    one. The same words as its first `user.message` event, without reading the log, and there too for
    a conversation logged before that event existed."""
    for block in state.timeline:
        if isinstance(block, UserMessageBlock):
            return block.text
    if state.current is not None:
        return state.current.text
    return state.queue[0].text if state.queue else None


class HostCore:
    def __init__(
        self,
        store: Store,
        runtime: Runtime,
        profiles: Mapping[str, AgentProfile],
        *,
        idle_ttl_s: float = 600,
        clock: Callable[[], float] = time.time,
        claim: Callable[[str], Awaitable[None]] | None = None,
        release: Callable[[str], Awaitable[None]] | None = None,
        quotas: QuotaLimits | None = None,
        store_outage_s: float = DEFAULT_STORE_OUTAGE_S,
    ) -> None:
        self.store = store
        self.store_outage_s = store_outage_s   # how long a conversation waits for its store (docs/design.md#store-outage)
        self.meter = Meter(store, quotas or QuotaLimits(), clock)
        self._claim = claim        # single activation across hosts: the Directory must grant it
        self._release = release
        self.runtime = runtime
        self.profiles = profiles
        self.idle_ttl_s = idle_ttl_s
        self.clock = clock
        self._active: dict[str, _Active] = {}
        self._activating: dict[str, asyncio.Future[_Active]] = {}
        self._listeners: dict[str, list[Listener]] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._metering: set[asyncio.Task[Any]] = set()   # token charges and slot releases under way
        self._deleting: set[str] = set()          # being deleted here: nothing activates them
        self._deleted: dict[str, Event] = {}      # deleted here: their last event, for a late listener
        # Idempotency keys an outage left uncertain: remembered (maybe) but the command not acked.
        # The value: the activation that applied it, or None when it was not applied.
        self._unsettled: dict[tuple[str, str], _Active | None] = {}
        self._applying: set[tuple[str, str]] = set()  # user messages between their key and their apply
        self._background: set[asyncio.Task[Any]] = set()   # deactivations and revivals after an outage
        self._closing = False
        self._closed = asyncio.Event()            # ends a revival's wait at once

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap_idle())

    async def close(self) -> None:
        self._closing = True
        self._closed.set()                   # revivals stop; a deactivation under way ends its turn first
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        if self._background:
            await asyncio.wait(self._background)
        for cid in list(self._active):
            await self.passivate(cid, force=True)
        if self._metering:  # charges already made must reach the store before it closes
            await asyncio.gather(*self._metering, return_exceptions=True)

    @property
    def active_ids(self) -> list[str]:
        return list(self._active)

    # -- the mailbox --------------------------------------------------------------------------------

    async def command(self, conversation_id: str, command: Command) -> str:
        """Apply a command; "accepted" once a checkpoint holding it is durable, "duplicate" for a
        repeat. During a store outage (docs/design.md#store-outage) raises StoreUnavailable, the
        command not applied — or applied, when only its checkpoint waits: sent again, it is then
        acked once that checkpoint is durable, never applied twice."""
        if not isinstance(command, UserMessage):
            return await self._command(conversation_id, command)
        key = (conversation_id, command.id)
        if key in self._applying:
            return "duplicate"  # the same message again while its first copy is being applied here
        self._applying.add(key)
        try:
            return await self._command(conversation_id, command)
        finally:
            self._applying.discard(key)

    async def _command(self, conversation_id: str, command: Command) -> str:
        active = await self._ensure_active(conversation_id)
        refused = active.stalled()
        if refused is not None:  # its log waits for the store: nothing could be made durable now
            raise refused
        active.last_activity = self.clock()
        conv = active.conversation
        idempotent = isinstance(command, UserMessage | Steer | Answer)
        key = (conversation_id, command.id)
        try:
            if (isinstance(command, UserMessage | Steer | Answer)
                    and not await self.store.remember_key(conversation_id, command.id, self.clock())
                    and not await self._sent_again(active, command)):
                return "duplicate"
        except Tombstoned:
            raise UnknownConversation(conversation_id) from None  # deleted meanwhile
        except StoreUnavailable:
            if idempotent:
                self._unsettle(key, self._unsettled.get(key))  # the key may have been remembered
            raise
        try:
            async with active.admission:
                if isinstance(command, UserMessage) or (isinstance(command, Steer) and not conv.turn_running):
                    try:
                        await self._admit_turn(active)
                    except QuotaExceeded:
                        await self.store.forget_key(conversation_id, command.id)  # refused: sending it again is no repeat
                        raise
                self._apply(conv, command)
        except StoreUnavailable:
            if idempotent:
                self._unsettle(key, None)  # remembered, not applied: sent again, it is applied then
            raise
        if idempotent:
            self._unsettle(key, active)  # applied here; settled once its checkpoint is durable
            self._note(active, running=conv.busy, at=self.clock())
        await self._settle(active)  # the accepted command survives a crash of this host
        if idempotent:
            self._unsettled.pop(key, None)
        return "accepted"

    # -- external calls (docs/design.md#mcp-face) ----------------------------------------------------

    async def external(self, conversation_id: str, call: ExternalCall) -> ExternalReply:
        """An external client's call, carried out by the conversation (its single writer) as the
        agent's own would be: the same gates, tool executor, log and checkpoints. Refused with
        StoreUnavailable while the conversation's log waits for the store, as a command is."""
        active = await self._ensure_active(conversation_id)
        refused = active.stalled()
        if refused is not None:
            raise refused
        active.last_activity = self.clock()
        return await active.conversation.external_call(call)

    async def external_view(self, conversation_id: str, session_id: str, client: ExternalClient,
                            access: Access | None) -> ExternalView:
        active = await self._ensure_active(conversation_id)
        active.last_activity = self.clock()
        return active.conversation.external_view(session_id, client, access)

    async def external_cancel(self, conversation_id: str, call_id: str) -> bool:
        active = self._active.get(conversation_id)
        return active is not None and active.conversation.external_cancel(call_id)

    async def _sent_again(self, active: _Active, command: UserMessage | Steer | Answer) -> bool:
        """The store knew the key. A repeat ("duplicate", False) — unless an outage left that key
        uncertain: then whether to apply it now (True), or, when it was applied, to ack it once its
        checkpoint is durable (False)."""
        key = (active.conversation.conversation_id, command.id)
        applied_in = self._unsettled.get(key, _NOT_UNSETTLED)
        if applied_in is _NOT_UNSETTLED:
            # Remembered by an activation that is gone. A message no state holds (not queued, running
            # or in the timeline; recovery queues again every one the log holds) was never made
            # durable: its host died between remembering the key and logging its `user.message`.
            # Acked `duplicate`, it was lost (bench/soak.py, host kills): it is applied now.
            return isinstance(command, UserMessage) and not active.conversation.state.holds_message(command.id)
        held = applied_in is active or (isinstance(command, UserMessage)
                                        and active.conversation.state.holds_message(command.id))
        if not held:
            return True  # remembered, never applied (or applied by an activation the outage ended)
        await self._settle(active)
        self._unsettled.pop(key, None)
        return False

    def _unsettle(self, key: tuple[str, str], applied_in: _Active | None) -> None:
        if key not in self._unsettled and len(self._unsettled) >= MAX_UNSETTLED_REMEMBERED:
            self._unsettled.pop(next(iter(self._unsettled)))
        self._unsettled[key] = applied_in

    async def _settle(self, active: _Active) -> None:
        """Wait until a checkpoint of the state as it is now is durable. Raises StoreUnavailable,
        rather than waiting, once an outage holds it up: the caller's frame is answered `unavailable`
        at once, while the checkpoint still waits (docs/design.md#store-outage)."""
        saved = asyncio.ensure_future(self._save_now(active))
        saved.add_done_callback(_consume)
        while True:
            done, _ = await asyncio.wait({saved}, timeout=SETTLE_POLL_S)
            if done:
                try:
                    return saved.result()
                except EventLogStopped as exc:
                    cause = exc.__cause__
                    if isinstance(cause, StoreUnavailable):  # the log gave up: the store is unavailable
                        raise StoreUnavailable(cause.cause, cause.retry_after_ms) from exc
                    raise
            refused = active.stalled()
            if refused is not None:
                raise refused

    @staticmethod
    def _apply(conv: Conversation, command: Command) -> None:
        if isinstance(command, UserMessage):
            conv.user_message(command.id, command.text, command.trace, caller=command.caller)
        elif isinstance(command, Steer):
            conv.steer(command.text, command.id, command.trace, caller=command.caller)
        elif isinstance(command, Answer) and not conv.answer(command.ask_id, command.answer):
            raise UnknownAsk(command.ask_id)
        elif isinstance(command, SetMode):
            conv.set_mode(command.mode)
        elif isinstance(command, Cancel):
            conv.cancel()

    async def _admit_turn(self, active: _Active) -> None:
        """A message that starts a turn, now or after the running one (docs/design.md#quotas). If the
        conversation holds no concurrent-turn slot (it is idle, or its last turn is ending) it takes
        one, held until its last queued turn ends. Raises QuotaExceeded, having charged nothing."""
        charges = await self.meter.admit_turn(active.owner)
        conv = active.conversation
        if active.turn_slot:
            return  # a follow-up: the running turn's slot covers it
        if active.releasing is not None:
            with contextlib.suppress(Exception):
                await active.releasing  # the last busy spell's release commits before this take
        try:
            await self.meter.take_slot(active.owner, conv.conversation_id)
        except QuotaExceeded:
            await self.meter.refund(charges)
            raise
        active.turn_slot = True

    def _turns_done(self, active: _Active) -> None:
        """The conversation's last queued turn ended: its slot goes back (a message arriving after
        this takes a slot again, busy conversation or not), and the list says it no longer runs.
        Both are submitted before the turn's `turn.completed` is appended (docs/design.md#quotas)."""
        if active.listed_running:
            self._note(active, running=False, at=self.clock())
        if active.turn_slot:
            active.turn_slot = False
            owner, cid = active.owner, active.conversation.conversation_id
            # Given back once however often asked: tried again through an outage, or the slot would stay taken.
            active.releasing = self._meter_soon(self._retrying(lambda: self.meter.release_slot(owner, cid)))

    def _note(self, active: _Active, *, running: bool, at: float | None) -> None:
        """The conversation's list row (docs/design.md#conversation-list): whether it runs, the time of
        what happened (None: nothing did), and its title until this activation noted one."""
        title = ""
        if not active.titled and (text := first_message(active.conversation.state)) is not None:
            title = title_of(text)
            active.titled = True
        active.listed_running = running
        cid = active.conversation.conversation_id
        # A note is idempotent: tried again through an outage, so the list is right once it ends.
        self._meter_soon(self._retrying(lambda: self.store.note_activity(cid, running=running, at=at, title=title)),
                         "noting the conversation's activity")

    def _meter_soon(self, work: Awaitable[Any], what: str = "quota bookkeeping") -> asyncio.Task[Any]:
        async def run() -> Any:
            try:
                return await work
            except StoreUnavailable as exc:  # lost to an outage (docs/design.md#store-outage): no traceback
                log.warning("%s failed: %s", what, exc)
                return None
            except Exception:  # a lost charge, release or note is logged, never a failed turn
                log.exception("%s failed", what)
                return None

        task = asyncio.get_running_loop().create_task(run())
        self._metering.add(task)
        task.add_done_callback(self._metering.discard)
        return task

    async def _retrying(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """`call()` again through a store outage (a write safe to repeat), for at most store_outage_s,
        and not once this host closes."""
        return await retry_unavailable(call, ceiling_s=self.store_outage_s, stop=lambda: self._closing)

    def listen(self, conversation_id: str, listener: Listener) -> Callable[[], None]:
        """Durable event batches of a conversation, as they are published. Returns an unsubscribe.
        A conversation deleted here gets its `conversation.deleted` at once."""
        final = self._deleted.get(conversation_id)
        if final is not None:
            listener([final])
            return lambda: None
        listeners = self._listeners.setdefault(conversation_id, [])
        listeners.append(listener)

        def unsubscribe() -> None:
            if listener in listeners:
                listeners.remove(listener)
            if not listeners:
                self._listeners.pop(conversation_id, None)

        return unsubscribe

    async def activate(self, conversation_id: str) -> int:
        """Make sure the conversation is active here; returns its last durable seq."""
        active = await self._ensure_active(conversation_id)
        return active.conversation.events.durable_seq

    async def in_flight(self, conversation_ids: Sequence[str]) -> list[str]:
        """Those of `conversation_ids` with work a host's death cut: a turn running (or paused on
        ask_user) or messages queued, as the last snapshot holds them — or a log that goes on past
        the snapshot: a message its host applied before any checkpoint held it, which recovery
        queues again (docs/design.md#recovery, #host-death). A turn that ended after its last
        snapshot is a harmless false positive (recovery finds its `turn.completed`)."""
        found = []
        for cid in conversation_ids:
            if cid in self._active:
                found.append(cid)
                continue
            snapshot = await self.store.load_snapshot(cid)
            if snapshot is not None:
                state = ConversationState.decode(snapshot[1])
                if state.current is not None or state.queue:
                    found.append(cid)
                    continue
            if await self.store.last_seq(cid) > (snapshot[0] if snapshot is not None else 0):
                found.append(cid)
        return found

    async def idle(self, conversation_id: str) -> None:
        active = self._active.get(conversation_id)
        if active is not None:
            await active.conversation.idle()
            await self._save_now(active)

    # -- activation ---------------------------------------------------------------------------------

    async def _ensure_active(self, conversation_id: str) -> _Active:
        if conversation_id in self._deleting or conversation_id in self._deleted:
            raise UnknownConversation(conversation_id)
        active = self._active.get(conversation_id)
        if active is not None:
            return active
        pending = self._activating.get(conversation_id)
        if pending is not None:  # concurrent first frames: one activation (docs/design.md#placement)
            return await asyncio.shield(pending)
        future: asyncio.Future[_Active] = asyncio.get_running_loop().create_future()
        self._activating[conversation_id] = future
        try:
            active = await self._activate(conversation_id)
            self._active[conversation_id] = active
            future.set_result(active)
            return active
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it
            raise
        finally:
            self._activating.pop(conversation_id, None)

    async def _activate(self, conversation_id: str) -> _Active:
        if self._claim is not None:
            await self._claim(conversation_id)  # raises when another host holds the activation
        found = await self.store.conversation_owner(conversation_id)
        if found is None:
            if self._release is not None:
                await self._release(conversation_id)  # nothing to hold: its placement goes too
            raise UnknownConversation(conversation_id)
        owner, agent = found
        profile = self.profiles.get(agent)
        if profile is None:  # its agent left the configuration (docs/design.md#several-agents)
            if self._release is not None:
                await self._release(conversation_id)
            raise AgentNotServed(agent, conversation_id)
        snapshot = await self.store.load_snapshot(conversation_id)
        if snapshot is not None:
            state = ConversationState.decode(snapshot[1])
        else:
            state = ConversationState(
                conversation_id=conversation_id, agent=agent,
                agent_state=profile.initial_state or profile.states[0],
            )
        last_seq = await self.store.last_seq(conversation_id)
        events = EventLog(
            conversation_id,
            last_seq=last_seq,
            flush_interval_ms=profile.policies.flush_interval_ms,
            persist=lambda batch, outputs: self.store.append_events(conversation_id, batch, outputs),
            clock=self.clock,
            store_outage_s=self.store_outage_s,
            read_back=lambda after, limit: self.store.read_events(conversation_id, after, limit),
        )
        if state.tools:  # the executor's part of the snapshot (counters, workspace)
            self.runtime.tools.import_conversation(conversation_id, state.tools)
        conv = Conversation(state, profile, self.runtime, events)
        active = _Active(conv, self.clock(), owner)
        events.subscribe(lambda batch: self._publish(conversation_id, batch))
        events.on_give_up = lambda exc: self._deactivate(active, exc)
        conv.on_checkpoint = lambda: self._checkpoint(active)
        conv.on_idle = lambda: self._turns_done(active)
        conv.on_usage = lambda tokens: self._charge_tokens(owner, tokens)
        after = snapshot[0] if snapshot is not None else 0
        # A crash may have cut a turn after its last checkpoint (docs/design.md#recovery): apply the
        # log's tail, then resume whatever was running or queued.
        tail = await self.store.read_events(conversation_id, after, limit=last_seq - after) if last_seq > after else []
        cut_calls = cut_external_calls(state, tail)
        for cut in cut_calls:
            # An external call the crash cut (docs/design.md#mcp-face): its `round_interrupted` is its
            # durable result before recovery resumes anything, so that a retry the conversation no
            # longer remembers finds it and runs nothing. The first write wins: a result the tool
            # recorded before the crash stays.
            await self._retrying(functools.partial(self.store.record_tool_result, conversation_id, cut.call_id,
                                                   encode_result(cut)))
        if cut_calls:  # a run of them the crash left going (the Ray tool pool outlives hosts) stops
            await self.runtime.tools.cut(conversation_id, [cut.call_id for cut in cut_calls])
        recover(conv, tail, Caller.of(owner))
        # A conversation busy again holds the slot it took before (its lease row); an idle one gives
        # back a slot a crash left taken (between its take and the checkpoint of its command).
        active.turn_slot = active.listed_running = conv.busy
        if not conv.busy:
            active.releasing = self._meter_soon(self._release_stale_slot(owner, conversation_id))
            self._note(active, running=False, at=None)  # a turn's end a crash kept from the list
        return active

    async def _release_stale_slot(self, owner: Owner, conversation_id: str) -> None:
        if await self.meter.holds_slot(conversation_id):
            await self.meter.release_slot(owner, conversation_id)

    def _charge_tokens(self, owner: Owner, tokens: int) -> None:
        self._meter_soon(self.meter.charge_tokens(owner, tokens))

    def _publish(self, conversation_id: str, batch: Sequence[Event]) -> None:
        for listener in list(self._listeners.get(conversation_id, ())):
            try:
                listener(batch)
            except Exception:  # one broken listener never stops the others
                log.exception("listener failed for %s", conversation_id)

    # -- checkpoints --------------------------------------------------------------------------------

    def _checkpoint(self, active: _Active) -> asyncio.Future[None]:
        """Capture state and seq at one synchronous moment; save once that seq is durable.
        Returns a future that resolves when this checkpoint (or a later one) is saved."""
        conv = active.conversation
        active.last_activity = self.clock()
        active.pending_snapshot = (conv.events.last_seq, conv.snapshot())
        if active.saving is None or active.saving.done():
            active.saving = asyncio.get_running_loop().create_task(self._save_pending(active))
        saved = asyncio.shield(active.saving)
        saved.add_done_callback(_consume)  # a turn may not await it; who awaits it still gets its failure
        return saved

    async def _save_pending(self, active: _Active) -> None:
        """Save the pending checkpoints once the log made their seq durable — through a store outage
        too, for at most store_outage_s (then the conversation is deactivated, as when its log gives
        up). A log that stopped saves nothing: a snapshot never runs ahead of the log."""
        conv = active.conversation
        try:
            while active.pending_snapshot is not None:
                seq, data = active.pending_snapshot
                active.pending_snapshot = None
                await conv.events.flush()  # the snapshot never runs ahead of the durable log (EventLogStopped)
                try:
                    await self.store.save_snapshot(conv.conversation_id, seq, data)
                    active.save_outage = None
                except Tombstoned:
                    return  # a save that lost the race with a delete: nothing of it is kept, as intended
                except StoreUnavailable as exc:
                    # Saved again after a wait (the checkpoint taken last, if another came meanwhile);
                    # the wait counts from the first failure, whichever checkpoints came since.
                    now = time.monotonic()
                    backoff = active.save_outage = active.save_outage or Backoff(BATCH, now, self.store_outage_s)
                    delay = backoff.failed(now, exc.cause)
                    if delay is None or self._closing:
                        self._deactivate(active, exc)
                        raise
                    RETRY_STATS.other_retries += 1
                    if active.pending_snapshot is None:
                        active.pending_snapshot = (seq, data)
                    await asyncio.sleep(delay)
        finally:
            if active.pending_snapshot is None:
                active.save_outage = None

    async def _save_now(self, active: _Active) -> None:
        await self._checkpoint(active)

    # -- deletion (docs/design.md#deletion) --------------------------------------------------------

    async def delete(self, conversation_id: str, request_key: str) -> str:
        """Stop the conversation for good, then delete it from the store. "accepted"; "duplicate" when
        this very request (`request_key`) deleted it before; UnknownConversation when another did.

        The delete wins every race: the conversation is stopped first — its log discarded (nothing
        more is stored or published), its turn cancelled, no checkpoint taken — and only then is the
        delete submitted to the store, behind any write already submitted (the store commits in
        submission order, so it removes those); a write submitted later meets the tombstone. Nothing
        re-activates it here meanwhile. Then its listeners get `conversation.deleted`, with the
        next seq after the last one the log published, and are dropped."""
        if self._claim is not None and conversation_id not in self._active:
            await self._claim(conversation_id)  # WrongHost: the host holding it deletes it, and tells its watchers
        self._deleting.add(conversation_id)
        try:
            activating = self._activating.get(conversation_id)
            if activating is not None:
                await asyncio.wait({activating})
            active = self._active.pop(conversation_id, None)
            owner: Owner | None
            if active is not None:
                owner = active.owner
                active.pending_snapshot = None  # a save under way finishes before the delete, or is refused
                last_seq = await active.conversation.discard()
            else:
                found = await self.store.conversation_owner(conversation_id)
                owner = found[0] if found is not None else None
                last_seq = await self.store.last_seq(conversation_id)
            deleted = await self.store.delete_conversation(conversation_id, request_key, self.clock())
        finally:
            self._deleting.discard(conversation_id)
            self.runtime.tools.forget(conversation_id)
            if self._release is not None:
                await self._release(conversation_id)
        if not deleted:
            if await self.store.tombstone(conversation_id) == request_key:
                return "duplicate"
            raise UnknownConversation(conversation_id)
        if owner is not None:
            # Its open-conversation charge and any turn slot it held go back (docs/design.md#quotas),
            # before the ack: its owner may open another at once. A failure is logged, not raised.
            await self._meter_soon(self.meter.conversation_gone(owner, conversation_id))
        final = Event.of(conversation_id, last_seq + 1, ConversationDeleted(last_seq=last_seq), self.clock())
        if len(self._deleted) >= MAX_DELETED_REMEMBERED:
            self._deleted.clear()  # the store says it too: no owner, so `forbidden`, just not as fast
        self._deleted[conversation_id] = final
        self._publish(conversation_id, [final])
        self._listeners.pop(conversation_id, None)
        return "accepted"

    # -- passivation --------------------------------------------------------------------------------

    async def passivate(self, conversation_id: str, *, force: bool = False) -> bool:
        """Snapshot and drop an idle conversation; the next frame re-activates it, on any host.
        During a store outage an idle one stays (False: it cannot be checkpointed now); a forced one
        (the host closes) leaves without a checkpoint, to recover from the store
        (docs/design.md#store-outage)."""
        active = self._active.get(conversation_id)
        if active is None:
            return False
        conv = active.conversation
        if not force:
            if conv.busy or active.stalled() is not None:
                return False
            try:
                await self._settle(active)   # before it leaves: a failed save keeps it here
                durable = True
            except StoreUnavailable:
                return False
            except EventLogStopped:          # its log failed for good: nothing to checkpoint
                durable = False
            if (durable and conv.busy) or self._active.get(conversation_id) is not active:
                return False  # a command made it busy meanwhile, or the outage deactivated it
            self._active.pop(conversation_id, None)
            await (conv.close() if durable else conv.abandon())
        else:
            self._active.pop(conversation_id, None)
            durable = active.stalled() is None
            if durable and not conv.busy:
                try:
                    await self._settle(active)
                except (StoreUnavailable, EventLogStopped):
                    durable = False
            if durable:
                await conv.close()
            else:
                await conv.abandon()
        self.runtime.tools.forget(conversation_id)
        if self._release is not None:
            await self._release(conversation_id)
        return True

    # -- store outages (docs/design.md#store-outage) ------------------------------------------------

    def _deactivate(self, active: _Active, exc: StoreUnavailable) -> None:
        """The store stayed unavailable past store_outage_s for this conversation (its log gave up, or
        a checkpoint could not be saved): it leaves this host without a checkpoint — the store may
        still be down — its turn cancelled. If it had work in flight or watchers, it is activated
        again here as soon as the store answers, and recovers as after a host crash
        (docs/design.md#recovery); else its next frame activates it, on any host."""
        conv = active.conversation
        cid = conv.conversation_id
        if self._active.get(cid) is not active:
            return
        del self._active[cid]
        active.pending_snapshot = None
        revive = conv.busy or bool(self._listeners.get(cid))
        conv.halt()  # now: the turn must not go on (nor end in error) on what it is told next
        log.warning("conversation %s deactivated: the store stayed unavailable for %g s (%s)%s", cid,
                    self.store_outage_s, exc.cause, "; it is activated again once the store answers" if revive else "")
        task = asyncio.get_running_loop().create_task(self._drop(active, revive=revive))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _drop(self, active: _Active, *, revive: bool) -> None:
        cid = active.conversation.conversation_id
        try:
            await active.conversation.abandon()
            self.runtime.tools.forget(cid)
            if not revive:
                if self._release is not None:
                    await self._release(cid)
                return
            backoff = Backoff(REVIVE, time.monotonic())
            health = getattr(self.store, "health", None)
            while not self._closing and cid not in self._active and cid not in self._deleting and cid not in self._deleted:
                # Not before the store says it is back: a full disk still reads, and a turn resumed
                # then would call its model again only to wait, and be dropped, again.
                if callable(health) and not health().ok:
                    delay = backoff.failed(time.monotonic(), str(health().cause))
                else:
                    try:
                        await self._ensure_active(cid)
                        log.info("conversation %s activated again after the store outage", cid)
                        return
                    except StoreUnavailable as exc:
                        delay = backoff.failed(time.monotonic(), exc.cause)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closed.wait(), delay or REVIVE.max_s)
        except asyncio.CancelledError:
            raise
        except Exception:  # e.g. another host holds it now (WrongHost): that one recovers it
            log.warning("conversation %s: not activated again here after the store outage", cid, exc_info=True)

    async def _reap_idle(self) -> None:
        interval = max(0.05, min(self.idle_ttl_s / 4, 30.0))
        next_prune = self.clock()
        while True:
            await asyncio.sleep(interval)
            now = self.clock()
            if now >= next_prune:  # idempotency keys live ≥ 24 h (docs/design.md#store), not forever
                next_prune = now + KEY_PRUNE_INTERVAL_S
                try:
                    await self.store.prune_keys(now - IDEMPOTENCY_TTL_S)
                except Exception:
                    log.exception("pruning idempotency keys failed")
                try:
                    await self.meter.prune()  # quota windows long over
                except Exception:
                    log.exception("pruning quota counters failed")
            for cid, active in list(self._active.items()):
                if (now - active.last_activity >= self.idle_ttl_s and not active.conversation.busy
                        and active.stalled() is None):  # an outage: checkpointed once it is over
                    try:
                        await self.passivate(cid)
                    except Exception:
                        log.exception("passivation failed for %s", cid)

    async def inspect(self, conversation_id: str) -> dict[str, Any]:
        """The conversation's state as plain data (activates it): for operators and tests."""
        active = await self._ensure_active(conversation_id)
        conv = active.conversation
        conv.snapshot()  # refresh the tool executor's part
        return {"state": msgspec.to_builtins(conv.state), "last_seq": conv.events.last_seq, "busy": conv.busy}

    def describe(self) -> dict[str, Any]:
        """For operators and the gateway's metrics: what is hosted here, and the store as this host
        sees it (docs/design.md#store-outage): its health, its counters, and how many conversations
        wait for it now."""
        found: dict[str, Any] = {"active": len(self._active), "listeners": sum(len(v) for v in self._listeners.values()),
                                 "waiting_for_store": sum(1 for a in self._active.values() if a.stalled() is not None)}
        health = getattr(self.store, "health", None)
        if callable(health):
            h = health()
            found["store"] = {"ok": h.ok, "since": h.since, "cause": h.cause}
        counters = getattr(self.store, "counters", None)
        if callable(counters):
            found["store_counters"] = counters()
        return found
