"""Where the named actors live: every gateway and host finds them by these names, never by a handle
passed around (docs/design.md#hosting).

Pure: no Ray here (creating them is `actors/ray/singletons.py`), so the Directory's core reasons
about host names in unit tests without a cluster.
"""

from __future__ import annotations

from typing import Any

NAMESPACE = "reactgate"
DIRECTORY_NAME = "reactgate-directory"   # one per cluster, across generations: single activation needs one authority
TOOL_POOL_PREFIX = "reactgate-toolpool-" # one per generation, reactgate-toolpool-<generation>
HOST_PREFIX = "reactgate-host-"          # sharded hosts, reactgate-host-<generation>-<i>
DEDICATED_PREFIX = "reactgate-conv-"     # one host per conversation, reactgate-conv-<generation>-<conversation id>

# Every host and tool pool name carries its configuration generation (docs/design.md#generations):
# a gateway with a new configuration starts actors of its own, and never finds an old one by name.


def tool_pool(generation: str) -> str:
    return f"{TOOL_POOL_PREFIX}{generation}"


def sharded_host(generation: str, index: int) -> str:
    return f"{HOST_PREFIX}{generation}-{index}"


def dedicated_host(generation: str, conversation_id: str) -> str:
    return f"{DEDICATED_PREFIX}{generation}-{conversation_id}"


def is_dedicated(host: str) -> bool:
    return host.startswith(DEDICATED_PREFIX)


def generation_of(host: str) -> str | None:
    """The generation in a host's name; None for a name that is not a host's."""
    for prefix in (HOST_PREFIX, DEDICATED_PREFIX):
        if host.startswith(prefix):
            generation, sep, _ = host[len(prefix):].partition("-")
            return generation if sep else None
    return None


ACTOR_RESOURCE_SHARE = 0.001            # of `RayConfig.actor_resource`: a placement constraint, not a budget


def placement(actor_resource: str | None) -> dict[str, Any]:
    """Ray actor options that keep an actor on the nodes offering `actor_resource` (if any)."""
    return {"resources": {actor_resource: ACTOR_RESOURCE_SHARE}} if actor_resource else {}


def sharded_index(host: str) -> int | None:
    """`i` of `reactgate-host-<generation>-<i>`; None for any other name."""
    if not host.startswith(HOST_PREFIX):
        return None
    suffix = host[len(HOST_PREFIX):].rpartition("-")[2]
    return int(suffix) if suffix.isdigit() else None
