"""JsonStream: one incremental parse that must agree with `json.loads` at any chunking (docs/design.md#decision-protocol)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.jsonstream import MAX_DEPTH, SCAN_MIN_CHARS, JsonStream, Path


def parse(deltas: list[str]) -> JsonStream:
    """Feed deltas like a stream would; text after the value must be whitespace (as for json.loads)."""
    stream = JsonStream()
    trailing = []
    for delta in deltas:
        stop = stream.feed(delta)
        trailing.append(delta[stop:])
    stream.finish()
    if stream.done and "".join(trailing).strip(" \t\n\r"):
        stream.error = "extra data after the value"
    return stream


def split(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *sorted(c for c in set(cuts) if 0 < c < len(text)), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=st.dictionaries(st.text(max_size=8), json_values, max_size=5), ensure_ascii=st.booleans(),
       indent=st.sampled_from([None, 2]), data=st.data())
def test_values_equal_json_loads_at_any_chunking(value: dict[str, Any], ensure_ascii: bool, indent: int | None,
                                                 data: st.DataObject) -> None:
    text = json.dumps(value, ensure_ascii=ensure_ascii, indent=indent)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=30))
    stream = parse(split(text, cuts))
    assert stream.error is None
    assert stream.done
    assert stream.value == json.loads(text)


@settings(max_examples=100, deadline=None)
@given(value=json_values)
def test_scalars_and_arrays_at_top_level_one_char_per_delta(value: Any) -> None:
    text = json.dumps(value)
    stream = parse(list(text))
    assert stream.error is None
    assert stream.value == json.loads(text)


@pytest.mark.parametrize("text", ['"\\ud83d\\ude00"', '"a\\u00e9\\n\\t\\"\\\\\\/b"', '"\\uD834\\uDD1E x"'])
def test_unicode_escapes_and_surrogate_pairs_split_across_deltas(text: str) -> None:
    for size in range(1, len(text) + 1):
        stream = parse([text[i : i + size] for i in range(0, len(text), size)])
        assert stream.value == json.loads(text), size


def test_string_characters_are_reported_decoded_as_they_arrive() -> None:
    seen: list[tuple[Path, str]] = []
    stream = JsonStream(on_chars=lambda path, text: seen.append((path, text)))
    stream.feed('{"answer": "ab\\u00')
    assert "".join(t for _, t in seen) == "ab"  # the cut escape waits for its last digits
    stream.feed('e9c"}')
    assert "".join(t for _, t in seen) == "abéc"
    assert {path for path, _ in seen} == {("answer",)}


def test_keys_are_not_reported_as_string_characters() -> None:
    seen: list[str] = []
    stream = JsonStream(on_chars=lambda path, text: seen.append(text))
    stream.feed('{"key": 1, "other": "v"}')
    assert seen == ["v"]


def test_feed_stops_at_stop_character_outside_strings() -> None:
    stream = JsonStream()
    text = '{"a": "<b>", "n": 12<rest'
    stop = stream.feed(text, stop_at="<")
    assert text[stop:] == "<rest"
    assert not stream.failed and not stream.done


def test_feed_returns_the_index_just_past_the_value() -> None:
    stream = JsonStream()
    text = '{"a": [1, 2]}   tail'
    stop = stream.feed(text)
    assert stream.done and stream.value == {"a": [1, 2]}
    assert text[stop:].strip() == "tail"


def test_number_at_end_of_input_completes_on_finish() -> None:
    stream = parse(["-1", "2.5e", "+3"])
    assert stream.value == json.loads("-12.5e+3")


INVALID = {
    "trailing_comma_in_object": '{"a": 1,}',
    "trailing_comma_in_array": "[1, 2,]",
    "leading_comma": "[,1]",
    "missing_comma": '{"a": 1 "b": 2}',
    "missing_colon": '{"a" 1}',
    "bad_escape": '"\\x41"',
    "short_unicode_escape": '"\\u12G4"',
    "lone_high_surrogate": '"\\ud83dabcdef"',
    "high_surrogate_then_non_low": '"\\ud83d\\u0041"',
    "leading_zero": "01",
    "leading_zero_negative": "-01",
    "bare_minus": "-",
    "dot_without_digits": "1.",
    "plus_sign": "+1",
    "control_char_in_string": '"a\nb"',
    "tab_in_string": '"a\tb"',
    "unclosed_object": '{"a": 1',
    "unclosed_array": "[1, 2",
    "unclosed_string": '"abc',
    "unclosed_escape": '"abc\\',
    "single_quotes": "{'a': 1}",
    "unquoted_key": "{a: 1}",
    "bad_literal": "nul",
    "capitalised_literal": "True",
    "long_literal": "falsey",
    "mismatched_brackets": "[1}",
    "nan": "NaN",
    "duplicate_key": '{"a": 1, "a": 2}',
    "empty": "",
    "whitespace_only": "  \n",
}


@pytest.mark.parametrize("name", sorted(INVALID))
def test_invalid_json_fails(name: str) -> None:
    text = INVALID[name]
    whole = parse([text])
    per_char = parse(list(text))
    assert whole.error is not None and not whole.done
    assert per_char.error is not None and not per_char.done


def test_depth_limit_allows_max_depth() -> None:
    text = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    stream = parse([text])
    assert stream.error is None and stream.value == json.loads(text)


def test_depth_limit_rejects_deeper_nesting() -> None:
    text = '{"a":' * (MAX_DEPTH + 1) + "1" + "}" * (MAX_DEPTH + 1)
    stream = parse(list(text))
    assert stream.failed
    assert stream.error is not None and "deeper" in stream.error


def test_nothing_is_consumed_after_an_error() -> None:
    stream = JsonStream()
    assert stream.feed("[1,,2]") == 3
    assert stream.failed
    assert stream.feed("[]") == 0


# -- the same events at any chunking (the string scan takes whole runs; a cut must not show) --------

# Pieces that put escapes, quotes and surrogates next to every kind of delta boundary, valid or not.
STRING_PIECES = [
    '"', "\\", '\\"', "\\\\", "\\\\\\\"", "\\n", "\\t", "\\/", "\\u", "\\u00e9", "\\u0022", "\\u005c", "\\ud83d",
    "\\ude00", "\\uDC00", "\\uD834\\uDD1E", "\\ud83d\\u0041", "\\u12", "\\x", "\ud83d", "\x00", "\x1f", "\x7f",
    "\n", " ", "a", "é", "😀", "<", "{", "}", "[", "]", ":", ",", "1", "-2.5e3", "true", "nul",
    "x" * 50, "é—" * 30,  # long enough for the whole-run scan (SCAN_MIN_CHARS)
]
OPENERS = ["", '"', '{"final_answer": "', '["x", "', '{"a": {"b": ["']
json_like_texts = st.builds(
    lambda opener, body: opener + "".join(body),
    st.sampled_from(OPENERS),
    st.lists(st.one_of(st.sampled_from(STRING_PIECES), st.text(max_size=6)), max_size=30),
)

Event = tuple[Any, ...]


def events_of(deltas: list[str], stop_at: str = "") -> list[Event]:
    """Every callback and the end state, with string characters merged per path: a chunking may
    report a string in more pieces, never in other characters, order, or paths."""
    events: list[Event] = []

    def on_chars(path: Path, text: str) -> None:
        if events and events[-1][0] == "chars" and events[-1][1] == path:
            events[-1] = ("chars", path, events[-1][2] + text)
        else:
            events.append(("chars", path, text))

    stream = JsonStream(on_chars=on_chars, on_value=lambda path, value: events.append(("value", path, repr(value))))
    offset = 0
    for delta in deltas:
        stop = stream.feed(delta, stop_at=stop_at)
        if stop < len(delta):  # the value ended, failed, or met the stop character: nothing more is read
            events.append(("stopped", offset + stop))
            break
        offset += len(delta)
    else:
        stream.finish()
    events.append(("end", stream.error, stream.done, repr(stream.value)))
    return events


@settings(max_examples=400, deadline=None)
@given(text=json_like_texts, stop_at=st.sampled_from(["", "<"]), data=st.data())
def test_events_do_not_depend_on_the_chunking(text: str, stop_at: str, data: st.DataObject) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    whole = events_of([text], stop_at)
    assert events_of(list(text), stop_at) == whole
    assert events_of(split(text, cuts), stop_at) == whole


@settings(max_examples=300, deadline=None)
@given(value=st.text(), ensure_ascii=st.booleans(), data=st.data())
def test_string_characters_equal_json_loads_at_any_chunking(value: str, ensure_ascii: bool,
                                                            data: st.DataObject) -> None:
    text = json.dumps({"final_answer": value}, ensure_ascii=ensure_ascii)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    chars = [("chars", ("final_answer",), value)] if value else []
    expected = [*chars, ("value", ("final_answer",), repr(value)), ("end", None, True, repr({"final_answer": value}))]
    for deltas in ([text], list(text), split(text, cuts)):
        assert events_of(deltas) == expected


@pytest.mark.parametrize("body", [
    'a\\"b\\\\', '\\\\\\"x', "\\u0022\\u005c", "x\\ud83d\\ude00y", "x\\ud83d", "\\ud83d\\u0041", "\\uDC00",
    "ab\\", "ab\\u12", "a\x1fb", "a\\qb", 'a\\"b\\ud83d',
])
def test_strings_cut_at_every_position_report_the_same_events(body: str) -> None:
    pad = "x" * SCAN_MIN_CHARS  # each side of the cut is long enough for the whole-run scan
    text = '{"final_answer": "' + pad + body + pad + '", "n": 1}'
    whole = events_of([text])
    for cut in range(len(text) + 1):
        assert events_of([text[:cut], text[cut:]]) == whole, cut
