"""Server-sent events, framed: bytes in, whole events out — no socket, no event loop.

The fast path reads a provider's stream as SSE (docs/design.md#model-settings): an event ends at a
blank line; lines end with `\\n`, `\\r\\n` or `\\r`; a line starting with `:` is a comment, which
providers send as keep-alives. `SSEFrames` only cuts the bytes of successive reads into event blocks,
holding the unfinished rest until the next read; `fields` reads one block's `event:` and `data:`
lines. The wire decoders (`openai_wire.py`, `anthropic_wire.py`) recognise their wire's usual
one-line shape in a block directly and call `fields` for anything else: on the hot path, one split
per read and one JSON decode per event.
"""

from __future__ import annotations

from typing import Final

MAX_EVENT_BYTES: Final = 8 << 20    # a provider that never ends an event does not grow us forever
OVERSIZED: Final = f"an event of the stream exceeds {MAX_EVENT_BYTES} bytes"


class SSEFrames:
    """Whole event blocks from successive reads, each without its terminating blank line."""

    def __init__(self) -> None:
        self._tail = b""
        self.oversized = False    # an unfinished event outgrew MAX_EVENT_BYTES and was dropped

    def feed(self, data: bytes) -> list[bytes]:
        """The events `data` completes (with what earlier reads left over), in order; the rest waits."""
        if self._tail:
            data = self._tail + data
        if 13 in data:   # b"\r" (an int: a plain memchr)
            cr = b""
            if data.endswith(b"\r"):   # maybe the first half of a CRLF: decide when the rest arrives
                data, cr = data[:-1], b"\r"
            blocks = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n\n")
            self._tail = blocks.pop() + cr
        else:
            blocks = data.split(b"\n\n")
            self._tail = blocks.pop()
        if len(self._tail) > MAX_EVENT_BYTES:
            self._tail = b""
            self.oversized = True
        return blocks


def fields(block: bytes) -> tuple[bytes, bytes] | None:
    """One event block's name (`event:`, empty when absent) and data (its `data:` lines joined by
    `\\n`); None for a block without data — comments only, a keep-alive."""
    name = b""
    data: list[bytes] = []
    for line in block.split(b"\n"):
        if not line or line[:1] == b":":
            continue
        field, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if field == b"data":
            data.append(value)
        elif field == b"event":
            name = value
    return (name, b"\n".join(data)) if data else None
