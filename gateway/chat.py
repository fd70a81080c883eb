"""`reactgate chat` — the terminal client (SPEC §9), sans-I/O core plus a thin terminal shell.

`ChatProtocol` is the whole client logic with no socket and no terminal: frames in, render items
and frames out. It builds every client frame, tracks the last seen `seq` (dropping repeats, and
re-subscribing on a gap), keeps unacked commands to re-send with the same id after a reconnect
(the server dedupes them, SPEC §6 Idempotency), and turns events into a small render model.
`Transcript` turns render items into styled text; `Backoff` is the reconnect schedule. `ChatShell`
only moves bytes between a WebSocket, stdin and two rich consoles: the transcript goes to stdout,
connection status to stderr, so a resumed answer reads as one unbroken text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
from rich.console import Console
from rich.text import Text
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.typing import Subprotocol

from protocol.events import Event, payload_builtins
from protocol.frames import (
    SUBPROTOCOL,
    Ack,
    AnswerFrame,
    CancelFrame,
    ErrorCode,
    ErrorFrame,
    Mode,
    Open,
    Pong,
    SetModeFrame,
    SteerFrame,
    Subscribe,
    UserMessageFrame,
    decode_server_frame,
)

DEFAULT_URL: Final = "ws://127.0.0.1:8765/ws"
MODES: Final = ("agent", "ask")
# Commands the server dedupes by (conversation_id, id): safe to re-send after a reconnect.
# set_mode is not deduped but is idempotent in effect (the mode is a value, not a toggle).
# cancel is neither: a repeat could cancel the next turn, so an unacked cancel is never re-sent.
RESENT_ON_RECONNECT: Final = frozenset({"user_message", "steer", "answer", "set_mode"})
# Handshake refusals no retry can fix (SPEC §6): wrong path, bad token, bad subprotocol.
FATAL_HTTP_STATUS: Final = frozenset({400, 401, 403, 404})
# Error frames that end the session: the conversation is not ours, or the agent does not exist.
FATAL_ERRORS: Final = frozenset({ErrorCode.FORBIDDEN, ErrorCode.NOT_FOUND, ErrorCode.UNAUTHORIZED})
# What the transcript says when the gateway acks a command that has no event of its own yet.
ACKED_INFO: Final = {
    "set_mode": "mode {mode} ({status})",
    "steer": "steer {status}",
    "cancel": "cancel {status}",
}
COMPACT_CHARS: Final = 160
HELP: Final = (
    "commands: /mode ask|agent  /steer TEXT  /cancel  /quit  (//text sends a message starting with /)"
)


def new_frame_id() -> str:
    return uuid.uuid4().hex


# ---------------------------------------------------------------------------------------------
# The reconnect schedule.


@dataclass
class Backoff:
    """Exponential backoff with full jitter: attempt n sleeps uniform(0, min(cap, base·2ⁿ)).

    Full jitter spreads the reconnects of many clients dropped by one drain (1012) instead of
    sending them all back at the same instants.
    """

    base_s: float = 0.2
    cap_s: float = 5.0
    rng: Callable[[], float] = random.random
    attempt: int = 0

    def bound(self, attempt: int) -> float:
        return float(min(self.cap_s, self.base_s * 2 ** min(attempt, 32)))

    def next_delay(self) -> float:
        delay = self.rng() * self.bound(self.attempt)
        self.attempt += 1
        return delay

    def reset(self) -> None:
        self.attempt = 0


# ---------------------------------------------------------------------------------------------
# The render model: what the transcript shows, independent of how it is drawn.


@dataclass(frozen=True)
class TurnStarted:
    turn_id: str
    user_message_id: str


@dataclass(frozen=True)
class ThinkingDelta:
    turn_id: str
    round: int
    text: str


@dataclass(frozen=True)
class AnswerDelta:
    turn_id: str
    text: str


@dataclass(frozen=True)
class ToolCall:
    call_id: str
    tool_id: str
    params: dict[str, Any]
    trait: str | None


@dataclass(frozen=True)
class ToolResult:
    call_id: str
    tool_id: str
    ok: bool
    result: Any
    error: Any
    duration_ms: int | None


@dataclass(frozen=True)
class AskUser:
    ask_id: str
    question: str
    options: tuple[str, ...]
    timeout_s: float | None


@dataclass(frozen=True)
class UiCommand:
    command: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Fallback:
    from_model: str
    to_model: str
    error: str


@dataclass(frozen=True)
class NoticeItem:
    code: str
    message: str
    tool_id: str | None = None
    violations: tuple[str, ...] = ()


@dataclass(frozen=True)
class Trace:
    kind: str


@dataclass(frozen=True)
class TurnCompleted:
    turn_id: str
    reason: str
    used_tools: bool | None
    finish_ok: bool | None


@dataclass(frozen=True)
class Info:
    """Local information for the transcript (conversation id, help)."""

    text: str


@dataclass(frozen=True)
class Status:
    """Connection status: goes to stderr, never into the transcript."""

    text: str


@dataclass(frozen=True)
class ErrorItem:
    code: str
    message: str


Render = (
    TurnStarted | ThinkingDelta | AnswerDelta | ToolCall | ToolResult | AskUser | UiCommand | Fallback
    | NoticeItem | Trace | TurnCompleted | Info | Status | ErrorItem
)


@dataclass
class Step:
    """The outcome of one input to the protocol: what to draw, what to send, whether to stop."""

    renders: list[Render] = field(default_factory=list)
    sends: list[msgspec.Struct] = field(default_factory=list)
    done: bool = False          # --message: our turn completed
    quit: bool = False          # /quit
    fatal: str | None = None    # an error no reconnect can fix
    idle: bool = False          # no turn running: a good moment for the prompt

    def extend(self, other: Step) -> Step:
        self.renders += other.renders
        self.sends += other.sends
        self.done = self.done or other.done
        self.quit = self.quit or other.quit
        self.fatal = self.fatal or other.fatal
        self.idle = self.idle or other.idle
        return self


@dataclass
class _Pending:
    """A command not yet acked. Kept without a conversation id, so it can be queued before the
    first `open` is acked; sent (again) whenever the connection becomes ready."""

    id: str
    type: str
    fields: dict[str, Any]
    sent: bool = False


def _compact(value: Any, limit: int = COMPACT_CHARS) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class ChatProtocol:
    """The chat client without I/O. Feed it `connected()`, `receive(frame)`, `user_input(line)`
    and `disconnected()`; send what each returned `Step` lists, in order."""

    def __init__(
        self,
        conversation_id: str | None = None,
        *,
        agent: str | None = None,
        mode: Mode | None = None,
        new_id: Callable[[], str] = new_frame_id,
    ) -> None:
        self.conversation_id = conversation_id
        self.agent = agent
        self.initial_mode = mode
        self.new_id = new_id
        self.last_seq = 0                 # events ≤ this were rendered; resume subscribes after it
        self.ready = False                # this connection's `open` was acked
        self.opened_once = False
        self.duplicates_dropped = 0
        self.pending: dict[str, _Pending] = {}
        self.pending_ask: AskUser | None = None
        self.awaited_message_id: str | None = None   # --message: the turn to wait for
        self.awaited_turn_id: str | None = None
        self.turn_active = False
        self._answers: dict[str, str] = {}            # turn_id -> answer text streamed so far
        self._open_id: str | None = None
        self._subscribe_id: str | None = None
        self._resubscribing = False

    # -- connection lifecycle ---------------------------------------------------------------------

    def connected(self) -> Step:
        """A new connection: (re-)open the conversation. Everything else waits for the ack."""
        self.ready = False
        self._open_id = self.new_id()
        first = not self.opened_once
        frame = Open(
            id=self._open_id,
            conversation_id=self.conversation_id,
            agent=self.agent if first and self.conversation_id is None else None,
            mode=self.initial_mode if first else None,  # sticky server-side: never re-applied
        )
        return Step(sends=[frame])

    def disconnected(self) -> Step:
        self.ready = False
        self._open_id = self._subscribe_id = None
        self._resubscribing = False
        step = Step()
        for pending in list(self.pending.values()):
            if pending.sent and pending.type not in RESENT_ON_RECONNECT:
                del self.pending[pending.id]
                step.renders.append(Status(f"{pending.type} may not have reached the server: send it again"))
        return step

    # -- frames from the gateway ------------------------------------------------------------------

    def receive(self, raw: str | bytes) -> Step:
        try:
            frame = decode_server_frame(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return Step(renders=[Status(f"ignored an unreadable server frame: {exc}")])
        match frame:
            case Event():
                return self._on_event(frame)
            case Ack():
                return self._on_ack(frame)
            case ErrorFrame():
                return self._on_error(frame)
            case Pong():
                return Step()
        return Step()  # pragma: no cover - decode_server_frame returns only the types above

    def _on_ack(self, ack: Ack) -> Step:
        step = Step()
        if ack.id == self._open_id:
            return self._on_opened(ack)
        if ack.id == self._subscribe_id:
            self._resubscribing = False
            return step
        pending = self.pending.pop(ack.id, None)
        if pending is not None and pending.type in ACKED_INFO:
            step.renders.append(Info(ACKED_INFO[pending.type].format(**pending.fields, status=ack.status)))
            step.idle = not self.turn_active
        return step

    def _on_opened(self, ack: Ack) -> Step:
        step = Step()
        if ack.conversation_id is None:
            step.fatal = "the server acked open without a conversation id"
            return step
        if self.conversation_id is not None and ack.conversation_id != self.conversation_id:
            step.fatal = f"asked to re-open {self.conversation_id}, the server opened {ack.conversation_id}"
            return step
        self.conversation_id = ack.conversation_id
        self.ready = True
        if not self.opened_once:
            self.opened_once = True
            step.renders.append(Info(f"conversation {self.conversation_id}"))
            step.idle = not self.pending
        else:
            step.renders.append(Status(f"reconnected: resuming after seq {self.last_seq}"))
        step.sends.append(self._subscribe())
        for pending in self.pending.values():  # same ids: the server answers a repeat `duplicate`
            step.sends.append(self._build(pending))
            pending.sent = True
        return step

    def _on_error(self, error: ErrorFrame) -> Step:
        step = Step()
        code = str(error.code)
        if error.id is not None and error.id == self._open_id:
            step.fatal = f"{code}: {error.message}"
            return step
        if error.code in FATAL_ERRORS and error.id is not None and error.id == self._subscribe_id:
            step.fatal = f"{code}: {error.message}"
            return step
        if error.code is ErrorCode.SLOW_CONSUMER:
            # Paused: our own last_seq is what we rendered, so resuming from it loses nothing.
            step.renders.append(Status(f"slow consumer: resuming after seq {self.last_seq}"))
            if self.ready:
                step.sends.append(self._subscribe())
            return step
        if error.id is not None:
            self.pending.pop(error.id, None)
        step.renders.append(ErrorItem(code, error.message))
        return step

    def _subscribe(self) -> Subscribe:
        assert self.conversation_id is not None
        self._subscribe_id = self.new_id()
        self._resubscribing = True
        return Subscribe(id=self._subscribe_id, conversation_id=self.conversation_id, after_seq=self.last_seq)

    # -- events -------------------------------------------------------------------------------------

    def _on_event(self, frame: Event) -> Step:
        if frame.conversation_id != self.conversation_id:
            return Step()
        if frame.seq <= self.last_seq:  # replayed after a resume, or a restarted subscription
            self.duplicates_dropped += 1
            return Step()
        if frame.seq != self.last_seq + 1:
            # A gap: never render out of order. Restart the stream where we are (once; events of
            # the old subscription still in flight before its ack are dropped by this same rule).
            step = Step()
            if self.ready and not self._resubscribing:
                step.renders.append(Status(f"gap after seq {self.last_seq} (got {frame.seq}): re-subscribing"))
                step.sends.append(self._subscribe())
            return step
        self.last_seq = frame.seq
        return self._render_event(frame.event, payload_builtins(frame.data))

    def _render_event(self, name: str, data: dict[str, Any]) -> Step:
        step = Step()
        turn_id = str(data.get("turn_id", ""))
        out = step.renders
        match name:
            case "turn.started":
                self.turn_active = True
                self._answers[turn_id] = ""
                message_id = str(data.get("user_message_id", ""))
                if self.awaited_message_id is not None and message_id == self.awaited_message_id:
                    self.awaited_turn_id = turn_id
                out.append(TurnStarted(turn_id, message_id))
            case "thinking.delta":
                out.append(ThinkingDelta(turn_id, int(data.get("round", 0)), str(data.get("text", ""))))
            case "answer.delta":
                text = str(data.get("text", ""))
                self._answers[turn_id] = self._answers.get(turn_id, "") + text
                out.append(AnswerDelta(turn_id, text))
            case "tool.call":
                out.append(ToolCall(str(data.get("call_id", "")), str(data.get("tool_id", "")),
                                    dict(data.get("params") or {}), data.get("trait")))
            case "tool.result":
                call_id = str(data.get("call_id", ""))
                if self.pending_ask is not None and self.pending_ask.ask_id == call_id:
                    self.pending_ask = None  # answered (here or elsewhere) or timed out
                out.append(ToolResult(call_id, str(data.get("tool_id", "")), bool(data.get("ok")),
                                      data.get("result"), data.get("error"), data.get("duration_ms")))
            case "ask_user":
                ask = AskUser(str(data.get("ask_id", "")), str(data.get("question", "")),
                              tuple(str(o) for o in data.get("options") or ()), data.get("timeout_s"))
                self.pending_ask = ask
                out.append(ask)
            case "ui_command":
                out.append(UiCommand(str(data.get("command", "")), dict(data.get("args") or {})))
            case "fallback":
                out.append(Fallback(str(data.get("from", "")), str(data.get("to", "")), str(data.get("error", ""))))
            case "round.completed":
                for notice in data.get("notices") or ():
                    out.append(NoticeItem(str(notice.get("code", "")), str(notice.get("message", "")),
                                          notice.get("tool_id"), tuple(notice.get("violations") or ())))
            case "trace":
                kind = str(data.get("kind", ""))
                if kind != "illegal_finish":  # its notice already says it; the payload is for operators
                    out.append(Trace(kind))
            case "turn.completed":
                final = str(data.get("final_answer") or "")
                streamed = self._answers.pop(turn_id, "")
                if final and final != streamed:
                    # An answer that never streamed (e.g. a plain error message) is shown once here;
                    # one that streamed is never repeated (guarantee 2 as the user sees it).
                    rest = final[len(streamed):] if final.startswith(streamed) else final
                    out.append(AnswerDelta(turn_id, rest))
                self.turn_active = False
                if self.pending_ask is not None:
                    self.pending_ask = None
                out.append(TurnCompleted(turn_id, str(data.get("reason", "")), data.get("used_tools"),
                                         data.get("finish_ok")))
                step.idle = True
                if self.awaited_turn_id is not None and turn_id == self.awaited_turn_id:
                    step.done = True
            case _:
                out.append(Info(f"{name} {_compact(data)}"))
        return step

    # -- what the user does -----------------------------------------------------------------------

    def user_input(self, line: str) -> Step:
        text = line.rstrip("\r\n")
        stripped = text.strip()
        if not stripped:
            return Step()
        if stripped.startswith("/") and not stripped.startswith("//"):
            return self._slash(stripped)
        if stripped.startswith("//"):
            text = stripped[1:]
        if self.pending_ask is not None:
            return self.answer(self._resolve_option(text.strip(), self.pending_ask))
        return self.send_message(text)

    def _slash(self, line: str) -> Step:
        step = self._slash_command(line)
        if step.renders:  # local feedback only: the prompt comes back at once
            step.idle = not self.turn_active
        return step

    def _slash_command(self, line: str) -> Step:
        command, _, rest = line.partition(" ")
        rest = rest.strip()
        match command:
            case "/quit" | "/exit":
                return Step(quit=True)
            case "/help":
                return Step(renders=[Info(HELP)])
            case "/mode":
                if rest not in MODES:
                    return Step(renders=[ErrorItem("usage", "/mode ask|agent")])
                return self.set_mode(rest)
            case "/steer":
                if not rest:
                    return Step(renders=[ErrorItem("usage", "/steer TEXT")])
                return self.steer(rest)
            case "/cancel":
                return self.cancel()
        return Step(renders=[ErrorItem("usage", f"unknown command {command}. {HELP}")])

    @staticmethod
    def _resolve_option(text: str, ask: AskUser) -> str:
        """A number picks an option; anything else is the answer as typed."""
        if text.isdigit() and 1 <= int(text) <= len(ask.options):
            return ask.options[int(text) - 1]
        return text

    def send_message(self, text: str, *, await_turn: bool = False) -> Step:
        """`await_turn`: the Step that completes the turn this message starts has `done` set."""
        message_id, step = self._command("user_message", {"text": text})
        if await_turn:
            self.awaited_message_id = message_id
        return step

    def steer(self, text: str) -> Step:
        return self._command("steer", {"text": text})[1]

    def answer(self, text: str) -> Step:
        assert self.pending_ask is not None
        ask_id = self.pending_ask.ask_id
        self.pending_ask = None
        return self._command("answer", {"ask_id": ask_id, "answer": text})[1]

    def set_mode(self, mode: str) -> Step:
        return self._command("set_mode", {"mode": mode})[1]

    def cancel(self) -> Step:
        return self._command("cancel", {})[1]

    def _command(self, kind: str, fields: dict[str, Any]) -> tuple[str, Step]:
        pending = _Pending(self.new_id(), kind, fields)
        self.pending[pending.id] = pending
        if not self.ready:
            return pending.id, Step()  # sent with the next open ack
        pending.sent = True
        return pending.id, Step(sends=[self._build(pending)])

    def _build(self, pending: _Pending) -> msgspec.Struct:
        cid = self.conversation_id
        assert cid is not None
        f = pending.fields
        match pending.type:
            case "user_message":
                return UserMessageFrame(id=pending.id, conversation_id=cid, text=f["text"])
            case "steer":
                return SteerFrame(id=pending.id, conversation_id=cid, text=f["text"])
            case "answer":
                return AnswerFrame(id=pending.id, conversation_id=cid, ask_id=f["ask_id"], answer=f["answer"])
            case "set_mode":
                return SetModeFrame(id=pending.id, conversation_id=cid, mode=f["mode"])
            case "cancel":
                return CancelFrame(id=pending.id, conversation_id=cid)
        raise ValueError(f"unknown command type {pending.type!r}")


# ---------------------------------------------------------------------------------------------
# Drawing: render items → styled text segments. Streams (thinking, answer) are written inline;
# everything else is a line of its own.

Segment = tuple[str, str]  # (text, rich style)
STYLES: Final = {
    "thinking": "dim italic",
    "answer": "bold",
    "tool": "cyan",
    "ok": "green",
    "error": "red",
    "notice": "grey50",
    "ask": "bold magenta",
    "ui": "blue",
    "fallback": "yellow",
    "info": "grey50",
    "turn.ok": "green",
    "turn.warn": "yellow",
    "turn.bad": "red",
}
REASON_STYLE: Final = {"complete": "turn.ok", "exit": "turn.warn", "salvaged": "turn.warn"}


@dataclass
class Transcript:
    """Tracks which stream is open, so a switch between thinking, answer and other lines starts
    on a fresh line and a resumed stream continues exactly where it stopped."""

    stream: tuple[str, str, int] | None = None   # (lane, turn_id, round)
    at_line_start: bool = True

    def segments(self, item: Render) -> list[Segment]:
        match item:
            case ThinkingDelta():
                return self._stream(("thinking", item.turn_id, item.round), "thinking: ", item.text, "thinking")
            case AnswerDelta():
                return self._stream(("answer", item.turn_id, 0), "", item.text, "answer")
            case TurnStarted():
                return []
            case ToolCall():
                trait = f" [{item.trait}]" if item.trait else ""
                return self._line(f"→ {item.tool_id} {_compact(item.params)}{trait}", "tool")
            case ToolResult():
                took = f" {item.duration_ms} ms" if item.duration_ms is not None else ""
                if item.ok:
                    return self._line(f"← {item.tool_id} ok{took} {_compact(item.result)}", "ok")
                return self._line(f"← {item.tool_id} error{took} {_compact(item.error)}", "error")
            case AskUser():
                lines = self._line(f"? {item.question}", "ask")
                for n, option in enumerate(item.options, 1):
                    lines += [(f"  {n}. {option}\n", "ask")]
                hint = "  answer with a number or text" if item.options else "  type your answer"
                return [*lines, (hint + "\n", "info")]
            case UiCommand():
                return self._line(f"⇢ ui {item.command} {_compact(item.args)}", "ui")
            case Fallback():
                return self._line(f"⇄ fallback {item.from_model} → {item.to_model} ({item.error})", "fallback")
            case NoticeItem():
                tool = f" [{item.tool_id}]" if item.tool_id else ""
                extra = f" ({'; '.join(item.violations)})" if item.violations else ""
                return self._line(f"notice {item.code}{tool}: {item.message}{extra}", "notice")
            case Trace():
                return self._line(f"trace {item.kind}", "notice")
            case TurnCompleted():
                style = REASON_STYLE.get(item.reason, "turn.bad")
                mark = "✓" if style == "turn.ok" else "!"
                extra = ""
                if item.used_tools is False:
                    extra += ", no tools used"
                if item.finish_ok is False:
                    extra += ", finish not ok"
                return self._line(f"{mark} turn {item.turn_id} {item.reason}{extra}", style)
            case Info():
                return self._line(item.text, "info")
            case ErrorItem():
                return self._line(f"error {item.code}: {item.message}", "error")
            case Status():
                return []  # the shell writes status to stderr
        return []

    def _stream(self, key: tuple[str, str, int], prefix: str, text: str, style: str) -> list[Segment]:
        out: list[Segment] = []
        if self.stream != key:
            if not self.at_line_start:
                out.append(("\n", ""))
            self.stream = key
            if prefix:
                out.append((prefix, "info"))
        if text:
            out.append((text, style))
            self.at_line_start = text.endswith("\n")
        elif prefix:
            self.at_line_start = False
        return out

    def _line(self, text: str, style: str) -> list[Segment]:
        out: list[Segment] = []
        if not self.at_line_start:
            out.append(("\n", ""))
        self.stream = None
        self.at_line_start = True
        out.append((text + "\n", style))
        return out

    def close(self) -> list[Segment]:
        """End an open stream line (before a prompt, or at exit)."""
        self.stream = None
        if self.at_line_start:
            return []
        self.at_line_start = True
        return [("\n", "")]


# ---------------------------------------------------------------------------------------------
# The shell: sockets, stdin, consoles.


class Fatal(Exception):
    """An error no reconnect can fix (bad token, a conversation we do not own, ...)."""


class _StdinReader:
    """Lines from stdin on a daemon thread (stdin has no portable asyncio reader); None at EOF."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._loop = loop
        self._started = False

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        threading.Thread(target=self._run, name="reactgate-chat-stdin", daemon=True).start()

    def _run(self) -> None:
        try:
            for line in sys.stdin:
                self._loop.call_soon_threadsafe(self.queue.put_nowait, line)
        except (OSError, ValueError):
            pass
        self._loop.call_soon_threadsafe(self.queue.put_nowait, None)


