"""The load test's asyncio shell: N `SimUser`s on N real sockets, with injected abrupt drops.

`--reconnect-rate P`: each user drops its connection abruptly (`transport.abort()`, no close
frame) as a Poisson process of rate P per second — the time to the next drop is exponential with
mean 1/P s, drawn afresh after each reconnect. It then reconnects at once and its session resumes:
re-open, subscribe after the last delivered seq, re-send every unacked command with the same id.

`--cut-fraction F`: exactly round(F × N) users, chosen with the seed, are each cut once, mid-answer:
at the first `answer.delta` they receive after a moment drawn uniformly over the first 80% of the
duration (so the cuts are spread over the run, and each one interrupts an answer being streamed).

`--ramp-up S`: user i of N connects at i/N × S seconds instead of all at once. Users that start in
the same instant and play the same script stay in step: every model chunk of every conversation
then arrives in the same millisecond, a herd no real traffic makes.

Every loop is bounded: users stop starting turns at `--duration`, and everything still running is
cancelled `--drain-timeout` seconds later.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

import msgspec
from rich.progress import Progress
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.typing import Subprotocol

from client.connection import FATAL_HTTP_STATUS, retry_after_s
from client.loadtest.user import DEFAULT_MESSAGE, SimUser, Stats
from protocol.frames import SUBPROTOCOL, ClientFrame

DEFAULT_URL: Final = "ws://127.0.0.1:8765/ws"
RECONNECT_PAUSE_S: Final = (0.0, 0.05, 0.2, 0.5, 1.0)   # after the n-th failed connect in a row
CONNECT_TIMEOUT_S: Final = 10.0
TICK_S: Final = 0.25
_encoder: Final = msgspec.json.Encoder()


# ---------------------------------------------------------------------------------------------
# Where load may go, and how much.


class NotLoopback(ValueError):
    """The URL names a host that is not a loopback address literal."""


def require_loopback(url: str) -> str:
    """Return `url` if it is a ws:// or wss:// URL whose host is a loopback IP literal, else raise.

    Names (even `localhost`) are refused rather than resolved: what a name resolves to is not
    ours to check, and a load test aimed at the wrong machine is a denial of service.
    """
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError as exc:
        raise NotLoopback(f"not a valid URL {url!r}: {exc}") from None
    if parts.scheme not in ("ws", "wss"):
        raise NotLoopback(f"the URL must start with ws:// or wss://, got {url!r}")
    host = parts.hostname or ""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise NotLoopback(
            f"refusing to send load to {host or '(no host)'!r}: the load tester only targets a loopback "
            "address literal on this machine (127.0.0.1 or [::1]); names such as 'localhost' are not resolved"
        )
    return url


@dataclass(frozen=True)
class LoadConfig:
    url: str = DEFAULT_URL
    conversations: int = 10
    duration_s: float = 10.0
    reconnect_rate: float = 0.0      # abrupt drops per second per user (Poisson)
    cut_fraction: float = 0.0        # this fraction of users is cut once, mid-answer
    ramp_up_s: float = 0.0           # users start spread evenly over this many seconds
    drain_timeout_s: float = 30.0    # after the duration: time for the last turns to end
    token: str | None = None
    message: str = DEFAULT_MESSAGE
    report: Path | None = None
    seed: int | None = None

    def check(self) -> None:
        require_loopback(self.url)
        if self.conversations < 1:
            raise ValueError("--conversations must be at least 1")
        if not self.duration_s > 0 or not math.isfinite(self.duration_s):
            raise ValueError("--duration must be a positive number of seconds")
        if self.reconnect_rate < 0 or not math.isfinite(self.reconnect_rate):
            raise ValueError("--reconnect-rate must be ≥ 0 (drops per second per conversation)")
        if not 0 <= self.cut_fraction <= 1:
            raise ValueError("--cut-fraction must be between 0 and 1")
        if not 0 <= self.ramp_up_s < self.duration_s:
            raise ValueError("--ramp-up must be ≥ 0 and shorter than --duration")
        if self.drain_timeout_s < 0 or not math.isfinite(self.drain_timeout_s):
            raise ValueError("--drain-timeout must be ≥ 0")


@dataclass(frozen=True)
class ScriptInfo:
    """What the server is expected to play (`--script F`), as plain data: the load tester cannot
    choose the server's model, and reads no script itself (the CLI does)."""

    path: str
    rounds: int
    loop: bool
    chunks_per_round: tuple[int, ...]

    @property
    def chunks_per_pass(self) -> int:
        return sum(self.chunks_per_round)


