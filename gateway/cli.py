"""reactgate: serve governed agent conversations over WebSockets, chat with them, load-test them.

Each subcommand imports its module lazily, so `reactgate chat` never pays for LiteLLM or Ray."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final, TypeAlias

if TYPE_CHECKING:
    from asyncio import AbstractEventLoop

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM stalls offline without it
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
AddParser: TypeAlias = Callable[[Subparsers, str], argparse.ArgumentParser]  # (subparsers, its name) → its parser
Run: TypeAlias = Callable[[argparse.Namespace], int]                         # parsed arguments → the exit status


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    run: Run = args.run
    return run(args)


def parser() -> argparse.ArgumentParser:
    """`reactgate` with every subcommand of `SUBCOMMANDS` (at the end of this file), in its order."""
    top = argparse.ArgumentParser(prog="reactgate", description=__doc__)
    commands = top.add_subparsers(dest="command", required=True)
    groups: dict[str, Subparsers] = {}
    for words, (add_parser, run) in SUBCOMMANDS.items():
        *group, name = words.split()
        subparsers = commands
        if group:  # `reactgate agent check`: the group's parser first, once
            (word,) = group
            if word not in groups:
                groups[word] = commands.add_parser(word, help=GROUPS[word]).add_subparsers(
                    dest=f"{word}_command", required=True)
            subparsers = groups[word]
        add_parser(subparsers, name).set_defaults(run=run)
    return top


def _token(args: argparse.Namespace) -> str | None:
    """--token, else REACTGATE_TOKEN: read here, at the edge, never inside the client library."""
    return args.token or os.environ.get("REACTGATE_TOKEN") or None


# -- serve ----------------------------------------------------------------------------------------


def _serve_parser(subparsers: Subparsers, name: str) -> argparse.ArgumentParser:
    serve = subparsers.add_parser(name, help="serve agent conversations over WebSockets (demo agent with no flags)")
    serve.add_argument("--host", help="bind address (default 127.0.0.1; anything else needs an auth secret)")
    serve.add_argument("--port", type=int, help="port (default 8765; 0 picks a free one)")
    serve.add_argument("--backend", choices=["ray", "local"], help="hosting backend (default ray)")
    serve.add_argument("--agent", action="append", metavar="PROFILE.toml|DIR",
                       help="an agent profile TOML, or a directory of them; repeat to serve several, the first "
                       "being the default (default: the built-in demo agent)")
    serve.add_argument("--default-agent", metavar="NAME", help="the agent of `open` without one (default: the first)")
    serve.add_argument("--script", help="play this scripted-model JSON instead of the profile's model")
    serve.add_argument("--model", help="LiteLLM model string serving the agent (provider key from the environment)")
    serve.add_argument("--store", help="sqlite:///PATH (default ./data/reactgate.sqlite3) or postgresql://...")
    serve.add_argument("--ray-address", help="join this Ray cluster instead of starting a local one")
    serve.add_argument("--auth-secret", help="JWT HS256 secret, 32 bytes or more (prefer REACTGATE_AUTH_SECRET: argv is visible)")
    return serve


# The flags of `serve` that override a setting (README.md#configuration); unset, the setting stands.
SERVE_SETTINGS: Final = ("host", "port", "backend", "agent", "default_agent", "script", "model", "store", "ray_address",
                         "auth_secret")


def _serve(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from pydantic import ValidationError

    from actors.hosting.backend import ConfigurationReplaced
    from gateway.app import StartupError, build_backend
    from gateway.auth import AuthConfigError, load_verifier
    from gateway.origins import OriginConfigError, OriginPolicy
    from gateway.server import run
    from gateway.settings import BindRefused, Settings, check_bind

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    overrides = {key: value for key in SERVE_SETTINGS if (value := getattr(args, key)) is not None}
    try:
        settings = Settings(**overrides)
        # Everything that can be refused is refused before anything starts: the bind, the key
        # files and the secret's length, the allowed origins, the agent and its store.
        check_bind(settings)
        load_verifier(settings)
        OriginPolicy.from_settings(settings)
        backend = build_backend(settings)
    except (StartupError, BindRefused, AuthConfigError, OriginConfigError, ValidationError) as exc:
        print(f"reactgate serve: {exc}", file=sys.stderr)
        return 2
    try:
        factory = event_loop_factory(settings.event_loop)
    except StartupError as exc:
        print(f"reactgate serve: {exc}", file=sys.stderr)
        return 2
    logging.getLogger("reactgate.gateway").info("event loop: %s", "uvloop" if factory else "asyncio")
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(run(settings, backend))
    except ConfigurationReplaced as exc:  # the cluster serves a newer configuration (docs/design.md#generations)
        print(f"reactgate serve: refused by the cluster: {exc}", file=sys.stderr)
        return 2
    return 0


def event_loop_factory(choice: str) -> Callable[[], AbstractEventLoop] | None:
    """The loop `serve` runs on (Settings.event_loop): uvloop's where asked, or with "auto" where it
    imports; None is asyncio's own. Asked for and missing, it is refused at start-up."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            from gateway.app import StartupError

            raise StartupError("event_loop = uvloop, but uvloop is not installed (pip install uvloop)") from None
        return None
    return uvloop.new_event_loop  # type: ignore[no-any-return]


