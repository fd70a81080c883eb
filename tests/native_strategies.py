"""Hypothesis strategies for native function-calling messages (tests/fixtures/native_sse.py)."""

from __future__ import annotations

import json
import string

from hypothesis import strategies as st

from tests.fixtures.native_sse import Call, NativeMessage, Part, Reasoning, Redacted, Text

pieces = st.lists(st.text(max_size=6), min_size=1, max_size=5).map(tuple)
opaque = st.text(string.ascii_letters + string.digits + "+/=", min_size=1, max_size=16)   # signatures, redacted data
names = st.text(string.ascii_letters + string.digits + "_-", min_size=1, max_size=12)     # ^[a-zA-Z0-9_-]{1,64}$
values = st.none() | st.booleans() | st.integers() | st.text(max_size=6)
arguments = st.dictionaries(st.text(max_size=5), values, max_size=3).map(
    lambda d: json.dumps(d, ensure_ascii=False))


@st.composite
def split(draw: st.DrawFn, text: str) -> tuple[str, ...]:
    """`text` cut at arbitrary points, empty pieces included (providers send those too)."""
    points = sorted(draw(st.lists(st.integers(0, len(text)), max_size=6)))
    return tuple(text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True))


@st.composite
def calls(draw: st.DrawFn) -> Call:
    text = draw(arguments | st.just(""))   # "": a call with no arguments at all
    return Call(f"call_{draw(names)}", draw(names), draw(split(text)))


reasoning = st.builds(Reasoning, pieces, st.just("") | opaque)
parts: st.SearchStrategy[Part] = st.one_of(reasoning, st.builds(Redacted, opaque), st.builds(Text, pieces))


@st.composite
def messages(draw: st.DrawFn) -> NativeMessage:
    """Reasoning, redacted blocks and content in any order, 0–3 calls among them, any finish."""
    before = draw(st.lists(parts, max_size=4))
    made = draw(st.lists(calls(), max_size=3))
    after = draw(st.lists(parts, max_size=2))
    shuffled = draw(st.permutations([*before, *made]))
    finish = draw(st.sampled_from(["stop", "length", "tool_calls"] if made else ["stop", "length", "content_filter"]))
    return NativeMessage((*shuffled, *after), finish)
