"""LiteLLM, loaded once per process: the one place the model layer imports it (docs/design.md#fallback).

LiteLLM is imported lazily (≈3 s, ≈200 MB), only after the cost map is pinned to the local copy
(`actors/llm/__init__.py`), and configured lean before anything uses it. Everything of LiteLLM the
model layer calls — its stream wrapper, its request building, its exception classes and text checks
— is reached through `litellm_module()` and `litellm_part()`, so no caller can see it unconfigured. `warm_up` does the
import in a thread at start-up: done on the first turn, it would freeze every connection of the
process inside the event loop. (`scripted.py`, LiteLLM's custom provider for the scripted model, is
LiteLLM code itself and is loaded only where a scripted model is played through LiteLLM.)
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import sys
from types import ModuleType
from typing import Final

# -- the lean LiteLLM configuration --------------------------------------------------------------
#
# Measured with bench/litellm_baseline.py (CustomLLM → acompletion(stream=True), process CPU time,
# shared 2-core machine under load, so ±15 %). Per-chunk work in LiteLLM's async stream wrapper
# (`chunk_creator`: a pydantic ModelResponseStream per chunk, ~100 µs) has no switch. What we cut:
#
# - stop at the finish chunk and `aclose()` (done by `litellm_reader.py`, not a setting): draining the
#   wrapper to its end makes LiteLLM rebuild the whole response from every chunk in a worker thread
#   (`stream_chunk_builder`: re-counts prompt and completion tokens, prices the call) and schedule
#   success callbacks; nothing we read comes from it. Saves ~25-35 % per chunk on 5,000-chunk
#   calls (CPU 145-185 → 108-128 µs/chunk) and ~50 % on 50-chunk calls (≈19 → ≈9.5 ms CPU per call).
# - `suppress_debug_info`: LiteLLM prints a "Give Feedback / Get Help" banner to stdout on every
#   mapped provider exception — every fallback and scripted error. Per error, not per chunk.
# - `turn_off_message_logging`: any logging callback an operator configures gets payloads with the
#   messages redacted: prompts stay out of logs. No measurable cost either way.
# - `disable_streaming_logging`: no per-chunk success-logging job on LiteLLM's sync path (we are
#   async: no measurable effect; set so a sync caller does not pay it either).
# - `REPEATED_STREAMING_CHUNK_LIMIT`: LiteLLM raises "The model is repeating the same chunk" after
#   100 identical consecutive chunks (> 2 chars). Identical chunks are legitimate (scripted load
#   tests, a ruler of dashes); a runaway model is bounded by max_tokens and our iteration limits.
# Not set, on purpose: `disable_token_counter` — it makes `litellm.token_counter` return 0, and
# context assembly (docs/design.md#context) counts tokens with it. LiteLLM registers no callbacks by default.
# Usage (`include_usage`, for a token quota: docs/design.md#quotas) undoes the first cut: LiteLLM
# hands the usage chunk out only from that end-of-stream rebuild, after the finish chunk. So it is
# asked for only when a caller needs exact counts, and only from providers that take `stream_options`.
LEAN_SETTINGS: Final[dict[str, object]] = {
    "suppress_debug_info": True,
    "turn_off_message_logging": True,
    "disable_streaming_logging": True,
    "REPEATED_STREAMING_CHUNK_LIMIT": sys.maxsize,
}

_litellm: ModuleType | None = None


def litellm_module() -> ModuleType:
    """LiteLLM, imported once per process and configured lean."""
    global _litellm
    if _litellm is None:
        import litellm

        for key, value in LEAN_SETTINGS.items():
            setattr(litellm, key, value)
        _litellm = litellm
    return _litellm


@functools.cache
def litellm_part(name: str) -> ModuleType:
    """A module of LiteLLM's (`litellm_part("utils")`), after LiteLLM itself: importing LiteLLM
    loads every one the model layer uses, so this is a lookup — kept, as `import_module` takes the
    import lock even for a loaded module (four of them per model request)."""
    litellm_module()
    return importlib.import_module(f"litellm.{name}")


async def warm_up() -> None:
    """Import LiteLLM and load its tokenizer in a thread, at start-up."""

    def load() -> None:
        litellm_module().token_counter(model="gpt-4o", messages=[{"role": "user", "content": "warm up"}])

    await asyncio.to_thread(load)
