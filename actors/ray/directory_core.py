"""The Directory's bookkeeping: which host processes live, where each conversation is active, what a
dead host left behind, which configuration generation is current (docs/design.md#placement,
#host-death, #generations).

Plain and synchronous, no Ray: each decision is answered as *effects* — start a host, drain one,
hand a dead host's conversations over, adopt them, retire a host, remove a tool pool — which the
Directory actor (`actors/ray/directory.py`) carries out with Ray calls, lifelines and tasks. The
actor runs every call on its one event loop, so this core has a single writer; tests construct it
without Ray (tests/test_directory_core.py).

- Single activation: the `PlacementTable` (`actors/hosting/placement.py`) assigns each conversation
  to one host; this core feeds it host registrations, deaths and drains.
- Incarnations: each host process registers under its name with an incarnation id. A stale death
  report (or a late heartbeat) of an old incarnation never touches a newer one; a new incarnation
  registering under a live one's name counts as the old one's death, so nothing stays assigned to
  a process that is gone.
- Host death: a dead host's conversations become *orphans*. A live host reads in the store which
  of them had work in flight (`HandOver`); those are placed and activated at once (`Adopt`), since
  activation runs recovery and resumes the turn; idle ones wait for their next frame. A dead
  sharded host of the current generation is replaced.
- Generations: the last gateway to start makes its generation current (a rollback brings an old one
  back). The replaced generation's hosts drain — they keep what they hold and are granted nothing
  new — and its running gateways are refused; once it has no host left its tool pool goes. One
  table across generations: a conversation is never active in two.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from actors.hosting.backend import ConfigurationReplaced
from actors.hosting.placement import NoLiveHost, PlacementTable
from actors.ray import generation as generations
from actors.ray.config import RayConfig
from actors.ray.names import dedicated_host, generation_of, is_dedicated, sharded_host, sharded_index

log = logging.getLogger("reactgate.ray.directory")


@dataclass(frozen=True)
class Registration:
    """The Directory's answer to a host's registration or heartbeat."""

    known: bool          # False: a restarted Directory did not know this host: re-claim what it hosts
    wants_config: bool   # the Directory has no RayConfig to build replacements from: send it


# -- effects: what the Directory actor does for the core --------------------------------------------


@dataclass(frozen=True)
class StartHost:
    """Create this host unless an actor holds the name already. Only the Directory creates hosts,
    so two gateways never race to start the same one."""

    name: str
    config: RayConfig
    num_cpus: float


@dataclass(frozen=True)
class ReplaceHost:
    """Start a dead sharded host's replacement: `replacement(name)`, retried while Ray still holds the
    dead actor's name, until it registers or nothing wants it any more."""

    name: str


@dataclass(frozen=True)
class WatchLifeline:
    """Hold this incarnation's never-answered `lifeline` call; Ray fails it the moment the process is
    gone, and the actor then reports `died` (docs/design.md#host-death)."""

    name: str
    incarnation: str
    handle: Any


@dataclass(frozen=True)
class Drain:
    """Tell the host its generation was replaced: finish, passivate, hand over (docs/design.md#generations)."""

    name: str


@dataclass(frozen=True)
class Undrain:
    """Tell a draining host its generation is current again (a rollback): it stays."""

    name: str


@dataclass(frozen=True)
class HandOver:
    """Orphans wait: unless a hand-over runs already, ask the `checker()` host which of `orphans` had
    work in flight, and give its answer to `handed_over`."""


@dataclass(frozen=True)
class Adopt:
    """Activate these orphans on `host` now (recovery resumes their turns); report `adopted`, or
    `vanished` if the host died first and no lifeline of it will report that."""

    host: str
    conversation_ids: tuple[str, ...]


@dataclass(frozen=True)
class Retire:
    """End the host's process: a dedicated host with nothing left, or a drained one (~92 MB each)."""

    name: str


@dataclass(frozen=True)
class RemoveToolPool:
    """A replaced generation has no host left: its tool pool goes too."""

    generation: str


Effect = StartHost | ReplaceHost | WatchLifeline | Drain | Undrain | HandOver | Adopt | Retire | RemoveToolPool


