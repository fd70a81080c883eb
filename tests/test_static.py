"""The code as the checkers read it, so that main stays as clean as it is now: ruff's rules
(pyproject.toml `[tool.ruff]`) over the whole project, and mypy (`[tool.mypy]`) over the packages
that ship — actors, gateway, protocol and client (README, the layout)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHIPPED = ("actors", "gateway", "protocol", "client")


def check(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *command], cwd=REPO, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing() -> None:
    done = check("ruff", "check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_mypy_finds_nothing_in_the_shipped_packages(tmp_path: Path) -> None:
    done = check("mypy", "--cache-dir", str(tmp_path / "mypy-cache"), *SHIPPED)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert done.stdout.startswith("Success: no issues found")
