"""Asking a model to go on with a cut response (docs/design.md#continuation).

The turn machine decides *whether* a round is continued (`actors/turn_machine.py`, `CONTINUATION`);
this module is *how*: the messages that ask for it, the response rebuilt after a crash, and the
check that a continuation really continues. Whatever the cut, the continuation's deltas go into
the same round engine, so gates and emitted characters behave as if the stream had never broken.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from protocol.actions import call_tool_action
from protocol.channels import Channel, render, render_action, render_open_answer
from protocol.events import ToolCalled
from protocol.prefix import OPENING

CONTINUE_PROMPT: Final = (
    "[continue] Your previous response was cut at the length limit. Continue exactly where it stopped, "
    "without repeating anything."
)
CUT_PROMPT: Final = (
    "[continue] Your previous response was cut off by a connection failure, not by you. Continue exactly "
    "where it stopped, from the next character, without repeating anything and without starting over."
)

# How many characters of a continuation are held back to tell a continuation from a restart.
PROBE_CHARS: Final = 24


def continue_messages(base: list[dict[str, Any]], raw: str, prompt: str) -> list[dict[str, Any]]:
    """The messages that ask for a continuation: the decision's context, the text so far, the ask."""
    return [*base, {"role": "assistant", "content": raw}, {"role": "user", "content": prompt}]


def rebuilt_response(thinking: str, announced: Sequence[ToolCalled], answer: str) -> str:
    """A round a crash cut mid-answer, as the durable events tell it: the thinking, the calls
    announced, and an answer action open right after the last character the user saw."""
    parts = [render(Channel.THINKING, thinking)]
    parts += [render_action(call_tool_action(call.tool_id, call.params)) for call in announced]
    parts.append(render_open_answer(answer))
    return "".join(parts)


class RestartCheck:
    """Does a continuation continue?

    A model asked to continue a cut response sometimes starts over instead. Fed into the round's
    decoder, a restart would land inside the answer string and reach the user as answer text. The
    continuation's first characters are held back until they show which it is: a restart opens a
    new response (`opening`: `<channel:thinking>` in the channel protocol, none natively) or repeats
    the answer from its beginning. `trim`: the whitespace a prefill had to leave off the answer so
    far (docs/design.md#native); the continuation's own copy of it is dropped, never shown twice.
    """

    __slots__ = ("_held", "_opening", "_probe", "_trim", "decided")

    def __init__(self, answer_so_far: str, *, opening: str | None = OPENING, trim: str = "") -> None:
        self._probe = answer_so_far.lstrip()[:PROBE_CHARS]
        self._opening = opening or ""
        self._trim = trim
        self._held = ""
        self.decided = False

    def admit(self, delta: str) -> str | None:
        """The text to feed now ("" while held); None: the continuation restarted."""
        if self.decided:
            return delta
        self._held += delta
        head = self._held.lstrip()
        if len(head) < PROBE_CHARS and ((self._opening and self._opening.startswith(head))
                                        or self._probe.startswith(head)):
            return ""  # still undecided
        return self._decide(head)

    def finish(self) -> str | None:
        """End of the continuation's stream: release (or refuse) what is still held."""
        return "" if self.decided else self._decide(self._held.lstrip())

    def _decide(self, head: str) -> str | None:
        self.decided = True
        opening = self._opening
        if head and ((opening and head.startswith(opening[: len(head)]))
                     or (len(self._probe) >= PROBE_CHARS and head.startswith(self._probe))):
            return None
        held, self._held = self._held, ""
        if self._trim:
            kept = held.lstrip()
            dropped = held[: len(held) - len(kept)]
            if self._trim.startswith(dropped) or dropped.startswith(self._trim):
                held = held[min(len(dropped), len(self._trim)):]
        return held
