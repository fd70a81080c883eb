"""How a model call fails, in one vocabulary, whichever reader served it (docs/design.md#fallback).

A failure reaches the turn as one `ProviderError` whose kind is the same for the same answer on
every path — LiteLLM's wrapper, the fast path, the direct player — so that a profile's fallbacks
and notices read the same whichever reader a model's settings pick (docs/design.md#model-settings).
Every classifier lives here, each a table read in order:

- `error_kind`: a LiteLLM exception → kind (`EXCEPTION_KINDS`), for LiteLLM's reader;
- `classify`: an error answer's text and HTTP status → kind (`TEXT_RULES`, then `STATUS_KINDS`),
  the kinds LiteLLM 1.110's exception mapping gives for the same answer, for the fast path;
- `answer_fault`, `stream_fault`: an error status's body, or an error event inside the stream,
  read into a `Fault` (kind and message) by those rules.

Nothing here does I/O. LiteLLM is consulted only for its exception classes and two of its text
checks, through `litellm_part()`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

import msgspec

from actors.llm.lite import litellm_part
from actors.llm.wires import Wire


class ErrorKind(StrEnum):
    """The kinds a script can fail with (docs/design.md#scripted-model): each has an HTTP status and
    a LiteLLM exception (`ERROR_TABLE`). Classification also gives `context_window_exceeded`,
    `content_policy`, `connection`, `unknown` and `SCRIPT_EXHAUSTED`."""

    RATE_LIMIT = "rate_limit"
    TIMEOUT = "timeout"
    SERVER_ERROR = "server_error"
    UNAVAILABLE = "unavailable"
    BAD_REQUEST = "bad_request"
    AUTH = "auth"
    NOT_FOUND = "not_found"


SCRIPT_EXHAUSTED: Final = "script_exhausted"      # a used-up script: the kind, and its message's prefix

# One table for the scripted model's players and for classification: the LiteLLM exception the
# custom provider raises, and the HTTP status the mock endpoint answers with — chosen so that
# LiteLLM's `openai/` provider maps the status back to the same exception class.
ERROR_TABLE: Final[Mapping[ErrorKind, tuple[int, str]]] = {
    ErrorKind.RATE_LIMIT: (429, "RateLimitError"),
    ErrorKind.TIMEOUT: (408, "Timeout"),
    ErrorKind.SERVER_ERROR: (500, "InternalServerError"),
    ErrorKind.UNAVAILABLE: (503, "ServiceUnavailableError"),
    ErrorKind.BAD_REQUEST: (400, "BadRequestError"),
    ErrorKind.AUTH: (401, "AuthenticationError"),
    ErrorKind.NOT_FOUND: (404, "NotFoundError"),
}

# A stream gone quiet after its first delta, cut by the caller's idle timeout (docs/design.md#continuation):
# the words every reader and player uses for it.
SILENCE: Final = "no chunk for {:g} s in the middle of the response"


CAUSE_CHARS: Final = 500


class ProviderError(Exception):
    """A model call failed: every model failed before its first delta, or one failed mid-stream."""

    def __init__(self, kind: str, model: str, message: str, *, after_first_delta: bool) -> None:
        super().__init__(f"{model}: {kind}: {message}")
        self.kind = kind
        self.model = model
        self.message = message
        self.after_first_delta = after_first_delta

    @property
    def detail(self) -> str:
        """The message on one line, without the kind some messages open with, at most
        `CAUSE_CHARS`: what a notice quotes (docs/design.md#notices). Readers scrub keys out of
        `message` before they raise (keys.py), so this holds none."""
        text = " ".join(self.message.split())
        if text.startswith(f"{self.kind}: "):
            text = text[len(self.kind) + 2:]
        return text[:CAUSE_CHARS]

    @property
    def cause(self) -> str:
        """`kind: detail`: the failure as `turn.completed.error` and the log say it."""
        return f"{self.kind}: {self.detail}" if self.detail else self.kind


@dataclass(frozen=True, slots=True)
class Usage:
    """The tokens one call used, as the provider reported them."""

    prompt_tokens: int
    completion_tokens: int

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class Fault:
    """A failure read off the wire, before it is pinned on a model and a position in the answer."""

    kind: str
    message: str


# -- LiteLLM exceptions → kinds ------------------------------------------------------------------

# (class in `litellm.exceptions`, kind), most specific first: several LiteLLM classes subclass
# BadRequestError or APIConnectionError. The first class the exception is an instance of wins.
EXCEPTION_KINDS: Final[Sequence[tuple[str, str]]] = (
    ("ContextWindowExceededError", "context_window_exceeded"),
    ("ContentPolicyViolationError", "content_policy"),
    *((cls_name, kind.value) for kind, (_, cls_name) in ERROR_TABLE.items()),
    ("PermissionDeniedError", "auth"),
    ("APIConnectionError", "connection"),
    ("APIError", "server_error"),
    ("BadGatewayError", "server_error"),
)


def error_kind(exc: BaseException) -> str:
    """The kind of a LiteLLM exception (or of the one a mid-stream fallback error wraps)."""
    lx = litellm_part("exceptions")
    original = getattr(exc, "original_exception", None)
    if isinstance(exc, lx.MidStreamFallbackError) and isinstance(original, BaseException):
        exc = original
    if SCRIPT_EXHAUSTED in str(exc):
        return SCRIPT_EXHAUSTED
    for cls_name, kind in EXCEPTION_KINDS:
        if isinstance(exc, getattr(lx, cls_name)):
            return kind
    return "unknown"


# LiteLLM stacks class-name prefixes: "litellm.RateLimitError: RateLimitError: OpenAIException - …".
_PREFIX = re.compile(r"^(?:litellm\.)?[A-Z]\w*(?: Error)?(?::| -)\s+")


def error_message(exc: BaseException) -> str:
    """A LiteLLM exception's message without the class names LiteLLM stacks in front of it."""
    original = getattr(exc, "original_exception", None)
    if isinstance(original, BaseException):
        exc = original
    text = str(getattr(exc, "message", None) or exc)
    while (m := _PREFIX.match(text)) is not None:
        text = text[m.end() :]
    return (text or type(exc).__name__)[:500]


# -- error answers → kinds, as LiteLLM maps them -------------------------------------------------
#
# The kinds LiteLLM 1.110's exception mapping gives for the same answers (checked against its wrapper
# by tests/test_llm_fast.py). A status first meets the text rules (LiteLLM classifies by the error
# text before the status), then the status tables; a mid-stream error has no status on the OpenAI
# wire (the SDK raises a bare APIError: anything unmatched is `connection`, MID_STREAM_MESSAGES in
# mock_wires.py relies on it) and 500 on the Anthropic wire (LiteLLM's AnthropicError for an
# `error` event).

_BASE_STATUS: Final = {status: kind.value for kind, (status, _) in ERROR_TABLE.items()}
STATUS_KINDS: Final[Mapping[Wire, Mapping[int, str]]] = {
    Wire.OPENAI_CHAT: {**_BASE_STATUS, 422: "bad_request", 502: "server_error", 504: "timeout"},
    Wire.ANTHROPIC_MESSAGES: {**_BASE_STATUS, 403: "auth", 413: "bad_request", 502: "server_error",
                              504: "timeout", 529: "server_error"},
}
# Statuses neither table names: LiteLLM's OpenAI mapping raises a plain APIError (→ server_error)
# for any of them, its Anthropic mapping a BadRequestError for a 4xx.
OTHER_STATUS_KIND: Final[Mapping[Wire, Callable[[int], str]]] = {
    Wire.OPENAI_CHAT: lambda status: "server_error",
    Wire.ANTHROPIC_MESSAGES: lambda status: "bad_request" if 400 <= status < 500 else "server_error",
}

_TIMEOUT_TEXTS: Final = ("Request Timeout Error", "Request timed out", "Timed out generating response",
                         "The read operation timed out")
_OPENAI, _ANTHROPIC = frozenset({Wire.OPENAI_CHAT}), frozenset({Wire.ANTHROPIC_MESSAGES})
_BOTH: Final = _OPENAI | _ANTHROPIC


def _checkers() -> Any:
    """LiteLLM's own text checks (rate limits, context windows), which its lists keep current."""
    return litellm_part("litellm_core_utils.exception_mapping_utils").ExceptionCheckers


def _invalid_request(status: int | None) -> str:
    return {401: "auth", 404: "not_found"}.get(status or 0, "bad_request")


# (wires, test on (text, status), kind or kind-from-status), in LiteLLM's order; the first match wins.
TEXT_RULES: Final[Sequence[tuple[frozenset[Wire], Callable[[str, int | None], bool], Callable[[int | None], str]]]] = (
    (_BOTH, lambda t, s: SCRIPT_EXHAUSTED in t, lambda s: SCRIPT_EXHAUSTED),       # error_kind's first rule
    (_BOTH, lambda t, s: any(x in t for x in _TIMEOUT_TEXTS), lambda s: "timeout"),
    (_OPENAI, lambda t, s: _checkers().is_error_str_rate_limit(t, status_code=s), lambda s: "rate_limit"),
    (_OPENAI, lambda t, s: _checkers().is_error_str_context_window_exceeded(t), lambda s: "context_window_exceeded"),
    (_OPENAI, lambda t, s: "invalid_request_error" in t and "model_not_found" in t, lambda s: "not_found"),
    (_OPENAI, lambda t, s: "A timeout occurred" in t, lambda s: "timeout"),
    (_OPENAI, lambda t, s: ("invalid_request_error" in t and "content_policy_violation" in t)
     or "request was rejected as a result of the safety system" in t.lower(), lambda s: "content_policy"),
    (_OPENAI, lambda t, s: "invalid_request_error" in t and "Incorrect API key provided" not in t, _invalid_request),
    (_OPENAI, lambda t, s: "The server had an error processing your request." in t
     or "Web server is returning an unknown error" in t, lambda s: "server_error"),
    (_OPENAI, lambda t, s: "Request too large" in t, lambda s: "rate_limit"),
    (_ANTHROPIC, lambda t, s: "prompt is too long" in t or "prompt: length" in t
     or _checkers().is_error_str_context_window_exceeded(t), lambda s: "context_window_exceeded"),
    (_ANTHROPIC, lambda t, s: "overloaded_error" in t or "Overloaded" in t, lambda s: "server_error"),
    (_ANTHROPIC, lambda t, s: "Invalid API Key" in t, lambda s: "auth"),
    (_ANTHROPIC, lambda t, s: "content filtering policy" in t, lambda s: "content_policy"),
)


def classify(wire: Wire, status: int | None, text: str) -> str:
    """The kind of an error answer: its text (body or event message), its status (None for an
    error inside a 200 stream)."""
    for wires, matches, kind in TEXT_RULES:
        if wire in wires and matches(text, status):
            return kind(status)
    if status is None:
        return "connection"
    return STATUS_KINDS[wire].get(status) or OTHER_STATUS_KIND[wire](status)


class ErrorDetail(msgspec.Struct, gc=False):
    """The `error` member of an error answer or event, either wire."""

    message: str | None = None
    type: str | None = None
    code: str | int | None = None


class _ErrorBody(msgspec.Struct, gc=False):
    """An error answer's body, either wire: `{"error": {"message": …}}` or `{"error": "…"}`."""

    error: ErrorDetail | str | None = None


_ERROR_BODY = msgspec.json.Decoder(_ErrorBody)
_WHITESPACE = re.compile(r"\s+")


def answer_fault(wire: Wire, status: int, reason: str | None, body: bytes) -> Fault:
    """An error status: its kind from the body's text and the status; its message from the body."""
    text = body.decode("utf-8", errors="replace")
    try:
        error = _ERROR_BODY.decode(body).error
    except msgspec.DecodeError:
        error = None
    message = error.message if isinstance(error, ErrorDetail) else error
    message = _WHITESPACE.sub(" ", message or text or reason or "").strip()[:500]
    return Fault(classify(wire, status, text), f"{message} (HTTP {status})")


def stream_fault(wire: Wire, error: ErrorDetail | str | None, status: int | None) -> Fault:
    """An error event inside a 200 stream, with the status its wire implies (None on OpenAI's)."""
    if isinstance(error, ErrorDetail):
        message = error.message or "An error occurred during streaming"
        # The OpenAI-compatible servers LiteLLM's own handler reads (vLLM, sglang) put the status in `code`.
        if status is None and isinstance(error.code, int) and 400 <= error.code < 600:
            status = error.code
    else:
        message = error or "An error occurred during streaming"
    return Fault(classify(wire, status, message), message)


def unreadable(exc: Exception) -> Fault:
    """An event the decoder cannot read: the stream is broken, as a dropped connection is."""
    return Fault("connection", f"unreadable stream event: {exc}")
