"""`reactgate loadtest` as a command: check the configuration, run with a progress bar on stderr,
print the summary, write the report, and say with the exit code whether every check passed."""

from __future__ import annotations

import asyncio
from typing import Final

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn

from client.loadtest.report import print_summary, render_html
from client.loadtest.runner import LoadConfig, LoadRunner, ScriptInfo

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.fields[phase]:<8}"),
        BarColumn(),
        TextColumn("{task.fields[clock]}"),
        TextColumn("turns {task.fields[turns]}"),
        TextColumn("events/s {task.fields[eps]}"),
        TextColumn("users {task.fields[users]}"),
        console=console,
        auto_refresh=False,
    )


def run_loadtest(config: LoadConfig, script_info: ScriptInfo | None = None) -> int:
    """Exit 0 when every check passed, 1 when one failed, 2 on bad usage, 130 on Ctrl-C.

    `script_info` describes the script the server is expected to play (`--script F`); it is only
    reported."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    out = Console(highlight=False, soft_wrap=True)
    try:
        config.check()
    except ValueError as exc:  # NotLoopback, bad numbers
        err.print(f"reactgate loadtest: {exc}", markup=False)
        return EXIT_USAGE
    progress = _progress(err)
    progress.add_task("load", total=config.duration_s, phase="sending", clock="", turns=0, eps=0,
                      users=config.conversations)
    runner = LoadRunner(config, progress)
    try:
        with progress:
            result = asyncio.run(runner.run())
    except KeyboardInterrupt:
        return 130
    result.script_info = script_info
    print_summary(result, out)
    if config.report is not None:
        try:
            config.report.write_text(render_html(result), encoding="utf-8")
        except OSError as exc:
            err.print(f"reactgate loadtest: cannot write the report: {exc}", markup=False)
            return EXIT_USAGE
        out.print(f"report: {config.report}", markup=False, highlight=False)
    return EXIT_FAILED if result.failures() else EXIT_OK
