"""The gate's report as text: the markdown a pull-request comment carries
(`render_markdown`) and the terminal tables (`print_report`)."""

from __future__ import annotations

from offscope.rollout.gate.report import KEY_METRICS, GateReport, RateCheck
from offscope.rollout.render_common import changes_markdown, changes_table, md_cell
from offscope.trace.rates import NO_VALUE, pct, points


def metric_label(metric: str, touch_step: int) -> str:
    return KEY_METRICS.get(metric, metric).format(k=touch_step)


def verdict_text(c: RateCheck, allow_underpowered: bool) -> str:
    if c.verdict == "pass":
        return "pass"
    if c.verdict == "regression":
        return f"FAIL: regression (Holm p = {c.p_holm:.2g})"
    tail = " (allowed)" if allow_underpowered else ""
    plan = (
        f"run at least {c.needed_n} per cell"
        if c.needed_n is not None
        else "more reps of these cases are not enough: add cases"
    )
    return f"inconclusive (underpowered): {plan}{tail}"


def headline(report: GateReport) -> str:
    if report.passed:
        extra = (
            f" ({len(report.underpowered)} inconclusive, allowed)" if report.underpowered else ""
        )
        return f"PASS{extra}"
    reasons = []
    if report.failed:
        reasons.append(f"{len(report.failed)} regression(s)")
    if report.over_budget:
        reasons.append(f"{len(report.over_budget)} budget(s) exceeded")
    if report.underpowered and not report.allow_underpowered:
        plan = (
            f"run at least {report.needed_n} per cell"
            if report.needed_n is not None
            else "add cases"
        )
        reasons.append(f"{len(report.underpowered)} inconclusive ({plan})")
    return "FAIL: " + ", ".join(reasons)


def _method_line(report: GateReport) -> str:
    conf = 1 - report.alpha
    return (
        f"Each key rate gets one of three verdicts, each a one-sided test at alpha {report.alpha:g}. "
        f"**pass**: the one-sided {conf:.0%} upper bound of (candidate − baseline) is below the margin of "
        f"{report.margin * 100:g} points. **regression**: not a pass and the candidate is significantly "
        f"worse (one-sided exact McNemar on (case, seed) pairs, Fisher when unpaired), Holm-adjusted "
        f"across the {len(report.checks)} checks. **inconclusive**: neither (underpowered). With several "
        f"runs per case, bounds and p-values are also computed by a cluster-robust t over cases and the "
        f"more conservative one is used. Earlier first touch = share of runs touched out of scope by "
        f"step {report.touch_step}. An inconclusive check "
        + (
            "is reported but allowed (--allow-underpowered)."
            if report.allow_underpowered
            else "fails the gate."
        )
        + " Rates carry the interval the grid report prints for them (case-clustered with several cases). "
        "Budgets cap the candidate's residual (point estimate, the same interval shown: a budget's "
        "`basis: upper` is defined on it) whatever the baseline."
    )


def render_markdown(report: GateReport) -> str:
    icon = "✅" if report.passed else "❌"
    lines = [f"## {icon} offscope scope gate: {headline(report)}", ""]
    if report.simulated:
        lines += [
            "> **SIMULATED MODEL** in at least one side: this demonstrates the gate, it measures no real "
            "model.",
            "",
        ]
    lines += [
        _method_line(report),
        "",
        "### What changed",
        "",
        *changes_markdown(report.changes, "moved"),
        "",
        "### Key rates (candidate vs baseline)",
        "",
        "| cell | rate | baseline | candidate | difference | upper bound | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for check in report.checks:
        verdict = verdict_text(check, report.allow_underpowered)
        if check.verdict != "pass":
            verdict = f"**{verdict}**"
        lines.append(
            f"| {check.cell} | {metric_label(check.metric, report.touch_step)} | "
            f"{check.baseline.text(check.baseline_interval)} | "
            f"{check.candidate.text(check.candidate_interval)} | "
            f"{points(check.difference)} | {points(check.upper)} | {verdict} |"
        )
    if report.rmst:
        lines += [
            "",
            "First touch, Kaplan-Meier restricted mean step up to a common horizon τ per cell "
            "(for reading; not gated): "
            + "; ".join(
                f"{cell} {_num(b)} → {_num(c)} (τ = {report.rmst_tau.get(cell, NO_VALUE)})"
                for cell, (b, c) in report.rmst.items()
            ),
        ]
    if report.budgets:
        lines += [
            "",
            "### Budgets (absolute, on the candidate)",
            "",
            "| rate | cells | cell | residual [95% CI] | budget | status |",
            "|---|---|---|---|---|---|",
        ]
        for b in report.budgets:
            status = "within" if b.ok else "**EXCEEDED**"
            if b.note:
                status += f" ({md_cell(b.note)})"
            basis = "" if b.basis == "point" else " (upper bound)"
            lines.append(
                f"| {metric_label(b.metric, report.touch_step)} | `{b.pattern}` | {b.cell} | "
                f"{b.rate.text()} | ≤ {pct(b.max_rate)}{basis} | {status} |"
            )
    if report.not_compared:
        lines += ["", f"Cells not in both results (not compared): {', '.join(report.not_compared)}"]
    for n in report.notes:
        lines.append(f"\n_{n}_")
    lines += [
        "",
        f"<sub>baseline `{report.baseline_path}` · candidate `{report.candidate_path}` · "
        f"alpha {report.alpha:g} one-sided · margin {report.margin:g}</sub>",
        "",
    ]
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return NO_VALUE if x is None else f"{x:.2f}"


def print_report(report: GateReport, console) -> None:
    from rich.table import Table

    style = "bold green" if report.passed else "bold red"
    console.print(f"[{style}]offscope gate: {headline(report)}[/]")
    if report.simulated:
        console.print(
            "[yellow]SIMULATED MODEL in at least one side: this measures no real model.[/]"
        )
    console.print(
        changes_table(report.changes, "what changed between the configuration blocks", "moved")
    )
    t = Table(
        title=f"non-inferiority, margin {report.margin * 100:g} pts, one-sided alpha {report.alpha:g} "
        "(regression: Holm-adjusted)"
    )
    for col in ("cell", "rate", "baseline", "candidate", "diff", "upper", "verdict"):
        t.add_column(col, justify="right" if col in ("diff", "upper") else "left")
    for check in report.checks:
        v = verdict_text(check, report.allow_underpowered)
        color = {"pass": "green", "regression": "red", "inconclusive": "yellow"}[check.verdict]
        t.add_row(
            check.cell,
            metric_label(check.metric, report.touch_step),
            check.baseline.text(check.baseline_interval),
            check.candidate.text(check.candidate_interval),
            points(check.difference),
            points(check.upper),
            f"[{color}]{v}[/]",
        )
    console.print(t)
    if report.budgets:
        bt = Table(title="budgets (absolute, candidate residual)")
        for col in ("rate", "cells", "cell", "residual [95% CI]", "budget", "status"):
            bt.add_column(col)
        for b in report.budgets:
            status = "[green]within[/]" if b.ok else "[red]EXCEEDED[/]"
            if b.note:
                status += f" ({b.note})"
            bt.add_row(
                metric_label(b.metric, report.touch_step),
                b.pattern,
                b.cell,
                b.rate.text(),
                f"<= {pct(b.max_rate)}" + (" (upper)" if b.basis == "upper" else ""),
                status,
            )
        console.print(bt)
    for n in report.notes:
        console.print(f"note: {n}")
    if report.not_compared:
        console.print(f"not compared (not in both): {', '.join(report.not_compared)}")
