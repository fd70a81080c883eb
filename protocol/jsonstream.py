"""An incremental JSON value builder: text in (any chunking), values out, one parse.

The live lanes and the post-stream check both read this parser's state, so they can never
disagree about the same bytes (docs/design.md#one-decoder). Strings are decoded as they arrive and
reported through `on_chars`, so a `final_answer` can stream before its closing quote.

Strictly RFC 8259, except that the caller decides where the value ends (`stop_at`) so a tag
that follows the object is not read as JSON. Bulk text is scanned in runs, not character by
character: this sits on the per-delta hot path. A string's characters are found with `str.find`
and decoded by the C decoder `json` itself uses; only what that cannot take whole (an escape cut
by a delta boundary, invalid text) goes through the regex path, whose verdict is the reference.
"""

from __future__ import annotations

import re
from _json import scanstring  # the C string decoder behind json.loads (strict: no control characters)
from collections.abc import Callable
from typing import Any, Final

Path = tuple[str | int, ...]
OnChars = Callable[[Path, str], None]
OnValue = Callable[[Path, Any], None]

MAX_DEPTH: Final = 32

# A run of plain characters and two-character escapes; `\u` escapes take the slow path.
_STRING_RUN = re.compile(r'(?:[^"\\\x00-\x1f]+|\\["\\/bfnrt])+')
_SIMPLE_ESCAPE = re.compile(r"\\(.)")
_HIGH_SURROGATE = re.compile("[\ud800-\udbff]")
# Below this many characters the regex path's smaller fixed cost wins (a 4-char delta).
SCAN_MIN_CHARS: Final = 48
_U_ESCAPE = re.compile(r"\\u[0-9a-fA-F]{4}")
_U_PAIR = re.compile(r"\\u[0-9a-fA-F]{4}\\u[0-9a-fA-F]{4}")
_WS = re.compile(r"[ \t\n\r]*")
_NUMBER_CHARS = re.compile(r"[-+0-9.eE]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?\Z")
_LITERALS: Final = {"true": True, "false": False, "null": None}
_ESCAPES: Final = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _unescape(m: re.Match[str]) -> str:
    return _ESCAPES[m.group(1)]


def _scan_string(text: str, pos: int) -> tuple[str, int] | None:
    """Decode the string body text[pos:] in one C call: (its characters, the index just past its
    closing quote, or -1 when it goes on past the text). None when the text holds what only the
    regex path reads exactly: an escape cut at the end, a lone high surrogate, or invalid text."""
    quote = text.find('"', pos)
    while quote >= 0:  # the closing quote: not escaped, i.e. after an even run of backslashes
        k = quote
        while k > pos and text[k - 1] == "\\":
            k -= 1
        if not (quote - k) & 1:
            break
        quote = text.find('"', quote + 1)
    try:
        if quote >= 0:
            decoded, end = scanstring(text, pos, True)
            body_end = end - 1
        else:  # a quote as sentinel: a cut escape then fails to decode instead of decoding wrongly
            decoded, _ = scanstring(text[pos:] + '"', 0, True)
            end, body_end = -1, len(text)
    except ValueError:
        return None
    # The C decoder lets a high surrogate stand alone (also one cut from its low half by the end
    # of the text); this parser requires the pair.
    if text.find("\\u", pos, body_end) >= 0 and _HIGH_SURROGATE.search(decoded):
        return None
    return decoded, end


# Parser states.
_VALUE, _STRING, _NUMBER_S, _LITERAL, _KEY_OR_END, _KEY, _COLON, _AFTER, _DONE, _ERROR = range(10)


