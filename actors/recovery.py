"""Re-activation after a crash: apply the durable log tail written after the last checkpoint
(docs/design.md#recovery).

A checkpoint is taken at turn start, at each round's end, before and after tool execution, and at
turn end; so the tail holds at most one of: a round cut mid-stream, the results of a tool batch
cut mid-execution, or the end of a turn. Recovery reads the facts out of the tail and hands them
to the turn, which records them with its own emitters:
- a round cut by the crash whose answer streamed is salvaged: the user keeps exactly what they saw;
- otherwise the turn re-decides after a `round_interrupted` notice; calls that round announced
  get an error observation, so no call is left without one;
- a tool call whose result is durable is never executed again: the batch in progress is
  re-submitted to the durable tool executor, which answers from the store where it can;
- an external client's call the crash cut observes `round_interrupted`; its host records that as the
  call's durable result first (`cut_external_calls`), so a retry of it runs nothing, however late.
"""

from __future__ import annotations

from collections.abc import Sequence

from actors.catalog import Observation
from actors.conversation import INTERRUPTED, Conversation, ConversationState, QueuedMessage, interrupted
from actors.identity import Caller
from actors.turn import Turn
from actors.turn_machine import TurnProgress
from protocol.events import (
    AnswerDelta,
    Event,
    Fallback,
    MessageKind,
    RoundCompleted,
    ThinkingDelta,
    ToolCalled,
    ToolResult,
    TurnCompleted,
    TurnStarted,
    UserSaid,
)
from protocol.timeline import UserMessageBlock


def recover(conv: Conversation, tail: Sequence[Event], caller: Caller | None = None) -> None:
    """Apply `tail` (the durable events after the snapshot's seq), then resume the conversation.
    `caller` stands for the sender of a message only the log holds (see `_requeue`)."""
    state = conv.state
    for event in tail:
        if isinstance(event.data, UserSaid) and event.data.kind is not MessageKind.STEER:
            _requeue(conv, event.data, caller)
        if isinstance(event.data, TurnStarted) and state.current is None:
            _adopt_started_turn(conv, event.data)
    if state.current is not None:
        _recover_turn(conv, state.current, tail)
    _recover_external_calls(conv, tail)
    conv.resume()


def cut_external_calls(state: ConversationState, tail: Sequence[Event]) -> list[Observation]:
    """The `round_interrupted` observation of each external call (docs/design.md#mcp-face) the crash
    cut, and of each the tail says was cut (the crash may have come before its host recorded it). Its
    host records each as the call's durable result before recovering: the conversation remembers only
    its last cut calls, and a retry of an older one meets the durable result (actors/tools/durable.py)
    and runs nothing."""
    owed, settled = _external_calls(state, tail)
    calls: list[ToolResult | ToolCalled] = [*settled, *owed]
    return [interrupted(c.call_id, c.tool_id) for c in calls]


def _external_calls(state: ConversationState, tail: Sequence[Event]) -> tuple[list[ToolCalled], list[ToolResult]]:
    """External clients' calls a crash cut, each owed its one observation: the snapshot lists those
    started before it (their session's pending calls), the tail those started after it; a result in
    the tail settles one. And the results in the tail that say a call was cut."""
    results = {d.call_id for e in tail if isinstance(d := e.data, ToolResult) and d.client is not None}
    settled = [d for e in tail
               if isinstance(d := e.data, ToolResult) and d.client is not None and d.error == INTERRUPTED.error]
    owed: dict[str, ToolCalled] = {}
    for session in state.external.values():
        for p in session.progress.pending:
            owed[p.call_id] = ToolCalled(turn_id=session.session_id, round=0, call_id=p.call_id, tool_id=p.tool_id,
                                         params=p.params, trait="", client=session.client)
    for event in tail:
        if isinstance(d := event.data, ToolCalled) and d.client is not None:
            owed[d.call_id] = d
    return [c for call_id, c in owed.items() if call_id not in results], settled


