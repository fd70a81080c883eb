"""The two wire formats the fast path reads, and which providers speak them (docs/design.md#model-settings).

A provider's stream is read by us only where LiteLLM's own chat config streams one of these as
plain SSE; each wire has its decoder (`openai_wire.py`, `anthropic_wire.py`) and its error table
(`errors.STATUS_KINDS`).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Final


class Wire(StrEnum):
    OPENAI_CHAT = "openai_chat"                  # POST …/chat/completions, `data: {chunk}` … `data: [DONE]`
    ANTHROPIC_MESSAGES = "anthropic_messages"    # POST …/v1/messages, `event: <type>` + `data: {…}`


# Providers whose LiteLLM chat config streams plain chat-completions SSE (an `OpenAIGPTConfig`
# subclass that keeps its `OpenAIChatCompletionStreamingHandler`) or Anthropic Messages SSE.
# Left to LiteLLM, on purpose: groq, openrouter, mistral, fireworks_ai, xai (each has its own stream
# iterator); azure (deployment URLs, api-version, AD tokens; not an OpenAIGPTConfig); ollama_chat
# (NDJSON, not SSE); perplexity (citations post-processed from the stream); every other provider.
PROVIDER_WIRES: Final[Mapping[str, Wire]] = {
    "openai": Wire.OPENAI_CHAT,
    "hosted_vllm": Wire.OPENAI_CHAT,
    "together_ai": Wire.OPENAI_CHAT,
    "deepseek": Wire.OPENAI_CHAT,
    "litellm_proxy": Wire.OPENAI_CHAT,
    "lm_studio": Wire.OPENAI_CHAT,
    "deepinfra": Wire.OPENAI_CHAT,
    "cerebras": Wire.OPENAI_CHAT,
    "nvidia_nim": Wire.OPENAI_CHAT,
    "anthropic": Wire.ANTHROPIC_MESSAGES,
}
