"""Re-activation after a crash: apply the durable log tail written after the last checkpoint.

A checkpoint is taken at turn start, at each round's end, before and after tool execution, and at
turn end; so the tail holds at most one of: a round cut mid-stream, the results of a tool batch
cut mid-execution, or the end of a turn. The rules (SPEC §5 Faults):
- a round cut by the crash whose answer streamed is salvaged: the user keeps exactly what they saw;
- otherwise the turn re-decides after a `round_interrupted` notice; calls that round announced
  get an error observation, so no call is left without one;
- a tool call whose result is durable is never executed again: the batch in progress is
  re-submitted to the durable tool executor, which answers from the store where it can.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from actors.turn import Phase, Turn, TurnProgress
from protocol.events import Event
from protocol.notices import Notice, NoticeCode
from protocol.timeline import (
    FinalBlock,
    NoticeBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultBlock,
    UserMessageBlock,
)

if TYPE_CHECKING:
    from actors.conversation import Conversation
    from actors.store import Store


async def recover(conv: Conversation, tail: Sequence[Event], store: Store) -> None:
    state = conv.state
    for event in tail:
        if event.event == "turn.started" and state.current is None:
            _adopt_started_turn(conv, event)
    current = state.current
    if current is None:
        conv.resume()
        return
    mine = [e for e in tail if e.data.get("turn_id") == current.turn_id]
    completed = next((e for e in mine if e.event == "turn.completed"), None)
    _apply_results(conv, current, mine)
    if completed is not None:  # the turn ended; only its last checkpoint was lost
        if completed.data.get("final_answer"):
            conv.record(FinalBlock(current.turn_id, completed.data["final_answer"], completed.data["reason"]))
        state.current = None
        conv.resume()
        return
    cut_round = [e for e in mine if e.data.get("round") == current.round_no + 1 or e.event == "fallback"]
    if cut_round:
        await _round_cut(conv, current, cut_round)
    conv.resume()


def _adopt_started_turn(conv: Conversation, started: Event) -> None:
    """turn.started is durable but its own checkpoint is not: the message is still queued."""
    state = conv.state
    message_id = started.data.get("user_message_id")
    index = next((i for i, m in enumerate(state.queue) if m.message_id == message_id), None)
    if index is None:
        return
    message = state.queue.pop(index)
    state.turns += 1
    turn_id = started.data["turn_id"]
    conv.record(UserMessageBlock(turn_id, message.message_id, message.text))
    state.current = TurnProgress(turn_id=turn_id, message_id=message.message_id, text=message.text)


def _apply_results(conv: Conversation, current: TurnProgress, events: Sequence[Event]) -> None:
    """tool.result events the crash left after the checkpoint: record them, drop them from pending."""
    pending = {p.call_id for p in current.pending}
    for event in events:
        call_id = event.data.get("call_id")
        if event.event == "tool.result" and call_id in pending:
            data = event.data
            payload: dict[str, Any] = (
                dict(data.get("result") or {}) if data.get("ok") else {"error": data.get("error"), **data.get("detail", {})}
            )
            conv.record(ToolResultBlock(current.turn_id, call_id, data["tool_id"], bool(data.get("ok")), payload))
            current.pending = [p for p in current.pending if p.call_id != call_id]
            current.observations += 1
            pending.discard(call_id)


async def _round_cut(conv: Conversation, current: TurnProgress, events: Sequence[Event]) -> None:
    """A round the crash cut mid-stream (no round.completed for it in the log)."""
    round_no = current.round_no + 1
    if any(e.event == "round.completed" and e.data.get("round") == round_no for e in events):
        return
    turn = Turn.resume(conv, current)
    turn.round_no = round_no
    answer = "".join(e.data["text"] for e in events if e.event == "answer.delta")
    thinking = "".join(e.data["text"] for e in events if e.event == "thinking.delta")
    if thinking:
        conv.record(ThinkingBlock(current.turn_id, round_no, thinking))
    announced = [e for e in events if e.event == "tool.call"]
    for call in announced:  # announced, never executed: each still gets an observation
        data = call.data
        conv.record(ToolCallBlock(current.turn_id, round_no, data["call_id"], data["tool_id"], dict(data["params"])))
        turn.observe_error(data["call_id"], data["tool_id"], "round_interrupted")
    if answer:  # the user saw an answer: keep exactly that, never regenerate it
        turn.emit_salvage(answer)
        conv.state.current = None
        conv.checkpoint()
        return
    notice = Notice(code=NoticeCode.ROUND_INTERRUPTED,
                    message="the previous response was cut by a server fault before it finished; decide again")
    conv.record(NoticeBlock(current.turn_id, round_no, notice.to_dict()))
    conv.emit("round.completed", {
        "turn_id": current.turn_id, "round": round_no,
        "streamed_state": {"answer_streamed": False, "answer_text": "", "lanes": []},
        "accepted": [], "denied": [], "notices": [notice.to_dict()], "interrupted": True,
    })
    turn.phase = Phase.DECISION if turn.phase is not Phase.FINALIZE else Phase.FINALIZE
    conv.state.current = turn.progress()
    # Save through the host's hook, not `conv.checkpoint()`: no turn runs yet, and that would
    # recompute `current` from the running turn — None — and drop the turn we resume.
    if conv.on_checkpoint is not None:
        conv.on_checkpoint()
