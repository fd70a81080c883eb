"""`reactgate chat` — the terminal client (README.md#configuration), on `client.session`.

`Chat` is what the chat adds to the session, without I/O: what a line typed at the prompt means
(a message, the answer to the waiting question by option number or text, a /command), which turn
`--message` waits for, and what each session output shows — in the transcript, or as status.
`Transcript` draws events straight from their typed payloads (protocol/events.py): one `case` per
kind, so a new kind needs its struct, its emitter and one case here; a kind this version does not
know arrives as plain data and is shown as such. `ChatShell` only moves lines between a
`Connection`, stdin and two rich consoles: the transcript goes to stdout and connection status to
stderr, so a resumed answer reads as one unbroken text. The one file it writes is an export
(`/export FILE`, `write_export`): JSONL, one event frame per line, exactly as the gateway sent it.
`/delete` asks once, then deletes the conversation for good and the chat ends. The chat also
remembers the last conversation it opened per server URL (`client/resume.py`), for `--resume`, and
Ctrl-C says how to come back. `--message` exits with what its turn came to (`turn_exit_code`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from rich.console import Console
from rich.text import Text

from client.connection import Backoff, Connection, ConnectionLost, Item
from client.resume import LastConversations, come_back
from client.session import (
    Acked,
    ClientSession,
    CommandFailed,
    CommandLost,
    Deleted,
    ExportDone,
    Exported,
    Fatal,
    GapDetected,
    Opened,
    PendingFrame,
    Resubscribing,
    Resumed,
    RetryLater,
    ServerError,
    Unreadable,
)
from protocol.events import (
    AnswerDelta,
    Approval,
    AskUser,
    ConversationDeleted,
    EndReason,
    Event,
    Fallback,
    IllegalFinish,
    RoundCompleted,
    ThinkingDelta,
    ToolCalled,
    ToolResult,
    Trace,
    TurnCompleted,
    TurnStarted,
    UiCommand,
    UserSaid,
)
from protocol.frames import CancelFrame, ClientFrame, Mode, SetModeFrame, SteerFrame, encode_event

DEFAULT_URL: Final = "ws://127.0.0.1:8765/ws"
MODES: Final = tuple(m.value for m in Mode)
COMPACT_CHARS: Final = 160
HELP: Final = (
    "commands: /mode ask|agent  /steer TEXT  /cancel  /export FILE  /delete  /quit"
    "  (//text sends a message starting with /)"
)
CONFIRM_DELETE: Final = "delete this conversation and its whole history for good? type yes to confirm"

# `--message`'s exit codes (docs/operations.md#commands): 0 when its turn gave the user an answer —
# `complete`, `exit`, or a `salvaged` one that was not cut short — else EXIT_TURN_FAILED (a give-up,
# `provider_error`, `error`, `cancelled`, an answer cut short). 2: no connection, or refused; 130: Ctrl-C.
ANSWERED: Final = frozenset({EndReason.COMPLETE, EndReason.EXIT, EndReason.SALVAGED})
EXIT_TURN_FAILED: Final = 1
EXIT_FATAL: Final = 2
EXIT_INTERRUPTED: Final = 130


def turn_exit_code(done: TurnCompleted) -> int:
    return 0 if done.reason in ANSWERED and not done.partial else EXIT_TURN_FAILED


# ---------------------------------------------------------------------------------------------
# What the chat shows besides events.


@dataclass(frozen=True)
class Info:
    """A local line of the transcript (conversation id, help, an acked command)."""

    text: str


@dataclass(frozen=True)
class Problem:
    """An error line of the transcript: the server refused something, or a command was misused."""

    code: str
    message: str


@dataclass(frozen=True)
class Status:
    """Connection status: goes to stderr, never into the transcript."""

    text: str


Shown = Event | Info | Problem | Status


@dataclass
class Step:
    """The outcome of one input: what to show, and whether to stop."""

    shown: list[Shown] = field(default_factory=list)
    done: bool = False          # --message: our turn completed
    quit: bool = False          # /quit
    fatal: str | None = None    # an error no reconnect can fix
    idle: bool = False          # no turn running: a good moment for the prompt
    save: Save | None = None    # an export is complete: the shell writes it (`write_export`)

    def extend(self, other: Step) -> Step:
        self.shown += other.shown
        self.done = self.done or other.done
        self.quit = self.quit or other.quit
        self.fatal = self.fatal or other.fatal
        self.idle = self.idle or other.idle
        self.save = self.save or other.save
        return self


@dataclass(frozen=True)
class Save:
    """A completed export to write: one event frame per line, as the gateway sent it."""

    path: str
    lines: list[str]
    last_seq: int               # where the log ended when the export was asked for


def write_export(save: Save) -> Info | Problem:
    """Write an export's JSONL file; what the transcript says about it."""
    try:
        Path(save.path).write_text("".join(f"{line}\n" for line in save.lines), encoding="utf-8")
    except OSError as exc:
        return Problem("export", f"cannot write {save.path}: {exc.strerror or exc}")
    cut = f" (the log had {save.last_seq}: deleted meanwhile)" if len(save.lines) < save.last_seq else ""
    return Info(f"exported {len(save.lines)} events to {save.path}{cut}")


