"""Where `reactgate chat --resume` finds the conversation to continue: the last one the chat opened
on each server URL, in one small JSON file (docs/operations.md#commands).

The file is the user's, not the server's: under `$XDG_CACHE_HOME/reactgate/` (else
`~/.cache/reactgate/`), or wherever `REACTGATE_CHAT_STATE` says (tests). Losing it loses nothing
but the shortcut: `--conversation c_…` re-opens any conversation. Writes replace the file whole
(a temporary file, then a rename), so a chat killed mid-write leaves the old file, never half a one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

STATE_ENV: Final = "REACTGATE_CHAT_STATE"
MAX_URLS: Final = 64     # servers remembered, the most recently used kept


def state_path(environ: Mapping[str, str]) -> Path:
    """The state file: `REACTGATE_CHAT_STATE`, else `chat.json` in the user's cache directory."""
    explicit = environ.get(STATE_ENV)
    if explicit:
        return Path(explicit)
    cache = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".cache")
    return Path(cache) / "reactgate" / "chat.json"


class LastConversations:
    """Server URL → the last conversation the chat opened there."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def get(self, url: str) -> str | None:
        found = self._read().get(url)
        return found if isinstance(found, str) else None

    def remember(self, url: str, conversation_id: str) -> None:
        """Raises OSError when the file cannot be written (the chat reports it and goes on)."""
        entries = self._read()
        entries.pop(url, None)
        entries[url] = conversation_id                 # last: the most recently used
        self._write(dict(list(entries.items())[-MAX_URLS:]))

    def forget(self, url: str, conversation_id: str) -> None:
        """The conversation is gone (deleted): nothing to resume there."""
        entries = self._read()
        if entries.get(url) == conversation_id:
            del entries[url]
            self._write(entries)

    def _read(self) -> dict[str, object]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return dict(data) if isinstance(data, dict) else {}

    def _write(self, entries: Mapping[str, object]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        temporary.write_text(json.dumps(entries, indent=1), encoding="utf-8")
        os.replace(temporary, self.path)


def come_back(url: str, conversation_id: str, default_url: str) -> str:
    """How to return to `conversation_id` (what Ctrl-C prints)."""
    at = "" if url == default_url else f" --url {url}"
    return (f"to come back to this conversation: reactgate chat --resume{at} "
            f"(or reactgate chat{at} --conversation {conversation_id})")
