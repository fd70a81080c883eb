"""A kit to drive one Conversation through LiteLLM with a scripted model (docs/design.md#scripted-model) in a test.

`harness(script, **overrides)` registers the script under a fresh name, builds the demo profile
playing it (with policy overrides), an in-memory EventLog (flush_interval_ms=0: one event per
delta) and a Runtime whose `stream_model` records every model call's messages. The helpers wait
on events with timeouts — never on wall-clock sleeps — and `check_invariants` asserts what every
conversation must satisfy (docs/design.md#observations, #event-log).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from actors.conversation import Conversation, ConversationState, Runtime
from actors.eventlog import EventLog
from actors.llm.scripts import Script, parse_script, register_script
from actors.llm.stream import stream_model
from actors.profile import AgentProfile, demo_profile
from actors.tools.demo import demo_registry, fixed_clock
from actors.tools.executor import LocalToolExecutor
from protocol.events import Event, payload_builtins
from tests.roundkit import action, call, complete, text_round, thinking

TIMEOUT_S = 20.0
_names = itertools.count(1)


# -- script building --------------------------------------------------------------------------












def tool_round(tool_id: str, *, say: str = "Calling a tool.", **params: Any) -> dict[str, Any]:
    return text_round(thinking(say), action(call(tool_id, **params)))


def answer_round(answer: str, *, say: str = "Answering.", **round_fields: Any) -> dict[str, Any]:
    return text_round(thinking(say), action(complete(answer)), **round_fields)


# -- the harness ----------------------------------------------------------------------------------


@dataclass
class ModelCall:
    models: tuple[str, ...]
    messages: list[dict[str, Any]]

    @property
    def system(self) -> str:
        return str(self.messages[0]["content"])

    def text(self) -> str:
        return "\n".join(str(m["content"]) for m in self.messages)

    def tools(self) -> list[str]:
        """The tool ids the system prompt offered (its "Tools available now:" list)."""
        listed = self.system.split("Tools available now:", 1)[1]
        return [line[2:].split(" ", 1)[0] for line in listed.splitlines() if line.startswith("- ")]


@dataclass
class Harness:
    conv: Conversation
    executor: LocalToolExecutor
    events: list[Event]
    calls: list[ModelCall]                     # one per stream_model call (a fallback is inside one)
    _waiters: list[tuple[Callable[[Event], bool], asyncio.Future[Event]]] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)  # raised by `when` actions; checked below

    # -- driving --------------------------------------------------------------------------------

    def send(self, text: str, message_id: str | None = None) -> None:
        self.conv.user_message(message_id or f"m{self.conv.state.turns + len(self.conv.state.queue) + 1}", text)

    async def idle(self, timeout: float = TIMEOUT_S) -> None:
        await asyncio.wait_for(self.conv.idle(), timeout)

    async def turn(self, text: str = "hello", timeout: float = TIMEOUT_S) -> dict[str, Any]:
        """Send a message, wait until idle, return the last turn.completed data."""
        self.send(text)
        await self.idle(timeout)
        return self.completed()[-1]

    def on(self, predicate: Callable[[Event], bool]) -> asyncio.Future[Event]:
        """A future resolved by the first durable event (already seen or to come) matching `predicate`."""
        future: asyncio.Future[Event] = asyncio.get_running_loop().create_future()
        for e in self.events:
            if predicate(e):
                future.set_result(e)
                return future
        self._waiters.append((predicate, future))
        return future

    async def wait_event(self, name: str, timeout: float = TIMEOUT_S, **match: Any) -> Event:
        return await asyncio.wait_for(self.on(lambda e: e.event == name and _matches(payload_builtins(e.data), match)),
                                      timeout)

    def when(self, name: str, action: Callable[[Event], None], **match: Any) -> asyncio.Future[Event]:
        """Run `action(event)` as soon as the first matching event is published."""
        def fire(f: asyncio.Future[Event]) -> None:
            if f.cancelled():
                return
            try:
                action(f.result())
            except BaseException as exc:  # a callback's failure must fail the test, not just be logged
                self.errors.append(exc)

        future = self.on(lambda e: e.event == name and _matches(payload_builtins(e.data), match))
        future.add_done_callback(fire)
        return future

    def answer_asks(self, *answers: str) -> None:
        """Answer the next ask_user events, in order, each as soon as it appears."""
        remaining = list(answers)
        answered: set[str] = set()

        def reply(f: asyncio.Future[Event]) -> None:
            if f.cancelled() or not remaining:
                return
            ask_id = payload_builtins(f.result().data)["ask_id"]
            answered.add(ask_id)
            if not self.conv.answer(ask_id, remaining.pop(0)):
                self.errors.append(AssertionError(f"ask {ask_id} was not pending"))
            if remaining:
                self.on(is_new_ask).add_done_callback(reply)

        def is_new_ask(e: Event) -> bool:
            return e.event == "ask_user" and payload_builtins(e.data)["ask_id"] not in answered

        if remaining:
            self.on(is_new_ask).add_done_callback(reply)

    def _publish(self, batch: Sequence[Event]) -> None:
        self.events.extend(batch)
        for e in batch:
            for waiter in list(self._waiters):
                predicate, future = waiter
                if not future.done() and predicate(e):
                    future.set_result(e)
                    self._waiters.remove(waiter)

    # -- reading --------------------------------------------------------------------------------

    def named(self, name: str, **match: Any) -> list[dict[str, Any]]:
        """The `data` of every event `name` whose fields match, as a client decodes it from the wire."""
        found = (payload_builtins(e.data) for e in self.events if e.event == name)
        return [d for d in found if _matches(d, match)]

    def names(self) -> list[str]:
        return [e.event for e in self.events]

    def completed(self) -> list[dict[str, Any]]:
        return self.named("turn.completed")

    def traces(self, kind: str) -> list[dict[str, Any]]:
        return self.named("trace", kind=kind)

    def text(self, name: str, **match: Any) -> str:
        """The concatenated text of a delta lane (thinking.delta / answer.delta)."""
        return "".join(d["text"] for d in self.named(name, **match))

    def results(self, tool_id: str | None = None) -> list[dict[str, Any]]:
        return [d for d in self.named("tool.result") if tool_id is None or d["tool_id"] == tool_id]

    def rounds(self, turn_id: str = "t1") -> list[dict[str, Any]]:
        return self.named("round.completed", turn_id=turn_id)

    def notice_codes(self, turn_id: str = "t1") -> list[list[str]]:
        return [[n["code"] for n in r["notices"]] for r in self.rounds(turn_id)]

    @property
    def model_calls(self) -> int:
        return self.conv.state.model_calls

    def workspace(self) -> dict[str, Any]:
        return dict(self.executor.export_conversation(self.conv.conversation_id)["workspace"])

    def check_invariants(self) -> None:
        """Seqs 1..N contiguous; every tool.call has exactly one tool.result (and none without a call);
        every turn that started completed; no `when` action failed."""
        assert not self.errors, self.errors
        assert [e.seq for e in self.events] == list(range(1, len(self.events) + 1))
        calls = Counter(d["call_id"] for d in self.named("tool.call"))
        results = Counter(d["call_id"] for d in self.named("tool.result"))
        assert all(n == 1 for n in calls.values()), calls
        assert results == calls, (calls, results)
        started = [d["turn_id"] for d in self.named("turn.started")]
        ended = [d["turn_id"] for d in self.completed()]
        assert started == ended, (started, ended)


def _matches(data: Mapping[str, Any], match: Mapping[str, Any]) -> bool:
    return all(k in data and match[k] == data[k] for k in match)


def profile_for(
    model: str,
    *,
    fallbacks: Sequence[str] = (),
    **policy_overrides: Any,
) -> AgentProfile:
    """The demo profile (states default/focused) playing `model`, with policy overrides."""
    base = demo_profile(known_tools=demo_registry())
    policies = base.policies.model_copy(update=policy_overrides)
    return base.model_copy(update={"model": model, "fallbacks": tuple(fallbacks), "policies": policies})


def script_model(script: Mapping[str, Any] | Script, name: str | None = None) -> str:
    """Register `script` under a fresh name; returns the LiteLLM model string playing it."""
    parsed = script if isinstance(script, Script) else parse_script(script)
    return register_script(name or f"convkit-{next(_names)}", parsed)


def rounds_script(*rounds: Mapping[str, Any], loop: bool = False) -> dict[str, Any]:
    return {"rounds": list(rounds), "loop": loop}


def harness(
    script: Mapping[str, Any] | Script | None = None,
    *,
    model: str | None = None,
    fallbacks: Sequence[str] = (),
    profile: AgentProfile | None = None,
    mode: str = "agent",
    stream: Callable[..., AsyncIterator[Any]] = stream_model,
    model_kwargs: Mapping[str, Any] | None = None,
    flush_interval_ms: float = 0,
    conversation_id: str | None = None,
    count_tokens: Callable[[Sequence[Mapping[str, str]]], int] | None = None,
    **policy_overrides: Any,
) -> Harness:
    """Build a conversation playing `script` (or `model`) on the demo profile. Call inside a running loop."""
    if profile is None:
        if model is None:
            assert script is not None, "give a script, a model or a profile"
            model = script_model(script)
        profile = profile_for(model, fallbacks=fallbacks, **policy_overrides)
    registry = demo_registry()
    executor = LocalToolExecutor(registry, clock=fixed_clock())
    calls: list[ModelCall] = []

    def recording_stream(models: Sequence[str], messages: list[dict[str, Any]], **kwargs: Any) -> AsyncIterator[Any]:
        calls.append(ModelCall(tuple(models), [dict(m) for m in messages]))
        return stream(models, messages, **kwargs)

    runtime = Runtime(
        registry=registry, tools=executor, stream_model=recording_stream,
        count_tokens=count_tokens,  # None: LiteLLM's token counting, as in production
        model_kwargs=dict(model_kwargs or {}),
    )
    cid = conversation_id or f"conv-{next(_names)}"
    log = EventLog(cid, flush_interval_ms=flush_interval_ms)
    state = ConversationState(conversation_id=cid, agent=profile.name, mode=mode,  # type: ignore[arg-type]
                              agent_state=profile.initial_state or "default")
    conv = Conversation(state, profile, runtime, log)
    h = Harness(conv=conv, executor=executor, events=[], calls=calls)
    log.subscribe(h._publish)
    return h