def compact(value: Any, limit: int = COMPACT_CHARS) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def frame_type(frame: ClientFrame) -> str:
    """The frame's `type` on the wire (`cancel`, `steer`, …)."""
    return str(frame.__struct_config__.tag)


def status_text(item: Item) -> str | None:
    """The stderr line for a session or connection output that is status, not transcript."""
    match item:
        case Resumed(after_seq=seq):
            return f"reconnected: resuming after seq {seq}"
        case GapDetected(after_seq=seq, got=got):
            return f"gap after seq {seq} (got {got}): re-subscribing"
        case Resubscribing(after_seq=seq, code=code):
            return f"{code.replace('_', ' ')}: resuming after seq {seq}"
        case CommandLost(command=command):
            return f"{frame_type(command)} may not have reached the server: send it again"
        case RetryLater(frame=frame, code=code):
            return f"{frame_type(frame)} not processed ({code}): sending it again shortly"
        case Unreadable(detail=detail):
            return f"ignored an unreadable server frame: {detail}"
        case ConnectionLost(reason=reason, retry_in_s=delay):
            return f"{reason}; reconnecting in {delay:.2f} s"
    return None


def acked_text(command: PendingFrame, status: str) -> str | None:
    """What the transcript says when a command with no event of its own yet is acked."""
    match command:
        case SetModeFrame(mode=mode):
            return f"mode {mode} ({status})"
        case SteerFrame():
            return f"steer {status}"
        case CancelFrame():
            return f"cancel {status}"
    return None


# ---------------------------------------------------------------------------------------------
# The chat's own state over the session.


