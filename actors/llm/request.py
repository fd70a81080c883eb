"""The provider request of a fast-path call: built by LiteLLM, sent by us (docs/design.md#model-settings).

What LiteLLM is good at — resolving a model string to its provider, endpoint, auth headers and
request body — it still does, once per call, through its own provider configs (`get_llm_provider`,
`ProviderConfigManager.get_provider_chat_config`, `get_optional_params` → the config's
`map_openai_params`, then `validate_environment`, `get_complete_url`, `transform_request`: the steps
its `BaseLLMHTTPHandler` takes), so the fast path sends the very request LiteLLM would
(tests/test_llm_fast.py compares them). `fast_path_supports` says which calls it can build.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Final

import msgspec

from actors.llm.call import STREAM_READER, ModelCall
from actors.llm.errors import ProviderError
from actors.llm.keys import scrub
from actors.llm.lite import litellm_module, litellm_part
from actors.llm.scripts import PROVIDER
from actors.llm.wires import PROVIDER_WIRES, Wire

# The settings the fast path knows how to send (docs/design.md#model-settings): any other key is a LiteLLM
# parameter we would have to re-implement (response_format, api_version, extra_body, `tools` as a
# model setting, …), so a model that has one goes through LiteLLM. A native round's functions are
# not a setting: they come in `ModelCall.tools`, which the fast path sends, in the body LiteLLM builds
# from them (docs/design.md#native).
FAST_SETTINGS: Final = frozenset({
    "api_base", "api_key_env", STREAM_READER, "timeout",
    "temperature", "top_p", "top_k", "max_tokens", "max_completion_tokens", "stop",
    "presence_penalty", "frequency_penalty", "seed", "user",
})


@dataclass(frozen=True, slots=True)
class Route:
    """A model string resolved by LiteLLM: the provider's name for the model, the provider, the wire."""

    model: str
    provider: str
    wire: Wire
    api_base: str   # the base LiteLLM resolved (the call's, or the provider's default)


def fast_path_supports(call: ModelCall) -> bool:
    """Whether `build_request` can make this call exactly as LiteLLM would: the fast reader (no
    `stream_reader = "litellm"`), a provider in `PROVIDER_WIRES` (never `scripted/…`), only
    `FAST_SETTINGS`, and an endpoint LiteLLM can name."""
    if call.reader != "fast" or not FAST_SETTINGS.issuperset(call.params):
        return False
    if call.model.startswith(f"{PROVIDER}/"):
        return False
    return route(call.model, call.api_base) is not None


@lru_cache(maxsize=512)
def route(model: str, api_base: str | None) -> Route | None:
    """How LiteLLM resolves `model` (None: not a call this path makes). Cached: resolution reads
    LiteLLM's model tables, not the key."""
    litellm = litellm_module()
    try:
        name, provider, _key, base = litellm.get_llm_provider(model, api_base=api_base)
    except Exception:
        return None     # LiteLLM's own path raises its own error for it
    wire = PROVIDER_WIRES.get(provider)
    if wire is None:
        return None
    config = _config(name, provider)
    base = base or api_base
    if provider in ("openai", "anthropic"):
        base = config.get_api_base(base)
    if base is None:
        return None     # e.g. hosted_vllm with no api_base: LiteLLM reads its variables
    bridge = litellm_part("responses.bridge_check").responses_api_bridge_check
    if bridge(model=name, custom_llm_provider=provider, api_base=base)[0].get("mode") == "responses":
        return None     # LiteLLM would call the Responses API for it
    return Route(name, provider, wire, base)


def _config(name: str, provider: str) -> Any:
    providers = litellm_module().LlmProviders
    return litellm_part("utils").ProviderConfigManager.get_provider_chat_config(model=name, provider=providers(provider))


@dataclass(frozen=True, slots=True)
class FastRequest:
    route: Route
    url: str
    headers: Mapping[str, str] = field(repr=False)   # they carry the key
    body: bytes = field(repr=False)
    key: str | None = field(repr=False)   # to scrub error text of; never logged

    @property
    def origin(self) -> str:
        """scheme://host[:port] of the URL: what picks a proxy."""
        scheme, _, rest = self.url.partition("://")
        return f"{scheme}://{rest.split('/', 1)[0]}"


