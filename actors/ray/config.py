"""What the Ray side of reactgate needs, as one typed value built at the edge.

`gateway/app.py` builds a `RayConfig` from the gateway's settings; `RayBackend` receives it and
hands it to every actor it creates (the Directory passes it on to the hosts it starts), so no
actor reads its configuration from its own process environment. It is pickled into each actor's
arguments: the store URL (a PostgreSQL DSN may hold a password) therefore reaches the hosts
through Ray, visible to whoever can reach the Ray cluster — who could run code there anyway.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from actors.profile import AgentProfile
from actors.quotas import QuotaLimits
from actors.ray import generation as generations
from actors.tools.registry import ToolRegistry

# Ray starts workers at niceness 15; here the hosts *are* the service, and at 15 they yield to every
# other process on a shared node (bench/hosting_bench.py measured it). The tests' own Ray uses it too
# (tests/e2e.py `local_ray`): a host at 15 beside busy test workers starved, and a restarted one took
# longer than a test waits to import LiteLLM. The cluster's worker pods set it through the raylet's
# environment (`RAY_worker_niceness`, k8s/raycluster.yaml).
WORKER_NICENESS = 0


@dataclass(frozen=True)
class RayConfig:
    # What every host and the tool pool build their part of the runtime from.
    store_url: str = field(repr=False)  # never in a repr: a DSN may carry a password
    registry: ToolRegistry              # pickles by reference to its tools' module-level handlers
    profiles: Mapping[str, AgentProfile]
    scripts: Mapping[str, str] = field(default_factory=dict)  # name → file, played as scripted/<name>
    idle_ttl_s: float = 600.0
    store_outage_s: float = 120.0       # docs/design.md#store-outage
    quotas: QuotaLimits = field(default_factory=QuotaLimits)  # what the hosts enforce (docs/design.md#quotas)
    tool_max_concurrency_per_conversation: int = 4
    tool_max_concurrency_global: int = 64
    otlp_endpoint: str | None = None    # the gateway's collector: hosts export their spans there too (docs/design.md#tracing)
    # The cluster's shape.
    hosts: int = 2                      # sharded ConversationHosts (reactgate-host-<generation>-<i>)
    host_num_cpus: float = 0.0          # CPUs each host reserves from Ray's scheduler
    # Where the Directory, tool pools and hosts may run: a custom resource only the nodes meant for
    # them offer (on Kubernetes the worker group, never a gateway pod's node). Ray places an actor
    # that asks for no resource on its creator's node: without this, hosts would run in the
    # gateway's pod. None: anywhere (a local Ray, tests).
    actor_resource: str | None = None
    # Joining a cluster, or starting a local one when `address` is None.
    address: str | None = None          # e.g. ray://head:10001
    local_cpus: int = 2                 # num_cpus of a Ray started here
    worker_niceness: int | None = WORKER_NICENESS   # of a Ray started here; None: Ray's own (15)

    def __post_init__(self) -> None:
        if self.hosts < 1:
            raise ValueError(f"hosts must be at least 1, not {self.hosts}")
        if self.local_cpus < 1:
            raise ValueError(f"local_cpus must be at least 1, not {self.local_cpus}")

    # What the hosts serve, named by its content (docs/design.md#generations). Computed once, where
    # the config is built (the gateway), and pickled with it: every host reads the gateway's value.
    @cached_property
    def sections(self) -> dict[str, str]:
        runtime = (self.idle_ttl_s, self.store_outage_s, sorted(self.quotas.values.items()),
                   self.tool_max_concurrency_per_conversation, self.tool_max_concurrency_global, self.otlp_endpoint)
        return generations.sections(self.store_url, self.registry, self.profiles, self.scripts, runtime)

    @cached_property
    def generation(self) -> str:
        return generations.generation_of(self.sections)
