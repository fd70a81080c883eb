"""The prefix policy (docs/design.md#prefix-policy): a response must open with `<channel:thinking>`.

Checked on each raw delta *before* the channel parser sees it. The first delta after which the
text received so far (leading whitespace ignored) is neither a prefix of the opening tag nor
starts with it aborts the generation: nothing of it reaches a lane and no action runs.
"""

from __future__ import annotations

from typing import Final

from protocol.channels import Channel, open_tag

OPENING: Final = open_tag(Channel.THINKING)
PREVIEW_CHARS: Final = 200


class PrefixPolicy:
    __slots__ = ("_head", "settled", "violated")

    def __init__(self) -> None:
        self._head = ""          # text received so far, leading whitespace stripped, while unsettled
        self.settled = False     # the opening tag has fully arrived: nothing more to check
        self.violated = False

    def admit(self, delta: str) -> bool:
        """True when the text so far is still acceptable; False aborts the generation."""
        if self.settled:
            return True
        if self.violated:
            return False
        head = (self._head + delta).lstrip() if not self._head else self._head + delta
        self._head = head
        if head.startswith(OPENING):
            self.settled = True
            self._head = ""
            return True
        if OPENING.startswith(head):
            return True
        self.violated = True
        return False

    def preview(self) -> str:
        """The response up to and including the first character that made the opening impossible
        (at most PREVIEW_CHARS). It ends where the text went wrong, not where a delta happened to
        end, so the notice is the same however the response was chunked (docs/design.md#one-decoder)."""
        head = self._head
        if not self.violated:
            return head[:PREVIEW_CHARS]
        mismatch = next((i for i, (a, b) in enumerate(zip(head, OPENING, strict=False)) if a != b), len(OPENING))
        return head[: mismatch + 1][:PREVIEW_CHARS]
