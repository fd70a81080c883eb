"""One round's model streams into its engine: the round driver of the turn's shell (docs/design.md#turn).

A round is one model response, continuations included: every model call of the round feeds the
*same* `RoundEngine`, and the turn machine says after each whether the round is over, goes on or is
cut (`TurnMachine.continuation`). `RoundStreams` carries that out and protects:

- **An answer that reached the user is never generated twice** (docs/design.md#continuation). A
  length cut-off, a connection cut after part of the answer streamed, or a crash mid-answer is
  continued from the exact character, never asked again from its beginning; a continuation's first
  characters pass the restart check (`RestartCheck`), so a model that started over never reaches
  the user and the round ends salvaged, partial.
- **Fallback only before the first delta** (docs/design.md#fallback). The model call itself moves to
  the next model while nothing streamed (`ModelFallback`, announced as it comes); a failure after a
  delta is never answered by another model starting over: with an answer streaming, the next model
  (announced by a `fallback` event; with none left, the same one) *continues* it, else the round is
  cut with `provider_error`.
- **The record of which models wrote the round** (`models`, kept with its raw output,
  docs/design.md#replay): a model counts once its delta reached the engine.

A native round's engine reads every delta; the channel protocol's reads the text (docs/design.md#native).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Protocol

from actors.continuation import RestartCheck
from actors.decision import Decision, Prompt
from actors.llm.stream import ModelDelta, ModelFallback, ModelFinished, ProviderError, StreamItem
from actors.round import RoundEngine, RoundEvent, RoundOutcome, RoundResult
from actors.tracing import TurnTrace
from actors.turn_machine import CutRound, Holds, StreamEnd, Then, TurnMachine, continuation_models, cut_notice
from protocol.events import EventData, Fallback
from protocol.notices import Notice


class RoundContext(Prompt, Protocol):
    """What a round's streams need from the conversation: the prompt, the models, the model call."""

    @property
    def profile_models(self) -> Sequence[str]: ...
    @property
    def decision(self) -> Decision: ...           # the profile's decision protocol (docs/design.md#native)

    def stream(self, messages: list[dict[str, Any]], models: Sequence[str] | None = None,
               tools: Sequence[Mapping[str, Any]] | None = None) -> AsyncIterator[StreamItem]: ...


