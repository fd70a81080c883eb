"""Hosting many conversations in one process: activation, mailbox, checkpoints, passivation.

`HostCore` is the plain class the ConversationHost Ray actor (`actors/ray/host.py`) wraps, and that
the local backend uses directly (docs/design.md#hosting): the same lines run in both. It
guarantees, per conversation:
- single writer: one `Conversation` object per activation, commands applied in arrival order;
- write-ahead: the event log persists through the store before anything is published;
- idempotency: `user_message`, `steer` and `answer` are keyed by (conversation_id, id), durably;
- checkpoints: a snapshot whose seq is durable, saved at round and turn boundaries, so a
  re-activation on any host resumes from the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from actors.conversation import Conversation, ConversationState, Runtime
from actors.eventlog import EventLog
from actors.hosting.backend import Answer, Cancel, Command, SetMode, Steer, UnknownAsk, UserMessage
from actors.profile import AgentProfile
from actors.recovery import recover
from actors.store import IDEMPOTENCY_TTL_S, Store
from protocol.events import Event

log = logging.getLogger("reactgate.host")

Listener = Callable[[Sequence[Event]], None]
KEY_PRUNE_INTERVAL_S = 3600.0


class UnknownConversation(Exception):
    """The store has no such conversation (the backend checks ownership before this)."""


@dataclass(slots=True)
class _Active:
    conversation: Conversation
    last_activity: float
    saving: asyncio.Task[None] | None = None
    pending_snapshot: tuple[int, bytes] | None = None


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
    ) -> None:
        self.store = store
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

    @property
    def active_ids(self) -> list[str]:
        return list(self._active)

    # -- the mailbox --------------------------------------------------------------------------------

    async def command(self, conversation_id: str, command: Command) -> str:
        active = await self._ensure_active(conversation_id)
        active.last_activity = self.clock()
        conv = active.conversation
        idempotent = isinstance(command, UserMessage | Steer | Answer)
        if idempotent and not await self.store.remember_key(conversation_id, command.id, self.clock()):
            return "duplicate"
        if isinstance(command, UserMessage):
            conv.user_message(command.id, command.text)
        elif isinstance(command, Steer):
            conv.steer(command.text, command.id)
        elif isinstance(command, Answer) and not conv.answer(command.ask_id, command.answer):
            raise UnknownAsk(command.ask_id)
        elif isinstance(command, SetMode):
            conv.set_mode(command.mode)
        elif isinstance(command, Cancel):
            conv.cancel()
        await self._save_now(active)  # the accepted command survives a crash of this host
        return "accepted"

    def listen(self, conversation_id: str, listener: Listener) -> Callable[[], None]:
        """Durable event batches of a conversation, as they are published. Returns an unsubscribe."""
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
            raise UnknownConversation(conversation_id)
        _, agent = found
        profile = self.profiles.get(agent)
        if profile is None:
            raise UnknownConversation(f"{conversation_id}: agent {agent!r} is not served here")
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
        active = _Active(conv, self.clock())
        events.subscribe(lambda batch: self._publish(conversation_id, batch))
        conv.on_checkpoint = lambda: self._checkpoint(active)
        after = snapshot[0] if snapshot is not None else 0
        # A crash may have cut a turn after its last checkpoint (docs/design.md#recovery): apply the
        # log's tail, then resume whatever was running or queued.
        tail = await self.store.read_events(conversation_id, after, limit=last_seq - after) if last_seq > after else []
        recover(conv, tail)
        return active

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
            await self.store.save_snapshot(conv.conversation_id, seq, data)

    async def _save_now(self, active: _Active) -> None:
        await self._checkpoint(active)

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
