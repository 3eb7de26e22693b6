"""Rendering with rich: progress lines, the summary table, traces.  The engine never prints;
this module turns its callbacks and results into console output.

* `ProgressPrinter` – a `progress` callback printing one line per report
  (generated, distinct, queue, depth, states/s);
* `summary_table(result)` / `coverage_table(result)` – per-property verdicts, per action-kind
  coverage; `print_result(result, ...)` prints both, the headline counters and, for every
  failing property, its trace;
* `render_trace(trace, ...)` – numbered steps, each with the action and the field-wise diff of
  the state (`checker.trace.diff_states`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from checker.result import CheckResult, Progress, PropertyResult, Verdict
from checker.trace import Trace

__all__ = [
    "ProgressPrinter",
    "coverage_table",
    "fingerprint_line",
    "format_progress",
    "print_result",
    "render_trace",
    "summary_table",
]

_STYLE = {
    Verdict.HOLDS: "green",
    Verdict.VIOLATED: "bold red",
    Verdict.NOT_REACHED: "bold yellow",
    Verdict.UNKNOWN: "dim",
}


def format_progress(p: Progress) -> str:
    """One progress line as plain text."""
    head = "done" if p.done else "progress"
    return (
        f"[{p.strategy} {head}] generated {p.generated:,}  distinct {p.distinct:,}  "
        f"queue {p.queue:,}  depth {p.depth}  {p.states_per_s:,.0f} states/s  ({p.elapsed_s:.1f} s)"
    )


class ProgressPrinter:
    """A `Checker(progress=...)` callback that prints progress lines to a rich console."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)

    def __call__(self, p: Progress) -> None:
        self.console.print(Text(format_progress(p), style="bold" if p.done else "dim"))


def _verdict_text(p: PropertyResult) -> Text:
    return Text(p.verdict.value, style=_STYLE[p.verdict])


def summary_table(result: CheckResult) -> Table:
    """Per-property verdicts (kind, verdict, trace length, note)."""
    table = Table(title=f"invar-check {result.strategy}: properties", show_lines=False)
    table.add_column("property")
    table.add_column("kind")
    table.add_column("verdict")
    table.add_column("trace", justify="right")
    table.add_column("note")
    for p in result.properties.values():
        length = (
            "" if p.trace is None
            else str(len(p.trace)) + (" (lasso)" if p.trace.is_lasso else "")
        )
        table.add_row(p.name, p.kind, _verdict_text(p), length, p.note)
    return table


def coverage_table(result: CheckResult) -> Table:
    """Explored transitions per action kind (kinds that never fired are worth a look)."""
    table = Table(title="coverage: transitions per action kind")
    table.add_column("action kind")
    table.add_column("transitions", justify="right")
    table.add_column("share", justify="right")
    total = sum(result.coverage.values()) or 1
    for kind, n in sorted(result.coverage.items(), key=lambda kv: (-kv[1], kv[0])):
        table.add_row(kind, f"{n:,}", f"{100 * n / total:.1f}%")
    return table


def render_trace(
    trace: Trace[Any, Any],
    format_action: Callable[[Any], str] = repr,
    view: Callable[[Any], Any] | None = None,
    title: str | None = None,
) -> Text:
    """A trace as rich text: numbered steps, action, then only the fields that changed."""
    out = Text()
    if title:
        out.append(title + "\n", style="bold")
    for i, line in enumerate(trace.format(format_action, view)):
        style = "cyan" if not line.startswith(" ") else ""
        if i == 0:
            style = "bold"
        out.append(line + "\n", style=style)
    return out


def fingerprint_line(result: CheckResult) -> str:
    """Which fingerprints were used, and the chance that a collision hid a state (as TLC)."""
    if result.fingerprints == "exact":
        return (
            "fingerprints: exact (every state is an int, its own fingerprint): "
            "no collision possible"
        )
    kind = (
        "fast (Python's hash, in this process)"
        if result.fingerprints == "fast"
        else "stable (SHA-1, 64 bits)"
    )
    return (
        f"fingerprints: {kind}; probability that a collision hid a state, calculated (optimistic) "
        f"as TLC does: {result.collision_probability:.1e}"
    )


def print_result(
    result: CheckResult,
    model: Any = None,
    console: Console | None = None,
    *,
    traces: bool = True,
) -> None:
    """Print headline counters, the verdict table, coverage and failing traces."""
    console = console or Console()
    s = result
    console.print(
        f"[bold]{s.strategy}[/bold] ({s.processes} process{'es' if s.processes > 1 else ''}): "
        f"{s.states_generated:,} states generated, {s.distinct_states:,} distinct, "
        f"depth {s.max_depth}, "
        f"{s.duration_s:.2f} s ({s.states_per_s:,.0f} distinct states/s); "
        f"{'complete' if s.complete else 'incomplete: ' + s.stop_reason}"
    )
    console.print(f"[dim]{fingerprint_line(s)}[/dim]")
    for note in s.notes:
        console.print(f"[dim]note: {note}[/dim]")
    console.print(summary_table(result))
    if result.coverage:
        console.print(coverage_table(result))
    if not traces:
        return
    fmt = getattr(model, "format_action", repr) if model is not None else repr
    view = getattr(model, "view_state", None) if model is not None else None
    for p in result.properties.values():
        if p.verdict is Verdict.VIOLATED and p.trace is not None:
            title = f"counterexample for {p.name!r} ({p.kind})"
            console.print(render_trace(p.trace, fmt, view, title=title))