# -- chat -----------------------------------------------------------------------------------------


def _chat_parser(subparsers: Subparsers, name: str) -> argparse.ArgumentParser:
    chat = subparsers.add_parser(name, help="terminal client: stream a conversation, resume after reconnect")
    chat.add_argument("--url", default="ws://127.0.0.1:8765/ws", help="gateway WebSocket URL")
    chat.add_argument("--token", help="JWT (default: REACTGATE_TOKEN; argv is visible to other users)")
    which = chat.add_mutually_exclusive_group()
    which.add_argument("--conversation", help="re-open this conversation (replays its history)")
    which.add_argument("--resume", action="store_true",
                       help="re-open the last conversation this chat opened on --url (replays its history)")
    chat.add_argument("--agent", help="agent profile for a new conversation (default: the server's)")
    chat.add_argument("--mode", choices=["agent", "ask"], help="set this mode when opening")
    chat.add_argument("--message", help="send one message, print the turn, exit 0 when it gave an answer (else 1)")
    chat.add_argument("--give-up-after", type=float, default=120.0, metavar="S",
                      help="exit 2 after S seconds without a connection (default 120)")
    return chat


def _chat(args: argparse.Namespace) -> int:
    from client.chat import run_chat
    from client.resume import LastConversations, state_path

    return run_chat(
        args.url, token=_token(args), conversation_id=args.conversation, message=args.message,
        agent=args.agent, mode=args.mode, give_up_after_s=args.give_up_after,
        resume=args.resume, last=LastConversations(state_path(os.environ)),
    )


# -- mock-llm -------------------------------------------------------------------------------------


def _mock_llm_parser(subparsers: Subparsers, name: str) -> argparse.ArgumentParser:
    mock = subparsers.add_parser(name, help="serve a script as OpenAI-compatible and Anthropic Messages SSE endpoints")
    mock.add_argument("--script", required=True, help="script JSON file (docs/design.md#scripted-model)")
    mock.add_argument("--host", default="127.0.0.1")
    mock.add_argument("--port", type=int, default=8766)
    return mock


def _mock_llm(args: argparse.Namespace) -> int:
    from actors.llm.mock_server import run_mock_server

    return run_mock_server(args.script, host=args.host, port=args.port)


# -- loadtest -------------------------------------------------------------------------------------


def _loadtest_parser(subparsers: Subparsers, name: str) -> argparse.ArgumentParser:
    load = subparsers.add_parser(
        name,
        help="simulated users against a gateway on this machine: latency, throughput, lost/duplicated events",
        description="N simulated users (one connection and one conversation each) send turns back to back "
        "for S seconds, then let their last turn finish. Prints p50/p95/p99/max of time to first delta and "
        "delivery latency, turns/s, events/s, errors, and the counts of lost, duplicated and out-of-order "
        "events; exits 1 unless those are 0, every turn completed with the answer its deltas showed, no "
        "frame was unreadable or of another user's conversation, and every user's stream reached the "
        "server's head. Loopback addresses only.",
    )
    load.add_argument("--url", default="ws://127.0.0.1:8765/ws",
                      help="gateway WebSocket URL; the host must be a loopback address (127.0.0.1 or [::1])")
    load.add_argument("--conversations", type=int, default=10, metavar="N", help="concurrent users (default 10)")
    load.add_argument("--duration", type=float, default=10.0, metavar="S",
                      help="seconds during which users start new turns (default 10)")
    load.add_argument("--script", metavar="F",
                      help="the script the server plays (reactgate serve --script F): only reported, the load "
                      "tester cannot choose the server's model")
    load.add_argument("--reconnect-rate", type=float, default=0.0, metavar="P",
                      help="abrupt drops per second per user (Poisson; mean 1/P s between drops), each followed "
                      "by a reconnect that resumes after the last seen seq (default 0)")
    load.add_argument("--cut-fraction", type=float, default=0.0, metavar="F",
                      help="cut exactly round(F×N) users' connections once each, mid-answer, at moments spread "
                      "over the run; each resumes after the last seen seq (default 0)")
    load.add_argument("--ramp-up", type=float, default=0.0, metavar="S",
                      help="start the users evenly over S seconds instead of all at once (default 0)")
    load.add_argument("--report", metavar="FILE.html", help="write a self-contained HTML report with latency plots")
    load.add_argument("--token", help="JWT (default: REACTGATE_TOKEN; argv is visible to other users)")
    load.add_argument("--drain-timeout", type=float, default=30.0, metavar="S",
                      help="after the duration, wait at most S seconds for the last turns (default 30)")
    load.add_argument("--message", help="the user message every turn sends")
    load.add_argument("--seed", type=int, help="seed for the drop schedule")
    return load