class Chat:
    """Prompt lines and session outputs in, `Step`s out; commands go to `session`, whose frames the
    connection sends (`Connection.flush`)."""

    def __init__(self, session: ClientSession) -> None:
        self.session = session
        self.pending_ask: AskUser | None = None       # the question the next line answers
        self.turn_active = False
        self.awaited_message_id: str | None = None    # --message: the turn to wait for
        self.awaited_turn_id: str | None = None
        self.awaited_end: TurnCompleted | None = None  # --message: how that turn ended
        self.confirming_delete = False                # /delete asked; the next line answers
        self.exports: dict[str, tuple[str, list[str]]] = {}   # export id → (file, lines so far)
        self.mine: set[str] = set()                   # ids of what this client sent: the terminal already shows them

    def send_message(self, text: str, *, await_turn: bool = False) -> str:
        """`await_turn`: the Step that completes the turn this message starts has `done` set."""
        message_id = self.session.user_message(text)
        self.mine.add(message_id)
        if await_turn:
            self.awaited_message_id = message_id
        return message_id

    # -- session outputs --------------------------------------------------------------------------

    def on_output(self, item: Item) -> Step:
        match item:
            case Event():
                return self._on_event(item)
            case Opened(conversation_id=cid):
                return Step([Info(f"conversation {cid}")], idle=not self.session.pending_ids)
            case Acked(command=command, status=status):
                text = acked_text(command, status)
                return Step([Info(text)], idle=not self.turn_active) if text else Step()
            case CommandFailed(code=code, message=message) | ServerError(code=code, message=message):
                return Step([Problem(str(code), message)])
            case Exported(export_id=export_id, event=event) if export_id in self.exports:
                self.exports[export_id][1].append(encode_event(event).decode())
                return Step()
            case ExportDone(export_id=export_id, last_seq=last_seq) if export_id in self.exports:
                path, lines = self.exports.pop(export_id)
                return Step(save=Save(path, lines, last_seq), idle=not self.turn_active)
            case Deleted(conversation_id=cid):
                return Step([Info(f"conversation {cid} deleted")])
            case Fatal(reason=reason):
                return Step(fatal=reason)
        text = status_text(item)
        return Step([Status(text)]) if text else Step()

    def _on_event(self, event: Event) -> Step:
        step = Step([event])
        match event.data:
            case TurnStarted(turn_id=turn_id, user_message_id=message_id):
                self.turn_active = True
                if message_id == self.awaited_message_id:
                    self.awaited_turn_id = turn_id
            case AskUser() as ask:
                self.pending_ask = ask
            case ToolResult(call_id=call_id) | Approval(call_id=call_id):
                if self.pending_ask is not None and self.pending_ask.ask_id == call_id:
                    self.pending_ask = None  # answered (here or elsewhere) or timed out
            case TurnCompleted(turn_id=turn_id) as done:
                self.turn_active = False
                self.pending_ask = None
                step.idle = True
                step.done = turn_id == self.awaited_turn_id
                if step.done:
                    self.awaited_end = done
        return step

    # -- what the user types ----------------------------------------------------------------------

    def user_input(self, line: str) -> Step:
        text = line.rstrip("\r\n")
        stripped = text.strip()
        if self.confirming_delete:
            self.confirming_delete = False
            if stripped == "yes":
                self.session.delete()
                return Step([Info("deleting…")])
            return Step([Info("not deleted")], idle=not self.turn_active)
        if not stripped:
            return Step()
        if stripped.startswith("/") and not stripped.startswith("//"):
            step = self._slash(stripped)
            if step.shown:  # local feedback only: the prompt comes back at once
                step.idle = not self.turn_active
            return step
        if stripped.startswith("//"):
            text = stripped[1:]
        if self.pending_ask is not None:
            ask, self.pending_ask = self.pending_ask, None
            self.session.answer(ask.ask_id, resolve_option(text.strip(), ask))
        else:
            self.mine.add(self.session.user_message(text))
        return Step()

    def _slash(self, line: str) -> Step:
        command, _, rest = line.partition(" ")
        rest = rest.strip()
        match command:
            case "/quit" | "/exit":
                return Step(quit=True)
            case "/help":
                return Step([Info(HELP)])
            case "/mode":
                if rest not in MODES:
                    return Step([Problem("usage", "/mode ask|agent")])
                self.session.set_mode(rest)
            case "/steer":
                if not rest:
                    return Step([Problem("usage", "/steer TEXT")])
                self.mine.add(self.session.steer(rest))
            case "/cancel":
                self.session.cancel()
            case "/delete":
                self.confirming_delete = True
                return Step([Info(CONFIRM_DELETE)])
            case "/export":
                if not rest:
                    return Step([Problem("usage", "/export FILE")])
                self.exports[self.session.export()] = (rest, [])
            case _:
                return Step([Problem("usage", f"unknown command {command}. {HELP}")])
        return Step()


def resolve_option(text: str, ask: AskUser) -> str:
    """A number picks an option; anything else is the answer as typed."""
    if text.isdigit() and 1 <= int(text) <= len(ask.options):
        return ask.options[int(text) - 1]
    return text


# ---------------------------------------------------------------------------------------------
# Drawing: events and lines → styled text segments. Streams (thinking, answer) are written
# inline; everything else is a line of its own.

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
    "user": "bold",
    "turn.ok": "green",
    "turn.warn": "yellow",
    "turn.bad": "red",
}
REASON_STYLE: Final = {EndReason.COMPLETE: "turn.ok", EndReason.EXIT: "turn.warn", EndReason.SALVAGED: "turn.warn"}


