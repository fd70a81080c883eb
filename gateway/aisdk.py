"""Our event log → the Vercel AI SDK's UI message stream (`ai` 6.x, stream protocol `v1`), sans-I/O.

The guarantee this module protects: **the user sees only what the runtime allowed, each character
once** (docs/design.md#guarantees). It decides nothing; it translates what the log holds. Every
`answer.delta` character becomes exactly one `text-delta` character, in log order, and the only
other text it writes is a turn's `final_answer` when the log says that answer never streamed
(`END_REASONS`): so a turn's text parts always concatenate to its `turn.completed.final_answer`.
A tool part appears only for a `tool.call` the gates let through, or a question the turn asked.

`UIMessageStream` is one HTTP response: the events of one turn, from its start or from where a
paused turn goes on, in and chunk dicts out (`EVENT_CHUNKS` says what each event kind gives). The
response ends when the turn does, or when the turn waits on the user (an `ask_user`): the client
answers inside its next POST, which `parse_chat_request` reads back into our `answer` commands.
`ui_messages` rebuilds the whole conversation as the SDK's `UIMessage` list, the parts assembled
exactly as the SDK's own reader (`processUIMessageStream`) assembles the stream.

Mapping choices, each forced by how the SDK's client behaves:
- A round is a step: its first event opens it (`start-step`), its `round.completed` closes it.
  Tool results and questions come after that (the runtime runs a round's calls once the round is
  closed), so they land between steps; the SDK's reader finds a tool part by its call id anywhere.
- Tools the runtime runs are `providerExecuted`: the client must not run them, and the SDK's
  `lastAssistantMessageIsCompleteWithToolCalls` then looks only at the questions it must answer.
- The model's question is the client-side tool `ask_user` (no output until the user answers); its
  `react.ask_user` call is shown by the `ask_user` event, never by the `tool.call` (a question the
  turn never got to ask — a steer or cancel cut it first — shows nothing).
- An approval is the SDK's tool approval (`tool-approval-request`, `approvalId` = `ask_id` = the
  call id); a call the user did not approve ends `tool-output-denied`.
- A failure end closes every part first, then `error`, then `finish`: the SDK's `Chat` stops reading
  at `error`, so a part closed after it would stay "streaming" in the client.

No socket, no clock: the HTTP shell subscribes, feeds events, and writes `sse(chunk)` lines.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import msgspec

from actors.catalog import ASK_USER_TOOL
from actors.turn_machine import APPROVE, DENIED_BY_USER, DENY, Consent
from protocol.events import (
    AnswerDelta,
    Approval,
    AskUser,
    ConversationDeleted,
    EndReason,
    Event,
    Fallback,
    IllegalFinish,
    IterationLimit,
    RoundCompleted,
    Salvaged,
    ThinkingDelta,
    ToolCalled,
    ToolResult,
    Trace,
    TurnCompleted,
    TurnStarted,
    UiCommand,
    UserSaid,
    payload_builtins,
)
from protocol.frames import ID_MAX_CHARS

Chunk = dict[str, Any]

# -- the wire: one SSE `data:` line per chunk -------------------------------------------------------

HEADERS: Final[dict[str, str]] = {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    "x-vercel-ai-ui-message-stream": "v1",
    "x-accel-buffering": "no",   # nginx must not buffer a stream
}
DONE: Final[bytes] = b"data: [DONE]\n\n"

_encoder: Final = msgspec.json.Encoder()


def sse(chunk: Mapping[str, Any]) -> bytes:
    """One chunk as its SSE event: compact JSON, which never holds a newline."""
    return b"data: " + _encoder.encode(chunk) + b"\n\n"


# -- the mapping -------------------------------------------------------------------------------------

# Event kind → the chunks it gives (docs/wire-protocol.md#8-event-reference). The code below is this
# table, one handler per row (`_HANDLERS`).
EVENT_CHUNKS: Final[dict[str, str]] = {
    UserSaid.KIND: "nothing (ui_messages: a `user` message)",
    TurnStarted.KIND: "nothing (the response's `start` names the message)",
    ThinkingDelta.KIND: "`reasoning-start` once per open reasoning part, `reasoning-delta`",
    AnswerDelta.KIND: "`text-start` once per open text part, `text-delta`",
    ToolCalled.KIND: "`tool-input-start`, `tool-input-available` (providerExecuted); nothing for "
                     "react.ask_user, which its `ask_user` shows",
    ToolResult.KIND: "`tool-output-available`, or `tool-output-denied` (denied_by_user), or "
                     "`tool-output-error`",
    AskUser.KIND: "the model's question: the client tool `ask_user`; an approval: the call's part "
                  "and `tool-approval-request`; then `finish` (the turn waits)",
    UiCommand.KIND: "`data-reactgate-ui_command`",
    Fallback.KIND: "`data-reactgate-fallback`",
    RoundCompleted.KIND: "`finish-step` (its data gives nothing)",
    Trace.KIND: "`data-reactgate-trace` for the kinds in TRACES_SHOWN, else nothing",
    TurnCompleted.KIND: "close parts; the final answer as text if it never streamed; `finish-step`; "
                        "`error` on a failure end; `finish`",
    ConversationDeleted.KIND: "`error`, `finish`",
}

# Traces a UI should show (`approval`, `salvaged`, `illegal_finish`, `iteration_limit`); the others
# are for operators.
TRACES_SHOWN: Final[tuple[type[Trace], ...]] = (Approval, Salvaged, IllegalFinish, IterationLimit)
_DATA_PREFIX: Final = "data-reactgate-"
_ASK_TOOL_NAME: Final = "ask_user"   # the client-side tool a question becomes


class _End(NamedTuple):
    finish_reason: str        # the SDK's FinishReason
    answer_streamed: bool     # final_answer came as answer.delta (docs/wire-protocol.md#turncompleted)
    failure: str | None       # a failure end: the `error` chunk's words


END_REASONS: Final[dict[EndReason, _End]] = {
    EndReason.COMPLETE: _End("stop", True, None),
    EndReason.EXIT: _End("stop", True, None),
    EndReason.SALVAGED: _End("stop", True, None),
    EndReason.ITERATION_LIMIT: _End("length", False, None),
    EndReason.PROTOCOL_VIOLATION: _End("error", False, "the model gave no valid response"),
    EndReason.PROVIDER_ERROR: _End("error", False, "the model provider failed"),
    EndReason.CANCELLED: _End("other", False, None),
    EndReason.ERROR: _End("error", False, "the server failed"),
}
_PAUSED_FINISH_REASON: Final = "tool-calls"   # the turn waits on the user's answer


def _error_text(result: ToolResult) -> str:
    """A failed observation, readable: `timeout (timeout_s=30)`, `tool_error: boom (exception=…)`."""
    detail = dict(result.detail or {})
    message = detail.pop("message", None)
    text = result.error or "error"
    if message:
        text += f": {message}"
    if detail:
        text += " (" + ", ".join(f"{k}={_compact(v)}" for k, v in detail.items()) + ")"
    return text


def _compact(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# -- one response ------------------------------------------------------------------------------------


class UIMessageStream:
    """One response of the UI message stream: the events of one turn (from its user.message/turn.started,
    or from where a paused turn goes on) → chunks."""

    def __init__(self, message_id: str) -> None:
        self.message_id = message_id
        self._done = False
        self._step: int | None = None              # the round whose step is open
        self._lane: tuple[str, str] | None = None  # the open part: ("text" | "reasoning", its id)
        self._parts_opened: dict[int, int] = {}    # per round, for part ids
        self._shown: set[str] = set()              # call ids whose tool part this response started
        self._held: set[str] = set()               # react.ask_user calls not asked yet

    def start(self) -> list[Chunk]:
        return [{"type": "start", "messageId": self.message_id}]

    def feed(self, event: Event) -> list[Chunk]:
        """The chunks this event gives (often none). After the end, nothing: the next response goes on."""
        return [] if self._done else self._translate(event)

    @property
    def done(self) -> bool:
        """True once the response must end: the turn completed, or it paused on an ask_user."""
        return self._done

    def error(self, text: str) -> list[Chunk]:
        """The backend failed: close what is open, then `error`, then `finish`."""
        if self._done:
            return []
        return self._end("error", error=text)

    # -- the handlers, one per event kind (EVENT_CHUNKS) ---------------------------------------------

    def _translate(self, event: Event) -> list[Chunk]:
        handler = _HANDLERS.get(type(event.data))
        return handler(self, event) if handler is not None else []   # a kind we do not know: skipped

    def _nothing(self, event: Event) -> list[Chunk]:
        return []

    def _thinking(self, event: Event) -> list[Chunk]:
        d: ThinkingDelta = event.data  # type: ignore[assignment]
        return self._delta("reasoning", d.turn_id, d.round, d.text)

    def _answer(self, event: Event) -> list[Chunk]:
        d: AnswerDelta = event.data  # type: ignore[assignment]
        return self._delta("text", d.turn_id, d.round, d.text)

    def _tool_call(self, event: Event) -> list[Chunk]:
        d: ToolCalled = event.data  # type: ignore[assignment]
        chunks = self._enter(d.round)
        if d.tool_id == ASK_USER_TOOL:   # shown when asked: its ask_user carries what the user sees
            self._held.add(d.call_id)
            return chunks
        return chunks + self._close_lane() + self._tool_part(d.call_id, d.tool_id, d.params, runs_here=True)

    def _tool_result(self, event: Event) -> list[Chunk]:
        d: ToolResult = event.data  # type: ignore[assignment]
        if d.call_id in self._held:   # a question never asked: nothing was shown, nothing to close
            self._held.discard(d.call_id)
            return []
        if d.tool_id == ASK_USER_TOOL and d.call_id not in self._shown and not _was_asked(d):
            return []   # cut before or while it was asked, in an earlier response: we cannot know
        if d.ok:
            return [{"type": "tool-output-available", "toolCallId": d.call_id, "output": d.result or {}}]
        if d.error == DENIED_BY_USER:
            return [{"type": "tool-output-denied", "toolCallId": d.call_id}]
        return [{"type": "tool-output-error", "toolCallId": d.call_id, "errorText": _error_text(d)}]

    def _ask_user(self, event: Event) -> list[Chunk]:
        d: AskUser = event.data  # type: ignore[assignment]
        self._held.discard(d.ask_id)
        chunks = self._close_lane()
        if d.kind == "approval":
            # Its tool.call came just before. In a response that goes on after an earlier pause the
            # client holds the part already: sending it again rewrites the same part, harmlessly.
            chunks += self._tool_part(d.ask_id, d.tool_id or "", d.params or {}, runs_here=True)
            chunks.append({"type": "tool-approval-request", "approvalId": d.ask_id, "toolCallId": d.ask_id})
        else:
            chunks += self._tool_part(d.ask_id, _ASK_TOOL_NAME,
                                      {"question": d.question, "options": list(d.options)}, runs_here=False)
        return chunks + self._end(_PAUSED_FINISH_REASON)

    def _data(self, event: Event) -> list[Chunk]:
        return [{"type": _DATA_PREFIX + event.event, "id": event.event_id, "data": payload_builtins(event.data)}]

    def _round_completed(self, event: Event) -> list[Chunk]:
        return self._close_step()

    def _turn_completed(self, event: Event) -> list[Chunk]:
        d: TurnCompleted = event.data  # type: ignore[assignment]
        end = END_REASONS.get(d.reason, _End("other", False, None))
        chunks = self._close_lane()
        if not end.answer_streamed and d.final_answer:   # the text to show (docs/wire-protocol.md#turncompleted)
            part = f"{d.turn_id}.final"
            chunks += [{"type": "text-start", "id": part}, {"type": "text-delta", "id": part, "delta": d.final_answer},
                       {"type": "text-end", "id": part}]
        failure = None
        if end.failure is not None:   # `provider_error: the model provider failed (rate_limit: …)`
            failure = f"{d.reason}: {end.failure}" + (f" ({d.error})" if d.error else "")
        return chunks + self._end(end.finish_reason, error=failure)

    def _deleted(self, event: Event) -> list[Chunk]:
        return self._end("error", error="the conversation was deleted")

    # -- parts and steps ----------------------------------------------------------------------------

    def _delta(self, kind: str, turn_id: str, round_no: int, text: str) -> list[Chunk]:
        chunks = self._enter(round_no)
        if not text:
            return chunks
        if self._lane is None or self._lane[0] != kind:   # another kind of part begins
            chunks += self._close_lane()
            n = self._parts_opened.get(round_no, 0)
            self._parts_opened[round_no] = n + 1
            self._lane = (kind, f"{turn_id}.{round_no}.{n}")
            chunks.append({"type": f"{kind}-start", "id": self._lane[1]})
        chunks.append({"type": f"{kind}-delta", "id": self._lane[1], "delta": text})
        return chunks

    def _tool_part(self, call_id: str, name: str, params: Mapping[str, Any], *, runs_here: bool) -> list[Chunk]:
        if call_id in self._shown:   # one part per call and response, whatever else mentions it
            return []
        self._shown.add(call_id)
        start: Chunk = {"type": "tool-input-start", "toolCallId": call_id, "toolName": name}
        available: Chunk = {"type": "tool-input-available", "toolCallId": call_id, "toolName": name,
                            "input": dict(params)}
        if runs_here:   # the runtime runs it, not the client
            start["providerExecuted"] = available["providerExecuted"] = True
        return [start, available]

    def _enter(self, round_no: int) -> list[Chunk]:
        if self._step == round_no:
            return []
        chunks = self._close_step()
        self._step = round_no
        return [*chunks, {"type": "start-step"}]

    def _close_lane(self) -> list[Chunk]:
        if self._lane is None:
            return []
        kind, part = self._lane
        self._lane = None
        return [{"type": f"{kind}-end", "id": part}]

    def _close_step(self) -> list[Chunk]:
        chunks = self._close_lane()
        if self._step is None:
            return chunks
        self._step = None
        return [*chunks, {"type": "finish-step"}]

    def _end(self, finish_reason: str, *, error: str | None = None) -> list[Chunk]:
        chunks = self._close_step()
        if error is not None:
            chunks.append({"type": "error", "errorText": error})
        self._done = True
        return [*chunks, {"type": "finish", "finishReason": finish_reason}]


def _was_asked(result: ToolResult) -> bool:
    """Only a question that was asked gets an answer or times out."""
    return result.ok or result.error == "ask_user_timeout"


_Handler = Callable[[UIMessageStream, Event], list[Chunk]]
_HANDLERS: Final[dict[type, _Handler]] = {
    UserSaid: UIMessageStream._nothing,
    TurnStarted: UIMessageStream._nothing,
    ThinkingDelta: UIMessageStream._thinking,
    AnswerDelta: UIMessageStream._answer,
    ToolCalled: UIMessageStream._tool_call,
    ToolResult: UIMessageStream._tool_result,
    AskUser: UIMessageStream._ask_user,
    UiCommand: UIMessageStream._data,
    Fallback: UIMessageStream._data,
    RoundCompleted: UIMessageStream._round_completed,
    TurnCompleted: UIMessageStream._turn_completed,
    ConversationDeleted: UIMessageStream._deleted,
    **{trace: UIMessageStream._data if trace in TRACES_SHOWN else UIMessageStream._nothing
       for trace in Trace.__subclasses__()},
}


# -- the whole conversation, for a reloaded page -------------------------------------------------------


def ui_messages(events: Iterable[Event]) -> list[dict[str, Any]]:
    """The whole conversation as the AI SDK's UIMessage list, for a reloaded page: a `user` message per
    user.message event (id = its message_id, parts [{type:"text", text}]) and one `assistant` message
    per turn (id = the turn id) whose parts are what the stream would have assembled (step-start,
    reasoning, text, tool parts with their final state).

    A user message sits just before the reply of the turn it started (a follow-up is logged while
    the turn before runs); one that started none (a steer into a running turn) where it was logged."""
    log = list(events)
    starters = {e.data.user_message_id for e in log if isinstance(e.data, TurnStarted)}
    waiting: dict[str, str] = {}           # starters' words, until their turn starts
    started: set[str] = set()
    turns: dict[str, _Assembly] = {}
    running: _Assembly | None = None       # the turn a `fallback` (no turn_id) belongs to
    messages: list[dict[str, Any]] = []
    for event in log:
        data = event.data
        if isinstance(data, UserSaid):
            if data.message_id in starters and data.message_id not in started:
                waiting[data.message_id] = data.text
            else:
                messages.append(_user(data.message_id, data.text))
        elif isinstance(data, TurnStarted):
            started.add(data.user_message_id)
            if data.user_message_id in waiting:
                messages.append(_user(data.user_message_id, waiting.pop(data.user_message_id)))
            running = turns[data.turn_id] = _Assembly(data.turn_id)
            messages.append(running.message)
        else:
            turn_id = getattr(data, "turn_id", None)
            assembly = turns.get(turn_id) if isinstance(turn_id, str) else running
            if assembly is not None:
                assembly.feed(event)
            if isinstance(data, TurnCompleted):
                running = None
    return messages


def _user(message_id: str, text: str) -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}


class _Assembly:
    """One turn's assistant message, assembled from its chunks as the SDK's reader does. One
    translator for the whole turn, going on after each pause as the next response would; the
    user's approval, which the client writes into the part itself, is read from its trace."""

    def __init__(self, turn_id: str) -> None:
        self.stream = UIMessageStream(turn_id)
        self.message: dict[str, Any] = {"id": turn_id, "role": "assistant", "parts": []}
        self.parts: list[dict[str, Any]] = self.message["parts"]
        self.open: dict[str, dict[str, Any]] = {}   # text and reasoning parts by chunk id

    def feed(self, event: Event) -> None:
        for chunk in self.stream._translate(event):
            self.apply(chunk)

    def apply(self, chunk: Chunk) -> None:
        kind: str = chunk["type"]
        if kind in ("text-start", "reasoning-start"):
            part = {"type": kind.removesuffix("-start"), "text": "", "state": "streaming"}
            if kind == "reasoning-start":
                part["id"] = chunk["id"]
            self.open[chunk["id"]] = part
            self.parts.append(part)
        elif kind in ("text-delta", "reasoning-delta"):
            self.open[chunk["id"]]["text"] += chunk["delta"]
        elif kind in ("text-end", "reasoning-end"):
            self.open.pop(chunk["id"])["state"] = "done"
        elif kind == "start-step":
            self.parts.append({"type": "step-start"})
        elif kind == "finish-step":
            self.open.clear()
        elif kind in ("tool-input-start", "tool-input-available"):
            self._tool_input(chunk)
        elif kind in _TOOL_UPDATES:
            self._tool_update(chunk)
        elif kind.startswith("data-"):
            self.parts.append(dict(chunk))
            if kind == _DATA_PREFIX + Trace.KIND and chunk["data"].get("kind") == "approval":
                self._approval_responded(chunk["data"])
        # start, finish, error: no part

    def _tool_input(self, chunk: Chunk) -> None:
        step = self._current_step()
        part = next((p for p in step if _is_tool(p) and p["toolCallId"] == chunk["toolCallId"]), None)
        if part is None:
            part = {"type": "tool-" + chunk["toolName"], "toolCallId": chunk["toolCallId"]}
            self.parts.append(part)
        part["state"] = "input-streaming" if chunk["type"] == "tool-input-start" else "input-available"
        for key in ("input", "output", "errorText"):
            part.pop(key, None)
        if "input" in chunk:
            part["input"] = chunk["input"]
        if chunk.get("providerExecuted"):
            part["providerExecuted"] = True

    def _tool_update(self, chunk: Chunk) -> None:
        tool = self._tool(chunk["toolCallId"])
        if tool is None:   # a log holding a result without its call: nothing to update
            return
        tool["state"] = _TOOL_UPDATES[chunk["type"]]
        if chunk["type"] == "tool-approval-request":
            tool["approval"] = {"id": chunk["approvalId"]}
        for key in ("output", "errorText"):
            if key in chunk:
                tool[key] = chunk[key]

    def _tool(self, call_id: str) -> dict[str, Any] | None:
        """As the reader finds it: in the current step, else the latest anywhere."""
        candidates: list[dict[str, Any]] = [*self._current_step(), *reversed(self.parts)]
        return next((p for p in candidates if _is_tool(p) and p["toolCallId"] == call_id), None)

    def _approval_responded(self, trace: Mapping[str, Any]) -> None:
        """What the client's addToolApprovalResponse wrote before the next request."""
        part = self._tool(trace["call_id"])
        if part is not None and part["state"] == "approval-requested":
            part["state"] = "approval-responded"
            part["approval"] = {"id": part["approval"]["id"], "approved": trace.get("decision") in _RUNS}

    def _current_step(self) -> list[dict[str, Any]]:
        starts = [i for i, p in enumerate(self.parts) if p["type"] == "step-start"]
        return self.parts[starts[-1] + 1:] if starts else self.parts


