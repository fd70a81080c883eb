"""The durable event: what a client can see of a conversation (SPEC §6).

`seq` is per conversation, strictly increasing by 1 and never reused; the event id is
`conversation_id/seq`. An event reaches a client only after the store made it durable.
"""

from __future__ import annotations

from typing import Any

import msgspec


class Event(msgspec.Struct, frozen=True, kw_only=True):
    conversation_id: str
    seq: int
    event: str                 # e.g. "thinking.delta", "turn.completed"
    data: dict[str, Any]
    ts: float                  # unix seconds, set when the event was made

    @property
    def event_id(self) -> str:
        return f"{self.conversation_id}/{self.seq}"
