"""What one model call reports besides its text, the same whichever reader served it (LiteLLM's or
the fast path, docs/design.md#model-settings): how it failed, and the tokens it used."""

from __future__ import annotations

from dataclasses import dataclass


class ProviderError(Exception):
    """A model call failed: every model failed before its first delta, or one failed mid-stream."""

    def __init__(self, kind: str, model: str, message: str, *, after_first_delta: bool) -> None:
        super().__init__(f"{model}: {kind}: {message}")
        self.kind = kind
        self.model = model
        self.message = message
        self.after_first_delta = after_first_delta


@dataclass(frozen=True, slots=True)
class Usage:
    """The tokens one call used, as the provider reported them."""

    prompt_tokens: int
    completion_tokens: int

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens
