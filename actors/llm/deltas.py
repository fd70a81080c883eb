"""What a model call yields, whichever reader served it (docs/design.md#overview).

A reader — fast (our SSE decoders), LiteLLM's wrapper, the direct player — yields the model's
deltas as it streams them (the family in `protocol/deltas.py`: content, reasoning, native calls)
and then one `ModelFinished`; `stream_model` adds a `ModelFallback` when
a model failed before its first delta and the next one takes over (docs/design.md#fallback). The
items pass from the decoder to the round engine unchanged: one allocation per delta on the hot path,
a frozen msgspec Struct (≈65 ns, against ≈365 ns for a frozen dataclass).

A consumer dispatches on `type(item)` and passes over a type it does not read.
"""

from __future__ import annotations

import msgspec

from actors.llm.errors import Usage
from protocol.deltas import ModelOutput


class ModelFinished(msgspec.Struct, frozen=True, gc=False):
    """The last item of a call: the finish reason in OpenAI's vocabulary (LiteLLM's
    `map_finish_reason`: Anthropic `end_turn` → `stop`, `max_tokens` → `length`, …), the model that
    answered, and its usage when asked for (`include_usage`) and the provider could say."""

    finish_reason: str | None
    model: str
    usage: Usage | None = None


class ModelFallback(msgspec.Struct, frozen=True, gc=False):
    """`from_model` failed before its first delta (`error`); `to_model` answers instead."""

    from_model: str
    to_model: str
    error: str


StreamItem = ModelOutput | ModelFallback | ModelFinished
