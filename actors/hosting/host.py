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
  created with; one whose agent is not served here is `AgentNotServed`, never activated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from actors.conversation import Conversation, ConversationState, Runtime
from actors.eventlog import EventLog
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
from actors.identity import Owner
from actors.profile import AgentProfile
from actors.quotas import QuotaExceeded, QuotaLimits
from actors.recovery import recover
from actors.store import IDEMPOTENCY_TTL_S, Store, Tombstoned
from protocol.events import ConversationDeleted, Event
from protocol.frames import title_of
from protocol.timeline import UserMessageBlock

log = logging.getLogger("reactgate.host")

Listener = Callable[[Sequence[Event]], None]
KEY_PRUNE_INTERVAL_S = 3600.0
MAX_DELETED_REMEMBERED = 10_000


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
    ) -> None:
        self.store = store
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

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap_idle())

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for cid in list(self._active):
            await self.passivate(cid, force=True)
        if self._metering:  # charges already made must reach the store before it closes
            await asyncio.gather(*self._metering, return_exceptions=True)

    @property
    def active_ids(self) -> list[str]:
        return list(self._active)

    # -- the mailbox --------------------------------------------------------------------------------

    async def command(self, conversation_id: str, command: Command) -> str:
        active = await self._ensure_active(conversation_id)
        active.last_activity = self.clock()
        conv = active.conversation
        idempotent = isinstance(command, UserMessage | Steer | Answer)
        try:
            if idempotent and not await self.store.remember_key(conversation_id, command.id, self.clock()):
                return "duplicate"
        except Tombstoned:
            raise UnknownConversation(conversation_id) from None  # deleted meanwhile
        async with active.admission:
            if isinstance(command, UserMessage) or (isinstance(command, Steer) and not conv.turn_running):
                try:
                    await self._admit_turn(active)
                except QuotaExceeded:
                    await self.store.forget_key(conversation_id, command.id)  # refused: sending it again is no repeat
                    raise
            self._apply(conv, command)
        if idempotent:
            self._note(active, running=conv.busy, at=self.clock())
        await self._save_now(active)  # the accepted command survives a crash of this host
        return "accepted"

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
            active.releasing = self._meter_soon(self.meter.release_slot(active.owner, active.conversation.conversation_id))

    def _note(self, active: _Active, *, running: bool, at: float | None) -> None:
        """The conversation's list row (docs/design.md#conversation-list): whether it runs, the time of
        what happened (None: nothing did), and its title until this activation noted one."""
        title = ""
        if not active.titled and (text := first_message(active.conversation.state)) is not None:
            title = title_of(text)
            active.titled = True
        active.listed_running = running
        self._meter_soon(self.store.note_activity(active.conversation.conversation_id, running=running, at=at,
                                                  title=title), "noting the conversation's activity")

    def _meter_soon(self, work: Awaitable[Any], what: str = "quota bookkeeping") -> asyncio.Task[Any]:
        async def run() -> Any:
            try:
                return await work
            except Exception:  # a lost charge, release or note is logged, never a failed turn
                log.exception("%s failed", what)
                return None

        task = asyncio.get_running_loop().create_task(run())
        self._metering.add(task)
        task.add_done_callback(self._metering.discard)
        return task

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
        ask_user) or messages queued, as the last snapshot holds them (docs/design.md#host-death).
        No false negative: a command is acked only once a snapshot holding it is durable, and a
        turn's start is checkpointed; a turn that ended after its last snapshot is a harmless
        false positive (recovery finds its `turn.completed`)."""
        found = []
        for cid in conversation_ids:
            if cid in self._active:
                found.append(cid)
                continue
            snapshot = await self.store.load_snapshot(cid)
            if snapshot is None:
                continue
            state = ConversationState.decode(snapshot[1])
            if state.current is not None or state.queue:
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
        )
        if state.tools:  # the executor's part of the snapshot (counters, workspace)
            self.runtime.tools.import_conversation(conversation_id, state.tools)
        conv = Conversation(state, profile, self.runtime, events)
        active = _Active(conv, self.clock(), owner)
        events.subscribe(lambda batch: self._publish(conversation_id, batch))
        conv.on_checkpoint = lambda: self._checkpoint(active)
        conv.on_idle = lambda: self._turns_done(active)
        conv.on_usage = lambda tokens: self._charge_tokens(owner, tokens)
        after = snapshot[0] if snapshot is not None else 0
        # A crash may have cut a turn after its last checkpoint (docs/design.md#recovery): apply the
        # log's tail, then resume whatever was running or queued.
        tail = await self.store.read_events(conversation_id, after, limit=last_seq - after) if last_seq > after else []
        recover(conv, tail)
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
        return asyncio.shield(active.saving)

    async def _save_pending(self, active: _Active) -> None:
        conv = active.conversation
        while active.pending_snapshot is not None:
            seq, data = active.pending_snapshot
            active.pending_snapshot = None
            with contextlib.suppress(RuntimeError):
                await conv.events.flush()  # the snapshot never runs ahead of the durable log
            try:
                await self.store.save_snapshot(conv.conversation_id, seq, data)
            except Tombstoned:
                return  # a save that lost the race with a delete: nothing of it is kept, as intended

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
        """Snapshot and drop an idle conversation; the next frame re-activates it, on any host."""
        active = self._active.get(conversation_id)
        if active is None:
            return False
        conv = active.conversation
        if conv.busy and not force:
            return False
        self._active.pop(conversation_id, None)
        if not conv.busy:
            await self._save_now(active)
        await conv.close()
        self.runtime.tools.forget(conversation_id)
        if self._release is not None:
            await self._release(conversation_id)
        return True

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
                if now - active.last_activity >= self.idle_ttl_s and not active.conversation.busy:
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
        return {"active": len(self._active), "listeners": sum(len(v) for v in self._listeners.values())}
