"""The scripted model's script (docs/design.md#scripted-model): what the model answers to the i-th call of a conversation.

A script is data, validated once when loaded; every player — the direct player
(`direct_player.py`), the LiteLLM custom provider (`scripted.py`) and the OpenAI-compatible mock endpoint
(`mock_server.py`) — reads the same `Round.chunks`, so no two paths stream different deltas for the
same script. The two in-process players also share one pacing (`play`) and one way to fail
(`RoundFailed`), so they cannot drift apart in timing or errors either.

Playback is stateless: the caller says which call of the conversation this is (the conversation
keeps the durable counter, so a conversation that moved to another process after a crash goes on
where it was). The call index travels as two HTTP-style headers, harmless for real providers.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections import OrderedDict
from collections.abc import AsyncGenerator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    PrivateAttr,
    ValidationError,
    model_validator,
)

from actors.llm.errors import SCRIPT_EXHAUSTED, SILENCE, ErrorKind

PROVIDER = "scripted"                      # LiteLLM model strings `scripted/<name>`
CONVERSATION_HEADER = "X-Reactgate-Conversation"
CALL_INDEX_HEADER = "X-Reactgate-Call-Index"
DEFAULT_CHUNK_CHARS = 4
BUILTIN_DIR = Path(__file__).resolve().parent.parent / "builtin"
BUILTIN_SCRIPTS: Mapping[str, str] = {"demo": "demo_script.json"}

FinishReason = Literal["stop", "length", "content_filter"]


class ScriptError(ValueError):
    """A script file that does not match the script format (docs/design.md#scripted-model); the message names the file and the field."""


class ScriptExhausted(LookupError):
    """A non-loop script has no round for this call. Players turn it into a provider error."""

    def __init__(self, name: str, call_index: int, rounds: int) -> None:
        super().__init__(
            f"{SCRIPT_EXHAUSTED}: script {name!r} has {rounds} round(s), no round for call {call_index}"
        )
        self.call_index = call_index


class UnknownScript(LookupError):
    pass


class RoundUsage(BaseModel):
    """The usage a round reports (docs/design.md#quotas): given, or else counted from characters."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_tokens: NonNegativeInt
    completion_tokens: NonNegativeInt


USAGE_CHARS_PER_TOKEN = 4


class Round(BaseModel):
    """One model call's answer: deltas as given, or text cut into `chunk_chars` pieces, or an error.

    `error` together with `deltas`/`text` streams the content first and then fails — a
    mid-stream provider error (docs/design.md#fallback); `error` alone fails before any chunk (after `delay_ms`,
    so a slow failure can be scripted too).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    deltas: tuple[str, ...] | None = None
    text: str | None = None
    chunk_chars: PositiveInt | None = None
    error: ErrorKind | None = None
    finish_reason: FinishReason = "stop"
    delay_ms: NonNegativeFloat = 0
    # A provider that hangs mid-answer: after this many chunks the stream goes silent and never
    # ends by itself — only the caller's stream idle timeout, a cancel or the process's death ends it.
    hang_after: NonNegativeInt | None = None
    # What the players report as the call's usage; absent, they count characters (4 per token).
    usage: RoundUsage | None = None

    _chunks: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="after")
    def _one_content(self) -> Round:
        if self.deltas is not None and self.text is not None:
            raise ValueError("a round has either `deltas` or `text`, not both")
        if self.deltas is None and self.text is None and self.error is None:
            raise ValueError("a round needs `deltas`, `text` or `error`")
        if self.chunk_chars is not None and self.text is None:
            raise ValueError("`chunk_chars` applies only to `text`")
        if self.hang_after is not None and self.error is not None:
            raise ValueError("a round that hangs never reaches its `error`: give one of `hang_after`, `error`")
        return self

    def model_post_init(self, context: Any, /) -> None:
        if self.deltas is not None:
            self._chunks = self.deltas
        elif self.text is not None:
            n = self.chunk_chars or DEFAULT_CHUNK_CHARS
            self._chunks = tuple(self.text[i : i + n] for i in range(0, len(self.text), n))

    @property
    def chunks(self) -> tuple[str, ...]:
        """The deltas this round streams, in order (empty for an error-only round)."""
        return self._chunks

    @property
    def delay_s(self) -> float:
        return self.delay_ms / 1000.0

    def reported_usage(self, messages: Sequence[Mapping[str, Any]]) -> RoundUsage:
        """The usage both players report for this round, answering `messages`."""
        if self.usage is not None:
            return self.usage
        prompt = sum(len(str(m.get("content") or "")) for m in messages)
        completion = sum(len(c) for c in self.chunks)
        return RoundUsage(prompt_tokens=-(-prompt // USAGE_CHARS_PER_TOKEN),
                          completion_tokens=-(-completion // USAGE_CHARS_PER_TOKEN))

    def hangs_before(self, i: int) -> bool:
        """Whether the stream goes silent, for good, before chunk `i` (or, i = len(chunks), its end)."""
        return self.hang_after is not None and i >= self.hang_after


async def hang() -> None:
    """A stream gone silent for good (`Round.hang_after`): waits until cancelled."""
    await asyncio.get_running_loop().create_future()


_FINAL_ANSWER = re.compile(r'"final_answer"\s*:\s*"')
_CLOSING_FENCE = re.compile(r"\s*```\s*(?=</channel:action>)")
_CUT_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{0,3})?$")


def _continuation_request(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """The response so far, when the request asks to continue it (its text then a `[continue]`)."""
    if len(messages) < 2 or messages[-2].get("role") != "assistant":
        return None
    if not str(messages[-1].get("content") or "").startswith("[continue]"):
        return None
    return str(messages[-2].get("content") or "")


def continuation(full: str, so_far: str) -> str:
    """What follows `so_far` in the response `full`: by the text itself when `so_far` is its start,
    else by the answer characters (a response rebuilt from durable events is spelled differently
    but holds the same answer so far). A `so_far` that `full` does not continue gets all of `full`."""
    if full.startswith(so_far):
        return full[len(so_far):]
    cut = list(_FINAL_ANSWER.finditer(so_far))
    whole = _FINAL_ANSWER.search(full)
    if not cut or whole is None:
        return full
    try:
        shown = json.loads('"' + _CUT_ESCAPE.sub("", so_far[cut[-1].end():]) + '"')
        answer, end = json.JSONDecoder().raw_decode('"' + full[whole.end():])
    except ValueError:
        return full
    if not isinstance(answer, str) or not answer.startswith(shown):
        return full
    tail = full[whole.end() + end - 2:]
    if "```" not in so_far[so_far.rfind("<channel:action>"):]:
        tail = _CLOSING_FENCE.sub("", tail, count=1)  # the text so far has no fence to close
    return json.dumps(answer[len(shown):], ensure_ascii=False)[1:-1] + tail


class Script(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rounds: tuple[Round, ...] = Field(min_length=1)
    loop: bool = False
    # A model that continues when asked to (docs/design.md#continuation): a request that sends a
    # cut response back with a `[continue]` instruction gets the rest of the round that response
    # came from, instead of the next round. Off, every call plays its round, whatever it is asked.
    continues: bool = False

    def answer(self, call_index: int, messages: Sequence[Mapping[str, Any]], name: str = "?") -> Round:
        """The round that answers call `call_index`, given the request's messages."""
        so_far = _continuation_request(messages) if self.continues else None
        if so_far:
            for back in range(1, len(self.rounds) + 1):  # the most recent round first
                source = self.rounds[(call_index - back) % len(self.rounds)]
                full = "".join(source.chunks)
                if source.error is None and full and (rest := continuation(full, so_far)) != full:
                    return Round(text=rest, chunk_chars=source.chunk_chars, delay_ms=source.delay_ms,
                                 finish_reason=source.finish_reason)
        return self.round_for(call_index, name)

    def round_for(self, call_index: int, name: str = "?") -> Round:
        """The round answering call `call_index` (0-based) of a conversation."""
        if call_index < 0:
            raise ValueError(f"call index must be ≥ 0, got {call_index}")
        if call_index < len(self.rounds):
            return self.rounds[call_index]
        if self.loop:
            return self.rounds[call_index % len(self.rounds)]
        raise ScriptExhausted(name, call_index, len(self.rounds))


def _describe(source: str, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"{source}: {where}: {err['msg']}")
    return "\n".join(lines)


def parse_script(data: str | bytes | Mapping[str, Any], source: str = "<script>") -> Script:
    try:
        if isinstance(data, Mapping):
            return Script.model_validate(data)
        return Script.model_validate_json(data)
    except ValidationError as exc:
        raise ScriptError(_describe(source, exc)) from None


def load_script(path: str | Path) -> Script:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ScriptError(f"{p}: cannot read script: {exc.strerror or exc}") from None
    try:
        json.loads(raw)
    except ValueError as exc:
        raise ScriptError(f"{p.name}: not valid JSON: {exc}") from None
    return parse_script(raw, source=p.name)


# -- registry: model string `scripted/<name>` plays the script registered as <name> -------------

_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_registry: dict[str, Script] = {}


def script_model(name: str) -> str:
    return f"{PROVIDER}/{name}"


def register_script(name: str, script: Script | str | Path) -> str:
    """Register a script (or a script file) under `name`; returns the model string playing it.

    The registry is per process: every process that plays `scripted/<name>` must register it
    (built-in scripts such as `demo` resolve by themselves).
    """
    if not _NAME.fullmatch(name):
        raise ValueError(f"script name must match {_NAME.pattern}, got {name!r}")
    _registry[name] = script if isinstance(script, Script) else load_script(script)
    return script_model(name)



def get_script(name: str) -> Script:
    script = _registry.get(name)
    if script is not None:
        return script
    builtin = BUILTIN_SCRIPTS.get(name)
    if builtin is None:
        raise UnknownScript(f"no script registered as {name!r} (model {script_model(name)!r})")
    script = _registry[name] = load_script(BUILTIN_DIR / builtin)
    return script


# -- playback position -----------------------------------------------------------------------

_CONVERSATION_KEY = CONVERSATION_HEADER.lower()
_CALL_INDEX_KEY = CALL_INDEX_HEADER.lower()


def playback_position(headers: Mapping[str, str] | None) -> tuple[str | None, int | None]:
    """(conversation id, call index) from request headers, case-insensitively; None when absent."""
    conversation: str | None = None
    index: int | None = None
    for key, value in (headers or {}).items():
        lk = key.lower()
        if lk == _CONVERSATION_KEY:
            conversation = str(value)
        elif lk == _CALL_INDEX_KEY:
            try:
                index = int(value)
            except (TypeError, ValueError):
                index = None
    return conversation, index


class CallCounter:
    """Fallback playback position for callers that do not send a call index (plain LiteLLM use,
    curl against the mock endpoint). Bounded, in memory: not durable, by design."""

    def __init__(self, max_conversations: int = 100_000) -> None:
        self._next: OrderedDict[str, int] = OrderedDict()
        self._max = max_conversations

    def next(self, conversation_id: str) -> int:
        index = self._next.pop(conversation_id, 0)
        self._next[conversation_id] = index + 1
        if len(self._next) > self._max:
            self._next.popitem(last=False)
        return index


# -- playback: one pacing and one way to fail, for both in-process players ---------------------

class RoundFailed(Exception):
    """A played round fails as a provider would. `error` names the exception class a LiteLLM
    provider raises for it (`errors.ERROR_TABLE`); `kind` is the provider-error kind reactgate reports —
    `error`'s own, except a used-up script (a bad request to a provider, `script_exhausted` to us)."""

    def __init__(self, error: ErrorKind, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        self.error = error
        self.message = message
        self.kind = kind or error.value


def round_to_play(name: str, call_index: int, messages: Sequence[Mapping[str, Any]]) -> Round:
    """The round script `name` answers call `call_index` with; an unknown script is `not_found`,
    a used-up one `script_exhausted`, as the players report them."""
    try:
        return get_script(name).answer(call_index, messages, name)
    except UnknownScript as exc:
        raise RoundFailed(ErrorKind.NOT_FOUND, str(exc)) from None
    except ScriptExhausted as exc:
        raise RoundFailed(ErrorKind.BAD_REQUEST, str(exc), SCRIPT_EXHAUSTED) from None


_playing = 0


def open_playbacks() -> int:
    """Rounds being played in this process right now, by either player. Not playback state: it lets
    tests (and operators) see that closing a stream early really stopped the generation."""
    return _playing


async def play(round_: Round, *, read_timeout_s: float | None,
               idle_timeout_s: float | None = None) -> AsyncGenerator[str, None]:
    """`round_`'s chunks, paced as a provider streams them; its `error` as a `RoundFailed`.

    `delay_ms` before each chunk — a `sleep(0)` when 0: like a provider's socket, every chunk
    yields to the loop, so other conversations and the event log's flusher run while one streams.
    A delay over `read_timeout_s` fails with `timeout` before any chunk (a provider's read timeout);
    `hang_after` goes silent for good. With `idle_timeout_s`, a silence after the first non-empty
    chunk longer than that fails with `timeout` (`stream_model`'s idle timeout, docs/design.md#continuation),
    decided on the script's own clock — no timer per chunk, and no cut a loaded machine invents.
    Closing the generator stops the playback there.
    """
    global _playing
    delay = round_.delay_s
    if read_timeout_s is not None and delay > read_timeout_s:
        await asyncio.sleep(read_timeout_s)
        raise RoundFailed(ErrorKind.TIMEOUT, f"no chunk within {read_timeout_s:g} s")
    chunks = round_.chunks
    quiet: float | None = None   # script time since the last non-empty chunk; None before the first
    _playing += 1
    try:
        for i, text in enumerate(chunks):
            wait = math.inf if round_.hangs_before(i) else delay
            if quiet is not None and idle_timeout_s is not None and quiet + wait > idle_timeout_s:
                await _silence(quiet, idle_timeout_s)
            if wait == math.inf:
                await hang()
            await asyncio.sleep(wait)
            yield text
            quiet = 0.0 if text else None if quiet is None else quiet + wait
        if round_.hangs_before(len(chunks)):
            if quiet is not None and idle_timeout_s is not None:
                await _silence(quiet, idle_timeout_s)
            await hang()
        if round_.error is not None:
            if delay and not chunks:
                await asyncio.sleep(delay)
            raise RoundFailed(round_.error, f"scripted {round_.error.value}")
    finally:
        _playing -= 1


async def _silence(quiet: float, idle_timeout_s: float) -> None:
    """The rest of the idle timeout, then the cut."""
    await asyncio.sleep(max(0.0, idle_timeout_s - quiet))
    raise RoundFailed(ErrorKind.TIMEOUT, SILENCE.format(idle_timeout_s))
