"""The hosting interface: how the gateway reaches conversations, whatever hosts them.

Both backends implement it — `local` (in-process, `actors/hosting/local.py`) and `ray`
(ConversationHosts, `actors/ray/backend.py`) — so the gateway and the scenario tests are written
once (docs/design.md#hosting).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from actors.external_call import Access, ExternalCall, ExternalReply, ExternalView
from actors.hosting.subscription import Direct
from actors.identity import Caller, Owner
from actors.quotas import TenantUsage
from protocol.events import Event, ExternalClient
from protocol.frames import AgentList, ConversationPage, Mode


class Forbidden(Exception):
    """The caller does not own the conversation — raised whether or not it exists."""


class UnknownAgent(Exception):
    """`open` named an agent profile the server does not serve."""


class AgentNotServed(UnknownAgent):
    """The conversation's agent is not served here (docs/design.md#several-agents): its profile left
    the configuration. Its conversations answer `not_found` naming the agent until it comes back."""

    def __init__(self, agent: str, conversation_id: str) -> None:
        super().__init__(f"unknown agent {agent!r}: this conversation's agent is not served here")
        self.agent = agent
        self.conversation_id = conversation_id

    def __reduce__(self) -> tuple[type[AgentNotServed], tuple[str, str]]:
        return AgentNotServed, (self.agent, self.conversation_id)  # raised on a host, re-raised here


class UnknownAsk(Exception):
    """`answer` named an ask_id with no question waiting: already answered, timed out, or never asked."""


class ConfigurationReplaced(Exception):
    """This gateway's configuration generation was replaced by a newer one (docs/design.md#generations):
    it must not serve any more (its store or profiles may not be the cluster's); its clients resume
    on a gateway of the current generation."""

    def __init__(self, mine: str, current: str | None, changed: Sequence[str] = ()) -> None:
        differs = f" (it differs in: {', '.join(changed)})" if changed else ""
        super().__init__(f"configuration generation {mine} was replaced by {current or 'a newer one'}{differs}; "
                         "start gateways with the current configuration")
        self.mine = mine
        self.current = current
        self.changed = tuple(changed)

    def __reduce__(self) -> tuple[type[ConfigurationReplaced], tuple[str, str | None, tuple[str, ...]]]:
        return ConfigurationReplaced, (self.mine, self.current, self.changed)  # raised in an actor, re-raised here


@dataclass(frozen=True, slots=True)
class Opened:
    conversation_id: str
    last_seq: int


@dataclass(frozen=True, slots=True)
class UserMessage:
    id: str
    text: str
    # The W3C context of the gateway's span for this command: the turn it starts joins that trace,
    # on whichever host runs it (docs/design.md#tracing). Empty when nothing is traced.
    trace: Mapping[str, str] = field(default_factory=dict, compare=False)
    caller: Caller | None = field(default=None, compare=False)  # what the turn's tools know of who calls


@dataclass(frozen=True, slots=True)
class Steer:
    id: str
    text: str
    trace: Mapping[str, str] = field(default_factory=dict, compare=False)  # as UserMessage's
    caller: Caller | None = field(default=None, compare=False)


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


@dataclass(frozen=True, slots=True)
class Export:
    """An export (docs/wire-protocol.md#export): its ack's status, the head it covers, and the log
    up to that head, page by page, exactly as subscribers got it."""

    status: AckStatus
    last_seq: int
    pages: AsyncIterator[list[Event]]


class Backend(Protocol):
    # The configuration generation this backend serves (docs/design.md#generations): shown on /readyz
    # and /metrics. None where nothing outlives the process (the local backend).
    generation: str | None
    # Set by the server before `start`; a backend whose generation is replaced calls it once.
    on_replaced: Callable[[ConfigurationReplaced], None] | None

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def open(
        self, owner: Owner, conversation_id: str | None, agent: str | None, mode: str | None,
        create_missing: bool = False,
    ) -> Opened:
        """Create (no id) or re-open (id the caller owns) a conversation; `create_missing`: an id of
        `owners.chat_conversation_id` is created on first use. Raises Forbidden, UnknownAgent."""
        ...

    async def command(self, owner: Owner, conversation_id: str, command: Command) -> AckStatus:
        """Deliver a client command to the conversation's mailbox. `user_message`, `steer` and `answer`
        are idempotent by (conversation_id, command.id): a repeat returns "duplicate" and does nothing.
        Raises Forbidden."""
        ...

    def subscribe(self, owner: Owner, conversation_id: str, after_seq: int,
                  direct: Direct | None = None) -> AsyncIterator[list[Event]]:
        """Every durable event with seq > after_seq in order, then live ones, in batches.
        Raises Forbidden on first iteration if the caller does not own the conversation.
        A deletion ends it with `conversation.deleted` (docs/design.md#deletion). `direct`: live
        batches handed over as they are published, when it takes them (actors/hosting/subscription.py)."""
        ...

    async def delete(self, owner: Owner, conversation_id: str, request_id: str) -> AckStatus:
        """Stop the conversation and delete everything kept of it (docs/design.md#deletion); its
        subscriptions end with `conversation.deleted`. Idempotent by (conversation_id, request_id): the
        delete that removed it, repeated by its owner, returns "duplicate". Raises Forbidden, also for
        a conversation another delete removed: a deleted conversation is nobody's."""
        ...

    async def export(self, owner: Owner, conversation_id: str, request_id: str) -> Export:
        """The conversation's log up to its head now. `request_id` is remembered like a command's id:
        a repeat is "duplicate", and is exported again. Raises Forbidden."""
        ...

    async def quota_usage(self) -> list[TenantUsage]:
        """Every tenant's quota counters in their current window, from the store (/metrics,
        docs/design.md#quotas). `open`, `command` and the hosts raise `actors.quotas.QuotaExceeded`."""
        ...

    def agents(self) -> AgentList:
        """The agents served and the default one (GET /agents, docs/design.md#several-agents)."""
        ...

    async def list_conversations(self, owner: Owner, limit: int, before: str | None) -> ConversationPage:
        """A page of `owner`'s own conversations, newest activity first, after the cursor `before`
        (docs/design.md#conversation-list). Raises protocol.frames.InvalidCursor."""
        ...

    async def external_call(self, owner: Owner, conversation_id: str, call: ExternalCall) -> ExternalReply:
        """An external client's call in the caller's conversation (docs/design.md#mcp-face), decided and
        run by the conversation under its agent's rules; returns once it is observed (or refused, or
        waits for an approval the client itself is to give). Raises Forbidden."""
        ...

    async def external_view(self, owner: Owner, conversation_id: str, session_id: str, client: ExternalClient,
                            access: Access | None) -> ExternalView:
        """The tools that session may call now in the caller's conversation. Raises Forbidden."""
        ...

    async def external_cancel(self, owner: Owner, conversation_id: str, call_id: str) -> bool:
        """Cancel an external call in flight: it observes `cancelled`. Raises Forbidden."""
        ...
