"""SQLite on a full disk (docs/design.md#store-outage), over a real gateway on the local and the Ray
backend: the store is a file on a small tmpfs this test mounts; a filler file leaves it a few KiB
mid-answer. The conversation waits (the store reports the outage), nothing is published that is not
durable, and once the filler is gone the turn completes whole: every event the client saw is in the
file, once, and `PRAGMA integrity_check` is ok.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e import (
    LocalServer,
    RayHosting,
    as_frames,
    check_log,
    local_server,
    ray_hosting,
    ray_server,
    slow_answer_script,
    store_url,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = slow_answer_script(answer_chars=240, delay_ms=50)
TMPFS_SIZE = "8m"
TURN_TIMEOUT_S = 120.0
Serve = Callable[..., contextlib.AbstractAsyncContextManager[LocalServer]]


@contextlib.contextmanager
def small_disk() -> Iterator[Path]:
    """A tmpfs of TMPFS_SIZE, unmounted at the end. Skips where it cannot be mounted (fails under CI)."""
    where = Path(tempfile.mkdtemp(prefix="reactgate-disk-"))
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(where)],
        capture_output=True, check=False, timeout=30).returncode == 0
    if not mounted:
        where.rmdir()
        reason = "a full disk is a tmpfs this test mounts: it needs root and mount"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (under CI a missing service is a failure)")
        pytest.skip(reason)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, timeout=30)
        shutil.rmtree(where, ignore_errors=True)


def fill(disk: Path, leave: int = 8 * 1024) -> Path:
    """A filler file taking all but `leave` bytes of the disk, or all of it if the store grew meanwhile.

    Unbuffered: a write that meets the full disk leaves nothing in a buffer for `close` to fail on."""
    filler = disk / "filler"
    free = shutil.disk_usage(disk).free
    with filler.open("wb", buffering=0) as f, contextlib.suppress(OSError):
        f.write(b"\0" * max(0, free - leave))
    return filler


@pytest.fixture(scope="module")
def disk() -> Iterator[Path]:
    with small_disk() as where:
        yield where


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory, disk: Path) -> Iterator[RayHosting]:
    with ray_hosting(tmp_path_factory.mktemp("ray"), {"demo": SCRIPT}, store=store_url(disk / "ray.sqlite3")) as hosting:
        yield hosting


@pytest.fixture(params=["local", pytest.param("ray", marks=pytest.mark.ray)])
def serve(request: pytest.FixtureRequest, disk: Path) -> tuple[Serve, Path]:
    if request.param == "ray":
        hosting: RayHosting = request.getfixturevalue("ray_cluster")
        return (lambda **settings: ray_server(hosting, **settings)), disk / "ray.sqlite3"
    return (lambda **settings: local_server(disk / "local.sqlite3", SCRIPT, **settings)), disk / "local.sqlite3"


async def store_down(server: LocalServer, cid: str) -> None:
    """Until the store the conversation's host writes to reports the outage: the gateway's own store
    on the local backend, the host's (its `stats`) on Ray."""
    async def down() -> bool:
        backend = server.backend
        if not hasattr(backend, "host_of"):
            return not backend.store.health().ok
        import ray

        from actors.ray.names import NAMESPACE
        stats = await ray.get_actor(await backend.host_of(cid), namespace=NAMESPACE).stats.remote()
        return not stats["store"]["ok"]

    async def wait() -> None:
        while not await down():
            await asyncio.sleep(0.05)

    await asyncio.wait_for(wait(), TURN_TIMEOUT_S)


async def test_a_full_disk_mid_answer_pauses_the_turn_until_space_is_freed(serve: tuple[Serve, Path], disk: Path) -> None:
    start, path = serve
    async with start() as server, server.client() as c:
        cid = await c.open()
        await c.subscribe(cid)
        await c.say(cid)
        await c.event(cid, "answer.delta", TURN_TIMEOUT_S)
        filler = fill(disk)
        try:
            await store_down(server, cid)   # the store that holds the conversation says it cannot write
            assert not any(e["event"] == "turn.completed" for e in c.events[cid])
        finally:
            filler.unlink()
        await c.turn_completed(cid, "t1", TURN_TIMEOUT_S)
        seen_all = c.events[cid]
        check_log(seen_all)
        assert seen_all == as_frames(await server.log(cid))
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
