"""The scripted model's script (docs/design.md#scripted-model): what the model answers to the i-th call of a conversation.

A script is data, validated once when loaded. A round is channel-protocol text (`deltas`, `text`) or
a native message (`native`: reasoning, content and function calls, docs/design.md#native); either way
its output is one tuple of typed deltas (`Round.stream`, the family of `protocol/deltas.py`), and
every player — the direct player (`direct_player.py`), the LiteLLM custom provider (`scripted.py`)
and the mock endpoint on both wires (`mock_server.py`) — plays that tuple through one pacing
(`play`) and one way to fail (`RoundFailed`), so no two paths stream, pace or fail differently for
the same script.

Playback is stateless: the caller says which call of the conversation this is (the conversation
keeps the durable counter, so a conversation that moved to another process after a crash goes on
where it was). The call index travels as two HTTP-style headers, harmless for real providers.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
from collections import OrderedDict
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    PrivateAttr,
    Tag,
    ValidationError,
    model_validator,
)

from actors.llm.errors import SCRIPT_EXHAUSTED, SILENCE, ErrorKind
from protocol.deltas import (
    ModelDelta,
    ModelOutput,
    ReasoningDelta,
    ReasoningSignature,
    RedactedReasoning,
    ToolCallArgs,
    ToolCallEnd,
    ToolCallStart,
)

PROVIDER = "scripted"                      # LiteLLM model strings `scripted/<name>`
CONVERSATION_HEADER = "X-Reactgate-Conversation"
CALL_INDEX_HEADER = "X-Reactgate-Call-Index"
DEFAULT_CHUNK_CHARS = 4
BUILTIN_DIR = Path(__file__).resolve().parent.parent / "builtin"
BUILTIN_SCRIPTS: Mapping[str, str] = {"demo": "demo_script.json", "demo_native": "demo_native_script.json"}

FinishReason = Literal["stop", "length", "content_filter", "tool_calls"]


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


class NoSubScript(LookupError):
    """A `by_message` script with no sub-script for this conversation's first user message and no
    `default`. Players turn it into a `bad_request` provider error."""


class RoundUsage(BaseModel):
    """The usage a round reports (docs/design.md#quotas): given, or else counted from characters."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_tokens: NonNegativeInt
    completion_tokens: NonNegativeInt


USAGE_CHARS_PER_TOKEN = 4


# -- a native round's parts (docs/design.md#scripted-model) ------------------------------------------


class ReasoningPart(BaseModel):
    """Provider reasoning, cut into `chunk_chars` pieces; a `signature` closes it as an Anthropic
    thinking block (docs/design.md#native)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    TAG: ClassVar[str] = "reasoning"

    reasoning: str
    signature: str | None = Field(default=None, min_length=1)


class RedactedPart(BaseModel):
    """An Anthropic `redacted_thinking` block, streamed whole."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    TAG: ClassVar[str] = "redacted"

    redacted: str = Field(min_length=1)


class TextPart(BaseModel):
    """Content, cut into `chunk_chars` pieces: a preamble before a call, else the answer."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    TAG: ClassVar[str] = "text"

    text: str


class Call(BaseModel):
    """A function call: its name, its arguments — an object, serialized as JSON, or a string sent
    as it is (so a test can send arguments that are not JSON) — and the provider's id."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    id: str | None = Field(default=None, min_length=1)

    @property
    def arguments_text(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, ensure_ascii=False)


class CallPart(BaseModel):
    """A call; its arguments split at the `split` points, or else into `chunk_chars` pieces."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    TAG: ClassVar[str] = "call"

    call: Call
    split: tuple[PositiveInt, ...] | None = None

    @model_validator(mode="after")
    def _split_inside(self) -> CallPart:
        if self.split is not None:
            size = len(self.call.arguments_text)
            if list(self.split) != sorted(set(self.split)) or self.split[-1:] >= (size,):
                raise ValueError(f"`split` points must increase and lie inside the arguments (1 to {size - 1})")
        return self

    def fragments(self, chunk_chars: int) -> list[str]:
        text = self.call.arguments_text
        if self.split is None:
            return _pieces(text, chunk_chars)
        cuts = [0, *self.split, len(text)]
        return [text[a:b] for a, b in itertools.pairwise(cuts)]


def _part_key(value: Any) -> str | None:
    """Which part a value is: the first of its keys that names one (a part model: its own)."""
    if isinstance(value, Mapping):
        return next((key for key in _PART_KEYS if key in value), None)
    return getattr(value, "TAG", None)


_PART_KEYS = ("reasoning", "redacted", "text", "call")
NativePart = Annotated[
    Annotated[ReasoningPart, Tag("reasoning")] | Annotated[RedactedPart, Tag("redacted")]
    | Annotated[TextPart, Tag("text")] | Annotated[CallPart, Tag("call")],
    Discriminator(_part_key, custom_error_type="native_part",
                  custom_error_message="a native part has one of the keys `reasoning`, `redacted`, `text`, `call`"),
]


def _pieces(text: str, n: int) -> list[str]:
    return [text[i : i + n] for i in range(0, len(text), n)]


def _size(delta: ModelOutput) -> int:
    """The characters a delta counts for in a round's usage (signatures and redacted blocks: none)."""
    match delta:
        case ModelDelta(text=text) | ReasoningDelta(text=text):
            return len(text)
        case ToolCallArgs(fragment=fragment):
            return len(fragment)
        case ToolCallStart(name=name):
            return len(name)
    return 0


class Round(BaseModel):
    """One model call's answer: channel-protocol `deltas` as given, or `text` cut into `chunk_chars`
    pieces, or a `native` message (reasoning, content, function calls), or an error.

    `error` together with content streams the content first and then fails — a mid-stream
    provider error (docs/design.md#fallback); `error` alone fails before any chunk (after `delay_ms`,
    so a slow failure can be scripted too).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    deltas: tuple[str, ...] | None = None
    text: str | None = None
    native: tuple[NativePart, ...] | None = Field(default=None, min_length=1)
    chunk_chars: PositiveInt | None = None
    error: ErrorKind | None = None
    # A native round's default is `tool_calls` when its message makes a call, else `stop` (`_native_finish`).
    finish_reason: FinishReason = "stop"
    delay_ms: NonNegativeFloat = 0
    # A provider that hangs mid-answer: after this many deltas the stream goes silent and never
    # ends by itself — only the caller's stream idle timeout, a cancel or the process's death ends it.
    hang_after: NonNegativeInt | None = None
    # What the players report as the call's usage; absent, they count characters (4 per token).
    usage: RoundUsage | None = None

    _stream: tuple[ModelOutput, ...] = PrivateAttr(default=())

    @model_validator(mode="before")
    @classmethod
    def _native_finish(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and data.get("native") and "finish_reason" not in data:
            calls = any(_part_key(part) == "call" for part in data["native"])
            return {**data, "finish_reason": "tool_calls" if calls else "stop"}
        return data

    @model_validator(mode="after")
    def _one_content(self) -> Round:
        given = [name for name in ("deltas", "text", "native") if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"a round has either `{given[0]}` or `{given[1]}`, not both")
        if not given and self.error is None:
            raise ValueError("a round needs `deltas`, `text`, `native` or `error`")
        if self.chunk_chars is not None and self.text is None and self.native is None:
            raise ValueError("`chunk_chars` applies only to `text` and `native`")
        if self.hang_after is not None and self.error is not None:
            raise ValueError("a round that hangs never reaches its `error`: give one of `hang_after`, `error`")
        if self.finish_reason == "tool_calls" and not self.calls:
            raise ValueError("`finish_reason` `tool_calls` needs a native round that makes a call")
        if self.native is not None and self.finish_reason == "content_filter":
            raise ValueError("a native round finishes with `stop`, `length` or `tool_calls`")
        ids = [d.call_id for d in self._native_stream(1) if type(d) is ToolCallStart]
        if len(set(ids)) < len(ids):
            raise ValueError(f"call ids must differ within a message (call n's id defaults to `call_n`): {ids}")
        return self

    def model_post_init(self, context: Any, /) -> None:
        n = self.chunk_chars or DEFAULT_CHUNK_CHARS
        if self.deltas is not None:
            self._stream = tuple(ModelDelta(d) for d in self.deltas)
        elif self.text is not None:
            self._stream = tuple(ModelDelta(piece) for piece in _pieces(self.text, n))
        elif self.native is not None:
            self._stream = tuple(self._native_stream(n))

    def _native_stream(self, n: int) -> Iterator[ModelOutput]:
        """The message's deltas in order; each call ends (`ToolCallEnd`) right after its last
        fragment — except, in a round that fails, the call it fails in: cut mid-call."""
        parts = self.native or ()
        index = 0
        for k, part in enumerate(parts):
            if isinstance(part, ReasoningPart):
                yield from (ReasoningDelta(piece) for piece in _pieces(part.reasoning, n))
                if part.signature is not None:
                    yield ReasoningSignature(part.signature)
            elif isinstance(part, RedactedPart):
                yield RedactedReasoning(part.redacted)
            elif isinstance(part, TextPart):
                yield from (ModelDelta(piece) for piece in _pieces(part.text, n))
            else:
                yield ToolCallStart(index, part.call.id or f"call_{index}", part.call.name)
                yield from (ToolCallArgs(index, fragment) for fragment in part.fragments(n))
                if self.error is None or k < len(parts) - 1:
                    yield ToolCallEnd(index)
                index += 1

    @property
    def stream(self) -> tuple[ModelOutput, ...]:
        """The deltas this round streams, in order (empty for an error-only round). A text round's
        empty chunks are kept as empty `ModelDelta`s: they pace the stream, and readers skip them."""
        return self._stream

    @property
    def chunks(self) -> tuple[str, ...]:
        """The content pieces this round streams, in order: a channel round's whole response."""
        return tuple(d.text for d in self._stream if type(d) is ModelDelta)

    @property
    def calls(self) -> tuple[Call, ...]:
        """The function calls a native round makes, in order."""
        return tuple(p.call for p in self.native or () if isinstance(p, CallPart))

    def thinking_blocks(self) -> tuple[dict[str, str], ...]:
        """The Anthropic thinking blocks this round streams, as a request must send them back:
        reasoning up to each signature, and the redacted blocks (docs/design.md#native)."""
        blocks: list[dict[str, str]] = []
        text: list[str] = []
        for part in self.native or ():
            if isinstance(part, ReasoningPart):
                text.append(part.reasoning)
                if part.signature is not None:
                    blocks.append({"type": "thinking", "thinking": "".join(text), "signature": part.signature})
                    text.clear()
            elif isinstance(part, RedactedPart):
                blocks.append({"type": "redacted_thinking", "data": part.redacted})
        return tuple(blocks)

    @property
    def delay_s(self) -> float:
        return self.delay_ms / 1000.0

    def reported_usage(self, messages: Sequence[Mapping[str, Any]]) -> RoundUsage:
        """The usage both players report for this round, answering `messages`."""
        if self.usage is not None:
            return self.usage
        prompt = sum(len(str(m.get("content") or "")) for m in messages)
        completion = sum(map(_size, self._stream))
        return RoundUsage(prompt_tokens=-(-prompt // USAGE_CHARS_PER_TOKEN),
                          completion_tokens=-(-completion // USAGE_CHARS_PER_TOKEN))

    def hangs_before(self, i: int) -> bool:
        """Whether the stream goes silent, for good, before delta `i` (or, i = len(stream), its end)."""
        return self.hang_after is not None and i >= self.hang_after

    def rest_after(self, so_far: str) -> Round | None:
        """What this round says after `so_far`, a cut answer sent back to be continued
        (docs/design.md#continuation); None when this round is not the one `so_far` came from.
        Channel text goes on from the character (`continuation`); a native round's content goes on
        from where its answer stopped — its answer being the content after its last call, or all of
        its content when it makes none."""
        if self.error is not None:
            return None
        if self.native is None:
            full = "".join(self.chunks)
            if not full or (rest := continuation(full, so_far)) == full:
                return None
            return Round(text=rest, chunk_chars=self.chunk_chars, delay_ms=self.delay_ms,
                         finish_reason=self.finish_reason)
        for whole in (self._answer(), "".join(p.text for p in self.native if isinstance(p, TextPart))):
            if whole.startswith(so_far):
                finish = "stop" if self.finish_reason == "tool_calls" else self.finish_reason
                return Round(native=(TextPart(text=whole[len(so_far):]),), chunk_chars=self.chunk_chars,
                             delay_ms=self.delay_ms, finish_reason=finish)
        return None

    def _answer(self) -> str:
        parts = self.native or ()
        last_call = max((k for k, p in enumerate(parts) if isinstance(p, CallPart)), default=-1)
        return "".join(p.text for p in parts[last_call + 1:] if isinstance(p, TextPart))


async def hang() -> None:
    """A stream gone silent for good (`Round.hang_after`): waits until cancelled."""
    await asyncio.get_running_loop().create_future()


_FINAL_ANSWER = re.compile(r'"final_answer"\s*:\s*"')
_CLOSING_FENCE = re.compile(r"\s*```\s*(?=</channel:action>)")
_CUT_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{0,3})?$")


def message_text(content: Any) -> str:
    """A message's text: its content string, or its text blocks' (OpenAI parts, Anthropic blocks)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text") or "") for b in content if isinstance(b, Mapping) and b.get("type") == "text")
    return ""


def cut_answer(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """The response so far, when the request asks to continue it (docs/design.md#native): an
    assistant prefill (the request ends with the assistant's answer so far), or the answer so far
    as an assistant message followed by a user message starting `[continue]`."""
    if messages and messages[-1].get("role") == "assistant":
        return message_text(messages[-1].get("content"))
    if len(messages) < 2 or messages[-2].get("role") != "assistant":
        return None
    if not message_text(messages[-1].get("content")).startswith("[continue]"):
        return None
    return message_text(messages[-2].get("content"))


def first_user_message(messages: Sequence[Mapping[str, Any]]) -> str:
    return next((message_text(m.get("content")) for m in messages if m.get("role") == "user"), "")


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
    """Rounds played by call index, or (`by_message`) named sub-scripts chosen by the conversation's
    first user message: the first whose key it contains (case-insensitively), else `default`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rounds: tuple[Round, ...] = Field(default=(), min_length=1)
    loop: bool = False
    # A model that continues when asked to (docs/design.md#continuation): a request that sends a
    # cut response back — as a prefill, or with a `[continue]` instruction — gets the rest of the
    # round that response came from, instead of the next round. Off, every call plays its round.
    continues: bool = False
    by_message: dict[str, Script] | None = Field(default=None, min_length=1)
    default: Script | None = None

    @model_validator(mode="after")
    def _rounds_or_choice(self) -> Script:
        if self.by_message is None:
            if not self.rounds:
                raise ValueError("a script needs `rounds` or `by_message`")
            if self.default is not None:
                raise ValueError("`default` applies only to `by_message`")
            return self
        if self.rounds or self.loop or self.continues:
            raise ValueError("a `by_message` script has no `rounds`, `loop` or `continues` of its own: its sub-scripts do")
        for sub in [*self.by_message.values(), *([self.default] if self.default is not None else [])]:
            if sub.by_message is not None:
                raise ValueError("a sub-script chooses no sub-scripts of its own")
        return self

    def all_rounds(self) -> Iterator[Round]:
        """Every round of the script, its sub-scripts' included."""
        yield from self.rounds
        for sub in [*(self.by_message or {}).values(), *([self.default] if self.default is not None else [])]:
            yield from sub.all_rounds()

    def chosen(self, messages: Sequence[Mapping[str, Any]], name: str = "?") -> Script:
        """The script that plays this conversation: this one, or the sub-script its first user message picks."""
        if self.by_message is None:
            return self
        first = first_user_message(messages).casefold()
        for key, sub in self.by_message.items():
            if key.casefold() in first:
                return sub
        if self.default is not None:
            return self.default
        raise NoSubScript(f"script {name!r} has no sub-script for the first user message {first[:80]!r} "
                          f"(keys {list(self.by_message)}, no default)")

    def answer(self, call_index: int, messages: Sequence[Mapping[str, Any]], name: str = "?") -> Round:
        """The round that answers call `call_index`, given the request's messages."""
        script = self.chosen(messages, name)
        so_far = cut_answer(messages) if script.continues else None
        if so_far:
            rounds = script.rounds
            for back in range(1, len(rounds) + 1):  # the most recent round first
                rest = rounds[(call_index - back) % len(rounds)].rest_after(so_far)
                if rest is not None:
                    return rest
        return script.round_for(call_index, name)

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
    errors = exc.errors()
    lines = []
    for err in errors:
        loc = err["loc"]
        if err["type"] == "too_short" and any(e["loc"][: len(loc)] == loc and e["loc"] != loc for e in errors):
            continue  # a list whose items failed is short of them: the items' errors say why
        where = ".".join(str(p) for p in loc) or "(top level)"
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
    a used-up one `script_exhausted`, one with no sub-script for the conversation `bad_request`,
    as the players report them."""
    try:
        return get_script(name).answer(call_index, messages, name)
    except UnknownScript as exc:
        raise RoundFailed(ErrorKind.NOT_FOUND, str(exc)) from None
    except ScriptExhausted as exc:
        raise RoundFailed(ErrorKind.BAD_REQUEST, str(exc), SCRIPT_EXHAUSTED) from None
    except NoSubScript as exc:
        raise RoundFailed(ErrorKind.BAD_REQUEST, str(exc)) from None


_playing = 0


def open_playbacks() -> int:
    """Rounds being played in this process right now, by any player. Not playback state: it lets
    tests (and operators) see that closing a stream early really stopped the generation."""
    return _playing


async def play(round_: Round, *, read_timeout_s: float | None,
               idle_timeout_s: float | None = None) -> AsyncGenerator[ModelOutput, None]:
    """`round_`'s stream, paced as a provider streams it; its `error` as a `RoundFailed`.

    `delay_ms` before each delta — a `sleep(0)` when 0: like a provider's socket, every chunk
    yields to the loop, so other conversations and the event log's flusher run while one streams.
    A call's end comes with its last fragment, with no delay of its own. A delay over
    `read_timeout_s` fails with `timeout` before any delta (a provider's read timeout); `hang_after`
    goes silent for good. With `idle_timeout_s`, a silence after the first non-empty delta longer
    than that fails with `timeout` (`stream_model`'s idle timeout, docs/design.md#continuation),
    decided on the script's own clock — no timer per delta, and no cut a loaded machine invents.
    Closing the generator stops the playback there.
    """
    global _playing
    delay = round_.delay_s
    if read_timeout_s is not None and delay > read_timeout_s:
        await asyncio.sleep(read_timeout_s)
        raise RoundFailed(ErrorKind.TIMEOUT, f"no chunk within {read_timeout_s:g} s")
    stream = round_.stream
    quiet: float | None = None   # script time since the last non-empty delta; None before the first
    _playing += 1
    try:
        for i, delta in enumerate(stream):
            kind = type(delta)
            wait = math.inf if round_.hangs_before(i) else 0.0 if kind is ToolCallEnd else delay
            if quiet is not None and idle_timeout_s is not None and quiet + wait > idle_timeout_s:
                await _silence(quiet, idle_timeout_s)
            if wait == math.inf:
                await hang()
            await asyncio.sleep(wait)
            yield delta
            if kind is not ModelDelta or delta.text:  # type: ignore[union-attr]
                quiet = 0.0
            elif quiet is not None:
                quiet += wait
        if round_.hangs_before(len(stream)):
            if quiet is not None and idle_timeout_s is not None:
                await _silence(quiet, idle_timeout_s)
            await hang()
        if round_.error is not None:
            if delay and not stream:
                await asyncio.sleep(delay)
            raise RoundFailed(round_.error, f"scripted {round_.error.value}")
    finally:
        _playing -= 1


async def _silence(quiet: float, idle_timeout_s: float) -> None:
    """The rest of the idle timeout, then the cut."""
    await asyncio.sleep(max(0.0, idle_timeout_s - quiet))
    raise RoundFailed(ErrorKind.TIMEOUT, SILENCE.format(idle_timeout_s))
