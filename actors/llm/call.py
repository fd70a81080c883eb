"""One model attempt, resolved once: `ModelCall` (docs/design.md#model-settings).

A model's settings win over the caller's arguments — `api_base`, `max_tokens`, `timeout`, and the
key its `api_key_env` names over an `api_key` argument. That rule is applied here, in
`ModelCall.resolve`, when an attempt starts, and nowhere else: every reader (fast, LiteLLM's
wrapper, the direct player) reads the resolved call, so no two readers can resolve it differently.

The key is read here too, from the variable the settings name, in the process that calls the model,
at the call (`keys.py`). A `ModelCall` lives for one attempt in that process: it is never pickled
into Ray, and its `repr` leaves the key out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from actors.llm.errors import ProviderError
from actors.llm.keys import KEY_SETTING, MissingKey, read_key
from actors.llm.scripts import CALL_INDEX_HEADER, CONVERSATION_HEADER

# A model setting of ours, never sent to a provider: "fast" (the default: our reader where the
# provider's wire allows) or "litellm" (LiteLLM's own stream wrapper — for a provider whose stream we
# misread, or to compare the two).
STREAM_READER: Final = "stream_reader"
DEFAULT_TIMEOUT_S: Final = 600.0   # LiteLLM's COMPLETION_HTTP_FALLBACK_SECONDS when no timeout is given

# Settings that become fields of the call rather than completion parameters: the ones reactgate
# itself consumes, whatever the provider (agent check knows them from here).
RESOLVED_SETTINGS: Final = frozenset({STREAM_READER, KEY_SETTING, "api_base", "timeout"})


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One attempt of one model: what every reader needs, settings already applied."""

    model: str
    messages: Sequence[Mapping[str, Any]]
    conversation_id: str
    call_index: int                   # the conversation's durable count (docs/design.md#scripted-model)
    reader: str                       # the `stream_reader` setting: "fast" or "litellm"
    params: Mapping[str, Any]         # completion parameters for the provider, as LiteLLM names them
    api_base: str | None
    api_key: str | None = field(repr=False)
    timeout: float | None             # as given (LiteLLM's default when None): see `read_timeout_s`
    idle_timeout_s: float | None      # silence after the first delta that cuts the stream
    include_usage: bool               # ask for the call's usage where the provider can say
    # A native round's functions (docs/design.md#native), in OpenAI's format (LiteLLM translates):
    # sent with the request by the fast path and LiteLLM's reader when not empty.
    tools: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def resolve(
        cls,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        settings: Mapping[str, Any],
        *,
        conversation_id: str,
        call_index: int,
        api_base: str | None = None,
        api_key: str | None = None,
        max_tokens: int | None = None,
        timeout_s: float | None = None,
        idle_timeout_s: float | None = None,
        include_usage: bool = False,
        tools: Sequence[Mapping[str, Any]] = (),
    ) -> ModelCall:
        """The call `model` makes with its `settings` (a profile's, docs/design.md#model-settings) and
        the caller's arguments. A key variable the settings name but this process does not have fails
        the attempt with `auth` before anything is sent, as a refused key would."""
        try:
            key = read_key(settings)
        except MissingKey as exc:
            raise ProviderError("auth", model, str(exc), after_first_delta=False) from None
        params = {k: v for k, v in settings.items() if k not in RESOLVED_SETTINGS}
        if "max_tokens" not in params and max_tokens is not None:
            params["max_tokens"] = max_tokens
        return cls(
            model=model, messages=messages, conversation_id=conversation_id, call_index=call_index,
            reader=settings.get(STREAM_READER, "fast"), params=params,
            api_base=settings.get("api_base", api_base), api_key=key or api_key,
            timeout=settings.get("timeout", timeout_s), idle_timeout_s=idle_timeout_s,
            include_usage=include_usage, tools=tuple(tools),
        )

    @property
    def headers(self) -> dict[str, str]:
        """The conversation and call index, sent with the request: the scripted provider and the mock
        endpoint play from them (scripts.py); real providers ignore unknown headers."""
        return {CONVERSATION_HEADER: self.conversation_id, CALL_INDEX_HEADER: str(self.call_index)}

    @property
    def read_timeout_s(self) -> float:
        """The longest wait for the answer's headers and then for each read, as LiteLLM's `timeout`."""
        return DEFAULT_TIMEOUT_S if self.timeout is None else float(self.timeout)
