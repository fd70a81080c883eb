"""Provider failures that name their cause (docs/design.md#fallback, #model-settings): a model string
with no provider and a key variable that is not set fail the call before anything is sent, in words
that say what to fix; every failure reaches the log of the process that called the model, once per
(model, cause) a minute. The window is tested with an injected clock, never a sleep."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from actors.llm.errors import ProviderError
from actors.llm.failures import FAILURES, FailureLog
from actors.llm.providers import no_provider, provider_of, unknown_settings
from actors.llm.stream import stream_model

MESSAGES = [{"role": "user", "content": "hi"}]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    @property
    def messages(self) -> list[str]:
        return [r.getMessage() for r in self.records]


@pytest.fixture
def lines() -> Any:
    logger = logging.getLogger(f"test.failures.{id(object())}")
    logger.propagate = False
    handler = Lines()
    logger.addHandler(handler)
    return logger, handler


def failure(model: str = "openai/acme-small", kind: str = "auth", message: str = "no key", *, mid: bool = False
            ) -> ProviderError:
    return ProviderError(kind, model, message, after_first_delta=mid)


async def call(model: str, settings: dict[str, Any] | None = None) -> ProviderError:
    with pytest.raises(ProviderError) as err:
        async for _ in stream_model([model], MESSAGES, conversation_id="c-fail", next_call_index=iter(range(9)).__next__,
                                    settings={model: settings or {}}):
            pass
    return err.value


# -- the log --------------------------------------------------------------------------------------


def test_a_cause_is_logged_once_per_minute_at_warning_then_says_how_many_were_left_out(lines: Any) -> None:
    logger, handler = lines
    clock = Clock()
    log = FailureLog(logger, clock=clock)
    assert [log.failed(failure(), f"c{i}") for i in range(4)] == [True, False, False, False]
    clock.now += 59.9
    assert not log.failed(failure(), "c5")
    clock.now += 0.1
    assert log.failed(failure(), "c6")
    assert [r.levelno for r in handler.records] == [logging.WARNING, logging.WARNING]
    assert handler.messages == [
        "model openai/acme-small failed before responding: auth: no key (conversation c0)",
        "model openai/acme-small failed before responding: auth: no key (conversation c6) (4 more like it in the last 60 s)",
    ]


def test_each_model_and_each_cause_has_its_own_window(lines: Any) -> None:
    logger, handler = lines
    log = FailureLog(logger, clock=Clock())
    log.failed(failure(), "c")
    log.failed(failure(model="openai/acme-large"), "c")
    log.failed(failure(kind="rate_limit", message="slow down", mid=True), "c")
    log.failed(failure(), "c")
    assert handler.messages == [
        "model openai/acme-small failed before responding: auth: no key (conversation c)",
        "model openai/acme-large failed before responding: auth: no key (conversation c)",
        "model openai/acme-small failed in the middle of the response: rate_limit: slow down (conversation c)",
    ]


def test_the_log_remembers_a_bounded_number_of_causes(lines: Any) -> None:
    logger, handler = lines
    clock = Clock()
    log = FailureLog(logger, clock=clock, max_causes=3)
    for i in range(10):
        log.failed(failure(message=f"request {i}"), "c")
    assert len(log._seen) == 3 and len(handler.records) == 10
    log.failed(failure(message="request 9"), "c")          # still remembered: left out
    assert len(handler.records) == 10


def test_a_cause_is_one_line_and_names_its_kind_once() -> None:
    assert failure(kind="bad_request", message="no provider\n  for model 'x'").cause == "bad_request: no provider for model 'x'"
    assert failure(kind="script_exhausted", message="script_exhausted: no round 3").detail == "no round 3"


async def test_stream_model_reports_every_failed_attempt(caplog: pytest.LogCaptureFixture) -> None:
    model = "openai/acme-log-check"
    FAILURES._seen.clear()
    with caplog.at_level(logging.WARNING, logger="reactgate.llm"):
        for _ in range(3):
            await call(model, {"api_key_env": "REACTGATE_TEST_UNSET_KEY_LOG"})
    lines = [r.getMessage() for r in caplog.records if r.name == "reactgate.llm"]
    assert lines == [f"model {model} failed before responding: auth: the variable REACTGATE_TEST_UNSET_KEY_LOG "
                     "(api_key_env) is not set where this model is called (conversation c-fail)"]


# -- causes named before anything is sent -----------------------------------------------------------


async def test_a_model_string_without_a_provider_fails_saying_so(monkeypatch: pytest.MonkeyPatch) -> None:
    error = await call("acme-small", {"api_base": "http://127.0.0.1:9/v1"})
    assert (error.kind, error.after_first_delta) == ("bad_request", False)
    assert error.message == no_provider("acme-small") == (
        "no provider for model 'acme-small': a LiteLLM model string starts with its provider, "
        "e.g. 'openai/acme-small' for an OpenAI-compatible endpoint")


async def test_an_unset_key_variable_fails_with_auth_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACME_LLM_KEY", raising=False)
    error = await call("openai/acme-small", {"api_base": "http://127.0.0.1:9/v1", "api_key_env": "ACME_LLM_KEY"})
    assert error.cause == "auth: the variable ACME_LLM_KEY (api_key_env) is not set where this model is called"


def test_litellm_names_the_provider_and_its_parameters() -> None:
    assert provider_of("openai/acme-small") == "openai" and provider_of("acme-small") is None
    assert provider_of("scripted/demo") == "scripted"
    assert unknown_settings("openai/acme-small", ["api_base", "api_key_env", "timeout", "stream_reader", "temperature",
                                                  "max_tokens", "extra_body", "temprature"]) == ["temprature"]
    assert unknown_settings("anthropic/claude-x", ["max_tokens", "seed"]) == ["seed"]
    assert unknown_settings("acme-small", ["temprature"]) == [] and unknown_settings("scripted/demo", ["x"]) == []
