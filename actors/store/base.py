"""The durable store behind conversations: the interface every backend implements (docs/design.md#store).

A conversation is the single writer of its event log; the store makes that log durable and
protects the guarantees that survive crashes and re-activations:

- write-ahead rule (docs/design.md#write-ahead): `append_events` returns only once the events are durable, so no
  event reaches a client before it is;
- `seq` is never reused (docs/design.md#event-log): an append whose first seq is not `last_seq + 1` raises
  `SeqConflict`, checked inside the committing transaction, so two activations that ever raced
  cannot both write the same seq;
- idempotency keys (docs/wire-protocol.md#10-delivery-idempotency-resume-multiplexing) are checked and inserted atomically;
- a tool call whose result is durable is never executed again (docs/design.md#recovery): first write wins;
- a round's raw output commits with the append that completes the round (docs/design.md#replay);
- a deleted conversation leaves only a tombstone, and every later write for it is refused
  (docs/design.md#deletion);
- the conversation list is a keyset query over one index, per owner, never an offset
  (docs/design.md#conversation-list).

Every write goes through a group-commit queue (`GroupCommit`): concurrent writes of many
conversations share one transaction and one fsync, which is what makes one SQLite file carry many
conversations. Writes are committed in the order they were submitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, Protocol, TypeVar, runtime_checkable

import msgspec

from actors.identity import Owner
from actors.quotas import QuotaCharge, QuotaCounter
from protocol.events import Event, decode_data, encode_data
from protocol.frames import ConversationEntry, Cursor

# Idempotency keys are durable for at least 24 h; prune only what is older.
IDEMPOTENCY_TTL_S = 24 * 3600.0

DEFAULT_READ_LIMIT = 1000


class StoreError(Exception):
    """Base class of the store's own errors."""


class StoreClosed(StoreError):
    """The store is not open (never opened, or closed while the call was queued)."""


class SeqConflict(StoreError):
    """An append did not continue the conversation's log: a gap, or a seq already used.

    Raised when the first seq of an append is not `last_seq + 1`, or the seqs of one append are not
    contiguous. Nothing of that append was written.
    """

    def __init__(self, conversation_id: str, seq: int, last_seq: int | None) -> None:
        self.conversation_id = conversation_id
        self.seq = seq
        self.last_seq = last_seq
        found = "a non-contiguous batch" if last_seq is None else f"last_seq {last_seq}"
        super().__init__(f"conversation {conversation_id!r}: seq {seq} does not follow {found}")


class ConversationExists(StoreError):
    """`create_conversation` named an id that already exists with another owner or agent, or that
    was deleted."""


class QuotaRefused(StoreError):
    """A quota charge one counter refused: the charge as a whole was not applied (`charge_quota`)."""

    def __init__(self, index: int) -> None:
        self.index = index
        super().__init__(f"quota charge {index} refused")


class StoreUnavailable(StoreError):
    """The store cannot take this call now — a failover, a restart, a network blip, a full disk, a
    lock held past its timeout — and may later: a pause, not a failure of the request
    (docs/design.md#store-outage). The caller may send it again after `retry_after_ms`; the
    client-facing error is `unavailable` (docs/wire-protocol.md#5-error-codes)."""

    def __init__(self, cause: str, retry_after_ms: int = 1000) -> None:
        self.cause = cause
        self.retry_after_ms = retry_after_ms
        super().__init__(f"the store is unavailable ({cause}): retry in {retry_after_ms} ms")

    def __reduce__(self) -> tuple[type[StoreUnavailable], tuple[str, int]]:  # raised across Ray
        return StoreUnavailable, (self.cause, self.retry_after_ms)


class Tombstoned(StoreError):
    """A write for a conversation that was deleted: nothing of it was written (docs/design.md#deletion)."""

    def __init__(self, conversation_id: str) -> None:
        self.conversation_id = conversation_id
        super().__init__(f"conversation {conversation_id!r} was deleted")


# Snapshots kept for a conversation under a key of their own: the tool pool's counters and workspace
# (actors/tools/pool.py). They are the conversation's, so they are deleted with it and refused after.
# A conversation id holds no "/".
TOOL_POOL_SCOPE: Final = "toolpool/"
SNAPSHOT_SCOPES: Final = (TOOL_POOL_SCOPE,)


