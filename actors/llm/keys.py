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


def call_kwargs(settings: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """A model's settings as LiteLLM keyword arguments, with `api_key_env` resolved to `api_key`;
    and the key itself, so that error text can be scrubbed of it."""
    kwargs = {k: v for k, v in settings.items() if k != KEY_SETTING}
    name = settings.get(KEY_SETTING)
    if name is None:
        return kwargs, None
    key = os.environ.get(name)
    if not key:
        raise MissingKey(f"the variable {name} (api_key_env) is not set where this model is called")
    kwargs["api_key"] = key
    return kwargs, key


def scrub(text: str, key: str | None) -> str:
    """`text` with every occurrence of `key` masked: provider error messages sometimes echo it."""
    return text.replace(key, "***") if key else text
