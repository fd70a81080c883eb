"""Quotas: what one caller may use, as one table, sans-I/O (docs/design.md#quotas).

`QUOTAS` is the policy: each (quota, scope) with its window, the setting that sets its limit
(`REACTGATE_<SETTING>`), where its counter lives and which shell refuses. Everything here is pure:
the charges a request takes, the refusal a refused charge becomes, the window a counter belongs to
and when it resets, all from an explicit `now`, so window edges are tested on a hand-driven clock.
The shells are thin: `actors/hosting/meter.py` runs these charges against the store's
`quota_counters` (shared by every gateway and host, durable), `actors/turn.py` admits tool calls,
and `gateway/server.py` counts connections.

Why the counters live where they do:
- conversations, turns and tokens are counted in the store, because every gateway and every host
  charges the same caller, and a counter must outlive the process that charged it;
- tool calls per turn belong to one turn: the count rides in the turn's checkpoint, which is durable
  before any tool runs (docs/design.md#recovery);
- connections are a replica's own sockets: counted in that replica's memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Final, NamedTuple, Protocol


class Quota(StrEnum):
    OPEN_CONVERSATIONS = "open_conversations"
    CONCURRENT_TURNS = "concurrent_turns"
    TURNS_PER_MINUTE = "turns_per_minute"
    TOKENS_PER_DAY = "tokens_per_day"
    TOOL_CALLS_PER_TURN = "tool_calls_per_turn"
    CONNECTIONS = "connections"


class Scope(StrEnum):
    USER = "user"                  # one caller: tenant + sub of the token
    TENANT = "tenant"              # every user of a tenant together
    TURN = "turn"                  # one turn of one conversation
    IP = "ip"                      # one client address, as the gateway sees the socket
    CONVERSATION = "conversation"  # not a quota's scope: the lease row of a running conversation


class Keeper(StrEnum):
    """Where a quota's counter lives."""

    STORE = "store"        # `quota_counters`: shared by every gateway and host, survives restarts
    TURN = "turn"          # the turn's checkpoint (`TurnProgress.tool_calls`)
    REPLICA = "replica"    # the gateway replica's memory (its own sockets)


class Charged(StrEnum):
    """When the counter moves, and so what a refusal means."""

    BEFORE = "before"      # charged atomically with the check: a refused request is not counted
    AFTER = "after"        # counted after the fact (model tokens); the next request is refused once over


@dataclass(frozen=True, slots=True)
class QuotaRule:
    window_s: int | None   # fixed window (epoch-aligned, UTC); None: held while it lasts, freed when it ends
    setting: str           # the gateway setting that sets the limit; 0 there means no limit
    keeper: Keeper
    charged: Charged
    enforced_by: str       # the shell that refuses


MINUTE: Final = 60
DAY: Final = 86_400

# The policy. Tests pin every cell literally (tests/test_quotas.py).
QUOTAS: Final[Mapping[tuple[Quota, Scope], QuotaRule]] = {
    (Quota.OPEN_CONVERSATIONS, Scope.USER): QuotaRule(
        None, "quota_open_conversations_per_user", Keeper.STORE, Charged.BEFORE, "actors/hosting/owners.py"),
    (Quota.OPEN_CONVERSATIONS, Scope.TENANT): QuotaRule(
        None, "quota_open_conversations_per_tenant", Keeper.STORE, Charged.BEFORE, "actors/hosting/owners.py"),
    (Quota.CONCURRENT_TURNS, Scope.USER): QuotaRule(
        None, "quota_concurrent_turns_per_user", Keeper.STORE, Charged.BEFORE, "actors/hosting/host.py"),
    (Quota.CONCURRENT_TURNS, Scope.TENANT): QuotaRule(
        None, "quota_concurrent_turns_per_tenant", Keeper.STORE, Charged.BEFORE, "actors/hosting/host.py"),
    (Quota.TURNS_PER_MINUTE, Scope.USER): QuotaRule(
        MINUTE, "quota_turns_per_minute_per_user", Keeper.STORE, Charged.BEFORE, "actors/hosting/host.py"),
    (Quota.TURNS_PER_MINUTE, Scope.TENANT): QuotaRule(
        MINUTE, "quota_turns_per_minute_per_tenant", Keeper.STORE, Charged.BEFORE, "actors/hosting/host.py"),
    (Quota.TOKENS_PER_DAY, Scope.USER): QuotaRule(
        DAY, "quota_tokens_per_day_per_user", Keeper.STORE, Charged.AFTER, "actors/hosting/host.py"),
    (Quota.TOKENS_PER_DAY, Scope.TENANT): QuotaRule(
        DAY, "quota_tokens_per_day_per_tenant", Keeper.STORE, Charged.AFTER, "actors/hosting/host.py"),
    (Quota.TOOL_CALLS_PER_TURN, Scope.TURN): QuotaRule(
        None, "quota_tool_calls_per_turn", Keeper.TURN, Charged.BEFORE, "actors/turn.py"),
    (Quota.CONNECTIONS, Scope.IP): QuotaRule(
        None, "quota_connections_per_ip", Keeper.REPLICA, Charged.BEFORE, "gateway/server.py"),
    (Quota.CONNECTIONS, Scope.USER): QuotaRule(
        None, "quota_connections_per_user", Keeper.REPLICA, Charged.BEFORE, "gateway/server.py"),
}  # fmt: skip

