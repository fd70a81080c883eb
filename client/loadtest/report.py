"""What a load test reports: the terminal summary (rich) and a self-contained HTML report.

The HTML page is `report.html` (package data), filled with `string.Template`; Python writes only the
table rows and the SVG charts that go into it. Nothing is fetched: no script, no CDN, no font.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources import files
from string import Template
from typing import Final

from hdrh.histogram import HdrHistogram
from rich.console import Console
from rich.table import Table

from client.loadtest.runner import Result
from client.loadtest.user import Stats

PRINTED_PERCENTILES: Final = (50.0, 95.0, 99.0)
# The classic HdrHistogram plot: x = log10(1 / (1 - q)), so 90 %, 99 %, 99.9 % … are equally spaced.
CURVE_PERCENTILES: Final = (0.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 97.5, 99.0, 99.5, 99.9, 99.95, 99.99)
CURVE_X_MAX: Final = 5.0  # where the max is drawn (the 99.999th percentile's position)
PERCENTILE_TICKS: Final = ((0.0, "0%"), (1.0, "90%"), (2.0, "99%"), (3.0, "99.9%"), (4.0, "99.99%"),
                           (5.0, "max"))
LATENCIES: Final = (
    ("time to first delta", "ttfd"),
    ("delivery (live)", "delivery"),
    ("delivery (resumed backlog)", "resume_delivery"),
    ("turn (message → completed)", "turn_time"),
)
PASS_TEXT: Final = "PASS: no event lost, duplicated or out of order; every turn completed"


# ---------------------------------------------------------------------------------------------
# Numbers.


@dataclass(frozen=True)
class Summary:
    """Percentiles of one histogram, in milliseconds."""

    count: int
    p50: float
    p95: float
    p99: float
    max: float
    mean: float


def summarize(hist: HdrHistogram) -> Summary:
    if hist.get_total_count() == 0:
        return Summary(0, math.nan, math.nan, math.nan, math.nan, math.nan)
    at = [hist.get_value_at_percentile(p) / 1000 for p in PRINTED_PERCENTILES]
    return Summary(hist.get_total_count(), at[0], at[1], at[2], hist.get_max_value() / 1000,
                   hist.get_mean_value() / 1000)


def percentile_curve(hist: HdrHistogram) -> list[tuple[float, float]]:
    """(x, ms) points: x = log10(1/(1-q)) for each percentile, then the max at CURVE_X_MAX."""
    if hist.get_total_count() == 0:
        return []
    points = [(math.log10(100.0 / (100.0 - p)), hist.get_value_at_percentile(p) / 1000) for p in CURVE_PERCENTILES]
    points.append((CURVE_X_MAX, hist.get_max_value() / 1000))
    return points


def latency_rows(stats: Stats) -> list[tuple[str, Summary]]:
    return [(label, summarize(getattr(stats, name))) for label, name in LATENCIES]


def correctness_rows(result: Result) -> list[tuple[str, int]]:
    """The counts that must all be 0 for the run to pass."""
    return [("lost", result.lost), ("duplicated", result.duplicated), ("out of order", result.out_of_order),
            ("incomplete turns", result.incomplete_turns), ("failed turns", result.stats.turns_failed)]


def counts_line(result: Result) -> str:
    """One plain line a script can parse."""
    s = result.stats
    return (
        f"lost={result.lost} duplicated={result.duplicated} out_of_order={result.out_of_order} "
        f"turns={s.turns_ended} completed_turns={s.turns_completed} failed_turns={s.turns_failed} "
        f"incomplete_turns={result.incomplete_turns} events={s.events} reconnects={s.reconnects} "
        f"garbled_turns={s.garbled_turns} foreign_events={s.errors['client.foreign_event']} "
        f"unreadable_frames={s.errors['client.unreadable_frame']} unverified_users={result.unverified_users}"
    )


def latency_line(stats: Stats) -> str:
    """One plain line of the latencies a script can parse (ms), next to `counts_line`."""
    parts = []
    for name in ("delivery", "ttfd", "resume_delivery"):
        s = summarize(getattr(stats, name))
        parts.append(f"{name}_p50_ms={_ms(s.p50)} {name}_p99_ms={_ms(s.p99)} {name}_max_ms={_ms(s.max)}")
    return " ".join(parts)


def summary_rows(result: Result) -> list[tuple[str, str]]:
    """Throughput and outcome rows, shared by the terminal summary and the HTML report."""
    stats, elapsed = result.stats, result.elapsed_s

    def rate(n: int) -> str:
        return f"{n / elapsed:.1f}" if elapsed > 0 else "-"

    return [
        ("turns ended", str(stats.turns_ended)),
        ("turns/s", rate(stats.turns_ended)),
        ("events", str(stats.events)),
        ("events/s", rate(stats.events)),
        ("reconnects (injected)", str(stats.reconnects)),
        ("commands re-sent / acked duplicate", f"{stats.resent} / {stats.duplicate_acks}"),
        ("asks answered", str(stats.asks_answered)),
        ("turn reasons", ", ".join(f"{k}={v}" for k, v in sorted(stats.reasons.items())) or "-"),
        ("errors", ", ".join(f"{k}={v}" for k, v in sorted(stats.errors.items())) or "none"),
    ]


def script_text(result: Result) -> str:
    info = result.script_info
    if info is None:
        return "No --script given."
    return (f"Script {info.path}: {info.rounds} round(s){' (loops)' if info.loop else ''}, chunks per round "
            f"{list(info.chunks_per_round)}, {info.chunks_per_pass} chunks per pass.")


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


# ---------------------------------------------------------------------------------------------
# The terminal.


def print_summary(result: Result, console: Console) -> None:
    latency = Table(title="latency (ms)", title_justify="left")
    for column in ("", "count", "p50", "p95", "p99", "max"):
        latency.add_column(column, justify="left" if not column else "right")
    for label, s in latency_rows(result.stats):
        latency.add_row(label, str(s.count), _ms(s.p50), _ms(s.p95), _ms(s.p99), _ms(s.max))
    console.print(latency)

    totals = Table(title="throughput and correctness", title_justify="left", show_header=False)
    totals.add_column(justify="left")
    totals.add_column(justify="right")
    rows = [("conversations", str(result.config.conversations)), ("elapsed (s)", f"{result.elapsed_s:.2f}"),
            *summary_rows(result)]
    for label, value in rows:
        totals.add_row(label, value)
    for label, n in correctness_rows(result):
        totals.add_row(label, f"[{'green' if n == 0 else 'bold red'}]{n}[/]")
    console.print(totals)
    if result.script_info is not None:
        console.print(f"{script_text(result)} This is what the server plays if started with this script.",
                      markup=False)
    console.print(counts_line(result), markup=False, highlight=False, soft_wrap=True)
    console.print(latency_line(result.stats), markup=False, highlight=False, soft_wrap=True)
    failures = result.failures()
    if failures:
        console.print(f"FAIL: {'; '.join(failures)}", style="bold red", markup=False)
    else:
        console.print("PASS", style="bold green")


# ---------------------------------------------------------------------------------------------
# SVG charts: the elements of one inline <svg>, with no scripts and no external resources.


@dataclass(frozen=True)
class Series:
    name: str
    color: str
    points: Sequence[tuple[float, float]]


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 × 10ⁿ that is ≥ value (axis maxima that read well)."""
    if not value > 0 or not math.isfinite(value):
        return 1.0
    scale = 10.0 ** math.floor(math.log10(value))
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        if step * scale >= value * (1 - 1e-12):  # float noise must not push 100 to 200
            return step * scale
    return 10.0 * scale  # pragma: no cover


