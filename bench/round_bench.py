"""What governing a round costs per delta, next to what LiteLLM spends per chunk (issue 2).

    .venv/bin/python bench/round_bench.py [--repeats 7]

One realistic response (~4 KB: thinking, then `complete` with a long final_answer holding quotes,
newlines and non-ASCII text) is cut into deltas of 1, 4, 16 and 256 characters. For each size,
in one run:

- ours:    prefix policy + channel parser + action decoder + gates + events, i.e. a fresh
           `RoundEngine` fed every delta, then `finish()`;
- join:    the floor: append each delta to a list, `"".join` at the end;
- litellm: LiteLLM's own streaming path for the same deltas: a `CustomLLM` registered in
           `litellm.custom_provider_map` yields them as `GenericStreamingChunk`s, consumed with
           `litellm.acompletion(stream=True)`.

Each figure is the median of `--repeats` runs (after one warm-up, the three measured round-robin),
in µs per delta/chunk, wall-clock (`time.perf_counter_ns`) as the goals are stated; in brackets the
same from this process's CPU time, which other processes on a shared machine do not inflate.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no cost-map fetch at import
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from actors.catalog import Catalog, ToolDecl, Trait
from actors.gates import RoundRules
from actors.round import RoundEngine, RoundEvent, RoundOutcome

SIZES = (1, 4, 16, 256)
GOAL_RATIO_AT_4 = 0.10      # ours ≤ 10% of LiteLLM's per-chunk cost at 4-char deltas
GOAL_MBPS_AT_256 = 20.0     # ≥ 20 MB/s at 256-char deltas

RULES = RoundRules(catalog=Catalog([ToolDecl("demo.search", trait=Trait.EXPLORATION)]))


def realistic_response() -> str:
    paragraph = (
        'Paris today: rain all day, 12 °C, light wind from the west. The "Seine walk" is still fine '
        "with an umbrella; museums (Louvre, Orsay) open at 9:30.\nTip: café terraces are covered — "
        "try one near Saint-Germain. Temperatures: morning 9 °C, afternoon 12 °C, evening 10 °C.\n"
    )
    answer = "Here is your weekend plan.\n\n" + "".join(f"{i}. {paragraph}" for i in range(1, 14))
    thinking = (
        "The user wants a weekend plan for Paris. I already have the weather observation (rain, 12 °C) "
        "and the opening hours from the search results, so I can answer now without another tool call."
    )
    action = json.dumps({"action": "complete", "final_answer": answer}, ensure_ascii=False)
    return f"<channel:thinking>{thinking}</channel:thinking>\n<channel:action>```json\n{action}\n```</channel:action>"


def split(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


# -- the three measurements -----------------------------------------------------------------------

# A sample of ours or join passes over the response this many times (a fresh engine each time),
# so that one sample lasts milliseconds and timer and cache noise stay small; LiteLLM's one pass
# already does.
PASSES_PER_SAMPLE = 20


class Clock:
    """Wall-clock (perf_counter_ns, the figure the goals are stated in) and this process's CPU
    time (process_time_ns, which other processes on a shared machine cannot inflate)."""

    def __enter__(self) -> Clock:
        self.wall, self.cpu = time.perf_counter_ns(), time.process_time_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall, self.cpu = time.perf_counter_ns() - self.wall, time.process_time_ns() - self.cpu


Sample = tuple[float, float]  # (wall ns, CPU ns) for one pass over the response


def run_ours(deltas: list[str]) -> Sample:
    """One pass: a fresh RoundEngine fed every delta, then finish()."""
    with Clock() as clock:
        for _ in range(PASSES_PER_SAMPLE):
            engine = RoundEngine(RULES, turn_id="b", round_no=1)
            events: list[RoundEvent] = []
            for delta in deltas:
                events += engine.feed(delta)
            _, result = engine.finish()
    assert result.outcome is RoundOutcome.FINISH, result.notices
    return clock.wall / PASSES_PER_SAMPLE, clock.cpu / PASSES_PER_SAMPLE


def run_join(deltas: list[str]) -> Sample:
    """One pass: append every delta to a list, join at the end."""
    with Clock() as clock:
        for _ in range(PASSES_PER_SAMPLE):
            parts: list[str] = []
            for delta in deltas:
                parts.append(delta)
            text = "".join(parts)
    assert len(text) == sum(map(len, deltas))
    return clock.wall / PASSES_PER_SAMPLE, clock.cpu / PASSES_PER_SAMPLE


def litellm_runner() -> Callable[[list[str]], Sample]:
    import litellm
    from litellm import CustomLLM
    from litellm.types.utils import GenericStreamingChunk
    from litellm.utils import custom_llm_setup

    litellm.suppress_debug_info = True
    current: list[str] = []

    class BenchProvider(CustomLLM):
        async def astreaming(self, *args: Any, **kwargs: Any) -> AsyncIterator[GenericStreamingChunk]:  # type: ignore[override]
            for delta in current:
                yield GenericStreamingChunk(text=delta, is_finished=False, finish_reason="", usage=None,
                                            index=0, tool_use=None)
            yield GenericStreamingChunk(text="", is_finished=True, finish_reason="stop", usage=None,
                                        index=0, tool_use=None)

    litellm.custom_provider_map = [{"provider": "benchprov", "custom_handler": BenchProvider()}]
    custom_llm_setup()

    async def consume() -> Sample:
        with Clock() as clock:
            stream = await litellm.acompletion(
                model="benchprov/x", messages=[{"role": "user", "content": "plan"}], stream=True
            )
            received = 0
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    received += len(chunk.choices[0].delta.content)
        assert received == sum(map(len, current)), (received, sum(map(len, current)))
        return clock.wall, clock.cpu

    loop = asyncio.new_event_loop()

    def run(deltas: list[str]) -> Sample:
        current[:] = deltas
        sample = loop.run_until_complete(consume())
        # LiteLLM's end-of-stream logging runs as background tasks; let them finish, untimed.
        pending = asyncio.all_tasks(loop)
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=5))
        time.sleep(0.05)  # and its logging thread pool, so that it does not run during our figures
        gc.collect()  # its garbage is collected here, untimed, not during the next runner's sample
        return sample

    return run


def medians(runs: list[Callable[[list[str]], Sample]], deltas: list[str], repeats: int) -> list[Sample]:
    """Median (wall, CPU) of each runner, measured round-robin so that load from other processes
    on a shared machine falls on all of them alike; one warm-up round is discarded."""
    samples: list[list[Sample]] = [[] for _ in runs]
    for r in range(repeats + 1):
        for i, run in enumerate(runs):
            sample = run(deltas)
            if r:
                samples[i].append(sample)
    return [(statistics.median(w for w, _ in xs), statistics.median(c for _, c in xs)) for xs in samples]


# -- the table ------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7, help="runs per figure (median), at least 5")
    parser.add_argument("--no-litellm", action="store_true", help="skip the LiteLLM baseline (quick profiling)")
    args = parser.parse_args()
    repeats = max(5, args.repeats)

    text = realistic_response()
    size_bytes = len(text.encode())
    litellm_run = None if args.no_litellm else litellm_runner()

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"response: {len(text)} chars ({size_bytes} bytes UTF-8); median of {repeats} runs per figure; "
          f"{os.cpu_count()} CPUs, load average {load}")
    print("wall-clock (perf_counter_ns); in brackets: the same from this process's CPU time, which a loaded "
          "machine does not inflate")
    header = (f"{'chars/delta':>11} {'deltas':>6} {'µs/delta ours':>18} {'µs/delta join':>13} "
              f"{'µs/chunk litellm':>20} {'ours % litellm':>16} {'MB/s ours':>16}")
    print(header)
    print("-" * len(header))
    # size -> (ours wall, ours CPU, litellm wall, litellm CPU) in µs per delta, MB/s wall, MB/s CPU
    figures: dict[int, tuple[float, float, float | None, float | None, float, float]] = {}
    for size in SIZES:
        deltas = split(text, size)
        n = len(deltas)
        runners = [run_ours, run_join] + ([litellm_run] if litellm_run else [])
        (ours, ours_cpu), (join, _), *rest = ((w / n / 1000, c / n / 1000) for w, c in medians(runners, deltas, repeats))
        lite, lite_cpu = rest[0] if rest else (None, None)
        mbps, mbps_cpu = (size_bytes / (us * n) for us in (ours, ours_cpu))
        figures[size] = (ours, ours_cpu, lite, lite_cpu, mbps, mbps_cpu)
        lite_s = f"{lite:.1f} [{lite_cpu:.1f}]" if lite and lite_cpu else "-"
        ratio = f"{ours / lite:.1%} [{ours_cpu / lite_cpu:.1%}]" if lite and lite_cpu else "-"
        ours_s = f"{ours:.2f} [{ours_cpu:.2f}]"
        mbps_s = f"{mbps:.1f} [{mbps_cpu:.1f}]"
        print(f"{size:>11} {n:>6} {ours_s:>18} {join:>13.3f} {lite_s:>20} {ratio:>16} {mbps_s:>16}")

    print()
    ours4, ours4_cpu, lite4, lite4_cpu, _, _ = figures[4]
    if lite4 and lite4_cpu:
        verdict = "PASS" if ours4 <= GOAL_RATIO_AT_4 * lite4 else "FAIL"
        print(f"goal: at 4-char deltas ours ≤ {GOAL_RATIO_AT_4:.0%} of LiteLLM per chunk: {ours4 / lite4:.1%} "
              f"({ours4:.2f} µs vs {lite4:.1f} µs) → {verdict}   [CPU time: {ours4_cpu / lite4_cpu:.1%}]")
    *_, mbps256, mbps256_cpu = figures[256]
    verdict = "PASS" if mbps256 >= GOAL_MBPS_AT_256 else "FAIL"
    verdict_cpu = "PASS" if mbps256_cpu >= GOAL_MBPS_AT_256 else "FAIL"
    print(f"goal: ≥ {GOAL_MBPS_AT_256:.0f} MB/s at 256-char deltas: {mbps256:.1f} MB/s → {verdict}   "
          f"[CPU time: {mbps256_cpu:.1f} MB/s → {verdict_cpu}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
