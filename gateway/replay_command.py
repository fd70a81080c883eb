"""`reactgate replay`: would another agent profile have governed a recorded conversation the same
way? (docs/design.md#replay)

Reads the conversation's durable events and round outputs from the store, replays them under the
profile given (`actors/replay.py`, no model call, no tool call), and prints what differs per round
— as tables, or with `--json` as one JSON document — then says it with the exit code, so that a
profile change can be gated in CI: 0 nothing differs, 3 something does, 2 bad input (the message
names the problem). The store is only read, except that opening it creates any missing table, as
`serve` would.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import msgspec
from rich.console import Console
from rich.table import Table
from rich.text import Text

from actors.agent import load_agent
from actors.replay import Governance, ReplayReport, RoundReplay, TurnReplay, replay
from actors.store import Store, store_from_url
from protocol.events import Event

EXIT_SAME: Final = 0
EXIT_USAGE: Final = 2
EXIT_DIFFERS: Final = 3

PAGE: Final = 1000  # events per store read


class BadInput(Exception):
    """What the user asked for cannot be replayed; the message says why."""


def run(args: argparse.Namespace) -> int:
    """`reactgate replay` (its arguments: gateway/cli.py)."""
    # Cells hold model-written text: no markup, no emoji codes, nothing rich would reinterpret.
    out = Console(highlight=False, soft_wrap=True, emoji=False)
    err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)
    try:
        governance = load_governance(Path(args.agent))
        report = asyncio.run(replay_stored(args.store, args.conversation, governance))
    except BadInput as exc:
        err.print(f"reactgate replay: {exc}", markup=False)
        return EXIT_USAGE
    if args.json:
        sys.stdout.write(msgspec.json.encode(as_document(report)).decode() + "\n")
    else:
        print_report(report, out, label=Path(args.agent).name)
    if report.replayed_turns == 0:
        err.print(f"reactgate replay: conversation {report.conversation_id!r} has no turn that can be replayed",
                  markup=False)
        return EXIT_USAGE
    return EXIT_DIFFERS if report.differs else EXIT_SAME


def load_governance(path: Path) -> Governance:
    """The profile to replay under, with its tools, loaded as `serve` loads it (its tool modules
    imported, its MCP servers asked for their tools' schemas; no tool is called)."""
    try:
        agent = asyncio.run(load_agent(path))
    except ValueError as exc:  # ProfileError names the file and the field
        raise BadInput(str(exc)) from None
    return Governance.of(agent.profile, agent.registry)


async def replay_stored(url: str, conversation_id: str, governance: Governance) -> ReplayReport:
    store = open_for_reading(url)
    try:
        await store.open()
    except Exception as exc:  # an unreachable server, a file that is no database: bad input here
        raise BadInput(f"cannot open the store {redacted(url)}: {exc}") from None
    try:
        found = await store.conversation_owner(conversation_id)
        if found is None:
            raise BadInput(f"no conversation {conversation_id!r} in the store {redacted(url)}")
        events = await read_all(store, conversation_id)
        outputs = await store.round_outputs(conversation_id)
    finally:
        await store.close()
    return replay(conversation_id, events, outputs, governance, recorded_agent=found[1])


def open_for_reading(url: str) -> Store:
    """The store a URL names; a SQLite file that does not exist is an error, not a new database."""
    try:
        store = store_from_url(url)
    except ValueError as exc:
        raise BadInput(str(exc).replace(url, redacted(url))) from None
    path = getattr(store, "path", None)
    if isinstance(path, str) and path != ":memory:" and not Path(path).is_file():
        raise BadInput(f"no SQLite store at {path}")
    return store


async def read_all(store: Store, conversation_id: str) -> list[Event]:
    events: list[Event] = []
    while True:
        page = await store.read_events(conversation_id, events[-1].seq if events else 0, limit=PAGE)
        events.extend(page)
        if len(page) < PAGE:
            return events


def redacted(url: str) -> str:
    """A store URL as it may be printed: without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


# -- output ------------------------------------------------------------------------------------------


def as_document(report: ReplayReport) -> dict[str, Any]:
    """The report as one JSON document, with the verdict the exit code gives."""
    document: dict[str, Any] = msgspec.to_builtins(report)
    document["differs"] = report.differs
    for turn, data in zip(report.turns, document["turns"], strict=True):
        data["differs"] = turn.differs
    return document


def print_report(report: ReplayReport, out: Console, *, label: str = "") -> None:
    """Tables of what differs, per round; `label` names the profile replayed under (its file)."""
    label = label or report.agent
    recorded = f" (recorded as {report.recorded_agent})" if report.recorded_agent else ""
    out.print(f"conversation {report.conversation_id}{recorded} replayed under {label} ({report.agent})", markup=False)
    for turn in report.turns:
        _print_turn(turn, label, out)
    differing = sum(1 for t in report.turns if t.differs)
    if differing:
        out.print(f"{differing} of {len(report.turns)} turns differ", markup=False)
    else:
        out.print("no differences", markup=False)


def _print_turn(turn: TurnReplay, agent: str, out: Console) -> None:
    if turn.skipped:
        out.print(f"turn {turn.turn_id}: not replayed: {turn.skipped}", markup=False)
        return
    if not turn.differs:
        end = turn.recorded_end.reason
        out.print(f"turn {turn.turn_id}: no differences ({len(turn.rounds)} rounds, ended {end})", markup=False)
        return
    for r in turn.rounds:
        if r.differs:
            _print_round(turn.turn_id, r, agent, out)
    if turn.end_differs:
        assert turn.replayed_end is not None
        table = _table(f"turn {turn.turn_id}: end", agent)
        for name in turn.end_differs:
            table.add_row(name, _cell(getattr(turn.recorded_end, name)), _cell(getattr(turn.replayed_end, name)))
        out.print(table)


def _print_round(turn_id: str, r: RoundReplay, agent: str, out: Console) -> None:
    table = _table(f"turn {turn_id}: round {r.round}", agent)
    for name in r.differs:
        table.add_row(name, _cell(getattr(r.recorded, name)), _cell(getattr(r.replayed, name)))
    out.print(table)
    for note in r.notes:
        out.print(f"  note: {note}", markup=False)


def _table(title: str, agent: str) -> Table:
    table = Table(title=Text(title), title_justify="left")
    table.add_column("")
    # Folded, never cut: a cell names the call or the notice the diff is about.
    table.add_column("recorded", overflow="fold")
    table.add_column(Text(f"under {agent}"), overflow="fold")
    return table


def _cell(value: object) -> Text:
    if isinstance(value, Sequence) and not isinstance(value, str):
        return Text("\n".join(str(v) for v in value) or "-")
    if value is None or value == "":
        return Text("-")
    return Text(str(value))
