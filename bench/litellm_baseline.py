"""What LiteLLM's streaming path costs per chunk, and what each "lean" setting saves.

    .venv/bin/python bench/litellm_baseline.py [--chunks 5000] [--runs 7]

N chunks from a minimal `CustomLLM` through `litellm.acompletion(stream=True)`, timed from the
call to the closed stream and LiteLLM's background logging tasks done, in µs per chunk of process
CPU time (LiteLLM rebuilds the response in a worker thread: process time counts it) and of wall time. Configurations run round-robin in one process (each
run applies its settings over LiteLLM's defaults), so a noisy neighbour slows them all alike; the
median of `--runs` runs is printed, after one warm-up round. The last row goes through
`actors.llm.stream.stream_model` (lean config + the scripted provider) for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LEAN = {"suppress_debug_info": True, "turn_off_message_logging": True, "disable_streaming_logging": True}
# name -> (litellm module settings, stop at the finish chunk instead of draining to the end)
CONFIGS: dict[str, tuple[dict[str, object], bool]] = {
    "default (drain to end)": ({}, False),
    "suppress_debug_info": ({"suppress_debug_info": True}, False),
    "turn_off_message_logging": ({"turn_off_message_logging": True}, False),
    "disable_streaming_logging": ({"disable_streaming_logging": True}, False),
    "settings above, drain to end": (LEAN, False),
    "stop at finish chunk + aclose": ({}, True),
    "lean: settings + stop at finish": (LEAN, True),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    chunks: int = args.chunks

    import litellm
    from litellm.llms.custom_llm import CustomLLM

    from actors.llm.lite import LEAN_SETTINGS
    from actors.llm.scripted import ensure_registered
    from actors.llm.scripts import Round, Script, register_script
    from actors.llm.stream import stream_model

    class Raw(CustomLLM):
        async def astreaming(self, *args, **kwargs):  # type: ignore[no-untyped-def, override]
            for i in range(chunks):
                yield {"text": f"tok{i % 10}", "is_finished": False, "finish_reason": "",
                       "usage": None, "index": 0, "tool_use": None}
            yield {"text": "", "is_finished": True, "finish_reason": "stop",
                   "usage": None, "index": 0, "tool_use": None}

    litellm.custom_provider_map = [{"provider": "rawbench", "custom_handler": Raw()}]
    ensure_registered()  # adds `scripted` and runs custom_llm_setup for both
    keys = {k for settings, _ in CONFIGS.values() for k in settings} | set(LEAN_SETTINGS)
    defaults = {k: getattr(litellm, k) for k in keys}

    def apply(settings: dict[str, object]) -> None:
        for key in keys:
            setattr(litellm, key, settings.get(key, defaults[key]))

    def raw(settings: dict[str, object], stop_at_finish: bool) -> Callable[[], Awaitable[None]]:
        async def once() -> None:
            apply(settings)
            stream = await litellm.acompletion(
                model="rawbench/x", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            try:
                async for chunk in stream:
                    if stop_at_finish and chunk.choices and chunk.choices[0].finish_reason is not None:
                        break
            finally:
                await stream.aclose()
        return once

    model = register_script("bench", Script(rounds=(Round(deltas=tuple(f"tok{i % 10}" for i in range(chunks))),),
                                             loop=True))
    counter = iter(range(10**9))

    async def via_stream_model() -> None:
        apply(LEAN_SETTINGS)
        async for _ in stream_model([model], [{"role": "user", "content": "hi"}], conversation_id="bench",
                                    next_call_index=lambda: next(counter)):
            pass

    cases: dict[str, Callable[[], Awaitable[None]]] = {name: raw(*cfg) for name, cfg in CONFIGS.items()}
    cases["stream_model (lean, scripted provider)"] = via_stream_model

    async def run() -> dict[str, list[tuple[float, float]]]:
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
        for r in range(args.runs + 1):
            for name, once in cases.items():
                t0, c0 = time.perf_counter(), time.process_time()
                await once()
                # LiteLLM's end-of-stream logging runs as background tasks on this loop: count them too.
                pending = asyncio.all_tasks() - {asyncio.current_task()}
                if pending:
                    await asyncio.wait(pending, timeout=5)
                wall = (time.perf_counter() - t0) / chunks * 1e6
                cpu = (time.process_time() - c0) / chunks * 1e6
                if r:
                    results[name].append((cpu, wall))
        return results

    results = asyncio.run(run())
    print(f"{chunks} chunks, median of {args.runs} round-robin runs, µs/chunk (lower is better);")
    print("CPU = process CPU time (all threads), robust to noisy neighbours; wall = elapsed")
    base = statistics.median(cpu for cpu, _ in results["default (drain to end)"])
    for name, xs in results.items():
        cpu = statistics.median(c for c, _ in xs)
        wall = statistics.median(w for _, w in xs)
        print(f"  {name:40s} CPU {cpu:6.1f} ×{cpu / base:4.2f}   wall {wall:6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
