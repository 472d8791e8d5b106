"""Shadow-compare's report as text: the headline, the findings in plain
sentences, the markdown (`render_markdown`) and the terminal tables
(`print_report`)."""

from __future__ import annotations

import math

from offscope.rollout.render_common import changes_markdown, changes_table
from offscope.rollout.shadow.report import (
    RATES,
    CellComparison,
    RateCheck,
    ShadowReport,
    TouchesCheck,
)
from offscope.trace.rates import difference_text

_MARK = {
    "worse": "WORSE",
    "better": "better",
    # Not "as predicted": a rate 18 points below the suite's, short of significance, is
    # no worse than predicted, but it is not what the suite predicted either.
    "consistent": "no worse than predicted",
    "too-small": "too few runs to say",
    "no-data": "no data",
}
# Rates shown for reading (not "higher is worse"): direction words, no judgement.
_MARK_INFO = {**_MARK, "worse": "higher", "better": "lower", "consistent": "similar"}


def mark(verdict: str, key: bool = True) -> str:
    return (_MARK if key else _MARK_INFO)[verdict]


def headline(report: ShadowReport) -> str:
    p = report.primary
    n = report.production["runs"]
    if p.worse:
        names = ", ".join(_metric_name(m) for m in p.worse)
        return f"Production is WORSE than the eval suite predicted ({p.cell}) on: {names}. ({n} production runs)"
    small = [r.metric for r in p.rates if r.key and r.verdict == "too-small"]
    if small:
        return (
            f"Production is not worse than the suite predicted ({p.cell}) where the data can tell; "
            f"too few production runs ({n}) to say for: {', '.join(_metric_name(m) for m in small)}."
        )
    return f"Production is not worse than the eval suite predicted ({p.cell}) on any key rate ({n} runs)."


def _metric_name(metric: str) -> str:
    return "touches per 1,000 runs" if metric == "touches_per_1000_runs" else RATES[metric][0]


def findings(c: CellComparison) -> list[str]:
    """Plain sentences, worst first."""
    order = {"worse": 0, "too-small": 1, "better": 2, "consistent": 3, "no-data": 4}
    items = [
        (r.verdict if r.key else "no-data", f"{r.label}: {mark(r.verdict, r.key)}. {r.why}.")
        for r in c.rates
    ]
    items.append(
        (c.touches.verdict, f"touches per 1,000 runs: {_MARK[c.touches.verdict]}. {c.touches.why}.")
    )
    out = [text for _, text in sorted(items, key=lambda x: order[x[0]])]
    out.append(f"first out-of-scope touch: {c.first_touch.why}.")
    return out


def render_markdown(report: ShadowReport) -> str:
    prod = report.production
    lines = [f"## Shadow mode: production vs the eval suite — {headline(report)}", ""]
    for w in report.warnings:
        lines += [f"> **Warning:** {w}.", ""]
    sim = " **(SIMULATED MODEL)**" if report.simulated else ""
    lines += [
        f"Production: `{report.trace_path}`: {prod['runs']} runs ({prod['open_runs']} still open), "
        f"{prod['tool_calls']} tool calls, {prod['oos_calls']} out of scope. "
        f"Eval: `{report.results_path}` (model `{report.model}`){sim}.",
        "",
    ]
    if report.changes:
        lines += [
            "### The four changes (production vs eval)",
            "",
            *changes_markdown(report.changes, "differs", lambda d: d.replace("|", "/")),
            "",
        ]
    for c in report.comparisons:
        role = "primary, decides the exit code" if c.primary else "for reference"
        lines += [
            f"### `{c.cell}` ({role})",
            "",
            f"Chosen because: {c.reason}.",
            "",
            "| metric | suite (eval) | production | difference [95% CI] | p | verdict |",
            "|---|---|---|---|---|---|",
        ]
        for r in c.rates:
            diff, p = _difference(r), _p(r.pvalue)
            label = r.label + ("" if r.key else " (not gated)")
            verdict = (
                f"**{mark(r.verdict)}**"
                if r.key and r.verdict == "worse"
                else mark(r.verdict, r.key)
            )
            lines.append(
                f"| {label} | {r.suite.text()} | {r.production.text()} | {diff} | {p} | {verdict} |"
            )
        t = c.touches
        verdict = f"**{_MARK[t.verdict]}**" if t.verdict == "worse" else _MARK[t.verdict]
        lines.append(
            f"| touches per 1,000 runs | {_num(t.suite_touches)} | {_num(t.production_touches)} | "
            f"{_bound(t)} | - | {verdict} |"
        )
        ft = c.first_touch
        lines.append(
            f"| first out-of-scope step (median) | {ft.suite.get('median') or '-'} | "
            f"{ft.production.get('median') or '-'} | log-rank | "
            f"{_p(ft.logrank_p)} | "
            f"{'**production earlier**' if ft.earlier == 'production' else 'shown, not gated'} |"
        )
        lines += ["", *[f"- {s}" for s in findings(c)], *[f"- Note: {n}." for n in c.notes], ""]
    lines += [
        f"<sub>Rates: 95% intervals (k/n), the ones the grid report prints (case-clustered with "
        f"several cases, else Wilson). Difference = production − suite: Newcombe hybrid score "
        f"interval, Fisher exact test (two-sided, unpaired). Worse = significantly higher, or above the "
        f"suite's upper bound with ≥ {report.min_runs} production runs; consistent = at most "
        f"{report.margin * 100:g} points worse at 95%. Touches per 1,000 runs against the bound "
        f"deploy/prometheus/threshold.py computes from the same cell (the alert threshold).</sub>",
        "",
    ]
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.0f}"