def snapshot_keys(conversation_id: str) -> tuple[str, ...]:
    """Every snapshot key a conversation may have."""
    return (conversation_id, *(scope + conversation_id for scope in SNAPSHOT_SCOPES))


def snapshot_owner(key: str) -> str:
    """The conversation a snapshot key belongs to."""
    for scope in SNAPSHOT_SCOPES:
        if key.startswith(scope):
            return key[len(scope):]
    return key


class RoundOutput(msgspec.Struct, frozen=True, kw_only=True):
    """What the model wrote in one round, before any gate, and what the round ran under
    (docs/design.md#replay). Never shown to a client: it holds denied lanes and swallowed text.

    `raw` is every call of the round as the round's decoder saw it, continuations included;
    `models` the models whose deltas it holds, in order. `mode`, `agent_state` and `phase` are the
    round's, as its gates saw them: a mode is a user's setting no event records."""

    turn_id: str
    round: int
    raw: str
    models: tuple[str, ...] = ()
    mode: str = "agent"
    agent_state: str = "default"
    phase: str = "decision"


_MODELS_ENCODER: Final = msgspec.json.Encoder()
_MODELS_DECODER: Final = msgspec.json.Decoder(tuple[str, ...])


def output_row(conversation_id: str, seq: int, output: RoundOutput) -> tuple[str, str, int, int, bytes, str, str, str, str]:
    """A round output as the columns of `round_outputs`, committed with the append ending at `seq`.
    Whatever the model wrote is stored, a lone surrogate included: it must never fail the append."""
    return (conversation_id, output.turn_id, output.round, seq, output.raw.encode("utf-8", "surrogatepass"),
            _MODELS_ENCODER.encode(list(output.models)).decode(), output.mode, output.agent_state, output.phase)


def decode_output(turn_id: str, round_no: int, raw: bytes, models: str, mode: str, agent_state: str,
                  phase: str) -> RoundOutput:
    return RoundOutput(turn_id=turn_id, round=int(round_no), raw=bytes(raw).decode("utf-8", "surrogatepass"),
                       models=_MODELS_DECODER.decode(models), mode=mode, agent_state=agent_state, phase=phase)


@dataclass(frozen=True, slots=True)
class ListedConversation:
    """A row of the conversation list: whose it is, and what a list page shows of it."""

    owner: Owner
    entry: ConversationEntry


def listed(conversation_id: str, tenant: str, sub: str, agent: str, created_at: float, last_active_at: float,
           last_seq: int | None, title: str, running: int) -> ListedConversation:
    """A `list_conversations` row as the stores read it (`SQL.list_columns`)."""
    return ListedConversation(Owner(tenant=str(tenant), sub=str(sub)), ConversationEntry(
        conversation_id=str(conversation_id), agent=str(agent), created_at=float(created_at),
        last_active_at=float(last_active_at), last_seq=int(last_seq or 0), title=str(title), running=bool(running)))


@dataclass(slots=True)
class StoreStats:
    """Counters of the write path; `commits < writes` shows that group commit batched."""

    commits: int = 0            # transactions committed (one fsync each)
    writes: int = 0             # write operations committed (appends, snapshots, keys, ...)
    appends: int = 0            # append_events calls committed
    events: int = 0             # events appended
    largest_batch: int = 0      # most write operations in one commit
    # store outages (docs/design.md#store-outage; actors/store/outage.py)
    unavailable: int = 0        # failures raised as StoreUnavailable (a failed group commit counts once)
    outages: int = 0            # outages begun (one WARNING each)
    unavailable_seconds: float = 0.0  # how long the outages that ended lasted, summed
    reconnects: int = 0         # connections made again after an outage broke or spoiled one


@dataclass(frozen=True, slots=True)
class StoreHealth:
    """The store as its own calls last found it (`Store.health()`, docs/design.md#store-outage): `ok`,
    or since when (unix time) and why not. The cause is a few words fit for a client ("disk full",
    "connection lost"), never a DSN, a password or a path. While it is not ok the store looks by
    itself whether it is back (it probes), so this turns ok again without other traffic."""

    ok: bool
    since: float | None = None
    cause: str | None = None


