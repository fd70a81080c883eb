"""The hosting interface: how the gateway reaches conversations, whatever hosts them.

Both backends implement it — `local` (in-process, `actors/hosting/local.py`) and `ray`
(ConversationHosts, `actors/ray/backend.py`) — so the gateway and the scenario tests are written
once (docs/design.md#hosting).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal, Protocol

from protocol.events import Event
from protocol.frames import Mode


@dataclass(frozen=True, slots=True)
class Owner:
    """Who may open, watch and write to a conversation: `sub` + `tenant` of the JWT."""

    tenant: str
    sub: str


class Forbidden(Exception):
    """The caller does not own the conversation — raised whether or not it exists."""


class UnknownAgent(Exception):
    """`open` named an agent profile the server does not serve."""


class UnknownAsk(Exception):
    """`answer` named an ask_id with no question waiting: already answered, timed out, or never asked."""


@dataclass(frozen=True, slots=True)
class Opened:
    conversation_id: str
    last_seq: int


@dataclass(frozen=True, slots=True)
class UserMessage:
    id: str
    text: str


@dataclass(frozen=True, slots=True)
class Steer:
    id: str
    text: str


@dataclass(frozen=True, slots=True)
class Answer:
    id: str
    ask_id: str
    answer: str


@dataclass(frozen=True, slots=True)
class SetMode:
    id: str
    mode: Mode


@dataclass(frozen=True, slots=True)
class Cancel:
    id: str


Command = UserMessage | Steer | Answer | SetMode | Cancel
AckStatus = Literal["accepted", "duplicate"]


class Backend(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def open(
        self, owner: Owner, conversation_id: str | None, agent: str | None, mode: str | None
    ) -> Opened:
        """Create (no id) or re-open (id the caller owns) a conversation. Raises Forbidden, UnknownAgent."""
        ...

    async def command(self, owner: Owner, conversation_id: str, command: Command) -> AckStatus:
        """Deliver a client command to the conversation's mailbox. `user_message`, `steer` and `answer`
        are idempotent by (conversation_id, command.id): a repeat returns "duplicate" and does nothing.
        Raises Forbidden."""
        ...

    def subscribe(self, owner: Owner, conversation_id: str, after_seq: int) -> AsyncIterator[list[Event]]:
        """Every durable event with seq > after_seq in order, then live ones, in batches.
        Raises Forbidden on first iteration if the caller does not own the conversation."""
        ...
