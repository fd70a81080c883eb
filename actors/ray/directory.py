"""The Directory actor: the single authority on where a conversation is active
(docs/design.md#placement).

A shell around `actors.hosting.placement.PlacementTable`: one named actor every gateway and host
finds, restarted by Ray if it dies (hosts re-register within a heartbeat). It also creates the
ConversationHosts — only it does, so two gateways never race to start the same one.
"""

from __future__ import annotations

import contextlib

import ray

from actors.hosting.placement import PlacementTable
from actors.ray.config import RayConfig
from actors.ray.host import ConversationHost
from actors.ray.names import NAMESPACE, dedicated_host, is_dedicated, sharded_host


@ray.remote(num_cpus=0, max_restarts=-1)
class Directory:
    """Placement, single activation and host incarnations (never Ray's get_if_exists)."""

    def __init__(self) -> None:
        self.table = PlacementTable()
        self.incarnations: dict[str, str] = {}

    def register_host(self, name: str, incarnation: str) -> None:
        self.incarnations[name] = incarnation
        self.table.add_host(name, dedicated=is_dedicated(name))

    def host_failed(self, name: str, incarnation: str) -> list[str]:
        if self.incarnations.get(name) != incarnation:
            return []  # already replaced by a newer incarnation
        self.incarnations.pop(name, None)
        return self.table.host_failed(name)

    def place(self, conversation_id: str) -> str:
        return self.table.place(conversation_id)

    def claim(self, conversation_id: str, host: str) -> str:
        return self.table.claim(conversation_id, host, dedicated=is_dedicated(host))

    def release(self, conversation_id: str, host: str) -> None:
        self.table.release(conversation_id, host)

    def hosts(self) -> list[str]:
        return sorted(self.table.live)

    def load(self) -> dict[str, int]:
        return self.table.load()

    def ensure_hosts(self, count: int, config: RayConfig) -> list[str]:
        """Create the named sharded hosts that do not exist yet (only the Directory creates them)."""
        names = []
        for i in range(count):
            name = sharded_host(i)
            names.append(name)
            with contextlib.suppress(ValueError):
                ray.get_actor(name, namespace=NAMESPACE)
                continue
            ConversationHost.options(  # type: ignore[attr-defined]
                name=name, namespace=NAMESPACE, lifetime="detached", num_cpus=config.host_num_cpus,
            ).remote(name, config)
        return names

    def ensure_dedicated(self, conversation_id: str, config: RayConfig) -> str:
        """`placement = "dedicated"`: one named actor for this conversation, created once."""
        name = dedicated_host(conversation_id)
        try:
            ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            ConversationHost.options(  # type: ignore[attr-defined]
                name=name, namespace=NAMESPACE, lifetime="detached", num_cpus=0,
            ).remote(name, config)
        self.table.assign(conversation_id, name, dedicated=True)
        return name

    def retire(self, name: str) -> None:
        """A dedicated host whose conversation was passivated: its process goes away (~92 MB)."""
        if not is_dedicated(name):
            return
        self.table.host_failed(name)
        self.incarnations.pop(name, None)
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(name, namespace=NAMESPACE))