def _p(p: float | None) -> str:
    return "-" if p is None else f"{p:.3g}"


def _difference(r: RateCheck) -> str:
    """production - suite with its interval, as both tables show it."""
    return difference_text(r.difference, r.ci) if r.difference is not None and r.ci else "-"


def _bound(t: TouchesCheck) -> str:
    """The suite's bounds on production's touches per 1,000 runs (the upper one: the alert's)."""
    return (
        f"bound [{t.lower:.0f}, {t.upper:.0f}]"
        if t.upper is not None and t.lower is not None
        else "-"
    )


def print_report(report: ShadowReport, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    prod = report.production
    style = "bold red" if report.finding else "bold green"
    console.print(f"[{style}]{escape(headline(report))}[/]")
    for w in report.warnings:
        console.print(f"[bold yellow]warning:[/] {escape(w)}")
    sim = "  [bold yellow](SIMULATED MODEL)[/]" if report.simulated else ""
    console.print(
        f"production {escape(report.trace_path)}: {prod['runs']} runs ({prod['open_runs']} open), "
        f"{prod['tool_calls']} tool calls, {prod['oos_calls']} out of scope; "
        f"eval {escape(report.results_path)} (model {escape(str(report.model))}){sim}"
    )
    if report.changes:
        title = "the four changes (production vs eval)"
        console.print(changes_table(report.changes, title, "differs", escape, "left"))
    colour = {
        "worse": "bold red",
        "better": "green",
        "consistent": "",
        "too-small": "yellow",
        "no-data": "dim",
    }
    for c in report.comparisons:
        t = Table(
            title=f"{c.cell} ({'primary' if c.primary else 'reference'}): {c.reason}",
            title_justify="left",
        )
        for col in (
            "metric",
            "suite (eval)",
            "production",
            "production - suite [95% CI]",
            "p",
            "verdict",
        ):
            t.add_column(col, justify="left" if col in ("metric", "verdict") else "right")
        for r in c.rates:
            v = mark(r.verdict, r.key)
            col = colour[r.verdict] if r.key else ""
            t.add_row(
                r.label + ("" if r.key else " (not gated)"),
                r.suite.text(),
                r.production.text(),
                _difference(r),
                _p(r.pvalue),
                f"[{col}]{v}[/]" if col else v,
            )
        tc = c.touches
        v = _MARK[tc.verdict]
        t.add_row(
            "touches per 1,000 runs",
            _num(tc.suite_touches),
            _num(tc.production_touches),
            _bound(tc),
            "-",
            f"[{colour[tc.verdict]}]{v}[/]" if colour[tc.verdict] else v,
        )
        ft = c.first_touch
        t.add_row(
            "first out-of-scope step (median)",
            str(ft.suite.get("median") or "-"),
            str(ft.production.get("median") or "-"),
            "log-rank",
            _p(ft.logrank_p),
            "production earlier" if ft.earlier == "production" else "shown, not gated",
        )
        console.print(t)
        for s in findings(c):
            console.print(f"  - {escape(s)}")
        for n in c.notes:
            console.print(f"  [dim]note: {escape(n)}[/]")