class JsonStream:
    """Feeds on text; builds exactly one JSON value (an object, for actions)."""

    __slots__ = (
        "_chunks",
        "_containers",
        "_esc",
        "_is_key",
        "_keys",
        "_on_chars",
        "_on_value",
        "_path",
        "_scalar",
        "_state",
        "error",
        "value",
    )

    def __init__(self, on_chars: OnChars | None = None, on_value: OnValue | None = None) -> None:
        self._state = _VALUE
        self._containers: list[dict[str, Any] | list[Any]] = []
        self._keys: list[str | None] = []   # per open object: the key whose value is being read
        self._path: list[str | int] = []
        self._chunks: list[str] = []        # decoded pieces of the current string
        self._esc = ""                      # a pending escape sequence cut by a delta boundary
        self._is_key = False
        self._scalar = ""                   # number or literal characters so far
        self._on_chars = on_chars
        self._on_value = on_value
        self.value: Any = None
        self.error: str | None = None

    @property
    def done(self) -> bool:
        return self._state == _DONE

    @property
    def failed(self) -> bool:
        return self._state == _ERROR

    def feed(self, text: str, pos: int = 0, stop_at: str = "") -> int:
        """Consume text[pos:] and return where consumption stopped: len(text), the index of the
        first `stop_at` character met outside a string, or the index just past the value."""
        n = len(text)
        while pos < n:
            state = self._state
            if state == _STRING:
                pos = self._feed_string(text, pos)
                continue
            if state in (_DONE, _ERROR):
                return pos
            ch = text[pos]
            if ch in " \t\n\r":
                pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
                if state in (_NUMBER_S, _LITERAL):
                    self._end_scalar()
                continue
            if stop_at and ch == stop_at:
                if state in (_NUMBER_S, _LITERAL):
                    self._end_scalar()
                return pos
            if state == _NUMBER_S:
                m = _NUMBER_CHARS.match(text, pos)
                end = m.end()  # type: ignore[union-attr]
                if end > pos:
                    self._scalar += text[pos:end]
                    pos = end
                    continue
                self._end_scalar()
                continue
            if state == _LITERAL:
                if ch.isalpha():
                    self._scalar += ch
                    pos += 1
                    if len(self._scalar) > 5:
                        self._fail(f"invalid literal {self._scalar[:8]!r}")
                    continue
                self._end_scalar()
                continue
            pos = self._structural(ch, pos)
        return pos

    def finish(self) -> None:
        """End of input: a number at the very end is complete; anything else open is an error."""
        if self._state in (_NUMBER_S, _LITERAL):
            self._end_scalar()
        if self._state not in (_DONE, _ERROR):
            self._fail("unexpected end of JSON" if self._containers or self._state == _STRING else "no JSON value")

    # -- internals -------------------------------------------------------------------------

    def _fail(self, message: str) -> None:
        if self._state != _ERROR:
            self._state = _ERROR
            self.error = message

    def _structural(self, ch: str, pos: int) -> int:
        state = self._state
        if state == _VALUE:
            return self._start_value(ch, pos)
        if state == _KEY_OR_END and ch == "}":
            self._close("}")
            return pos + 1
        if state in (_KEY_OR_END, _KEY):
            if ch == '"':
                self._state, self._is_key, self._chunks = _STRING, True, []
                return pos + 1
            self._fail(f"expected a key string, got {ch!r}")
            return pos
        if state == _COLON:
            if ch == ":":
                self._state = _VALUE
                return pos + 1
            self._fail(f"expected ':', got {ch!r}")
            return pos
        if state == _AFTER:
            top = self._containers[-1]
            if ch == ",":
                if isinstance(top, dict):
                    self._state = _KEY
                else:
                    self._path[-1] = len(top)
                    self._state = _VALUE
                return pos + 1
            if ch in "}]":
                self._close(ch)
                return pos + 1
            self._fail(f"expected ',' or a closing bracket, got {ch!r}")
            return pos
        self._fail(f"unexpected {ch!r}")
        return pos

    def _start_value(self, ch: str, pos: int) -> int:
        if ch == '"':
            self._state, self._is_key, self._chunks = _STRING, False, []
            return pos + 1
        if ch == "{" or ch == "[":
            if len(self._containers) >= MAX_DEPTH:
                self._fail(f"nesting deeper than {MAX_DEPTH}")
                return pos
            if ch == "{":
                self._containers.append({})
                self._keys.append(None)
                self._path.append("")
                self._state = _KEY_OR_END
            else:
                self._containers.append([])
                self._keys.append(None)
                self._path.append(0)
                self._state = _VALUE
            return pos + 1
        if ch == "]" and self._containers and isinstance(self._containers[-1], list) and not self._containers[-1]:
            self._close("]")
            return pos + 1
        if ch == "-" or ch.isdigit():
            self._state, self._scalar = _NUMBER_S, ""
            return pos
        if ch.isalpha():
            self._state, self._scalar = _LITERAL, ""
            return pos
        self._fail(f"unexpected {ch!r}")
        return pos

    def _feed_string(self, text: str, pos: int) -> int:
        # Hot path: a long final_answer streams through here. The decoded pieces of this call are
        # reported once, at its end (the same characters, in fewer callbacks), so how a call
        # decoded them — whole, by `_scan_string`, or run by run — cannot show in the events.
        n = len(text)
        pieces: list[str] = []
        scan = n - pos >= SCAN_MIN_CHARS  # until the whole-run scan declines, for the rest of this call
        while pos < n:
            if self._esc:
                pos = self._feed_escape(text, pos, pieces)
                if self._state != _STRING:
                    break
                continue
            if scan:
                scanned = _scan_string(text, pos)
                if scanned is not None:
                    decoded, end = scanned
                    if decoded:
                        pieces.append(decoded)
                    if end < 0:  # the string goes on past this text
                        pos = n
                        break
                    self._report(pieces)
                    self._end_string()
                    return end
                scan = False
            m = _STRING_RUN.match(text, pos)
            if m is not None:
                run = m.group()
                pieces.append(_SIMPLE_ESCAPE.sub(_unescape, run) if "\\" in run else run)
                pos = m.end()
                continue
            ch = text[pos]
            if ch == '"':
                self._report(pieces)
                self._end_string()
                return pos + 1
            if ch == "\\":
                self._esc = "\\"
                pos += 1
                continue
            self._report(pieces)
            self._fail("control character in string")
            return pos
        self._report(pieces)
        return pos

    def _report(self, pieces: list[str]) -> None:
        if not pieces:
            return
        self._chunks += pieces
        if self._on_chars is not None and not self._is_key:
            self._on_chars(tuple(self._path), "".join(pieces))

    def _feed_escape(self, text: str, pos: int, pieces: list[str]) -> int:
        """An escape the run regex did not take: a \\u escape, or one cut by a delta boundary.
        self._esc holds the escape read so far ("\\", "\\u12", or "\\uD83D\\uDE" for a surrogate pair)."""
        n = len(text)
        while pos < n:
            esc = self._esc
            if len(esc) == 1:
                ch = text[pos]
                if ch == "u":
                    self._esc = esc + ch
                    pos += 1
                    continue
                decoded = _ESCAPES.get(ch)
                if decoded is None:
                    self._fail("invalid escape in string")
                    return pos
                self._esc = ""
                pieces.append(decoded)
                return pos + 1
            need = 6 if len(esc) < 6 else 12  # 12: a high surrogate waits for its low half
            take = min(need - len(esc), n - pos)
            esc += text[pos : pos + take]
            pos += take
            self._esc = esc
            if len(esc) < need:
                return pos
            if need == 6:
                if not _U_ESCAPE.fullmatch(esc):
                    self._fail("invalid \\u escape in string")
                    return pos
                code = int(esc[2:], 16)
                if 0xD800 <= code < 0xDC00:
                    continue  # a high surrogate: wait for its low half
                self._esc = ""
                pieces.append(chr(code))
                return pos
            # A surrogate pair: "\\uD8xx\\uDCxx".
            if not _U_PAIR.fullmatch(esc):
                self._fail("invalid surrogate pair in string")
                return pos
            hi, lo = int(esc[2:6], 16), int(esc[8:12], 16)
            if not 0xDC00 <= lo < 0xE000:
                self._fail("invalid surrogate pair in string")
                return pos
            self._esc = ""
            pieces.append(chr(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)))
            return pos
        return pos

    def _end_string(self) -> None:
        s = "".join(self._chunks)
        self._chunks = []
        if self._is_key:
            obj = self._containers[-1]
            if s in obj:
                self._fail(f"duplicate key {s[:40]!r}")
                return
            self._keys[-1] = s
            self._path[-1] = s
            self._state = _COLON
        else:
            self._put(s)

    def _end_scalar(self) -> None:
        s = self._scalar
        if self._state == _LITERAL:
            if s not in _LITERALS:
                self._fail(f"invalid literal {s[:8]!r}")
                return
            self._put(_LITERALS[s])
            return
        if not _NUMBER.match(s):
            self._fail(f"invalid number {s[:16]!r}")
            return
        self._put(float(s) if any(c in s for c in ".eE") else int(s))

    def _put(self, value: Any) -> None:
        if not self._containers:
            self.value = value
            self._state = _DONE
            return
        top = self._containers[-1]
        if isinstance(top, dict):
            top[self._keys[-1]] = value  # type: ignore[index]
        else:
            top.append(value)
        if self._on_value is not None:
            self._on_value(tuple(self._path), value)
        self._state = _AFTER

    def _close(self, ch: str) -> None:
        top = self._containers[-1]
        if (ch == "}") != isinstance(top, dict):
            self._fail(f"mismatched {ch!r}")
            return
        self._containers.pop()
        self._keys.pop()
        self._path.pop()
        self._put(top)