_RUNS: Final = frozenset(c.value for c in Consent if c.runs)
# A chunk about a call's part → the part's state after it (the SDK's processUIMessageStream).
_TOOL_UPDATES: Final = {
    "tool-approval-request": "approval-requested",
    "tool-output-available": "output-available",
    "tool-output-error": "output-error",
    "tool-output-denied": "output-denied",
}


def _is_tool(part: Mapping[str, Any]) -> bool:
    return str(part["type"]).startswith("tool-") or part["type"] == "dynamic-tool"


# -- the request: a POST /api/chat body ----------------------------------------------------------------


class ChatRequestError(ValueError):
    """A chat request we cannot act on; the message names the bad field (`messages[-1].role: …`)."""


@dataclass(frozen=True)
class ChatRequest:
    chat_id: str
    user_message: tuple[str, str] | None   # (message id, text) of a new user turn
    answers: tuple[tuple[str, str], ...]   # (ask_id, answer text) for our `answer` frames
    agent: str | None = None               # `body: {agent}` of the transport: the agent of a new chat


def parse_chat_request(body: bytes) -> ChatRequest:
    """The DefaultChatTransport body: {id, messages, trigger, messageId, ...}. Raise `ChatRequestError(message)`
    (its message names the bad field) on anything malformed: not JSON, no id, no messages, a last message
    that is neither a user message with text nor an assistant message carrying tool outputs / approval
    responses.

    The client sends the whole conversation each time; only the last message is new. A user message
    starts a turn. An assistant message carries the user's answers to the turn's waiting questions:
    an `ask_user` part whose output the client set (a string, the answer; an object is the
    observation this stream sent back, already answered) and a part in state `approval-responded`
    (Approve or Deny). An answer the turn no longer waits on gets `not_found` from the backend and
    changes nothing (docs/wire-protocol.md#3-client-frames)."""
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise ChatRequestError(f"body: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ChatRequestError("body: not a JSON object")
    chat_id = _id(doc.get("id"), "id")
    agent = doc.get("agent")
    if agent is not None and not isinstance(agent, str):
        raise ChatRequestError("agent: not a string (the name of an agent this gateway serves)")
    trigger = doc.get("trigger", "submit-message")
    if trigger != "submit-message":
        raise ChatRequestError(f"trigger: {trigger!r} is not supported: only submit-message (an answer "
                               "that reached the user is never generated again)")
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ChatRequestError("messages: missing or empty")
    last = messages[-1]
    if not isinstance(last, dict):
        raise ChatRequestError("messages[-1]: not an object")
    parts = last.get("parts")
    if not isinstance(parts, list):
        raise ChatRequestError("messages[-1].parts: missing or not a list")
    role = last.get("role")
    if role == "user":
        text = "\n".join(_texts(parts))
        if not text:
            raise ChatRequestError("messages[-1].parts: a user message without text")
        return ChatRequest(chat_id, (_id(last.get("id"), "messages[-1].id"), text), (), agent)
    if role == "assistant":
        answers = tuple(_answers(parts))
        if not answers:
            raise ChatRequestError("messages[-1].parts: an assistant message without an answer "
                                   "(no ask_user output, no approval response)")
        return ChatRequest(chat_id, None, answers, agent)
    raise ChatRequestError(f"messages[-1].role: {role!r}, expected user or assistant")


def _id(value: Any, field: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= ID_MAX_CHARS:
        raise ChatRequestError(f"{field}: missing, or not a string of 1 to {ID_MAX_CHARS} characters")
    return value


def _texts(parts: list[Any]) -> Iterator[str]:
    for i, part in enumerate(parts):
        if not isinstance(part, dict):
            raise ChatRequestError(f"messages[-1].parts[{i}]: not an object")
        if part.get("type") == "text":
            if not isinstance(part.get("text"), str):
                raise ChatRequestError(f"messages[-1].parts[{i}].text: not a string")
            if part["text"]:
                yield part["text"]


def _answers(parts: list[Any]) -> Iterator[tuple[str, str]]:
    for i, part in enumerate(parts):
        field = f"messages[-1].parts[{i}]"
        if not isinstance(part, dict):
            raise ChatRequestError(f"{field}: not an object")
        kind = part.get("type")
        if not isinstance(kind, str) or not (kind.startswith("tool-") or kind == "dynamic-tool"):
            continue
        name = part.get("toolName") if kind == "dynamic-tool" else kind.removeprefix("tool-")
        state = part.get("state")
        if state == "approval-responded":
            approval = part.get("approval")
            if not isinstance(approval, dict) or not isinstance(approval.get("approved"), bool):
                raise ChatRequestError(f"{field}.approval: expected {{id, approved: boolean}}")
            yield _id(approval.get("id"), f"{field}.approval.id"), APPROVE if approval["approved"] else DENY
        elif name == _ASK_TOOL_NAME and state == "output-available" and isinstance(part.get("output"), str):
            yield _id(part.get("toolCallId"), f"{field}.toolCallId"), part["output"]