def _recover_external_calls(conv: Conversation, tail: Sequence[Event]) -> None:
    cut, settled = _external_calls(conv.state, tail)
    if cut or settled or any(s.progress.pending for s in conv.state.external.values()):
        conv.interrupt_external_calls(cut, [r.call_id for r in settled])
    if cut or settled:
        conv.save()


def _requeue(conv: Conversation, said: UserSaid, caller: Caller | None) -> None:
    """A message the durable log holds and the snapshot does not: its host applied it and died before
    a checkpoint held it. Its idempotency key is in the store already, so the same message sent again
    is a duplicate — dropping it here lost it for good (a host SIGKILLed under bench/soak.py: the
    gateway's retry on the new host was acked `duplicate`, and no turn ever ran). It is queued again,
    in log order, with the owner as its caller: the token's claims did not travel in the log."""
    if not conv.state.holds_message(said.message_id):
        conv.state.queue.append(QueuedMessage(said.message_id, said.text, {}, caller))


def _adopt_started_turn(conv: Conversation, started: TurnStarted) -> None:
    """turn.started is durable but its own checkpoint is not: the message is still queued."""
    state = conv.state
    index = next((i for i, m in enumerate(state.queue) if m.message_id == started.user_message_id), None)
    if index is None:
        return
    message = state.queue.pop(index)
    state.turns += 1
    conv.record(UserMessageBlock(started.turn_id, message.message_id, message.text))
    state.current = TurnProgress(turn_id=started.turn_id, message_id=message.message_id, text=message.text,
                                 trace=message.trace, caller=message.caller)  # the resumed turn stays in its message's trace


def _recover_turn(conv: Conversation, current: TurnProgress, tail: Sequence[Event]) -> None:
    turn = Turn(conv, current)
    mine = [e.data for e in tail if getattr(e.data, "turn_id", None) == current.turn_id]
    _count_model_calls(conv, current, tail)
    for data in mine:  # results the crash left after the checkpoint: recorded, never re-run
        if isinstance(data, ToolResult):
            turn.apply_durable_result(data)
    completed = next((d for d in mine if isinstance(d, TurnCompleted)), None)
    if completed is not None:  # the turn ended; only its last checkpoint was lost
        turn.complete_from_log(completed)
        conv.state.current = None
        return
    # The round the crash cut: the one a cut resumed, the one streaming when the snapshot was
    # taken (a command's save), or else the one after the last round-end checkpoint.
    if current.cut is not None:
        cut_round = current.cut.round_no
    else:
        cut_round = current.round_no if current.streaming else current.round_no + 1
    if current.streaming and current.cut is None:
        turn.machine.progress.round_no = cut_round - 1
    in_cut = [d for d in mine if getattr(d, "round", None) == cut_round]
    if not in_cut or any(isinstance(d, RoundCompleted) for d in in_cut):
        conv.state.current = turn.progress()
        return
    turn.apply_cut_round(
        thinking="".join(d.text for d in in_cut if isinstance(d, ThinkingDelta)),
        announced=[d for d in in_cut if isinstance(d, ToolCalled)],
        answer="".join(d.text for d in in_cut if isinstance(d, AnswerDelta)),
    )
    conv.state.current = turn.progress()
    # Saved now, not at the next checkpoint: what recovery recorded must not be lost to a second crash.
    conv.save()


def _count_model_calls(conv: Conversation, current: TurnProgress, tail: Sequence[Event]) -> None:
    """Model calls made after the snapshot, as the durable log shows them: one per round that
    streamed, one per fallback. The scripted model plays "the i-th call", so a resumed turn must
    not replay a call it already made (docs/design.md#scripted-model)."""
    # An external client's calls are no model call of the agent's (docs/design.md#mcp-face).
    rounds = {(d.turn_id, d.round) for e in tail if isinstance(d := e.data, ThinkingDelta | AnswerDelta | ToolCalled)
              and getattr(d, "client", None) is None}
    if current.streaming:
        rounds.discard((current.turn_id, current.round_no))  # its call was made before the snapshot
    conv.state.model_calls += len(rounds) + sum(isinstance(e.data, Fallback) for e in tail)