@dataclass
class Result:
    config: LoadConfig
    stats: Stats
    users: list[SimUser]
    elapsed_s: float
    script_info: ScriptInfo | None = None

    @property
    def lost(self) -> int:
        return sum(u.tracker.lost for u in self.users)

    @property
    def duplicated(self) -> int:
        return sum(u.tracker.duplicated for u in self.users)

    @property
    def out_of_order(self) -> int:
        return sum(u.tracker.out_of_order for u in self.users)

    @property
    def incomplete_turns(self) -> int:
        return self.stats.turns_started - self.stats.turns_ended

    @property
    def fatal(self) -> list[str]:
        return [u.fatal for u in self.users if u.fatal]

    @property
    def unverified_users(self) -> int:
        """Users (not stopped by a fatal error) whose stream was never seen to reach the server's head."""
        return sum(1 for u in self.users if not u.verified and not u.fatal)

    def failures(self) -> list[str]:
        """Why the run failed; empty when it passed. Each check is one the user's eyes would fail too."""
        out = []
        errors = self.stats.errors
        for name, n in (("lost", self.lost), ("duplicated", self.duplicated), ("out_of_order", self.out_of_order),
                        ("incomplete_turns", self.incomplete_turns), ("failed_turns", self.stats.turns_failed),
                        ("garbled_turns", self.stats.garbled_turns),
                        ("foreign_events", errors["client.foreign_event"]),
                        ("unreadable_frames", errors["client.unreadable_frame"]),
                        ("unverified_users", self.unverified_users)):
            if n:
                out.append(f"{name}={n}")
        if self.stats.turns_ended == 0:
            out.append("no turn completed")
        if self.fatal:
            out.append(f"{len(self.fatal)} user(s) stopped: {self.fatal[0]}")
        return out


# ---------------------------------------------------------------------------------------------
# The shell.


