"""The token counter keeps each message's count (actors/conversation.py): the same number as
LiteLLM's, and LiteLLM asked once per distinct message, whatever the number of conversations."""

from __future__ import annotations

from typing import Any

import litellm
import pytest

from actors.conversation import _count_one, litellm_token_counter

MESSAGE = {"role": "user", "content": "What is the weather in Paris?"}


def test_a_message_counts_what_litellm_counts() -> None:
    count = litellm_token_counter("gpt-4o")
    assert count([MESSAGE]) == litellm.token_counter(model="gpt-4o", messages=[MESSAGE])
    pair = [MESSAGE, {"role": "assistant", "content": "It rains."}]
    assert count(pair) == litellm.token_counter(model="gpt-4o", messages=pair)


def test_a_message_is_counted_once_for_every_conversation(monkeypatch: pytest.MonkeyPatch) -> None:
    _count_one.cache_clear()
    calls: list[Any] = []
    real = litellm.token_counter

    def spy(**kwargs: Any) -> int:
        calls.append(kwargs)
        return int(real(**kwargs))

    monkeypatch.setattr(litellm, "token_counter", spy)
    first, second = litellm_token_counter("gpt-4o"), litellm_token_counter("gpt-4o")
    assert first([MESSAGE]) == second([dict(MESSAGE)]) == first([MESSAGE])
    assert len(calls) == 1
    litellm_token_counter("claude-3-5-sonnet-20240620")([MESSAGE])   # another model counts apart
    assert len(calls) == 2
