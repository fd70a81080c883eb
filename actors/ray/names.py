"""Where the named actors live: every gateway and host finds them by these names, never by a handle
passed around (docs/design.md#hosting).
"""

from __future__ import annotations

from typing import Any

import ray

NAMESPACE = "reactgate"
DIRECTORY_NAME = "reactgate-directory"
TOOL_POOL_NAME = "reactgate-toolpool"
HOST_PREFIX = "reactgate-host-"         # sharded hosts, reactgate-host-<i>
DEDICATED_PREFIX = "reactgate-conv-"    # one host per conversation, reactgate-conv-<conversation id>


def sharded_host(index: int) -> str:
    return f"{HOST_PREFIX}{index}"


def dedicated_host(conversation_id: str) -> str:
    return f"{DEDICATED_PREFIX}{conversation_id}"


def is_dedicated(host: str) -> bool:
    return host.startswith(DEDICATED_PREFIX)


def get_or_create(actor_cls: Any, name: str, *args: Any, **options: Any) -> Any:
    """Create a named actor, or take the one that exists. Creation is atomic in Ray's GCS: of two
    racing creators, one gets ValueError and takes the winner's actor (never get_if_exists, which
    has had races)."""
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        pass
    try:
        return actor_cls.options(name=name, namespace=NAMESPACE, lifetime="detached", **options).remote(*args)
    except ValueError:
        return ray.get_actor(name, namespace=NAMESPACE)


def sharded_index(host: str) -> int | None:
    """`i` of `reactgate-host-<i>`; None for any other name."""
    if not host.startswith(HOST_PREFIX):
        return None
    suffix = host[len(HOST_PREFIX):]
    return int(suffix) if suffix.isdigit() else None
