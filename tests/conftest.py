"""Shared test configuration.

Services (PostgreSQL, Redis) are used when present; without them a test skips with the reason,
except under CI (CI=true), where a missing service is a failure, never a silent skip.
"""

from __future__ import annotations

import os
import socket

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import pytest

POSTGRES_DSN = os.environ.get("REACTGATE_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def require_service(name: str, host: str, port: int) -> None:
    if _reachable(host, port):
        return
    reason = f"{name} is not reachable on {host}:{port}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (under CI a missing service is a failure)")
    pytest.skip(reason)


@pytest.fixture
def postgres_dsn() -> str:
    require_service("PostgreSQL", "127.0.0.1", 5432)
    return POSTGRES_DSN

