"""Where a conversation lives: rendezvous hashing over live hosts, one activation at a time
(docs/design.md#placement).

Pure and synchronous; the Directory's core (`actors/ray/directory_core.py`) wraps it, and the
Directory Ray actor (`actors/ray/directory.py`) carries out what that core decides.
The table is the single authority: a conversation is assigned to exactly one host until that host
is reported dead, and only then re-placed — on the live host with the highest rendezvous weight, so
a host's death moves only its own conversations.

It lives with hosting rather than with the Ray code because it knows nothing of Ray: hosts are
names, and the rules (single activation, dedicated hosts never picked, a death moves only its own
conversations) are hosting rules that tests check without starting Ray.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def rendezvous_weight(conversation_id: str, host: str) -> int:
    digest = hashlib.blake2b(f"{host}\x00{conversation_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous_pick(conversation_id: str, hosts: Iterable[str]) -> str:
    return max(hosts, key=lambda h: rendezvous_weight(conversation_id, h))


class NoLiveHost(Exception):
    pass


class PlacementTable:
    def __init__(self) -> None:
        self.live: set[str] = set()          # sharded hosts: the pool rendezvous hashing picks from
        self.dedicated: set[str] = set()     # one-conversation hosts: never picked for another
        self.draining: set[str] = set()      # a replaced generation's hosts: hold what they have, get nothing new
        self.assigned: dict[str, str] = {}   # conversation id → host holding its single activation

    def add_host(self, host: str, *, dedicated: bool = False) -> None:
        if host in self.draining:
            return  # a draining host's heartbeat never makes it a candidate again
        pool = self.dedicated if dedicated else self.live
        if host not in pool:
            pool.add(host)

    def drain(self, host: str) -> None:
        """`host` keeps the activations it holds and is granted no other."""
        if host in self.live or host in self.dedicated:
            self.live.discard(host)
            self.dedicated.discard(host)
        self.draining.add(host)

    def undrain(self, host: str, *, dedicated: bool = False) -> None:
        """Its generation is current again (a rollback): a candidate like any live host."""
        if host in self.draining:
            self.draining.discard(host)
            self.add_host(host, dedicated=dedicated)

    def alive(self, host: str) -> bool:
        return host in self.live or host in self.dedicated or host in self.draining

    def host_failed(self, host: str) -> list[str]:
        """Mark a host dead; returns the conversations it held (they re-place on next use)."""
        if self.alive(host):
            self.live.discard(host)
            self.dedicated.discard(host)
            self.draining.discard(host)
        moved = [cid for cid, h in self.assigned.items() if h == host]
        for cid in moved:
            del self.assigned[cid]
        return moved

    def place(self, conversation_id: str) -> str:
        host = self.assigned.get(conversation_id)
        if host is not None and self.alive(host):
            return host
        if not self.live:
            raise NoLiveHost("no live conversation host")
        host = rendezvous_pick(conversation_id, self.live)
        self.assigned[conversation_id] = host
        return host

    def claim(self, conversation_id: str, host: str, *, dedicated: bool = False) -> str:
        """A host is about to activate a conversation: grant it unless another live host holds it.
        Returns the host that holds the (single) activation."""
        current = self.assigned.get(conversation_id)
        if current is not None and self.alive(current):
            return current
        if host in self.draining:
            return self.place(conversation_id)  # a new activation goes to the current generation
        self.add_host(host, dedicated=dedicated)
        self.assigned[conversation_id] = host
        return host

    def assign(self, conversation_id: str, host: str, *, dedicated: bool = False) -> None:
        """Record `host` as the holder, whoever held it: a dedicated host is created for its one
        conversation, so it is that conversation's place by definition."""
        self.add_host(host, dedicated=dedicated)
        self.assigned[conversation_id] = host

    def release(self, conversation_id: str, host: str) -> None:
        """A host passivated the conversation: it may activate anywhere next time."""
        if self.assigned.get(conversation_id) == host:
            del self.assigned[conversation_id]

    def load(self) -> dict[str, int]:
        counts = dict.fromkeys(self.live, 0)
        for host in self.assigned.values():
            if host in counts:
                counts[host] += 1
        return counts