def svg_chart(
    title: str,
    series: Sequence[Series],
    *,
    x_max: float,
    x_ticks: Sequence[tuple[float, str]],
    x_label: str,
    y_label: str,
    markers: Sequence[tuple[float, str]] = (),
    width: int = 640,
    height: int = 300,
) -> str:
    """A line chart as an inline SVG string."""
    left, right, top, bottom = 64, 16, 34, 48
    pw, ph = width - left - right, height - top - bottom
    y_max = nice_ceiling(max((y for s in series for _, y in s.points), default=0.0))
    x_max = x_max if x_max > 0 else 1.0

    def px(x: float) -> float:
        return left + pw * min(max(x / x_max, 0.0), 1.0)

    def py(y: float) -> float:
        return top + ph * (1.0 - min(max(y / y_max, 0.0), 1.0))

    esc = html.escape
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="{esc(title)}" font-family="sans-serif" font-size="11">',
        f'<text x="{left}" y="18" font-size="13" font-weight="bold">{esc(title)}</text>',
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#ccc"/>',
    ]
    for i in range(6):
        y = y_max * i / 5
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{py(y):.1f}" y2="{py(y):.1f}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:g}</text>')
    for x, label in x_ticks:
        out.append(f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{top}" y2="{top + ph}" stroke="#eee"/>')
        out.append(f'<text x="{px(x):.1f}" y="{top + ph + 15}" text-anchor="middle">{esc(label)}</text>')
    for x, label in markers:
        out.append(f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{top}" y2="{top + ph}" stroke="#999" '
                   'stroke-dasharray="4 3"/>')
        out.append(f'<text x="{px(x) - 4:.1f}" y="{top + ph - 6}" text-anchor="end" fill="#666">'
                   f'{esc(label)}</text>')
    out.append(f'<text x="{left + pw / 2:.1f}" y="{height - 8}" text-anchor="middle">{esc(x_label)}</text>')
    out.append(f'<text transform="translate(14 {top + ph / 2:.1f}) rotate(-90)" text-anchor="middle">'
               f'{esc(y_label)}</text>')
    for n, s in enumerate(series):
        if s.points:
            coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
            out.append(f'<polyline fill="none" stroke="{s.color}" stroke-width="2" points="{coords}"/>')
            out.extend(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{s.color}"/>'
                       for x, y in s.points)
        ly = top + 14 + 14 * n
        out.append(f'<rect x="{left + pw - 150}" y="{ly - 8}" width="10" height="10" fill="{s.color}"/>')
        out.append(f'<text x="{left + pw - 135}" y="{ly + 1}">{esc(s.name)}</text>')
    if not any(s.points for s in series):
        out.append(f'<text x="{left + pw / 2:.1f}" y="{top + ph / 2:.1f}" text-anchor="middle" fill="#999">'
                   'no samples</text>')
    out.append("</svg>")
    return "\n".join(out)


def percentile_chart(title: str, series: Sequence[tuple[str, str, HdrHistogram]]) -> str:
    return svg_chart(
        title, [Series(name, color, percentile_curve(h)) for name, color, h in series],
        x_max=CURVE_X_MAX, x_ticks=PERCENTILE_TICKS, x_label="percentile", y_label="ms",
    )


def timeline_chart(title: str, name: str, color: str, buckets: Sequence[int], duration_s: float) -> str:
    points = [(i + 0.5, float(n)) for i, n in enumerate(buckets)]
    x_max = max(float(len(buckets)), duration_s, 1.0)
    step = max(1, math.ceil(x_max / 10))
    ticks = [(float(t), str(t)) for t in range(0, int(x_max) + 1, step)]
    return svg_chart(title, [Series(name, color, points)], x_max=x_max, x_ticks=ticks,
                     x_label="seconds since start", y_label="per second",
                     markers=[(duration_s, "end of --duration")])


# ---------------------------------------------------------------------------------------------
# The HTML page.


def _template() -> Template:
    return Template(files("client.loadtest").joinpath("report.html").read_text(encoding="utf-8"))


def render_html(result: Result) -> str:
    stats, cfg, esc = result.stats, result.config, html.escape
    failures = result.failures()
    summary = [
        ("url", cfg.url),
        ("conversations", str(cfg.conversations)),
        ("duration (s)", f"{cfg.duration_s:g}"),
        ("reconnect rate (drops/s per conversation)", f"{cfg.reconnect_rate:g}"),
        ("cut once mid-answer (fraction of users)", f"{cfg.cut_fraction:g}"),
        ("ramp-up (s)", f"{cfg.ramp_up_s:g}"),
        ("elapsed, with drain (s)", f"{result.elapsed_s:.2f}"),
        *summary_rows(result),
    ]
    charts = [
        percentile_chart("time to first delta, by percentile", [("TTFD", "#1f77b4", stats.ttfd)]),
        percentile_chart("delivery latency, by percentile", [
            ("live events", "#2ca02c", stats.delivery), ("resumed backlog", "#ff7f0e", stats.resume_delivery),
        ]),
        timeline_chart("events received per second", "events/s", "#9467bd", stats.events_per_s, cfg.duration_s),
        timeline_chart("turns ended per second", "turns/s", "#d62728", stats.turns_per_s, cfg.duration_s),
    ]
    return _template().substitute(
        generated=esc(time.strftime("%Y-%m-%d %H:%M:%S")),
        verdict_class="fail" if failures else "pass",
        verdict=esc(f"FAIL: {'; '.join(failures)}" if failures else PASS_TEXT),
        correctness_rows="".join(
            f'<tr><th>{esc(k)}</th><td class="{"ok" if n == 0 else "bad"}">{n}</td></tr>'
            for k, n in correctness_rows(result)
        ),
        summary_rows="".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in summary),
        latency_rows="".join(
            f"<tr><th>{esc(label)}</th><td>{s.count}</td><td>{_ms(s.p50)}</td><td>{_ms(s.p95)}</td>"
            f"<td>{_ms(s.p99)}</td><td>{_ms(s.max)}</td><td>{_ms(s.mean)}</td></tr>"
            for label, s in latency_rows(stats)
        ),
        charts="\n".join(charts),
        script=esc(script_text(result)),
    )
