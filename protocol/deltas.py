"""The model's output as typed deltas: what every stream reader yields and every decoder reads.

A model answers in one of two decision protocols (docs/design.md#decision-protocol and #native): in
channel-tagged text, which is nothing but `ModelDelta`s, or natively — its content, its provider
reasoning and its own function calls. Readers of every wire format (OpenAI-compatible SSE,
Anthropic Messages SSE, LiteLLM's stream wrapper, the scripted model) yield the same family, so the
round engine never knows where a delta came from.

They are frozen msgspec Structs, tagged, so a native round's output is recorded as the deltas
themselves (`encode_deltas`/`decode_deltas`, docs/design.md#replay), and built for cheap: one per
provider event (≈65 ns, against ≈365 ns for a frozen dataclass), untracked by the garbage collector
since they hold only strings and integers. A consumer dispatches on `type(delta)` and passes over a
type it does not read, so the channel protocol reads `ModelDelta`s and nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec


class ModelDelta(msgspec.Struct, frozen=True, gc=False, tag="text"):
    """Content text: the whole response in the channel protocol; the answer lane natively."""

    text: str


class ReasoningDelta(msgspec.Struct, frozen=True, gc=False, tag="reasoning"):
    """Provider reasoning (`reasoning_content` / `reasoning`, Anthropic `thinking`): the thinking lane."""

    text: str


class ReasoningSignature(msgspec.Struct, frozen=True, gc=False, tag="signature"):
    """The signature that closes an Anthropic thinking block. Never shown; sent back unchanged."""

    signature: str


class RedactedReasoning(msgspec.Struct, frozen=True, gc=False, tag="redacted"):
    """An Anthropic `redacted_thinking` block, as it came. Never shown; sent back unchanged."""

    data: str


class ToolCallStart(msgspec.Struct, frozen=True, gc=False, tag="call"):
    """A native function call begins: its position in the message, the provider's id, its name."""

    index: int
    call_id: str
    name: str


class ToolCallArgs(msgspec.Struct, frozen=True, gc=False, tag="args"):
    """A fragment of a call's JSON arguments, as the provider split them."""

    index: int
    fragment: str


class ToolCallEnd(msgspec.Struct, frozen=True, gc=False, tag="call_end"):
    """A call's arguments are complete (readers end every started call before the message ends)."""

    index: int


ModelOutput = (
    ModelDelta | ReasoningDelta | ReasoningSignature | RedactedReasoning | ToolCallStart | ToolCallArgs | ToolCallEnd
)

_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder(list[ModelOutput])


def encode_deltas(deltas: Sequence[ModelOutput]) -> bytes:
    return _ENCODER.encode(deltas)


def decode_deltas(data: bytes | str) -> list[ModelOutput]:
    return _DECODER.decode(data)


def merged(deltas: Sequence[ModelOutput]) -> list[ModelOutput]:
    """Adjacent fragments of one kind (and one call) joined, empty ones dropped: what a different
    chunking of the same output may change, and nothing else."""
    out: list[ModelOutput] = []
    for d in deltas:
        if isinstance(d, ModelDelta | ReasoningDelta) and not d.text:
            continue
        if isinstance(d, ToolCallArgs) and not d.fragment:
            continue
        prev = out[-1] if out else None
        if isinstance(d, ModelDelta | ReasoningDelta) and type(prev) is type(d):
            out[-1] = type(d)(prev.text + d.text)
        elif isinstance(d, ToolCallArgs) and isinstance(prev, ToolCallArgs) and prev.index == d.index:
            out[-1] = ToolCallArgs(d.index, prev.fragment + d.fragment)
        else:
            out.append(d)
    return out