@dataclass
class Transcript:
    """Tracks which stream is open, so a switch between thinking, answer and other lines starts on
    a fresh line and a resumed stream continues exactly where it stopped; and what each turn's
    answer streamed, so a final answer is shown once."""

    stream: tuple[str, str, int] | None = None   # (lane, turn_id, round)
    at_line_start: bool = True
    answers: dict[str, str] = field(default_factory=dict)   # turn_id → answer text streamed so far
    mine: set[str] = field(default_factory=set)   # message ids typed here: not drawn again

    def segments(self, item: Shown) -> list[Segment]:
        match item:
            case Event():
                return self._event(item)
            case Info(text=text):
                return self._line(text, "info")
            case Problem(code=code, message=message):
                return self._line(f"error {code}: {message}", "error")
        return []  # Status: the shell writes it to stderr

    def _event(self, event: Event) -> list[Segment]:
        match event.data:
            case UserSaid(message_id=message_id, text=text, kind=kind):
                if message_id in self.mine:
                    return []  # typed at this prompt: the terminal shows it already
                return self._line(f"you › {text}" + (" (steer)" if kind == "steer" else ""), "user")
            case TurnStarted(turn_id=turn_id):
                self.answers[turn_id] = ""
                return []
            case ThinkingDelta(turn_id=turn_id, round=round_, text=text):
                return self._stream(("thinking", turn_id, round_), "thinking: ", text, "thinking")
            case AnswerDelta(turn_id=turn_id, text=text):
                self.answers[turn_id] = self.answers.get(turn_id, "") + text
                return self._stream(("answer", turn_id, 0), "", text, "answer")
            case ToolCalled(tool_id=tool_id, params=params, trait=trait):
                return self._line(f"→ {tool_id} {compact(params)}{f' [{trait}]' if trait else ''}", "tool")
            case ToolResult() as result:
                outcome = "ok" if result.ok else "error"
                return self._line(f"← {result.tool_id} {outcome} {result.duration_ms} ms {compact(result.payload())}",
                                  outcome)
            case AskUser(question=question, options=options, kind="approval", tool_id=tool_id, params=params):
                # A confirm tool waits for the user's yes (docs/design.md#execute-confirmation).
                lines = self._line(f"? {question} {tool_id} {compact(params or {})}", "ask")
                lines += [(f"  {n}. {option}\n", "ask") for n, option in enumerate(options, 1)]
                return [*lines, ("  answer with a number\n", "info")]
            case AskUser(question=question, options=options):
                lines = self._line(f"? {question}", "ask")
                lines += [(f"  {n}. {option}\n", "ask") for n, option in enumerate(options, 1)]
                hint = "  answer with a number or text" if options else "  type your answer"
                return [*lines, (hint + "\n", "info")]
            case UiCommand(command=command, args=args):
                return self._line(f"⇢ ui {command} {compact(args)}", "ui")
            case Fallback(from_model=from_model, to_model=to_model, error=error):
                return self._line(f"⇄ fallback {from_model} → {to_model} ({error})", "fallback")
            case RoundCompleted(notices=notices):
                out: list[Segment] = []
                for notice in notices:
                    tool = f" [{notice.tool_id}]" if notice.tool_id else ""
                    extra = f" ({'; '.join(notice.violations)})" if notice.violations else ""
                    out += self._line(f"notice {notice.code}{tool}: {notice.message}{extra}", "notice")
                return out
            case IllegalFinish():
                return []  # its notice already says it; the payload is for operators
            case ConversationDeleted():
                return []  # the session's `Deleted` says it, whoever deleted it
            case Approval(tool_id=tool_id, decision=decision):
                return self._line(f"{tool_id}: {decision.replace('_', ' ')}", "notice")
            case Trace() as trace:
                return self._line(f"trace {trace.__struct_config__.tag}", "notice")
            case TurnCompleted() as done:
                return self._turn_completed(done)
            case data:  # a kind this version does not know, or data that does not fit its kind
                return self._line(f"{event.event} {compact(data)}", "info")

    def _turn_completed(self, done: TurnCompleted) -> list[Segment]:
        out: list[Segment] = []
        streamed = self.answers.pop(done.turn_id, "")
        if done.final_answer and done.final_answer != streamed:
            # An answer that never streamed (e.g. a plain error message) is shown once here; one
            # that streamed is never repeated (docs/design.md#guarantees, 2, as the user sees it).
            final = done.final_answer
            rest = final[len(streamed):] if final.startswith(streamed) else final
            out += self._stream(("answer", done.turn_id, 0), "", rest, "answer")
        style = REASON_STYLE.get(done.reason, "turn.bad")
        mark = "✓" if style == "turn.ok" else "!"
        extra = (", no tools used" if not done.used_tools else "") + (", finish not ok" if not done.finish_ok else "")
        if done.partial:  # the answer was cut and could not be continued: say so, it is not finished
            return out + self._line(f"✂ turn {done.turn_id} {done.reason}: the answer was cut short{extra}", "turn.bad")
        cause = f" ({done.error})" if done.error else ""   # provider_error: what the provider said
        return out + self._line(f"{mark} turn {done.turn_id} {done.reason}{cause}{extra}", style)

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


def render_all(items: Iterable[Shown]) -> str:
    """Plain text of what the transcript would print for `items` (tests, logs)."""
    transcript = Transcript()
    return "".join(text for item in items for text, _ in transcript.segments(item))


