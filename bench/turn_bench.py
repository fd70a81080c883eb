"""CPU per model chunk of a whole scripted turn through LiteLLM: LiteLLM's part and ours.

    .venv/bin/python bench/turn_bench.py [--chunks 2000] [--turns 5] [--repeats 5]

A turn of the scripted model (docs/design.md#scripted-model): a `demo.weather` call, its observation, then a long
streamed answer — every model call through `litellm.acompletion(stream=True)` in its lean
configuration (`actors.llm.stream.LEAN_SETTINGS`, stop at the finish chunk).

- (a) LiteLLM's part: the same model calls, with the same messages, through `stream_model` alone,
  every item consumed and nothing else done with it.
- (b) the whole turn: a `Conversation` (round engine, gates, events, EventLog with the default
  `flush_interval_ms` of 25, tools, context assembly with LiteLLM's token counting) on top of (a).
- (c) ours alone: the same Conversation, fed the model items (a) produced, replayed from memory
  with no LiteLLM underneath — our per-chunk work measured directly.
- ours = (c); (b) − (a) is printed as a cross-check (a difference of two noisy figures).

CPU time (`time.process_time`) per chunk; (a) and (b) alternate turn by turn within each repeat,
and the median of the repeats is printed. Goal: ours ≤ 50% of LiteLLM's part.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from actors.conversation import Conversation, ConversationState, Runtime
from actors.eventlog import EventLog
from actors.llm.scripts import Script, parse_script, register_script
from actors.llm.stream import LEAN_SETTINGS, stream_model
from actors.profile import demo_profile
from actors.tools.demo import demo_registry, fixed_clock
from actors.tools.executor import LocalToolExecutor

GOAL = 0.50
WORDS = ("rain", "Paris", "umbrella", "jacket", "12 °C", "wind", "west", "cafés", "Seine", "evening")


def turn_script(answer_chunks: int, chunk_chars: int = 4) -> Script:
    """A weather call, then an answer streamed in `answer_chunks` chunks of `chunk_chars`."""
    words = itertools.cycle(WORDS)
    answer = ""
    while len(answer) < answer_chunks * chunk_chars:
        answer += next(words) + " "
    answer = answer[: answer_chunks * chunk_chars - 60]  # leave room for the action's JSON around it
    call = ('<channel:thinking>Checking the weather in Paris.</channel:thinking><channel:action>'
            '{"action": "call_tool", "tool_call": {"tool_id": "demo.weather", "params": {"city": "Paris"}}}'
            "</channel:action>")
    final = ('<channel:thinking>Answering.</channel:thinking><channel:action>'
             f'{{"action": "complete", "final_answer": "{answer}"}}</channel:action>')
    return parse_script({"rounds": [{"text": call, "chunk_chars": chunk_chars},
                                    {"text": final, "chunk_chars": chunk_chars}]})


class Turns:
    def __init__(self, script: Script, flush_interval_ms: float | None) -> None:
        self.model = register_script("turn-bench", script)
        self.chunks = sum(len(r.chunks) + 1 for r in script.rounds)  # + the finish chunk of each call
        self.registry = demo_registry()
        self.profile = demo_profile(known_tools=self.registry).with_script("turn-bench")
        self.ids = itertools.count()
        self.messages: list[list[dict[str, Any]]] = []   # what each model call of a turn was sent
        self.items: list[list[Any]] = []                 # and what it streamed back
        self.flush_ms = self.profile.policies.flush_interval_ms if flush_interval_ms is None else flush_interval_ms

    async def full_turn(self, record: bool = False, replay: bool = False) -> int:
        """(b), or (c) with `replay`: one whole turn through a Conversation. Returns its event count."""
        events = 0

        def publish(batch: Sequence[Any]) -> None:
            nonlocal events
            events += len(batch)

        async def recording(models: Sequence[str], messages: list[dict[str, Any]], **kw: Any) -> Any:
            self.messages.append([dict(m) for m in messages])
            items = []
            async for item in stream_model(models, messages, **kw):
                items.append(item)
                yield item
            self.items.append(items)

        recorded = iter(self.items)

        async def replaying(models: Sequence[str], messages: list[dict[str, Any]], **kw: Any) -> Any:
            kw["next_call_index"]()  # the conversation's call counter moves as for a real call
            for item in next(recorded):
                yield item

        cid = f"bench-{next(self.ids)}"
        streamer = recording if record else replaying if replay else stream_model
        runtime = Runtime(registry=self.registry, tools=LocalToolExecutor(self.registry, clock=fixed_clock()),
                          stream_model=streamer)
        log = EventLog(cid, flush_interval_ms=self.flush_ms)
        log.subscribe(publish)
        conv = Conversation(ConversationState(conversation_id=cid, agent="demo"), self.profile, runtime, log)
        conv.user_message("m1", "What's the weather in Paris, in detail?")
        await conv.idle()
        await conv.close()
        return events

    async def litellm_turn(self) -> int:
        """(a): the same model calls through stream_model alone. Returns the number of items."""
        cid = f"bench-{next(self.ids)}"
        calls = itertools.count()
        items = 0
        for messages in self.messages:
            async for _ in stream_model([self.model], messages, conversation_id=cid,
                                        next_call_index=lambda: next(calls)):
                items += 1
        return items


async def measure(turns: Turns, n: int) -> tuple[float, float, float]:
    """CPU µs per chunk of (a), (b) and (c) over `n` turns each, alternating turn by turn so that all
    see the same machine (other processes' load moves from second to second)."""
    spent = {"litellm": 0.0, "full": 0.0, "ours": 0.0}
    runs = (("litellm", turns.litellm_turn), ("full", turns.full_turn),
            ("ours", lambda: turns.full_turn(replay=True)))
    for _ in range(n):
        for which, run in runs:
            gc.collect()  # each side pays for its own garbage, not the other's
            t0 = time.process_time()
            await run()
            spent[which] += time.process_time() - t0
    per_chunk = n * turns.chunks * 1e-6
    return spent["litellm"] / per_chunk, spent["full"] / per_chunk, spent["ours"] / per_chunk


async def main_async(args: argparse.Namespace) -> int:
    turns = Turns(turn_script(args.chunks), args.flush_ms)
    events = await turns.full_turn(record=True)   # warm-up, and the messages (a) replays
    if len(turns.messages) != 2:
        print(f"unexpected turn: {len(turns.messages)} model calls", file=sys.stderr)
        return 2
    await turns.litellm_turn()

    lite: list[float] = []
    full: list[float] = []
    ours: list[float] = []
    for _ in range(args.repeats):
        a, b, c = await measure(turns, args.turns)
        lite.append(a)
        full.append(b)
        ours.append(c)
    diff = [f - a for f, a in zip(full, lite, strict=True)]
    m_lite, m_full, m_ours, m_diff = (statistics.median(x) for x in (lite, full, ours, diff))
    ratio = m_ours / m_lite

    lean = ", ".join(f"{k}={'maxsize' if v == sys.maxsize else v}" for k, v in LEAN_SETTINGS.items())
    print(f"one turn = 2 model calls, {turns.chunks} chunks, {events} events (flush_interval_ms="
          f"{turns.flush_ms:g}); {args.turns} turns per measure, "
          f"median of {args.repeats} repeats; CPU time (time.process_time)")
    print(f"LiteLLM configuration: {lean}; stop at the finish chunk and aclose()")
    print(f"  (a) LiteLLM's part  stream_model alone     {m_lite:7.1f} µs/chunk   "
          f"[{' '.join(f'{x:.0f}' for x in lite)}]")
    print(f"  (b) whole turn      Conversation+LiteLLM   {m_full:7.1f} µs/chunk   "
          f"[{' '.join(f'{x:.0f}' for x in full)}]")
    print(f"  (c) ours alone      Conversation, replayed {m_ours:7.1f} µs/chunk   "
          f"[{' '.join(f'{x:.0f}' for x in ours)}]")
    print(f"  cross-check (b) − (a)                      {m_diff:7.1f} µs/chunk   "
          f"[{' '.join(f'{x:.0f}' for x in diff)}]")
    verdict = "PASS" if ratio <= GOAL else "FAIL"
    print(f"  ratio ours (c) / LiteLLM's part (a) = {ratio:.2f}   goal ≤ {GOAL:.2f}: {verdict}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=2000, help="chunks of the streamed answer")
    parser.add_argument("--turns", type=int, default=5, help="turns per measure")
    parser.add_argument("--flush-ms", type=float, default=None,
                        help="EventLog flush_interval_ms (default: the profile's, 25; 0 = one event per delta)")
    parser.add_argument("--repeats", type=int, default=5, help="repeats (the median is printed); ≥ 3")
    args = parser.parse_args()
    if args.repeats < 3:
        parser.error("--repeats must be at least 3")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