class RoundStreams:
    """The model calls of a turn's rounds, each round's into its engine. `stream_event` shows what
    the engine made of a delta; `emit` announces a fallback."""

    def __init__(self, ctx: RoundContext, machine: TurnMachine, trace: TurnTrace, *, turn_id: str,
                 stream_event: Callable[[RoundEvent], None], emit: Callable[[EventData], None]) -> None:
        self.ctx = ctx
        self.machine = machine
        self.turn_id = turn_id
        self._trace = trace
        self._stream_event = stream_event
        self._emit = emit
        self.streaming = False          # a round's model stream is open (a checkpoint taken meanwhile says so)
        self.models: list[str] = []     # the models whose deltas the round's engine got

    async def run(self, engine: RoundEngine, resumed: CutRound | None = None) -> RoundResult:
        """The round: model streams into the engine until the machine says the round is over
        (`CONTINUATION`: continue after a length cut-off or a connection cut, docs/design.md#continuation).
        `resumed`: the round a crash cut mid-answer, replayed into `engine`; it goes on from its
        durable text with a continuation."""
        self.streaming = True
        self.models = []
        ctx, m = self.ctx, self.machine
        try:
            base, tools = ctx.decision.request(ctx, engine.rules, turn_id=self.turn_id,
                                               allow_no_tool=m.allows_no_tool, exploration_cap=m.exploration_cap)
            models: list[str] | None = None
            continuations = resumed.continuations if resumed is not None else 0
            end, failure = ((StreamEnd.CRASH, None) if resumed is not None
                            else await self._stream(engine, base, None, None, tools))
            while True:
                holds = Holds.ANSWER if engine.answer_streamed else Holds.TEXT if engine.has_output else Holds.NOTHING
                then = m.continuation(end, holds, continuable=engine.continuable, continuations=continuations)
                if then is Then.END:
                    return self.finish(engine)
                if then is Then.CUT:
                    notice = cut_notice(end, holds, continuations=continuations,
                                        kind=failure.kind if failure else "",
                                        mid_response=failure.after_first_delta if failure else True,
                                        cause=failure.detail if failure else "", model=failure.model if failure else "")
                    return self._finish_cut(engine, notice, failure.cause if failure else None)
                continuations += 1
                if failure is not None:
                    models = self._continuation_models(failure)
                model = (models or ctx.profile_models)[0]
                messages, restart = ctx.decision.continuation(base, engine, end, model)
                end, failure = await self._stream(engine, messages, models, restart, tools)
        finally:
            self.streaming = False

    def finish(self, engine: RoundEngine, cut: Notice | None = None, *, interrupted: bool = False) -> RoundResult:
        """End the round's engine; what it still held is shown as the engine makes it."""
        events, result = engine.finish(cut=cut, interrupted=interrupted)
        for event in events:
            self._stream_event(event)
        return result

    async def _stream(
        self, engine: RoundEngine, messages: list[dict[str, Any]], models: list[str] | None,
        restart: RestartCheck | None, tools: list[dict[str, Any]] | None,
    ) -> tuple[StreamEnd, ProviderError | None]:
        """One model call into the engine; how it ended. A restarted continuation never reaches the
        user; the prefix policy's abort closes the provider stream at once. A native round's engine
        reads every delta; the channel protocol's reads the text."""
        finish_reason: str | None = None
        model = (models or self.ctx.profile_models)[0]  # the one streaming; a fallback moves it on
        native = engine.native
        try:
            call = self._trace.model_call(self.ctx.stream(messages, models, tools), model)
            async with contextlib.aclosing(call) as stream:  # type: ignore[type-var]
                async for item in stream:
                    if type(item) is ModelDelta:
                        text = item.text if restart is None else restart.admit(item.text)
                        if text is None:
                            return StreamEnd.RESTARTED, None
                        if text and model not in self.models:
                            self.models.append(model)
                        events = engine.feed_delta(ModelDelta(text)) if native else engine.feed(text)
                        for event in events:
                            self._stream_event(event)
                        if engine.aborted:
                            return StreamEnd.ENDED, None
                    elif type(item) is ModelFallback:
                        model = item.to_model
                        self._emit(Fallback(from_model=item.from_model, to_model=item.to_model, error=item.error))
                    elif type(item) is ModelFinished:
                        finish_reason = item.finish_reason
                    elif native and not isinstance(item, ModelFallback | ModelFinished):
                        # reasoning, a call's start, its arguments, its end
                        if model not in self.models:
                            self.models.append(model)
                        for event in engine.feed_delta(item):
                            self._stream_event(event)
        except ProviderError as exc:
            return StreamEnd.CUT, exc
        if restart is not None:
            rest = restart.finish()
            if rest is None:
                return StreamEnd.RESTARTED, None
            for event in (engine.feed_delta(ModelDelta(rest)) if native else engine.feed(rest)) if rest else ():
                self._stream_event(event)
        return (StreamEnd.LENGTH if finish_reason == "length" and not engine.aborted else StreamEnd.ENDED), None

    def _continuation_models(self, failure: ProviderError) -> list[str]:
        """The models a continuation after `failure` goes to: the failing one's next fallbacks,
        announced by a `fallback` event; with none left, the failing model (docs/design.md#fallback)."""
        models, to = continuation_models(self.ctx.profile_models, failure.model)
        if to is not None:
            self._emit(Fallback(from_model=failure.model, to_model=to, error=f"{failure.kind}: {failure.message}"))
        return models

    def _finish_cut(self, engine: RoundEngine, cut: Notice, provider_error: str | None = None) -> RoundResult:
        """End a round whose stream was cut and not continued; a streamed answer is then partial.
        `provider_error`: the provider failure that cut it, which names the turn's end if this round
        spends the last retry."""
        result = self.finish(engine, cut)
        result.partial = result.outcome is RoundOutcome.SALVAGE
        result.provider_error = provider_error
        return result
