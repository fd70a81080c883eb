"""`reactgate` — the command line (SPEC §9). Each subcommand imports its module lazily, so
`reactgate chat` never pays for LiteLLM or Ray."""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM stalls offline without it
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="reactgate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    mock = sub.add_parser("mock-llm", help="serve a script as an OpenAI-compatible SSE endpoint")
    mock.add_argument("--script", required=True, help="script JSON file (SPEC §7)")
    mock.add_argument("--host", default="127.0.0.1")
    mock.add_argument("--port", type=int, default=8766)

    args = parser.parse_args(argv)
    if args.command == "mock-llm":
        from actors.llm.mock_server import run_mock_server

        return run_mock_server(args.script, host=args.host, port=args.port)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
