"""The cluster's one-of-a-name actors — the Directory, each generation's tool pool — found by name,
or created without a race (docs/design.md#hosting).

Apart from `actors/ray/names.py`, which says what they are called, because the names are pure and
the cores that reason about hosts (`actors/ray/directory_core.py`) import them without Ray.
"""

from __future__ import annotations

from typing import Any

import ray

from actors.ray.names import NAMESPACE


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