# A provider that reports no usage is charged by characters: prompt and completion, 4 per token.
CHARS_PER_TOKEN: Final = 4
# Windowed counters older than this are pruned (the longest window is a day).
KEEP_WINDOWS_S: Final = 2 * DAY


class Caller(Protocol):
    """Who is charged: an `Owner` (`actors.identity`) fits."""

    @property
    def tenant(self) -> str: ...
    @property
    def sub(self) -> str: ...


# -- limits: from the settings, at the edge ------------------------------------------------------


@dataclass(frozen=True)
class QuotaLimits:
    """The limit of each (quota, scope); absent or 0 means no limit (the counter still counts).
    Built by the edge from its configuration (the gateway's `quota_limits`, from the settings its
    rules name) and handed to the hosts and backends."""

    values: Mapping[tuple[Quota, Scope], int] = field(default_factory=dict)

    def limit(self, quota: Quota, scope: Scope) -> int | None:
        value = self.values.get((quota, scope), 0)
        return value if value > 0 else None

    @property
    def limits_tokens(self) -> bool:
        """Whether a token quota can refuse anything: only then is exact usage worth asking for."""
        return any(self.limit(Quota.TOKENS_PER_DAY, scope) is not None for scope in (Scope.USER, Scope.TENANT))


# -- counters and charges: what the store keeps ----------------------------------------------------


class QuotaCounter(NamedTuple):
    """One row of `quota_counters`. A gauge (no window) has window_start 0."""

    scope: str
    key: str
    quota: str
    window_start: int


class QuotaCharge(NamedTuple):
    counter: QuotaCounter
    amount: int
    limit: int | None = None    # None: counted whatever the total


class TenantUsage(NamedTuple):
    """A tenant's counter in its current window (what /metrics exports)."""

    tenant: str
    quota: str
    used: int