# ---------------------------------------------------------------------------------------------
# The shell: a connection, stdin, consoles.


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
        chat: Chat,
        url: str,
        *,
        token: str | None = None,
        message: str | None = None,
        out: Console | None = None,
        err: Console | None = None,
        backoff: Backoff | None = None,
        give_up_after_s: float = 120.0,
        last: LastConversations | None = None,
    ) -> None:
        self.chat = chat
        self.last = last
        self.url = url
        self.token = token
        self.message = message
        self.out = out or Console(highlight=False, soft_wrap=True, emoji=False, markup=False)
        self.err = err or Console(stderr=True, highlight=False, soft_wrap=True, emoji=False, markup=False)
        self.backoff = backoff or Backoff()
        self.give_up_after_s = give_up_after_s
        self.transcript = Transcript(mine=chat.mine)
        self.interactive = message is None
        self._stdin: _StdinReader | None = None
        self._result: int | None = None

    async def run(self) -> int:
        self._stdin = _StdinReader(asyncio.get_running_loop())
        if self.interactive:
            self._stdin.start()
            self._draw(Step([Info(HELP)]))
        else:
            assert self.message is not None
            self.chat.send_message(self.message, await_turn=True)  # goes out once the open is acked
        connection = Connection(self.chat.session, self.url, token=self.token, backoff=self.backoff,
                                give_up_after_s=self.give_up_after_s)
        try:
            async with connection:
                inputs = asyncio.create_task(self._pump_input(connection))
                try:
                    return await self._read(connection)
                finally:
                    inputs.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await inputs
        finally:
            for text, _ in self.transcript.close():
                self.out.print(text, end="")

    async def _read(self, connection: Connection) -> int:
        async for item in connection:
            step = self.chat.on_output(item)
            if step.save is not None:
                step.shown.append(write_export(step.save))
            self._draw(step)
            if isinstance(item, Opened | Deleted):
                self._keep_last(item)
            if step.fatal:
                self._status(f"giving up: {step.fatal}")
                return EXIT_FATAL
            if step.done and not self.interactive:
                assert self.chat.awaited_end is not None
                return turn_exit_code(self.chat.awaited_end)
        return self._result if self._result is not None else 0  # ended by /quit or Ctrl-D

    def _keep_last(self, item: Opened | Deleted) -> None:
        """What `--resume` continues on this URL: the conversation just opened; nothing once it is deleted."""
        if self.last is None:
            return
        try:
            if isinstance(item, Opened):
                self.last.remember(self.url, item.conversation_id)
            else:
                self.last.forget(self.url, item.conversation_id)
        except OSError as exc:
            self._status(f"cannot remember the conversation for --resume in {self.last.path}: {exc.strerror or exc}")

    async def _pump_input(self, connection: Connection) -> None:
        assert self._stdin is not None
        while True:
            line = await self._stdin.queue.get()
            if line is None:
                if self.interactive:  # Ctrl-D ends the session
                    self._result = 0
                    await connection.close()
                    return
                self._status("stdin closed: the question stays unanswered until it times out")
                return
            self.transcript.at_line_start = True  # the terminal echoed the Enter
            step = self.chat.user_input(line)
            self._draw(step)
            await connection.flush()
            if step.quit:
                self._result = 0
                await connection.close()
                return

    # -- output -----------------------------------------------------------------------------------

    def _draw(self, step: Step) -> None:
        for item in step.shown:
            if isinstance(item, Status):
                self._status(item.text)
                continue
            for text, style in self.transcript.segments(item):
                self.out.print(Text(text, style=STYLES.get(style, style)), end="")
            if isinstance(item, Event) and isinstance(item.data, AskUser) and self._stdin is not None:
                self._stdin.start()  # --message mode reads stdin only to answer a question
        if step.shown:
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


def run_chat(
    url: str = DEFAULT_URL,
    *,
    token: str | None = None,
    conversation_id: str | None = None,
    message: str | None = None,
    agent: str | None = None,
    mode: Mode | str | None = None,
    give_up_after_s: float = 120.0,
    resume: bool = False,
    last: LastConversations | None = None,
) -> int:
    """Entry point of `reactgate chat`; returns the exit code (0; 1 when `message`'s turn failed,
    see `turn_exit_code`; 2 on a fatal error or nothing to resume; 130 on Ctrl-C). `resume`: continue
    the last conversation `last` remembers for `url`."""
    if resume:
        conversation_id = last.get(url) if last is not None else None
        if conversation_id is None:
            where = f" ({last.path})" if last is not None else ""
            print(f"reactgate chat: no conversation to resume on {url}{where}: start one with reactgate chat",
                  file=sys.stderr)
            return EXIT_FATAL
    chat = Chat(ClientSession(conversation_id, agent=agent, mode=mode))
    shell = ChatShell(chat, url, token=token, message=message, give_up_after_s=give_up_after_s, last=last)
    try:
        return asyncio.run(shell.run())
    except KeyboardInterrupt:
        if chat.session.conversation_id is not None:
            print(f"\n[chat] {come_back(url, chat.session.conversation_id, DEFAULT_URL)}", file=sys.stderr)
        return EXIT_INTERRUPTED