@runtime_checkable
class Store(Protocol):
    """The async durable store. Bound to the event loop that opened it.

    Any call may raise StoreUnavailable: the store cannot take it now (a lost connection, a failover,
    a full disk, a lock held too long) and may later; the next call reconnects
    (docs/design.md#store-outage). A write that raised it may still have committed (its answer was
    lost), so a caller that repeats it must expect that: `remember_key` then answers False, a charge
    is made twice, and an append meets SeqConflict, which the event log recognises as its own
    (actors/eventlog.py)."""

    stats: StoreStats

    async def open(self) -> None:
        """Connect and create the schema if needed."""
        ...

    async def close(self) -> None:
        """Commit what is queued, then disconnect."""
        ...

    def health(self) -> StoreHealth:
        """Whether the store is in an outage now, since when and why (docs/design.md#store-outage)."""
        ...

    def counters(self) -> dict[str, float]:
        """The store's totals since it was made, for a metrics collector: its `StoreStats` and the
        retries of this process (`actors.store.outage.RETRY_STATS`), e.g. {"retried_batches": 3}."""
        ...

    async def create_conversation(
        self, conversation_id: str, owner: Owner, agent: str, created_at: float
    ) -> None:
        """Record a new conversation. Repeating the same creation is a no-op; the same id with
        another owner or agent raises ConversationExists."""
        ...

    async def conversation_owner(self, conversation_id: str) -> tuple[Owner, str] | None:
        """(owner, agent) of the conversation, or None when it does not exist."""
        ...

    # the conversation list (docs/design.md#conversation-list): a row per conversation, created with
    # it, kept up to date by its host, deleted with it

    async def note_activity(self, conversation_id: str, *, running: bool, at: float | None = None,
                            title: str = "") -> None:
        """The conversation's list row: whether a turn runs or is queued; `at`, when something
        happened (None: no activity, the time stays; it never moves back); `title`, kept only while
        the row has none. A conversation without a row (deleted) is left alone."""
        ...

    async def list_conversations(self, owner: Owner | None, limit: int, before: Cursor | None = None) -> list[ListedConversation]:
        """Up to `limit` conversations of `owner` (None: every owner's), most recently active first
        (ties: by id, descending), strictly after the position `before` in that order."""
        ...

    async def append_events(
        self, conversation_id: str, events: Sequence[Event], outputs: Sequence[RoundOutput] = ()
    ) -> None:
        """Append events with caller-assigned, contiguous seqs starting at last_seq + 1.
        Durable when it returns. Raises SeqConflict (nothing written) otherwise.

        `outputs`, the raw outputs of the rounds these events complete, commit in the same
        transaction, or not at all (docs/design.md#replay). They need events to ride with: an
        append of no events writes nothing. A round already stored keeps its first output."""
        ...

    async def read_events(
        self, conversation_id: str, after_seq: int, limit: int = DEFAULT_READ_LIMIT
    ) -> list[Event]:
        """Up to `limit` events with seq > after_seq, ordered by seq."""
        ...

    async def last_seq(self, conversation_id: str) -> int:
        """The highest appended seq, 0 when none."""
        ...

    async def save_snapshot(self, conversation_id: str, seq: int, data: bytes) -> None:
        """Store the conversation's serialized state as of `seq`. The snapshot with the highest seq
        wins (ties: the later save); an older one saved late, e.g. by a stale activation, is ignored."""
        ...

    async def load_snapshot(self, conversation_id: str) -> tuple[int, bytes] | None:
        """(seq, data) of the latest snapshot, or None."""
        ...

    async def remember_key(self, conversation_id: str, key: str, now: float) -> bool:
        """Atomically record a client idempotency key: True when new, False when already seen."""
        ...

    async def prune_keys(self, older_than: float) -> int:
        """Forget keys first seen before `older_than` (keep ≥ IDEMPOTENCY_TTL_S). Returns how many."""
        ...

    async def forget_key(self, conversation_id: str, key: str) -> None:
        """Forget one key: its command was refused (a quota) after the key was remembered."""
        ...

    async def record_tool_result(self, conversation_id: str, call_id: str, payload: bytes) -> bool:
        """Make a tool call's result durable. First write wins; returns whether this one was new."""
        ...

    async def tool_result(self, conversation_id: str, call_id: str) -> bytes | None:
        """The durable result of a tool call, or None if it never completed durably."""
        ...

    async def round_outputs(self, conversation_id: str) -> list[RoundOutput]:
        """Every stored round output of the conversation, in the order they were appended. A
        conversation recorded before outputs were stored has none (docs/design.md#replay)."""
        ...

    # quota counters (docs/design.md#quotas)

    async def charge_quota(self, charges: Sequence[QuotaCharge]) -> int | None:
        """Add each charge's amount to its counter, all or nothing, atomically across every process
        sharing the store. A charge with a limit applies only if its counter stays within it. Returns
        None when every charge applied, else the index of the first refused one (nothing applied)."""
        ...

    async def release_quota(self, holder: QuotaCounter | None, releases: Sequence[QuotaCharge]) -> bool:
        """Give back what charges took (never below 0). With a `holder` (a lease row) only if that row
        exists, which the release drops: a release then happens once however often it is asked for.
        Returns whether anything was given back."""
        ...

    async def quota_counts(self, counters: Sequence[QuotaCounter]) -> list[int]:
        """The counters' values, in order; 0 for a counter never charged."""
        ...

    async def quota_rows(self, scope: str, since: int) -> list[tuple[str, str, int, int]]:
        """(key, quota, window_start, used) of every counter of `scope` that is a gauge or whose window
        started at or after `since`."""
        ...

    async def prune_quota(self, older_than: int) -> int:
        """Drop windowed counters whose window started before `older_than`. Returns how many."""
        ...

    async def delete_conversation(self, conversation_id: str, request_key: str, now: float) -> bool:
        """Delete everything kept of the conversation — ownership, events, stream, snapshots (its
        scoped ones too), idempotency keys, tool results, round outputs — in one transaction, and
        leave a tombstone holding `request_key` (docs/design.md#deletion). Every write for it
        submitted later raises Tombstoned (`create_conversation`: ConversationExists).
        Returns False, having done nothing, when it was deleted before."""
        ...

    async def tombstone(self, conversation_id: str) -> str | None:
        """The request key of the delete that removed the conversation; None if it was never deleted."""
        ...


