"""Assembly: settings in, a ready backend out — the agent profiles, their models, tools, store, hosting.

Everything `reactgate serve` needs is decided here, at start-up, so that a bad profile, a bad
script or an unusable store is a clear error before the port opens (docs/design.md#profiles).
This is the edge where configuration is read: the backends below receive typed objects (a
`Runtime`, a `RayConfig`) and never look at the environment or at `Settings` themselves.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from actors import tracing
from actors.agent import load_agents
from actors.conversation import Runtime
from actors.hosting.backend import Backend
from actors.llm.scripts import load_script, register_script
from actors.llm.stream import stream_model
from actors.profile import AgentProfile
from actors.ray.config import RayConfig
from actors.store import store_from_url
from actors.tools.durable import DurableTools
from actors.tools.executor import LocalToolExecutor
from actors.tools.registry import ToolRegistry
from gateway.limits import quota_limits
from gateway.settings import Settings

SERVE_SCRIPT_NAME = "serve"
T = TypeVar("T")


class StartupError(Exception):
    """A configuration problem found at start-up; the message says what and where."""


@dataclass(frozen=True)
class AgentSetup:
    profile: AgentProfile      # the default agent: `open` without `agent` creates a conversation of it
    registry: ToolRegistry     # the tools of every agent served
    script_path: Path | None   # registered in every process that plays it (Ray workers too)
    others: tuple[AgentProfile, ...] = ()  # the other agents served, in their configuration's order

    @property
    def profiles(self) -> dict[str, AgentProfile]:
        """Every agent served, by name, the default first."""
        return {p.name: p for p in (self.profile, *self.others)}


def agent_setup(settings: Settings) -> AgentSetup:
    """The agents, each loaded as `reactgate agent check` loads it: its tools imported, its MCP servers
    asked for their tools (docs/design.md#your-own-agent, docs/design.md#several-agents). `--model`
    and `--script` apply to every one of them."""
    try:
        agents = _run(load_agents(settings.agent))
    except ValueError as exc:  # ProfileError names the file and the field
        raise StartupError(str(exc)) from None
    profiles = list(agents.profiles)
    if settings.model:
        profiles = [profile.with_model(settings.model) for profile in profiles]
    script_path = None
    if settings.script:
        script_path = Path(settings.script).resolve()
        register_playback(script_path)
        profiles = [profile.with_script(SERVE_SCRIPT_NAME) for profile in profiles]
    default = profiles[0]
    if settings.default_agent is not None:
        chosen = [p for p in profiles if p.name == settings.default_agent]
        if not chosen:
            raise StartupError(f"default agent {settings.default_agent!r} is not one of the agents served: "
                               + ", ".join(p.name for p in profiles))
        default = chosen[0]
    return AgentSetup(default, agents.registry, script_path, tuple(p for p in profiles if p is not default))


def _run(work: Coroutine[Any, Any, T]) -> T:
    """Run start-up work to completion from sync code, inside a running loop or not (tests build
    backends from within theirs): in that case on a thread with a loop of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(work)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, work).result()


def register_playback(script_path: Path) -> None:
    try:
        register_script(SERVE_SCRIPT_NAME, load_script(script_path))
    except ValueError as exc:  # ScriptError names the file and the field
        raise StartupError(str(exc)) from None


def local_backend(settings: Settings, setup: AgentSetup) -> Backend:
    from actors.hosting.local import LocalBackend

    store = store_from_url(settings.store)
    runtime = Runtime(
        registry=setup.registry,
        tools=DurableTools(LocalToolExecutor(setup.registry), store),
        stream_model=stream_model,
        quotas=quota_limits(settings),
    )
    return LocalBackend(
        store, runtime, setup.profiles, default_agent=setup.profile.name, idle_ttl_s=settings.idle_ttl_s,
        store_outage_s=settings.store_outage_s,
    )


def ray_config(settings: Settings, setup: AgentSetup) -> RayConfig:
    """Everything the Ray cluster needs, from the gateway's settings. The store URL travels to the
    hosts and the tool pool inside it (from REACTGATE_STORE here, a Secret on Kubernetes)."""
    return RayConfig(
        store_url=settings.store,
        registry=setup.registry,
        profiles=setup.profiles,  # each one in the generation (docs/design.md#generations)
        scripts={SERVE_SCRIPT_NAME: str(setup.script_path)} if setup.script_path else {},
        idle_ttl_s=settings.idle_ttl_s,
        store_outage_s=settings.store_outage_s,
        quotas=quota_limits(settings),
        otlp_endpoint=otlp_endpoint(settings),
        hosts=settings.hosts,
        actor_resource=settings.ray_actor_resource,
        address=settings.ray_address,
        local_cpus=settings.ray_cpus,
    )


def ray_backend(settings: Settings, setup: AgentSetup) -> Backend:
    from actors.ray.backend import RayBackend  # imports Ray: only when serving with it

    return RayBackend(ray_config(settings, setup), default_agent=setup.profile.name)


def otlp_endpoint(settings: Settings) -> str | None:
    """Where spans go (docs/design.md#tracing): REACTGATE_OTLP_ENDPOINT, else the standard
    OTEL_EXPORTER_OTLP_ENDPOINT, else nowhere."""
    return settings.otlp_endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None


def build_backend(settings: Settings) -> Backend:
    if settings.store.startswith("sqlite:///") and not settings.store.startswith("sqlite:///:memory:"):
        Path(settings.store.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    setup = agent_setup(settings)
    tracing.configure(otlp_endpoint(settings), service="reactgate-gateway")  # the Ray hosts: through their RayConfig
    if settings.backend == "local":
        return local_backend(settings, setup)
    return ray_backend(settings, setup)
