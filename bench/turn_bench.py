"""CPU per model chunk of a whole scripted turn: the model reader's part and ours, with the scripted
model played directly by `stream_model` and through LiteLLM's wrapper, side by side in one run.

    .venv/bin/python bench/turn_bench.py [--chunks 2000] [--turns 5] [--repeats 5]

A turn of the scripted model (docs/design.md#scripted-model): a `demo.weather` call, its observation,
then a long streamed answer. Each model call is served by one of two readers:

- direct:  `stream_model` plays the script itself (the default for `scripted/<name>`);
- litellm: the custom provider through `litellm.acompletion(stream=True)` → `CustomStreamWrapper`
  in its lean configuration (`actors.llm.lite.LEAN_SETTINGS`, stop at the finish chunk), chosen
  with the model setting `stream_reader = "litellm"`.

For each reader:
- (a) the reader's part: the same model calls, with the same messages, through `stream_model`
  alone, every item consumed and nothing else done with it.
- (b) the whole turn: a `Conversation` (round engine, gates, events, EventLog with the default
  `flush_interval_ms` of 25, tools, context assembly with LiteLLM's token counting) on top of (a).
And once:
- (c) ours alone: the same Conversation, fed the model items (a) produced, replayed from memory
  with no reader underneath — our per-chunk work measured directly.
(b) − (a) is printed as a cross-check of (c) (a difference of two noisy figures).

CPU time (`time.process_time`) per chunk; all five runs alternate turn by turn within each repeat,
and the median of the repeats is printed, with the LiteLLM / direct ratio of (a) and of (b).
Goal (kept from before the direct player): ours (c) ≤ 50% of LiteLLM's part (a).
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
from actors.llm.lite import LEAN_SETTINGS
from actors.llm.scripts import Script, parse_script, register_script
from actors.llm.stream import stream_model
from actors.profile import ModelSettings, demo_profile
from actors.tools.demo import demo_registry, fixed_clock
from actors.tools.executor import LocalToolExecutor

GOAL = 0.50
READERS: dict[str, dict[str, str]] = {"direct": {}, "litellm": {"stream_reader": "litellm"}}   # model settings
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
        profile = demo_profile(known_tools=self.registry).with_script("turn-bench")
        self.profiles = {reader: profile.model_copy(update={"model_settings": ModelSettings(**own)})
                         for reader, own in READERS.items()}
        self.ids = itertools.count()
        self.messages: list[list[dict[str, Any]]] = []   # what each model call of a turn was sent
        self.items: list[list[Any]] = []                 # and what it streamed back
        self.flush_ms = profile.policies.flush_interval_ms if flush_interval_ms is None else flush_interval_ms

    async def full_turn(self, reader: str = "direct", record: bool = False, replay: bool = False) -> int:
        """(b) with `reader`, or (c) with `replay`: one whole turn through a Conversation. Returns its event count."""
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
        conv = Conversation(ConversationState(conversation_id=cid, agent="demo"), self.profiles[reader], runtime, log)
        conv.user_message("m1", "What's the weather in Paris, in detail?")
        await conv.idle()
        await conv.close()
        return events

    async def model_turn(self, reader: str) -> list[Any]:
        """(a) with `reader`: the same model calls through stream_model alone. Returns what they streamed."""
        cid = f"bench-{next(self.ids)}"
        calls = itertools.count()
        settings = {self.model: READERS[reader]}
        streamed = []
        for messages in self.messages:
            streamed.append([item async for item in stream_model(
                [self.model], messages, conversation_id=cid, next_call_index=lambda: next(calls), settings=settings)])
        return streamed


RUNS = ("direct (a)", "litellm (a)", "direct (b)", "litellm (b)", "ours (c)")


async def measure(turns: Turns, n: int) -> dict[str, float]:
    """CPU µs per chunk of every run over `n` turns each, alternating turn by turn so that all see
    the same machine (other processes' load moves from second to second)."""
    spent = dict.fromkeys(RUNS, 0.0)
    runs = {"direct (a)": lambda: turns.model_turn("direct"), "litellm (a)": lambda: turns.model_turn("litellm"),
            "direct (b)": lambda: turns.full_turn("direct"), "litellm (b)": lambda: turns.full_turn("litellm"),
            "ours (c)": lambda: turns.full_turn(replay=True)}
    for _ in range(n):
        for which in RUNS:
            gc.collect()  # each side pays for its own garbage, not the other's
            t0 = time.process_time()
            await runs[which]()
            spent[which] += time.process_time() - t0
    per_chunk = n * turns.chunks * 1e-6
    return {which: cpu / per_chunk for which, cpu in spent.items()}


async def main_async(args: argparse.Namespace) -> int:
    turns = Turns(turn_script(args.chunks), args.flush_ms)
    events = await turns.full_turn(record=True)   # warm-up, and the messages (a) replays
    if len(turns.messages) != 2:
        print(f"unexpected turn: {len(turns.messages)} model calls", file=sys.stderr)
        return 2
    # The two readers must stream the same items, or the comparison compares different work.
    if not await turns.model_turn("direct") == await turns.model_turn("litellm") == turns.items:
        print("the direct player and LiteLLM's wrapper streamed different items", file=sys.stderr)
        return 2

    samples: dict[str, list[float]] = {which: [] for which in RUNS}
    for _ in range(args.repeats):
        for which, value in (await measure(turns, args.turns)).items():
            samples[which].append(value)
    for reader in READERS:
        samples[f"{reader} (b) − (a)"] = [b - a for b, a in zip(samples[f"{reader} (b)"], samples[f"{reader} (a)"],
                                                                strict=True)]
    median = {which: statistics.median(values) for which, values in samples.items()}

    def row(label: str, which: str) -> str:
        return f"  {label:<44}{median[which]:7.1f} µs/chunk   [{' '.join(f'{x:.0f}' for x in samples[which])}]"

    lean = ", ".join(f"{k}={'maxsize' if v == sys.maxsize else v}" for k, v in LEAN_SETTINGS.items())
    print(f"one turn = 2 model calls, {turns.chunks} chunks, {events} events (flush_interval_ms="
          f"{turns.flush_ms:g}); {args.turns} turns per measure, "
          f"median of {args.repeats} repeats; CPU time (time.process_time)")
    print(f"LiteLLM configuration: {lean}; stop at the finish chunk and aclose()")
    print(row("(a) reader's part, direct player", "direct (a)"))
    print(row("(a) reader's part, LiteLLM wrapper", "litellm (a)"))
    print(row("(b) whole turn, direct player", "direct (b)"))
    print(row("(b) whole turn, LiteLLM wrapper", "litellm (b)"))
    print(row("(c) ours alone, Conversation replayed", "ours (c)"))
    print(row("cross-check (b) − (a), direct player", "direct (b) − (a)"))
    print(row("cross-check (b) − (a), LiteLLM wrapper", "litellm (b) − (a)"))
    print(f"  ratio LiteLLM wrapper / direct player:  reader's part (a) "
          f"{median['litellm (a)'] / median['direct (a)']:.1f}×,  whole turn (b) "
          f"{median['litellm (b)'] / median['direct (b)']:.2f}×")
    ratio = median["ours (c)"] / median["litellm (a)"]
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
