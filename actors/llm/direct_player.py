"""The scripted model played directly, with no LiteLLM in between (docs/design.md#scripted-model).

Load tests and benches then measure reactgate rather than LiteLLM's per-chunk wrapper. A call yields
the round's stream as it is (`Round.stream`: content, and for a native round its reasoning,
signatures, redacted blocks and calls, docs/design.md#native) — what the custom provider
(`scripted.py`) streams through LiteLLM's wrapper for the same call, deltas, finish reason, usage
when asked for — and fails with the `ProviderError`s LiteLLM's reader reports (kind, message,
after_first_delta): both play through `scripts.play`, and tests/test_llm_stream.py checks them side
by side.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator

from actors.llm.call import ModelCall
from actors.llm.deltas import ModelFinished, StreamItem
from actors.llm.errors import ProviderError, Usage
from actors.llm.scripts import PROVIDER, RoundFailed, play, round_to_play
from protocol.deltas import ModelDelta

_SCRIPTED = f"{PROVIDER}/"


def plays_directly(call: ModelCall) -> bool:
    """Whether the call is this player's: a `scripted/<name>` model whose settings do not ask for
    LiteLLM's reader (`stream_reader = "litellm"` keeps the custom provider)."""
    return call.model.startswith(_SCRIPTED) and call.reader == "fast"


async def play_directly(call: ModelCall) -> AsyncGenerator[StreamItem, None]:
    """One attempt of `scripted/<name>`: round `call.call_index` of script <name>, paced by the
    script; its read timeout is the call's (LiteLLM's 600 s when none is given)."""
    delivered = False
    try:
        round_ = round_to_play(call.model[len(_SCRIPTED):], call.call_index, call.messages)
        async with contextlib.aclosing(play(round_, read_timeout_s=call.read_timeout_s,
                                            idle_timeout_s=call.idle_timeout_s)) as deltas:
            async for delta in deltas:
                if type(delta) is not ModelDelta or delta.text:   # an empty chunk only paces the stream
                    delivered = True
                    yield delta
    except RoundFailed as failed:
        raise ProviderError(failed.kind, call.model, failed.message, after_first_delta=delivered) from None
    usage = round_.reported_usage(call.messages) if call.include_usage else None
    yield ModelFinished(round_.finish_reason, call.model,
                        None if usage is None else Usage(usage.prompt_tokens, usage.completion_tokens))
