"""`ModelCall.resolve` (actors/llm/call.py): a model's settings win over the caller's arguments, once,
for every reader (docs/design.md#model-settings)."""

from __future__ import annotations

from typing import Any

import pytest

from actors.llm.call import DEFAULT_TIMEOUT_S, ModelCall
from actors.llm.errors import ProviderError
from actors.llm.scripts import CALL_INDEX_HEADER, CONVERSATION_HEADER

MESSAGES = [{"role": "user", "content": "hi"}]
ARGUMENTS: dict[str, Any] = {"api_base": "http://caller/v1", "api_key": "sk-caller", "max_tokens": 100, "timeout_s": 30}


def resolve(settings: dict[str, Any], **arguments: Any) -> ModelCall:
    return ModelCall.resolve("openai/x", MESSAGES, settings, conversation_id="conv-1", call_index=7, **arguments)


def test_the_arguments_apply_when_the_settings_say_nothing() -> None:
    call = resolve({}, **ARGUMENTS)
    assert (call.api_base, call.api_key, call.params, call.timeout) == (
        "http://caller/v1", "sk-caller", {"max_tokens": 100}, 30)


def test_settings_win_over_every_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALL_TEST_KEY", "sk-settings")
    call = resolve({"api_base": "http://own/v1", "api_key_env": "CALL_TEST_KEY", "max_tokens": 5, "timeout": 2},
                   **ARGUMENTS)
    assert (call.api_base, call.api_key, call.params, call.timeout) == ("http://own/v1", "sk-settings",
                                                                        {"max_tokens": 5}, 2)


def test_our_settings_never_become_provider_parameters() -> None:
    call = resolve({"stream_reader": "litellm", "api_base": "http://own/v1", "timeout": 2, "temperature": 0.2})
    assert call.params == {"temperature": 0.2}
    assert call.reader == "litellm"
    assert resolve({}).reader == "fast"


def test_a_key_variable_that_is_not_set_fails_the_attempt_with_auth() -> None:
    with pytest.raises(ProviderError) as err:
        resolve({"api_key_env": "CALL_TEST_UNSET_VARIABLE"}, api_key="sk-caller")
    assert (err.value.kind, err.value.model, err.value.after_first_delta) == ("auth", "openai/x", False)
    assert "CALL_TEST_UNSET_VARIABLE" in err.value.message


def test_the_key_stays_out_of_the_calls_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALL_TEST_KEY", "sk-very-secret")
    assert "sk-very-secret" not in repr(resolve({"api_key_env": "CALL_TEST_KEY"}))
    assert "sk-caller" not in repr(resolve({}, api_key="sk-caller"))


def test_the_read_timeout_is_litellms_default_without_one() -> None:
    assert resolve({}).read_timeout_s == DEFAULT_TIMEOUT_S
    assert resolve({}, timeout_s=3).read_timeout_s == 3.0
    assert resolve({"timeout": 1}, timeout_s=3).read_timeout_s == 1.0


def test_the_headers_carry_the_conversation_and_the_call_index() -> None:
    assert resolve({}).headers == {CONVERSATION_HEADER: "conv-1", CALL_INDEX_HEADER: "7"}


def test_tools_are_carried_for_the_request() -> None:
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    assert resolve({}).tools == ()
    assert resolve({}, tools=[tool]).tools == (tool,)
