"""Gateway settings (README.md#configuration): pydantic-settings, environment prefix `REACTGATE_`.

`auth_secret` is a `SecretStr`: its value never appears in a repr, a log line or an error.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="REACTGATE_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)
    backend: Literal["ray", "local"] = "ray"
    agent: Path | None = None
    script: Path | None = None
    model: str | None = None
    store: str = "sqlite:///./data/reactgate.sqlite3"
    ray_address: str | None = None
    # The Ray backend's cluster shape (gateway/app.py puts both into the RayConfig): `hosts` is the
    # number of sharded ConversationHosts (REACTGATE_HOSTS), not the bind address `host` above;
    # `ray_cpus` is num_cpus of a Ray this process starts when `ray_address` is unset.
    hosts: int = Field(default=2, gt=0)
    ray_cpus: int = Field(default=2, gt=0)
    auth_secret: SecretStr | None = None

    max_frame_bytes: int = Field(default=256 * 1024, gt=0)
    send_queue_frames: int = Field(default=2000, gt=0)
    rate_per_s: float = Field(default=20.0, gt=0)
    rate_burst: int = Field(default=50, gt=0)
    max_connections: int = Field(default=10_000, gt=0)
    max_conversations_per_connection: int = Field(default=64, gt=0)
    bad_frames_before_close: int = Field(default=10, gt=0)
    drain_grace_s: float = Field(default=25.0, gt=0)
    idle_ttl_s: float = Field(default=600.0, gt=0)
    # permessage-deflate: ~64 KiB per connection instead of ~14 KiB (FIELD_NOTES); off by default
    compression: bool = False


class BindRefused(ValueError):
    """Binding a non-loopback address without an auth secret would serve anonymous users."""


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and `localhost`. Empty or wildcard hosts are not loopback."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(settings: Settings) -> None:
    """Refuse to start on a non-loopback address without `auth_secret` (docs/wire-protocol.md#authentication)."""
    if settings.auth_secret is None and not is_loopback(settings.host):
        raise BindRefused(
            f"refusing to bind {settings.host!r} without an auth secret: anonymous access is only "
            "served on a loopback address (127.0.0.0/8, ::1, localhost). Set REACTGATE_AUTH_SECRET "
            "(or --auth-secret) or bind 127.0.0.1."
        )
