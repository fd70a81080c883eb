"""Hypothesis strategies for hostile client frames, shared by the gateway's fuzz tests."""

from __future__ import annotations

from hypothesis import strategies as st

from protocol.frames import CLIENT_FRAME_TYPES

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12)
json_values = st.recursive(
    scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3), max_leaves=10
)
# Any subset of a client frame's fields, each either plausible or of the wrong type.
fields = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from([*CLIENT_FRAME_TYPES, "nope", ""]) | json_values,
        "id": st.text(min_size=1, max_size=8) | json_values,
        "conversation_id": st.text(max_size=8) | json_values,
        "text": st.text(max_size=8) | json_values,
        "after_seq": st.integers() | json_values,
        "mode": st.sampled_from(["agent", "ask", "god"]) | json_values,
        "agent": st.sampled_from(["demo", "nobody"]) | json_values,
        "ask_id": json_values,
        "answer": json_values,
        "limit": st.integers(min_value=-1, max_value=120) | json_values,
        "before": st.text(max_size=12) | json_values,
        "surprise": json_values,
    },
)
