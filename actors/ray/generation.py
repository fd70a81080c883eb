"""Configuration generations: what the hosts serve, named by its content (docs/design.md#generations).

Hosts and the tool pool are named actors that outlive the gateway that started them, so they must
never keep serving a configuration no gateway brings any more. Each part of what they serve —
the store, every agent profile, the tools (down to their module's source), every script, the
runtime policies — gets a digest; the generation is the digest of those digests. Two gateways
with the same configuration compute the same generation, in any process; a changed profile, a
new store or a new tool module is a new generation, and its own set of hosts.

Pure, apart from reading the files whose content is part of the configuration (scripts, tool
modules): computed once, at the edge, when the `RayConfig` is built.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from actors.profile import AgentProfile
    from actors.tools.registry import Tool, ToolRegistry

GENERATION_LENGTH = 10   # hex digits: in actor names, logs, /readyz and /metrics


def _digest(text: str | bytes) -> str:
    data = text.encode() if isinstance(text, str) else text
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _file_digest(path: str | None) -> str:
    """A file's content; a name that cannot be read counts by its path (the host fails on it anyway)."""
    if not path:
        return "-"
    try:
        return _digest(Path(path).read_bytes())
    except OSError:
        return _digest(f"unreadable:{path}")


def _tool_description(tool: Tool[Any]) -> dict[str, Any]:
    handler = tool.handler
    module = getattr(handler, "__module__", None) or ""
    schema = tool.params_schema if tool.params_schema is not None else tool.params_model.model_json_schema()
    return {
        "decl": repr(tool.decl()),
        "schema": schema,
        "handler": f"{module}:{getattr(handler, '__qualname__', repr(handler))}",
        # A new image with changed tool code is a new generation even when nothing else changed.
        "source": _file_digest(getattr(sys.modules.get(module), "__file__", None)),
    }


def _tools_digest(registry: ToolRegistry) -> str:
    tools = sorted((_tool_description(tool) for tool in registry), key=lambda t: str(t["decl"]))
    return _digest(json.dumps(tools, sort_keys=True, default=str))


def sections(
    store_url: str, registry: ToolRegistry, profiles: Mapping[str, AgentProfile], scripts: Mapping[str, str],
    runtime: tuple[Any, ...],
) -> dict[str, str]:
    """Each part of the configuration the hosts serve, by name, and its digest."""
    parts = {
        "store": _digest(store_url),  # a digest only: a DSN may carry a password
        "tools": _tools_digest(registry),
        "runtime": _digest(repr(runtime)),
    }
    for name, profile in sorted(profiles.items()):
        parts[f"profile {name}"] = _digest(profile.model_dump_json())
    for name, path in sorted(scripts.items()):
        parts[f"script {name}"] = _file_digest(path)
    return parts


def generation_of(parts: Mapping[str, str]) -> str:
    return _digest("\n".join(f"{key}={value}" for key, value in sorted(parts.items())))[:GENERATION_LENGTH]


def differences(mine: Mapping[str, str], theirs: Mapping[str, str]) -> list[str]:
    """The parts that differ, for a message an operator can act on (never the values themselves)."""
    return sorted(key for key in mine.keys() | theirs.keys() if mine.get(key) != theirs.get(key))