# -- helpers shared by the backends -------------------------------------------------------------

def encode_event_data(event: Event) -> bytes:
    return encode_data(event.data)


def decode_event(conversation_id: str, seq: int, name: str, data: bytes, ts: float) -> Event:
    """A stored event, typed by its kind: what a live subscriber got, field for field."""
    return Event(conversation_id=conversation_id, seq=seq, event=name, data=decode_data(name, data), ts=ts)


def check_append(conversation_id: str, events: Sequence[Event]) -> None:
    """Reject what no store state could make valid, before it reaches the writer."""
    for event in events:
        if event.conversation_id != conversation_id:
            raise ValueError(
                f"event {event.event_id} appended to conversation {conversation_id!r}"
            )
    first = events[0].seq
    for offset, event in enumerate(events):
        if event.seq != first + offset:
            raise SeqConflict(conversation_id, event.seq, None)


# -- group commit -------------------------------------------------------------------------------

OpT = TypeVar("OpT")


@dataclass(slots=True)
class Pending(Generic[OpT]):
    op: OpT
    future: asyncio.Future[Any]
    kind: str = "write"         # "append" counts into StoreStats.appends/events
    events: int = 0


@dataclass(slots=True)
class Outcome:
    """What one write op produced inside a batch: a value, or the exception to raise to its caller."""

    value: Any = None
    error: BaseException | None = None


def judge_appends(appends: Sequence[tuple[str, int, int]], deleted: Collection[str], heads: dict[str, int]) -> list[Outcome]:
    """The rule every store applies to appends (conversation, first seq, last seq), in submission
    order, inside the transaction that commits them, against the durable log: an append to a
    deleted conversation is refused (`Tombstoned`, docs/design.md#deletion), one that does not start
    at its stream's last seq + 1 too (`SeqConflict`: a seq is never reused, whatever a caller
    believes last_seq is). `heads`: each stream's last seq (absent: 0), moved by every accepted
    append, so a second append of a stream in the same batch is judged against the first."""
    outcomes: list[Outcome] = []
    for conversation_id, first, last in appends:
        head = heads.get(conversation_id, 0)
        if conversation_id in deleted:
            outcomes.append(Outcome(error=Tombstoned(conversation_id)))
        elif first != head + 1:
            outcomes.append(Outcome(error=SeqConflict(conversation_id, first, head)))
        else:
            heads[conversation_id] = last
            outcomes.append(Outcome())
    return outcomes