def _loadtest(args: argparse.Namespace) -> int:
    from client.loadtest.command import EXIT_USAGE, run_loadtest
    from client.loadtest.runner import LoadConfig, ScriptInfo
    from client.loadtest.user import DEFAULT_MESSAGE

    config = LoadConfig(
        url=args.url, conversations=args.conversations, duration_s=args.duration,
        reconnect_rate=args.reconnect_rate, cut_fraction=args.cut_fraction, ramp_up_s=args.ramp_up,
        drain_timeout_s=args.drain_timeout, token=_token(args),
        message=args.message or DEFAULT_MESSAGE, report=Path(args.report) if args.report else None, seed=args.seed,
    )
    script_info = None
    if args.script:
        # The runner reports the script the server plays but never imports the runtime: read it here.
        from actors.llm.scripts import load_script

        try:
            config.check()  # a bad URL is reported before any file is read
            script = load_script(Path(args.script))  # raises ScriptError naming the file and the field
        except ValueError as exc:
            print(f"reactgate loadtest: {exc}", file=sys.stderr)
            return EXIT_USAGE
        script_info = ScriptInfo(args.script, len(script.rounds), script.loop, tuple(len(r.chunks) for r in script.rounds))
    return run_loadtest(config, script_info)


# -- agent check ----------------------------------------------------------------------------------


def _agent_check_parser(subparsers: Subparsers, name: str) -> argparse.ArgumentParser:
    check = subparsers.add_parser(
        name, help="load a profile as serve would (tools imported, MCP servers started) and print its tools per state",
    )
    check.add_argument("profile", nargs="+", help="agent profile TOML, or a directory of them; several are each "
                       "checked, then together")
    check.add_argument("--json", action="store_true", help="print JSON instead of tables")
    check.add_argument("--probe", action="store_true",
                       help="call each model once, as a turn would, and say what came back (exit 1 if one fails)")
    return check


def _agent_check(args: argparse.Namespace) -> int:
    from gateway.agent_check import check

    return check([Path(p) for p in args.profile], as_json=args.json, run_probe=args.probe)


# -- replay ---------------------------------------------------------------------------------------


def _replay_parser(subparsers: Subparsers, name: str) -> argparse.ArgumentParser:
    replay = subparsers.add_parser(
        name,
        help="re-run a recorded conversation's model output under another agent profile; exit 3 when it differs",
        description="Re-runs the raw model output of every recorded round of a conversation through the "
        "governance of another agent profile (no model call, no tool call; recorded observations are reused "
        "where the same call is accepted) and prints what would differ per round: lanes allowed/denied, "
        "emitted characters, notices, finish legality, the final answer. Exits 0 when nothing differs, "
        "3 when something does, 2 on bad input.",
    )
    replay.add_argument("--store", required=True, help="the store holding the conversation: sqlite:///PATH or postgresql://...")
    replay.add_argument("--conversation", required=True, help="the conversation id")
    replay.add_argument("--agent", required=True, metavar="OTHER.toml", help="the agent profile to replay under")
    replay.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    return replay


def _replay(args: argparse.Namespace) -> int:
    from gateway.replay_command import run

    return run(args)


# -- conversations --------------------------------------------------------------------------------


def _conversations_parser(subparsers: Subparsers, name: str) -> argparse.ArgumentParser:
    listing = subparsers.add_parser(
        name,
        help="list conversations from the store, most recently active first: one owner's, or everyone's",
        description="The conversation list a caller gets from `list` or GET /v1/conversations, for operators, "
        "read from the store: one owner's (--tenant and --sub) or everyone's, newest activity first, a page at "
        "a time (--before the cursor the previous page printed). Ids go on to `reactgate replay`.",
    )
    listing.add_argument("--store", required=True, help="sqlite:///PATH or postgresql://...")
    listing.add_argument("--tenant", help="the owner's tenant (with --sub)")
    listing.add_argument("--sub", help="the owner's sub (with --tenant)")
    listing.add_argument("--limit", type=int, default=50, help="conversations per page (default 50, at most 1000)")
    listing.add_argument("--before", metavar="CURSOR", help="the next page after the one that printed this cursor")
    listing.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    return listing


def _conversations(args: argparse.Namespace) -> int:
    from gateway.conversations_command import run

    return run(args)


# -- the table ------------------------------------------------------------------------------------

GROUPS: Final[Mapping[str, str]] = {"agent": "work with agent profiles"}

# Every subcommand: its words after `reactgate` (a first word of several is a group of GROUPS), the
# parser of its arguments, what runs it. Parsing imports nothing beyond argparse; each run imports
# what it needs.
SUBCOMMANDS: Final[Mapping[str, tuple[AddParser, Run]]] = {
    #  reactgate …     parser                  run
    "serve":         (_serve_parser,         _serve),
    "chat":          (_chat_parser,          _chat),
    "mock-llm":      (_mock_llm_parser,      _mock_llm),
    "loadtest":      (_loadtest_parser,      _loadtest),
    "agent check":   (_agent_check_parser,   _agent_check),
    "replay":        (_replay_parser,        _replay),
    "conversations": (_conversations_parser, _conversations),
}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
