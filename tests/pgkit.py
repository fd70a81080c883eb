"""A private PostgreSQL for the tests (and benches) that must break the store: its own `initdb` data
directory and port, run as the `postgres` user with the machine's PostgreSQL 15 binaries, stopped by
its own postmaster pid — never the shared server on 5432.

`stop(mode)` is the fault: `immediate` is a crash (connections cut, no checkpoint), `fast` a clean
shutdown; `start()` brings it back on the same port and data. Without root or the binaries the
tests skip with the reason, except under CI (CI=true), where that is a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_private_postgres() -> None:
    """Skip (or, under CI, fail) where a private PostgreSQL cannot be started."""
    reason = None
    if not (PG_BIN / "initdb").exists():
        reason = f"a private PostgreSQL needs the binaries in {PG_BIN}"
    elif os.geteuid() != 0:
        reason = "a private PostgreSQL runs as the `postgres` user: the tests must run as root"
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (under CI a missing service is a failure)")
    pytest.skip(reason)


class PrivatePostgres:
    """initdb + pg_ctl as `postgres`, on its own port and data directory: a directory of its own under
    /tmp (the `postgres` user cannot enter root's pytest directories), removed by `shutdown`."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="reactgate-pg-"))
        self.dir = self.root / "pgdata"
        self.port = _free_port()
        self.log = self.root / "postgres.log"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, *cmd: str, timeout: float = 120) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *cmd], check=True, timeout=timeout,
                       stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd="/")

    def init(self) -> PrivatePostgres:
        self.dir.mkdir(parents=True)
        self.log.touch()
        for path in (self.root, self.dir, self.log):
            shutil.chown(path, "postgres")
        self._as_postgres(str(PG_BIN / "initdb"), "-D", str(self.dir), "-U", "postgres", "--auth=trust",
                          "--no-sync", "-E", "UTF8")
        self.start()
        return self

    def start(self) -> None:
        self._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.dir), "-l", str(self.log), "-w", "-t", "60",
                          "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=200",
                          "start")

    def stop(self, mode: str = "immediate") -> None:
        """The fault: `immediate` cuts every connection at once, as a crash or a failover does."""
        self._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.dir), "-m", mode, "-w", "-t", "60", "stop")

    def postmaster_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self.dir / "postmaster.pid").read_text().splitlines()[0])
        return None

    def shutdown(self) -> None:
        """Cleanup: stop it by its own pid (SIGINT: a fast shutdown), SIGKILL after 30 s."""
        pid = self.postmaster_pid()
        if pid is not None and Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGINT)
            deadline = time.monotonic() + 30
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)