def build_request(call: ModelCall) -> FastRequest:
    """The request LiteLLM would send for `call`, with the stream's usage asked for when the call
    wants it. Fails as LiteLLM would, before anything is sent: `auth` when no key can be found,
    `bad_request` when LiteLLM refuses a parameter or a message."""
    found = route(call.model, call.api_base)
    if found is None:
        raise ValueError(f"{call.model!r} is not a call the fast path makes: check fast_path_supports first")
    litellm = litellm_module()
    config = _config(found.model, found.provider)
    key = call.api_key
    if key is None:
        key = litellm.get_llm_provider(call.model, api_base=call.api_base)[2]
        if key is None and found.provider in ("openai", "anthropic"):
            key = config.get_api_key()
        if key is None and found.provider == "openai":
            # The OpenAI SDK refuses to start without one; LiteLLM maps that to AuthenticationError.
            raise ProviderError("auth", call.model, "no api key: name its variable in the model's api_key_env",
                                after_first_delta=False)
    own = dict(call.params)
    if call.tools:
        own["tools"] = list(call.tools)
    try:   # LiteLLM refusing the request (an unsupported parameter, a message it cannot translate)
        optional = copy.deepcopy(_optional_params(found, call.include_usage, msgspec.json.encode(sorted(own.items()))))
        extra_body = optional.pop("extra_body", None)
        params = litellm_part("litellm_core_utils.get_litellm_params").get_litellm_params(
            api_base=found.api_base, custom_llm_provider=found.provider)
        # as LiteLLM's `completion` takes them in first: None fields dropped (`content: None` beside
        # an assistant's `tool_calls`, docs/design.md#native), user content checked
        msgs = litellm_part("utils").validate_and_fix_openai_messages([dict(m) for m in call.messages])
        out_headers = config.validate_environment(
            headers=call.headers, model=found.model, messages=msgs, optional_params=optional,
            litellm_params=params, api_key=key, api_base=found.api_base,
        )
        url = config.get_complete_url(api_base=found.api_base, api_key=key, model=found.model, optional_params=optional,
                                      litellm_params=params, stream=True)
        body = config.transform_request(model=found.model, messages=msgs, optional_params=optional,
                                        litellm_params=params, headers=out_headers)
        if found.wire is Wire.ANTHROPIC_MESSAGES:
            url = litellm_part("litellm_core_utils.url_utils").ensure_api_route(url, "v1/messages")   # as LiteLLM's dispatch
            out_headers, body = litellm_part("anthropic_beta_headers_manager").update_request_with_filtered_beta(
                headers=out_headers, request_data=body, provider=found.provider, api_base=found.api_base)
            body = dict(litellm_part("anthropic_beta_gated_fields").strip_beta_gated_request_body(
                body, out_headers, drop_params=None, model=found.model, provider=found.provider))
        if extra_body:
            body = {**body, **config.transform_extra_body(extra_body=extra_body, request=body, model=found.model,
                                                          litellm_params=params)}
        if config.supports_stream_param_in_request_body:
            body["stream"] = True
    except Exception as exc:
        raise ProviderError("bad_request", call.model, scrub(f"{type(exc).__name__}: {exc}", key)[:500],
                            after_first_delta=False) from None
    return FastRequest(found, url, {str(k): str(v) for k, v in out_headers.items()}, msgspec.json.encode(body), key)


@lru_cache(maxsize=512)
def _optional_params(found: Route, include_usage: bool, settings: bytes) -> dict[str, Any]:
    """LiteLLM's mapping of the settings to the provider's parameters (its supported-parameter checks,
    `map_openai_params`, unknown ones to `extra_body`): a function of the settings alone, so it runs
    once per model and settings, not once per call (it reads model tables: ~0.3 ms). Copy before use."""
    own = dict(msgspec.json.decode(settings))
    if include_usage and found.wire is Wire.OPENAI_CHAT and "stream_options" in (
            _config(found.model, found.provider).get_supported_openai_params(found.model) or ()):
        own["stream_options"] = {"include_usage": True}
    return dict(litellm_part("utils").get_optional_params(model=found.model, custom_llm_provider=found.provider,
                                                          stream=True, **own))
