"""What LiteLLM knows of a model string: its provider, and the settings that provider takes
(docs/design.md#model-settings).

A model string with no provider LiteLLM knows (`acme-small` for `openai/acme-small`) can never be
called; LiteLLM's reader fails such a call before anything is sent, with `no_provider`'s words
rather than LiteLLM's. `reactgate agent check` asks the same questions ahead of time, and warns
(docs/design.md#agent-check): a model with no provider, a setting its provider does not take.
The scripted model (`scripted/<name>`) is ours: its provider is known, and it takes no settings.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from typing import Final

from actors.llm.call import RESOLVED_SETTINGS
from actors.llm.lite import litellm_module
from actors.llm.scripts import PROVIDER

# Settings LiteLLM itself takes for a call to any provider, beside the OpenAI parameters it maps
# per provider (`get_supported_openai_params`).
LITELLM_CALL_SETTINGS: Final = frozenset({"api_version", "extra_body", "drop_params"})


@lru_cache(maxsize=512)
def provider_of(model: str, api_base: str | None = None) -> str | None:
    """The provider LiteLLM resolves `model` to (None: it knows none). Reads LiteLLM's tables, not the key."""
    if model.startswith(f"{PROVIDER}/"):
        return PROVIDER
    try:
        return str(litellm_module().get_llm_provider(model, api_base=api_base)[1])
    except Exception:
        return None


def no_provider(model: str) -> str:
    """What a model string without a provider LiteLLM knows is told (a call's error, agent check's warning)."""
    name = model.rpartition("/")[2]
    return (f"no provider for model {model!r}: a LiteLLM model string starts with its provider, "
            f"e.g. 'openai/{name}' for an OpenAI-compatible endpoint")


def unknown_settings(model: str, settings: Iterable[str], api_base: str | None = None) -> list[str]:
    """The settings among `settings` that neither reactgate (`RESOLVED_SETTINGS`), LiteLLM
    (`LITELLM_CALL_SETTINGS`) nor the model's provider (LiteLLM's `get_supported_openai_params`)
    takes: LiteLLM sends them to the provider unchecked, or refuses them. Empty when the provider is
    unknown (that is `no_provider`'s to say) or is the scripted model."""
    provider = provider_of(model, api_base)
    if provider is None or provider == PROVIDER:
        return []
    return [key for key in settings if key not in RESOLVED_SETTINGS | LITELLM_CALL_SETTINGS | supported_params(model, api_base)]


@lru_cache(maxsize=512)
def supported_params(model: str, api_base: str | None = None) -> frozenset[str]:
    """The OpenAI parameters LiteLLM maps for `model`'s provider."""
    litellm = litellm_module()
    try:
        name, provider, _, _ = litellm.get_llm_provider(model, api_base=api_base)
        return frozenset(litellm.get_supported_openai_params(model=name, custom_llm_provider=provider) or ())
    except Exception:
        return frozenset()
