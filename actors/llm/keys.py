"""Model keys (docs/design.md#model-settings): read from the variable a profile names, in the
process that calls the model, at the moment of the call — never from a profile, never pickled
into Ray, never in a log, an event, the store or an error frame.

This is the one place under actors/ that reads a secret from the environment: the key belongs to
the host that calls the model (a Kubernetes Secret mounted there), not to the configuration the
gateway hands its hosts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

KEY_SETTING = "api_key_env"


class MissingKey(LookupError):
    """The variable a profile names for its key is not set in this process."""


def read_key(settings: Mapping[str, Any]) -> str | None:
    """The key of the variable `settings` name in `api_key_env`, read now; None when they name none."""
    name = settings.get(KEY_SETTING)
    if name is None:
        return None
    key = os.environ.get(name)
    if not key:
        raise MissingKey(f"the variable {name} (api_key_env) is not set where this model is called")
    return key


def scrub(text: str, key: str | None) -> str:
    """`text` with every occurrence of `key` masked: provider error messages sometimes echo it."""
    return text.replace(key, "***") if key else text
