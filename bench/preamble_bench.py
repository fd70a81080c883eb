"""What telling a preamble from an answer costs the time to the first answer character, natively
(docs/design.md#native: "Preambles").

    .venv/bin/python bench/preamble_bench.py [--turns 5] [--chars-per-s 80 400] [--answer-chars 300]

A native turn of the built-in native demo twin played by the scripted model: the weather call, its
observation, then an answer of `--answer-chars` characters streamed at a provider's pace (4-character
chunks, `--chars-per-s` characters a second: 80 is the mock's usual 20 chunks/s, 400 about a real
model's 100 tokens/s). Finishing is legal in that round, so content is held back until the first of:
a call, the end of the message, or `preamble_hold_chars` characters.

For each pace and each hold (0: no hold; the default 120), it prints the time from the answer
round's first content chunk leaving the model to the first `answer.delta` reaching the event log
(median of the turns), and the difference: the cost of the rule. Timing, not CPU: the wait is the
hold itself, so it is the same on a loaded machine up to scheduling noise.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from actors.conversation import Conversation, ConversationState, Runtime
from actors.eventlog import EventLog
from actors.llm.deltas import ModelFinished
from actors.llm.scripts import parse_script, register_script
from actors.llm.stream import stream_model
from actors.profile import BUILTIN_DIR, load_profile
from actors.tools.demo import demo_registry, fixed_clock
from actors.tools.executor import LocalToolExecutor
from protocol.deltas import ModelDelta

HOLDS = (0, 120)


async def one_turn(answer_chars: int, chars_per_s: float, hold: int, n: int) -> float:
    """Seconds from the answer round's first content chunk to its first answer.delta."""
    chunk = 4
    answer = ("It is raining in Paris, 12 °C. " * 40)[:answer_chars]
    name = register_script(f"preamble-{hold}-{chars_per_s}-{n}", parse_script({"rounds": [
        {"native": [{"call": {"name": "demo_weather", "arguments": {"city": "Paris"}}}]},
        {"native": [{"text": answer}], "chunk_chars": chunk, "delay_ms": 1000 * chunk / chars_per_s},
    ]}))
    registry = demo_registry()
    base = load_profile(BUILTIN_DIR / "demo_native.toml", known_tools=registry)
    profile = base.with_script(name.split("/", 1)[1]).model_copy(update={"policies": base.policies.model_copy(
        update={"preamble_hold_chars": hold, "flush_interval_ms": 0})})
    first_chunk: list[float] = []
    first_answer: list[float] = []
    calls = 0

    async def timed_stream(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        answering = calls == 2
        async for item in stream_model(*args, **kwargs):
            if answering and type(item) is ModelDelta and not first_chunk:
                first_chunk.append(time.perf_counter())
            yield item
            if type(item) is ModelFinished:
                return

    runtime = Runtime(registry=registry, tools=LocalToolExecutor(registry, clock=fixed_clock()),
                      stream_model=timed_stream, count_tokens=lambda messages: 1)
    log = EventLog(f"bench-{n}", flush_interval_ms=0)
    log.subscribe(lambda batch: [first_answer.append(time.perf_counter()) for e in batch
                                 if e.event == "answer.delta" and not first_answer])
    conv = Conversation(ConversationState(conversation_id=f"bench-{n}", agent=profile.name), profile, runtime, log)
    conv.user_message("m1", "weather in Paris?")
    await asyncio.wait_for(conv.idle(), 120)
    await conv.close()
    return first_answer[0] - first_chunk[0]


async def main(args: argparse.Namespace) -> None:
    n = 0
    print(f"{'chars/s':>8} {'hold':>5} {'first answer char after the first content chunk, median (ms)':>62}")
    for pace in args.chars_per_s:
        medians: dict[int, float] = {}
        for hold in HOLDS:
            samples = []
            for _ in range(args.turns):
                n += 1
                samples.append(await one_turn(args.answer_chars, pace, hold, n))
            medians[hold] = statistics.median(samples)
            print(f"{pace:>8.0f} {hold:>5} {1000 * medians[hold]:>62.0f}")
        expected = 1000 * (HOLDS[1] - 4) / pace   # the chunks after the first, until the hold is reached
        print(f"{'':>8} {'cost':>5} {1000 * (medians[HOLDS[1]] - medians[HOLDS[0]]):>62.0f}"
              f"   (the hold's own length at this pace: {expected:.0f} ms)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--chars-per-s", type=float, nargs="+", default=[80.0, 400.0])
    parser.add_argument("--answer-chars", type=int, default=300)
    asyncio.run(main(parser.parse_args()))
