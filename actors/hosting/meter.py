"""The quota shell over the store (docs/design.md#quotas): runs the charges `actors/quotas.py` plans
against `quota_counters`, and turns a refused one into `QuotaExceeded`.

Both backends use it where a quota cannot be bypassed: `Owners` (both backends check ownership
there) charges a new conversation; `HostCore` (the one host core of both backends) admits turns,
holds a running conversation's concurrent-turn slot and charges the tokens its model calls used.
The counters are the store's, so every gateway and every host charges the same ones, and they
survive any restart.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from actors import quotas
from actors.quotas import Caller, QuotaCharge, QuotaExceeded, QuotaLimits, TenantUsage
from actors.store import Store


class Meter:
    def __init__(self, store: Store, limits: QuotaLimits, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.limits = limits
        self.clock = clock

    async def _charge(self, charges: list[QuotaCharge]) -> None:
        refused = await self.store.charge_quota(charges)
        if refused is not None:
            raise quotas.refusal(charges[refused], self.clock())

    # -- conversations ------------------------------------------------------------------------

    async def open_conversation(self, who: Caller) -> None:
        """Before creating a conversation. Raises QuotaExceeded."""
        await self._charge(quotas.open_charges(self.limits, who))

    async def conversation_gone(self, who: Caller, conversation_id: str) -> None:
        """A conversation that will never run again (deleted, or never created after its charge): its
        open-conversation charge and any slot it held are given back."""
        await self.release_slot(who, conversation_id)
        await self.store.release_quota(None, quotas.open_charges(self.limits, who))

    # -- turns --------------------------------------------------------------------------------

    async def admit_turn(self, who: Caller) -> list[QuotaCharge]:
        """A message that will start a turn: refused once today's tokens reached a limit, or over the
        turns per minute (then not counted). Returns the charges, for `refund`."""
        now = self.clock()
        if self.limits.limits_tokens:
            used = await self.store.quota_counts(quotas.token_counters(who, now))
            over = quotas.tokens_refusal(self.limits, who, used, now)
            if over is not None:
                raise over
        charges = quotas.turn_charges(self.limits, who, now)
        await self._charge(charges)
        return charges

    async def refund(self, charges: list[QuotaCharge]) -> None:
        await self.store.release_quota(None, charges)

    async def take_slot(self, who: Caller, conversation_id: str) -> None:
        """The conversation gets busy: one concurrent-turn slot until it is idle again. A slot it already
        holds (its lease row exists: say, taken before a crash) is kept, not charged twice."""
        charges = quotas.slot_charges(self.limits, who, conversation_id)
        refused = await self.store.charge_quota(charges)
        if refused is not None and refused != 0:
            raise quotas.refusal(charges[refused], self.clock())

    async def release_slot(self, who: Caller, conversation_id: str) -> bool:
        """The conversation is idle: give its slot back (once, whoever asks and however often)."""
        lease, releases = quotas.slot_release(who, conversation_id)
        return await self.store.release_quota(lease, releases)

    async def holds_slot(self, conversation_id: str) -> bool:
        return (await self.store.quota_counts([quotas.slot_lease(conversation_id)]))[0] > 0

    # -- tokens -------------------------------------------------------------------------------

    async def charge_tokens(self, who: Caller, tokens: int) -> None:
        """What a model call used: counted whatever the total; the next turn is refused once over."""
        if tokens > 0:
            await self.store.charge_quota(quotas.token_charges(who, tokens, self.clock()))

    # -- operators ----------------------------------------------------------------------------

    async def tenant_usage(self) -> list[TenantUsage]:
        """Every tenant's counters in their current window (/metrics)."""
        now = self.clock()
        rows = await self.store.quota_rows(quotas.Scope.TENANT.value, quotas.usage_since(now))
        return quotas.current_usage(rows, now)

    async def prune(self) -> int:
        """Drop windows long over (the host's hourly housekeeping)."""
        return await self.store.prune_quota(int(self.clock() - quotas.KEEP_WINDOWS_S))


__all__ = ["Meter", "QuotaExceeded"]