class ChatShell:
    def __init__(
        self,
        proto: ChatProtocol,
        url: str,
        *,
        token: str | None = None,
        message: str | None = None,
        out: Console | None = None,
        err: Console | None = None,
        backoff: Backoff | None = None,
        give_up_after_s: float = 120.0,
    ) -> None:
        self.proto = proto
        self.url = url
        self.token = token
        self.message = message
        self.out = out or Console(highlight=False, soft_wrap=True, emoji=False, markup=False)
        self.err = err or Console(stderr=True, highlight=False, soft_wrap=True, emoji=False, markup=False)
        self.backoff = backoff or Backoff()
        self.give_up_after_s = give_up_after_s
        self.transcript = Transcript()
        self.interactive = message is None
        self._ws: ClientConnection | None = None
        self._stdin: _StdinReader | None = None
        self._result: int | None = None

    # -- output -----------------------------------------------------------------------------------

    def _draw(self, step: Step) -> None:
        for item in step.renders:
            if isinstance(item, Status):
                self._status(item.text)
                continue
            for text, style in self.transcript.segments(item):
                self.out.print(Text(text, style=STYLES.get(style, style)), end="")
            if isinstance(item, AskUser) and self._stdin is not None:
                self._stdin.start()  # --message mode reads stdin only to answer a question
        if step.renders:
            self.out.file.flush()
        if self.interactive and step.idle:
            self._prompt()

    def _status(self, text: str) -> None:
        self.err.print(Text(f"[chat] {text}", style="grey50"))

    def _prompt(self) -> None:
        for text, _ in self.transcript.close():
            self.out.print(text, end="")
        self.out.print(Text("you › ", style="bold"), end="")
        self.out.file.flush()
        self.transcript.at_line_start = False  # output arriving before Enter starts a new line

    async def _apply(self, step: Step) -> None:
        self._draw(step)
        if step.fatal:
            raise Fatal(step.fatal)
        ws = self._ws
        if ws is not None:
            for frame in step.sends:
                try:
                    await ws.send(msgspec.json.encode(frame).decode())
                except ConnectionClosed:
                    break  # unacked commands stay pending; the reconnect re-sends them
        if step.quit or (step.done and not self.interactive):
            self._result = 0

    # -- main loop ----------------------------------------------------------------------------------

    async def run(self) -> int:
        self._stdin = _StdinReader(asyncio.get_running_loop())
        if self.interactive:
            self._stdin.start()
            self._draw(Step(renders=[Info(HELP)]))
        else:
            assert self.message is not None
            await self._apply(self.proto.send_message(self.message, await_turn=True))
        inputs = asyncio.create_task(self._pump_input())
        try:
            return await self._connect_loop()
        except Fatal as exc:
            self._status(f"giving up: {exc}")
            return 2
        finally:
            inputs.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await inputs
            for text, _ in self.transcript.close():
                self.out.print(text, end="")

    async def _connect_loop(self) -> int:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        failing_since: float | None = None
        while True:
            reason = ""
            try:
                async with connect(
                    self.url, subprotocols=[Subprotocol(SUBPROTOCOL)], additional_headers=headers,
                    open_timeout=10, max_size=None,
                ) as ws:
                    self._ws = ws
                    try:
                        await self._apply(self.proto.connected())
                        async for raw in ws:
                            await self._apply(self.proto.receive(raw))
                            if self.proto.ready:
                                self.backoff.reset()
                                failing_since = None
                            if self._result is not None:
                                await ws.close()
                                return self._result
                    finally:
                        self._ws = None
                reason = "connection closed"
            except InvalidStatus as exc:
                status = exc.response.status_code
                body = exc.response.body.decode(errors="replace").strip() if exc.response.body else ""
                if status in FATAL_HTTP_STATUS:
                    raise Fatal(f"handshake refused with HTTP {status}: {body}") from None
                reason = f"HTTP {status} {body}".strip()
            except InvalidURI as exc:
                raise Fatal(str(exc)) from None
            except ConnectionClosed as exc:
                received = exc.rcvd
                reason = f"connection lost ({received.code} {received.reason})" if received else "connection lost"
            except (OSError, InvalidHandshake, TimeoutError) as exc:
                reason = f"cannot connect: {exc}"
            if self._result is not None:
                return self._result
            await self._apply(self.proto.disconnected())
            now = time.monotonic()
            failing_since = failing_since if failing_since is not None else now
            if now - failing_since > self.give_up_after_s:
                raise Fatal(f"{reason}; no connection for {self.give_up_after_s:.0f} s")
            delay = self.backoff.next_delay()
            self._status(f"{reason}; reconnecting in {delay:.2f} s")
            await asyncio.sleep(delay)

    async def _pump_input(self) -> None:
        assert self._stdin is not None
        while True:
            line = await self._stdin.queue.get()
            if line is None:
                if self.interactive:  # Ctrl-D ends the session
                    self._result = 0
                    if self._ws is not None:
                        await self._ws.close()
                    return
                self._status("stdin closed: the question stays unanswered until it times out")
                return
            self.transcript.at_line_start = True  # the terminal echoed the Enter
            await self._apply(self.proto.user_input(line))
            if self._result is not None and self._ws is not None:
                await self._ws.close()
                return


def run_chat(
    url: str = DEFAULT_URL,
    *,
    token: str | None = None,
    conversation_id: str | None = None,
    message: str | None = None,
    agent: str | None = None,
    mode: Mode | None = None,
    give_up_after_s: float = 120.0,
) -> int:
    """Entry point of `reactgate chat`; returns the exit code."""
    token = token or os.environ.get("REACTGATE_TOKEN") or None
    proto = ChatProtocol(conversation_id, agent=agent, mode=mode)
    shell = ChatShell(proto, url, token=token, message=message, give_up_after_s=give_up_after_s)
    try:
        return asyncio.run(shell.run())
    except KeyboardInterrupt:
        return 130


def render_all(items: Iterable[Render]) -> str:
    """Plain text of a sequence of render items, as the transcript would print it (tests, logs)."""
    transcript = Transcript()
    return "".join(text for item in items for text, _ in transcript.segments(item))
