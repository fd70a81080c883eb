"""The loop `reactgate serve` runs on (Settings.event_loop, gateway/cli.py): uvloop by default where
it imports, asyncio's own when asked or where it does not, refused at start-up when asked and missing."""

from __future__ import annotations

import sys

import pytest
import uvloop

from gateway.app import StartupError
from gateway.cli import event_loop_factory
from gateway.settings import Settings


def test_uvloop_is_the_default_where_it_imports() -> None:
    assert Settings().event_loop == "auto"
    assert event_loop_factory("auto") is uvloop.new_event_loop
    assert event_loop_factory("uvloop") is uvloop.new_event_loop
    assert event_loop_factory("asyncio") is None


def test_without_uvloop_auto_falls_back_and_an_explicit_choice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` raises ImportError
    assert event_loop_factory("auto") is None
    with pytest.raises(StartupError, match="uvloop is not installed"):
        event_loop_factory("uvloop")


def test_an_unknown_loop_is_refused_naming_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REACTGATE_EVENT_LOOP", "trio")
    with pytest.raises(ValueError, match="event_loop"):
        Settings()