class LoadRunner:
    def __init__(self, config: LoadConfig, progress: Progress | None = None) -> None:
        self.config = config
        self.stats = Stats()
        self.rng = random.Random(config.seed)
        self.progress = progress
        self.users: list[SimUser] = []
        self._sockets: dict[int, ClientConnection] = {}
        self._dropping: set[int] = set()   # users whose connection we are aborting on purpose

    async def run(self) -> Result:
        cfg = self.config
        gc.freeze()  # what is loaded stays: a full collection must not stall 300 sockets' reads mid-run
        start = time.monotonic()
        send_until = start + cfg.duration_s
        hard_deadline = send_until + cfg.drain_timeout_s
        self.users = [
            SimUser(self.stats, send_until=send_until, started_at=start, message=cfg.message)
            for _ in range(cfg.conversations)
        ]
        cut = self.rng.sample(range(cfg.conversations), round(cfg.cut_fraction * cfg.conversations))
        for index in cut:
            self.users[index].cut_after = start + self.rng.uniform(0.0, 0.8 * cfg.duration_s)
        tasks = [asyncio.create_task(self._drive(i, send_until, hard_deadline)) for i in range(len(self.users))]
        ticker = asyncio.create_task(self._tick(start, send_until, hard_deadline))
        try:
            await asyncio.wait(tasks, timeout=max(0.0, hard_deadline - time.monotonic()))
        finally:
            for task in (*tasks, ticker):
                task.cancel()
            await asyncio.gather(*tasks, ticker, return_exceptions=True)
        for user in self.users:
            if not user.finished:
                user.abandon()
        elapsed = time.monotonic() - start
        self._show(elapsed, final=True)
        return Result(cfg, self.stats, self.users, elapsed)

    async def _drive(self, index: int, send_until: float, hard_deadline: float) -> None:
        """One user's connection loop: connect, play, and on a drop reconnect at once.

        Not websockets' reconnect iterator (which `client.connection` uses): the load test must
        reconnect the instant after a drop it injected — the outage it measures is the protocol's,
        not a backoff's —, count every failed attempt by its cause, and stop at the hard deadline,
        so the loop is written out here.
        """
        user = self.users[index]
        if self.config.ramp_up_s:
            await asyncio.sleep(index * self.config.ramp_up_s / len(self.users))
        headers = {"Authorization": f"Bearer {self.config.token}"} if self.config.token else None
        failures, last_failure, asked_s = 0, "", 0.0
        while not user.finished and time.monotonic() < hard_deadline:
            if user.conversation_id is None and failures and time.monotonic() >= send_until:
                user.fatal = f"never connected: {last_failure}"  # nothing to drain: do not wait
                user.finished = True
                return
            dropper: asyncio.Task[None] | None = None
            try:
                async with connect(
                    self.config.url, subprotocols=[Subprotocol(SUBPROTOCOL)], additional_headers=headers,
                    open_timeout=CONNECT_TIMEOUT_S, max_size=None, compression=None,
                ) as ws:
                    failures = 0
                    self._sockets[index] = ws
                    if self.config.reconnect_rate > 0:
                        dropper = asyncio.create_task(self._drop_later(index, ws))
                    await self._send(ws, user.connected())
                    async for raw in ws:
                        await self._send(ws, user.receive(raw, time.monotonic(), time.time()))
                        if user.finished:
                            break
                        if user.cut_due:
                            user.cut_due = False
                            self._cut(index, ws)
                    if user.finished:
                        await ws.close()
                        return
                    self.stats.errors["client.closed_by_server"] += 1
            except InvalidStatus as exc:
                status = exc.response.status_code
                self.stats.errors[f"client.http_{status}"] += 1
                if status in FATAL_HTTP_STATUS:
                    user.fatal = f"handshake refused with HTTP {status}"
                    user.finished = True
                    return
                failures, last_failure = failures + 1, f"HTTP {status}"
                asked_s = retry_after_s(exc.response.headers.get("Retry-After"))   # an overloaded replica's
            except InvalidURI as exc:
                user.fatal = str(exc)
                user.finished = True
                return
            except ConnectionClosed:
                if index not in self._dropping:
                    self.stats.errors["client.connection_lost"] += 1
            except (OSError, InvalidHandshake, TimeoutError) as exc:
                self.stats.errors["client.connect_failed"] += 1
                failures, last_failure = failures + 1, str(exc) or type(exc).__name__
            finally:
                if dropper is not None:
                    dropper.cancel()
                self._sockets.pop(index, None)
                self._dropping.discard(index)
                user.disconnected()
            if failures:
                pause = max(RECONNECT_PAUSE_S[min(failures, len(RECONNECT_PAUSE_S) - 1)], asked_s)
                asked_s = 0.0
                await asyncio.sleep(min(pause, max(0.0, hard_deadline - time.monotonic())))

    async def _drop_later(self, index: int, ws: ClientConnection) -> None:
        await asyncio.sleep(self.rng.expovariate(self.config.reconnect_rate))
        if self.users[index].finished:
            return
        self._cut(index, ws)

    def _cut(self, index: int, ws: ClientConnection) -> None:
        self._dropping.add(index)
        self.stats.reconnects += 1
        ws.transport.abort()  # no close frame: what a crashed client or a cut network looks like

    @staticmethod
    async def _send(ws: ClientConnection, frames: Sequence[ClientFrame]) -> None:
        for frame in frames:
            await ws.send(_encoder.encode(frame).decode())

    async def _tick(self, start: float, send_until: float, hard_deadline: float) -> None:
        """Progress display and rate-limit retries, until the hard deadline."""
        while (now := time.monotonic()) < hard_deadline:
            for index, ws in list(self._sockets.items()):
                frames = self.users[index].due(now)
                if frames:
                    with contextlib.suppress(ConnectionClosed):
                        await self._send(ws, frames)
            self._show(now - start)
            await asyncio.sleep(TICK_S)

    def _show(self, elapsed: float, *, final: bool = False) -> None:
        if self.progress is None or not self.progress.task_ids:
            return
        stats, duration = self.stats, self.config.duration_s
        series = stats.events_per_s
        last_full = int(elapsed) - 1   # the last whole second
        eps = series[last_full] if 0 <= last_full < len(series) else 0
        if final:
            eps = round(stats.events / elapsed) if elapsed > 0 else 0
        phase = "done" if final else ("sending" if elapsed < duration else "draining")
        self.progress.update(
            self.progress.task_ids[0], completed=min(elapsed, duration), phase=phase,
            clock=f"{elapsed:5.1f}/{duration:.0f} s", turns=stats.turns_ended, eps=eps,
            users=sum(not u.finished for u in self.users),
        )
        self.progress.refresh()