class DirectoryCore:
    def __init__(self) -> None:
        self._table = PlacementTable()
        self._incarnations: dict[str, str] = {}     # host → its registered incarnation (one process)
        # host → how the actor calls it: its registered incarnation's handle, or the one this
        # Directory created and that has not registered yet. Opaque here: the core never calls it.
        self._handles: dict[str, Any] = {}
        self._config: RayConfig | None = None       # the current generation's: what hosts are built from
        self._replaced: dict[str, str] = {}         # generation → the one that replaced it (never current again)
        self._hosts_wanted = 0
        self.orphans: dict[str, str] = {}           # conversation → the dead host it was assigned to
        self._resumed = 0

    # -- hosts -----------------------------------------------------------------------------------------

    def register(self, name: str, incarnation: str, handle: Any, *, fresh: bool) -> tuple[Registration, list[Effect]]:
        """A host's start (`fresh`) or heartbeat."""
        known = self._incarnations.get(name)
        if known == incarnation or (known is not None and not fresh):
            # Already registered; or a heartbeat the replaced incarnation sent before it died, arriving late.
            return Registration(known=True, wants_config=self._config is None), []
        # Ray names are unique: a new process holding the name means the old one is gone. Its
        # conversations must not stay assigned to the name, where nothing would activate them.
        effects = self.died(name, known) if known is not None else []
        self._incarnations[name] = incarnation
        self._handles[name] = handle
        if self._is_replaced(name):
            self._table.drain(name)  # e.g. re-registering with a restarted Directory: still draining
            effects.append(Drain(name))
        else:
            self._table.add_host(name, dedicated=is_dedicated(name))
        effects.append(WatchLifeline(name, incarnation, handle))
        if self.orphans:
            effects.append(HandOver())  # they may have a place now
        return Registration(known=fresh, wants_config=self._config is None), effects

    def reclaim(self, name: str, incarnation: str, conversation_ids: Sequence[str]) -> list[str]:
        """A host this (restarted) Directory did not know re-claims what it hosts; returns the ids
        another live host holds."""
        if self._incarnations.get(name) != incarnation:
            return []
        return [cid for cid in conversation_ids
                if self._table.claim(cid, name, dedicated=is_dedicated(name)) != name]

    def configure(self, config: RayConfig) -> list[Effect]:
        """A host of the current generation gives a restarted Directory the configuration
        replacements are built from (a draining host never does)."""
        return self._make_current(config) if self._config is None else []

    def is_current(self, name: str, incarnation: str) -> bool:
        """Whether `incarnation` is the one registered under `name`: a lifeline is held, and a death
        report believed, only for that one."""
        return self._incarnations.get(name) == incarnation

    def handle(self, name: str) -> Any:
        """How the actor reaches the host, None if it does not know it."""
        return self._handles.get(name)

    def died(self, name: str, incarnation: str) -> list[Effect]:
        """The host's process is gone (its lifeline failed, or a report was confirmed)."""
        if self._incarnations.get(name) != incarnation:
            return []  # reported before, or a newer incarnation registered
        del self._incarnations[name]
        self._handles.pop(name, None)
        moved = self._table.host_failed(name)
        log.warning("host %s (%s) died holding %d conversations", name, incarnation[:8], len(moved))
        effects: list[Effect] = []
        for cid in moved:
            self.orphans[cid] = name
        if self.orphans:
            effects.append(HandOver())
        index = sharded_index(name)
        if index is not None and index < self._hosts_wanted and not self._is_replaced(name):
            effects.append(ReplaceHost(name))
        return effects + self._close_generation_if_empty(generation_of(name))

    def replacement(self, name: str) -> StartHost | None:
        """What to start for a dead sharded host, while it is still wanted: not registered again, and
        not of a replaced generation (its name would be served with another generation's config)."""
        if name in self._incarnations or self._config is None or self._is_replaced(name):
            return None
        return StartHost(name, self._config, self._config.host_num_cpus)

    def created(self, name: str, handle: Any) -> None:
        """The actor created `name`'s process; until it registers, this is how to reach it."""
        self._handles.setdefault(name, handle)

    def retire(self, name: str) -> list[Effect]:
        """A dedicated host whose conversation was passivated, or a drained host of a replaced
        generation, asks to end. Forgotten first, so its lifeline's failure is no death to handle."""
        if not is_dedicated(name) and name not in self._table.draining:
            return []
        self._table.host_failed(name)
        self._incarnations.pop(name, None)
        self._handles.pop(name, None)
        return [Retire(name), *self._close_generation_if_empty(generation_of(name))]

    # -- handing over a dead host's conversations ------------------------------------------------------

    def checker(self) -> str | None:
        """The live host that reads the orphans' state in the store: the first sharded one, else the
        first dedicated one; None until one registers."""
        live = [h for h in sorted(self._table.live) or sorted(self._table.dedicated) if h in self._handles]
        return live[0] if live else None

    def handed_over(self, asked: Mapping[str, str], busy: Sequence[str]) -> list[Effect]:
        """The checker's answer: of the orphans `asked` about (conversation → dead host), `busy` had work
        in flight. Those are placed and adopted now; the idle ones are left unplaced."""
        for cid, dead in asked.items():
            if self.orphans.get(cid) == dead:  # not orphaned again, by another death, meanwhile
                del self.orphans[cid]
        starts: list[Effect] = []
        targets: dict[str, list[str]] = {}
        for cid in busy:
            host = self._place_orphan(cid, asked[cid], starts)
            if host is not None:
                targets.setdefault(host, []).append(cid)
        return [*starts, *(Adopt(host, tuple(cids)) for host, cids in targets.items())]

    def _place_orphan(self, conversation_id: str, dead: str, starts: list[Effect]) -> str | None:
        if is_dedicated(dead):
            if self._config is None:
                self.orphans[conversation_id] = dead  # until a host or gateway tells us how to build one
                return None
            host, effects = self._ensure_dedicated(conversation_id, self._config)
            starts.extend(effects)
            return host
        try:
            return self._table.place(conversation_id)
        except NoLiveHost:
            self.orphans[conversation_id] = dead
            return None

    def adopted(self, count: int) -> None:
        self._resumed += count

    def has_lifeline(self, host: str) -> bool:
        """A registered host's lifeline reports its death, and that hands its conversations over."""
        return host in self._incarnations

    def vanished(self, host: str) -> list[Effect]:
        """A host that never registered died before adopting what it was given: hand it over again."""
        for cid in self._table.host_failed(host):
            self.orphans[cid] = host
        return [HandOver()]

    # -- placement --------------------------------------------------------------------------------------

    def place(self, conversation_id: str, generation: str | None = None) -> str:
        """The conversation's host; a gateway of a replaced generation is refused (ConfigurationReplaced)."""
        if generation is not None:
            self.check(generation)
        return self._table.place(conversation_id)

    def claim(self, conversation_id: str, host: str) -> str:
        return self._table.claim(conversation_id, host, dedicated=is_dedicated(host))

    def release(self, conversation_id: str, host: str) -> None:
        self._table.release(conversation_id, host)

    def hosts(self) -> list[str]:
        return sorted(self._table.live)

    def holder(self, conversation_id: str) -> str | None:
        return self._table.assigned.get(conversation_id)

    def handovers(self) -> dict[str, int]:
        return {"resumed": self._resumed, "orphans": len(self.orphans)}

    # -- generations ------------------------------------------------------------------------------------

    @property
    def generation(self) -> str | None:
        return self._config.generation if self._config is not None else None

    def check(self, generation: str, sections: Mapping[str, str] | None = None) -> None:
        """Raises ConfigurationReplaced if a gateway of `generation` may no longer serve; given its
        `sections`, the message names what differs from the current configuration."""
        if generation in self._replaced:
            current = self._config
            changed = generations.differences(sections, current.sections) if sections and current else []
            raise ConfigurationReplaced(generation, current.generation if current else None, changed)

    def ensure_hosts(self, count: int, config: RayConfig) -> tuple[list[str], list[Effect]]:
        """The names of `config`'s generation's `count` sharded hosts, and the start of those not
        registered. `config`'s generation becomes current."""
        effects = self._make_current(config)
        self._hosts_wanted = max(self._hosts_wanted, count)
        names = [sharded_host(config.generation, i) for i in range(count)]
        effects += [StartHost(n, config, config.host_num_cpus) for n in names if n not in self._incarnations]
        return names, effects

    def ensure_dedicated(self, conversation_id: str, config: RayConfig) -> tuple[str, list[Effect]]:
        """`placement = "dedicated"`: the conversation's own host, created once."""
        effects = self._make_current(config)
        host, started = self._ensure_dedicated(conversation_id, config)
        return host, effects + started

    def _ensure_dedicated(self, conversation_id: str, config: RayConfig) -> tuple[str, list[Effect]]:
        holder = self._table.assigned.get(conversation_id)
        if holder is not None and self._table.alive(holder) and holder in self._table.draining:
            return holder, []  # the old generation's host finishes its turn; the next activation comes here
        name = dedicated_host(config.generation, conversation_id)
        self._table.assign(conversation_id, name, dedicated=True)
        return name, [] if name in self._incarnations else [StartHost(name, config, 0)]

    def _is_replaced(self, host: str) -> bool:
        generation = generation_of(host)
        return self._config is not None and generation is not None and generation != self._config.generation

    def _make_current(self, config: RayConfig) -> list[Effect]:
        """Make `config`'s generation current; the one it replaces drains."""
        current = self._config
        if current is not None and current.generation == config.generation:
            return []
        if self._replaced.pop(config.generation, None) is not None:
            log.warning("configuration generation %s returns (a rollback)", config.generation)
        self._config = config
        self._hosts_wanted = config.hosts
        effects: list[Effect] = []
        if current is None:
            for name in self._handles:  # a restarted Directory: hosts it met before
                if self._is_replaced(name):
                    self._table.drain(name)
                    effects.append(Drain(name))
            return effects
        self._replaced[current.generation] = config.generation
        changed = generations.differences(config.sections, current.sections)
        log.warning("configuration generation %s replaces %s (changed: %s); draining %s's hosts",
                    config.generation, current.generation, ", ".join(changed) or "nothing", current.generation)
        for name in self._handles:
            if generation_of(name) == current.generation:
                self._table.drain(name)
                effects.append(Drain(name))
            elif generation_of(name) == config.generation and name in self._table.draining:
                self._table.undrain(name, dedicated=is_dedicated(name))  # still there from before the rollback
                effects.append(Undrain(name))
        return effects + self._close_generation_if_empty(current.generation)

    def _close_generation_if_empty(self, generation: str | None) -> list[Effect]:
        if generation is None or generation not in self._replaced:
            return []
        if any(generation_of(name) == generation for name in self._incarnations):
            return []
        return [RemoveToolPool(generation)]