# How long after a commit began the next may wait, when only appends are queued (docs/design.md#store).
# A commit has a fixed cost (the fsync, the transaction, the hop to the writer and back); with tens of
# conversations streaming, appends come a few ms apart and each took a commit of its own (at N = 100,
# 19,433 commits for 35,340 chunks). Waiting up to 10 ms lets them share one: about -13% server CPU
# per chunk at 10-200 conversations, +5 ms delivery p50, +4-16 ms to the first token
# (bench/README.md, "Appends share a commit"). A conversation streaming alone seldom waits: its deltas
# come 25 ms or more apart; a burst of its events (a tool's call, then its result) may.
APPEND_INTERVAL_S = 0.010


class GroupCommit(Generic[OpT]):
    """Collects write ops from concurrent callers and commits them in batches.

    One writer task takes everything queued (up to `max_batch`), hands it to `commit_batch`, which
    runs the ops in one transaction and returns one Outcome per op, and resolves each caller's
    future. While a batch commits, new ops queue up, so batches grow with load without a timer.
    A batch of appends alone (`kind="append"`: an event log's, which no caller is waiting on to go
    on) also waits until `append_interval_s` after the previous commit began; any other write, or a
    full batch, commits at once. `commit_batch` counts the transactions it commits into
    `StoreStats.commits`.
    """

    def __init__(
        self,
        commit_batch: Callable[[list[OpT]], Awaitable[list[Outcome]]],
        stats: StoreStats,
        *,
        max_batch: int = 512,
        append_interval_s: float = APPEND_INTERVAL_S,
    ) -> None:
        self._commit_batch = commit_batch
        self._stats = stats
        self._max_batch = max_batch
        self._append_interval_s = append_interval_s
        self._queue: list[Pending[OpT]] = []
        self._wake = asyncio.Event()
        self._urgent = asyncio.Event()   # queued: a write other than an append, or a full batch
        self._began = -math.inf          # when the last commit began (loop time)
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    def start(self) -> None:
        self._closing = False
        self._task = asyncio.get_running_loop().create_task(self._run(), name="store-group-commit")

    async def stop(self) -> None:
        """Commit everything already queued, then stop; later submits raise StoreClosed."""
        self._closing = True
        self._wake.set()
        self._urgent.set()
        if self._task is not None:
            await self._task
            self._task = None

    async def submit(self, op: OpT, *, kind: str = "write", events: int = 0) -> Any:
        if self._closing or self._task is None:
            raise StoreClosed("store is not open")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append(Pending(op, future, kind, events))
        self._wake.set()
        if kind != "append" or len(self._queue) >= self._max_batch:
            self._urgent.set()
        # A cancelled caller cancels only its future, never its write: the op stays queued and may
        # still commit (the caller must then re-read last_seq), which is the same ambiguity as a
        # crash right after the commit; the writer skips a future already done. Awaited directly,
        # not through asyncio.shield: one future and one loop callback per append fewer.
        return await future

    async def _run(self) -> None:
        while True:
            if not self._queue:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            loop = asyncio.get_running_loop()
            wait = self._began + self._append_interval_s - loop.time()
            if wait > 0 and not self._urgent.is_set() and not self._closing:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._urgent.wait()
            self._urgent.clear()
            self._began = loop.time()
            batch = self._queue[: self._max_batch]
            del self._queue[: self._max_batch]
            await self._commit(batch)

    async def _commit(self, batch: list[Pending[OpT]]) -> None:
        try:
            outcomes = await self._commit_batch([p.op for p in batch])
        except asyncio.CancelledError:
            # The writer itself is cancelled (loop shutdown): whether the batch committed is unknown.
            for pending in batch:
                pending.future.cancel()
            raise
        except Exception as exc:
            # The batch as a whole failed (e.g. the connection broke), and its outcome may be unknown
            # (a commit whose acknowledgement was lost): every caller learns it and must re-read.
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(exc)
            return
        stats = self._stats
        stats.largest_batch = max(stats.largest_batch, len(batch))
        for pending, outcome in zip(batch, outcomes, strict=True):
            if outcome.error is None:
                stats.writes += 1
                if pending.kind == "append":
                    stats.appends += 1
                    stats.events += pending.events
            if pending.future.done():
                continue
            if outcome.error is not None:
                pending.future.set_exception(outcome.error)
            else:
                pending.future.set_result(outcome.value)