def window_start(window_s: int | None, now: float) -> int:
    return 0 if window_s is None else int(now // window_s) * window_s


def resets_at(window_s: int | None, now: float) -> float | None:
    """When the window holding `now` ends; None for a gauge (it frees up as what it counts ends)."""
    return None if window_s is None else float(window_start(window_s, now) + window_s)


def scope_key(scope: Scope, who: Caller) -> str:
    """The counter key of `who` in `scope`. A user's key is unambiguous whatever the claims hold."""
    if scope is Scope.TENANT:
        return who.tenant
    return f"{len(who.tenant)}:{who.tenant}:{who.sub}"


def counter(quota: Quota, scope: Scope, who: Caller, now: float) -> QuotaCounter:
    rule = QUOTAS[quota, scope]
    return QuotaCounter(scope.value, scope_key(scope, who), quota.value, window_start(rule.window_s, now))


def _charges(limits: QuotaLimits, quota: Quota, who: Caller, now: float, amount: int = 1) -> list[QuotaCharge]:
    # The user's counter before the tenant's: a refusal names the narrowest scope it hit.
    return [QuotaCharge(counter(quota, scope, who, now), amount, limits.limit(quota, scope))
            for scope in (Scope.USER, Scope.TENANT)]


def open_charges(limits: QuotaLimits, who: Caller) -> list[QuotaCharge]:
    """Creating a conversation (`open` without an id)."""
    return _charges(limits, Quota.OPEN_CONVERSATIONS, who, 0.0)


def turn_charges(limits: QuotaLimits, who: Caller, now: float) -> list[QuotaCharge]:
    """A message that will start a turn (now, or after the running one)."""
    return _charges(limits, Quota.TURNS_PER_MINUTE, who, now)


def slot_lease(conversation_id: str) -> QuotaCounter:
    """The row that says a conversation holds a concurrent-turn slot: taken when it gets busy, dropped
    when it is idle again. It makes a release happen once, whoever releases and however often."""
    return QuotaCounter(Scope.CONVERSATION.value, conversation_id, Quota.CONCURRENT_TURNS.value, 0)


def slot_charges(limits: QuotaLimits, who: Caller, conversation_id: str) -> list[QuotaCharge]:
    """A conversation that gets busy (a turn starts, follow-ups may queue behind it): one slot until
    it is idle again. The lease comes first; refused, it means the slot is already held."""
    return [QuotaCharge(slot_lease(conversation_id), 1, 1), *_charges(limits, Quota.CONCURRENT_TURNS, who, 0.0)]


def slot_release(who: Caller, conversation_id: str) -> tuple[QuotaCounter, list[QuotaCharge]]:
    """(the lease, what its release gives back)."""
    return slot_lease(conversation_id), _charges(QuotaLimits(), Quota.CONCURRENT_TURNS, who, 0.0)


def token_charges(who: Caller, tokens: int, now: float) -> list[QuotaCharge]:
    """Tokens a model call used: counted whatever the total (Charged.AFTER)."""
    return _charges(QuotaLimits(), Quota.TOKENS_PER_DAY, who, now, tokens)


def token_counters(who: Caller, now: float) -> list[QuotaCounter]:
    return [counter(Quota.TOKENS_PER_DAY, scope, who, now) for scope in (Scope.USER, Scope.TENANT)]


def tokens_refusal(limits: QuotaLimits, who: Caller, used: Sequence[int], now: float) -> QuotaExceeded | None:
    """Before a turn: refused once today's tokens (`used`, per `token_counters`) reached a limit."""
    for scope, count in zip((Scope.USER, Scope.TENANT), used, strict=True):
        limit = limits.limit(Quota.TOKENS_PER_DAY, scope)
        if limit is not None and count >= limit:
            return QuotaExceeded(Quota.TOKENS_PER_DAY, scope, limit, resets_at(DAY, now))
    return None


def refusal(charge: QuotaCharge, now: float) -> QuotaExceeded:
    """The refusal a refused charge is (the store names the charge)."""
    quota, scope = Quota(charge.counter.quota), Scope(charge.counter.scope)
    return QuotaExceeded(quota, scope, charge.limit or 0, resets_at(QUOTAS[quota, scope].window_s, now))


def estimate_tokens(chars: int) -> int:
    return -(-chars // CHARS_PER_TOKEN)


def admitted_tool_calls(used: int, requested: int, limit: int | None) -> int:
    """How many of `requested` calls a turn that already ran `used` may still run."""
    return requested if limit is None else max(0, min(requested, limit - used))


def tool_calls_refusal_detail(limit: int) -> dict[str, object]:
    """The failed observation's detail for a call over the turn's tool calls (the model reads it)."""
    return {"quota": Quota.TOOL_CALLS_PER_TURN.value, "limit": limit,
            "message": f"this turn already ran its {limit} tool calls: answer with what you have"}


def connection_refusal(limits: QuotaLimits, from_ip: int, from_user: int) -> QuotaExceeded | None:
    """A new connection, given how many this replica already holds from its address and its user."""
    for scope, held in ((Scope.IP, from_ip), (Scope.USER, from_user)):
        limit = limits.limit(Quota.CONNECTIONS, scope)
        if limit is not None and held >= limit:
            return QuotaExceeded(Quota.CONNECTIONS, scope, limit)
    return None


def usage_since(now: float) -> int:
    """The oldest window start a current tenant counter can have."""
    return min(window_start(rule.window_s, now) for (_, scope), rule in QUOTAS.items()
               if scope is Scope.TENANT and rule.window_s is not None)


def current_usage(rows: Iterable[tuple[str, str, int, int]], now: float) -> list[TenantUsage]:
    """Tenant counters (key, quota, window_start, used) still in their current window."""
    windows = {quota.value: rule.window_s for (quota, scope), rule in QUOTAS.items() if scope is Scope.TENANT}
    return sorted(TenantUsage(key, quota, int(used)) for key, quota, start, used in rows
                  if quota in windows and start == window_start(windows[quota], now))


# -- the refusal ------------------------------------------------------------------------------


def iso(ts: float) -> str:
    """`resets_at` on the wire: UTC, whole seconds (windows are epoch-aligned)."""
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class QuotaExceeded(Exception):
    """A request over a quota: the gateway sends `error quota_exceeded` naming the quota, its scope and,
    for a windowed quota, when it resets (docs/wire-protocol.md#5-error-codes). Picklable: on Ray it is
    raised on a host and re-raised in the gateway."""

    def __init__(self, quota: str, scope: str, limit: int, resets_at: float | None = None) -> None:
        super().__init__(quota, scope, limit, resets_at)
        self.quota = Quota(quota)
        self.scope = Scope(scope)
        self.limit = limit
        self.resets_at = resets_at

    @property
    def resets_at_iso(self) -> str | None:
        return None if self.resets_at is None else iso(self.resets_at)

    @property
    def message(self) -> str:
        head = f"quota exceeded: {self.quota} per {self.scope} (limit {self.limit})"
        if self.resets_at is not None:
            return f"{head}; resets at {iso(self.resets_at)}"
        return f"{head}; frees up as {_FREED_BY[self.quota]}"

    def __str__(self) -> str:
        return self.message


_FREED_BY: Final[Mapping[Quota, str]] = {
    Quota.OPEN_CONVERSATIONS: "conversations are deleted",
    Quota.CONCURRENT_TURNS: "running turns end",
    Quota.TOOL_CALLS_PER_TURN: "the turn ends",
    Quota.CONNECTIONS: "connections close",
    Quota.TURNS_PER_MINUTE: "the window ends",
    Quota.TOKENS_PER_DAY: "the window ends",
}
