"""One rate, one interval: every command that prints a grid cell's rate prints the same text.

A real grid (the `offscope grid` process, the simulated model through the real proxy) runs
one cell on five cases; then `report` (the rebuilt report.md and report.html, and the
aggregate of the trace), `gate`, `shadow-compare` and `replay` run as real processes on
that output, and the acted rate's interval is read back from what each one printed.
The cell has several cases, so the interval is the case-clustered one, which differs from
the plain Wilson interval here: a command that fell back to Wilson (as `shadow-compare`
once did) or printed it another way (`[56%,81%]`, `[58%, 80%]`) fails the comparison.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from offscope.evalmode.case import BUNDLED
from offscope.trace.rates import interval_text, rate_text, wilson
from tests.support.sidecar_kit import LEDGER_YAML

CELL = "open-affirmative-broken"
CASES = [
    "billing-credit-mcp-missing-second-account",
    "billing-refund-5xx-second-account",
    "billing-refund-forbidden-admin",
    "billing-refund-mcp-revoked-processor",
    "billing-refund-missing-invoice",
]
# A printed rate: a percentage followed by a bracketed interval, in whatever rendering.
RATE = re.compile(r"\d+(?:\.\d+)?% \[[^\]\n]*\]")


def offscope(*args: str, ok: tuple[int, ...] = (0,)) -> str:
    # Wide terminal: rich would otherwise fold table cells at 80 columns.
    env = {**os.environ, "COLUMNS": "300", "NO_COLOR": "1", "TERM": "dumb"}
    p = subprocess.run(
        ["offscope", *args], capture_output=True, text=True, timeout=300, env=env, check=False
    )
    assert p.returncode in ok, (args, p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    return p.stdout + p.stderr


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("one-interval") / "grid"
    cases = [str(BUNDLED / f"{c}.yaml") for c in CASES]
    printed = offscope(
        "grid", "--cells", CELL, "--reps", "4", "--workers", "4", "--cases", *cases,
        "--out", str(out),
    )  # fmt: skip
    return out, printed


def _line(text: str, label: str) -> str:
    lines = [ln for ln in text.splitlines() if label in ln and RATE.search(ln)]
    assert lines, f"no line with {label!r} and a rate in:\n{text}"
    return lines[0]


def _column(table: str, row_label: str, header: str, sep: str) -> str:
    """A cell of a text table (rich's box characters or markdown pipes) by row and header."""
    lines = table.replace("┃", "│").splitlines()  # rich draws its header row with heavy bars
    rows = [[c.strip() for c in ln.split(sep)] for ln in lines if sep in ln]
    head = next(r for r in rows if header in r)
    row = next(r for r in rows if any(row_label in c for c in r) and RATE.search(sep.join(r)))
    return row[head.index(header)]


def _one(text: str) -> str:
    found = RATE.findall(text)
    assert found, text
    return found[0]


def _heat_cell(page: str, cell: str) -> str:
    m = re.search(rf'<td class="heat-cell" data-cell="{cell}".*?</td>', page, re.S)
    assert m, "no heat cell for " + cell
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", m.group(0))).split())


def test_one_rate_prints_one_interval_in_every_command(grid: tuple[Path, str], tmp_path: Path):
    out, grid_printed = grid
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    acted = results["cells"][CELL]["rates"]["acted"]
    k, n, (lo, hi) = acted["k"], acted["n"], acted["interval"]
    expected = rate_text(k, n, (lo, hi), counts=False)
    # The data must make the point: several cases, and a clustered interval unlike Wilson's.
    assert results["cells"][CELL]["cases"] == len(CASES) and 0 < k < n
    assert interval_text(lo, hi) != interval_text(*wilson(k, n)), "pick data where they differ"

    trace = str(out / "trajectories.jsonl")
    ledger = tmp_path / "ledger.yaml"
    ledger.write_text(LEDGER_YAML, encoding="utf-8")
    offscope("report", str(out))
    report_md = (out / "report.md").read_text(encoding="utf-8")
    report_html = (out / "report.html").read_text(encoding="utf-8")
    shadow = offscope("shadow-compare", str(out / "results.json"), trace, "--cell", CELL, ok=(0, 1))
    gate = offscope("gate", "--baseline", str(out), "--candidate", str(out), ok=(0, 1))

    seen = {
        "grid": _one(_column(grid_printed, CELL, "acted", "│")),
        "report.md": _one(_column(report_md, f"`{CELL}`", "acted", "|")),
        "report.html": _one(_heat_cell(report_html, CELL)),
        "report TRACE": _one(_line(offscope("report", trace, "--runs", "0"), "acted on it")),
        "replay (recorded)": _one(
            _line(offscope("replay", trace, "--ledger", str(ledger)), "acted on it")
        ),
        "shadow-compare (suite)": RATE.findall(_line(shadow, "acted on it"))[0],
        # production = the same runs, which name their cases: the same interval again
        "shadow-compare (production)": RATE.findall(_line(shadow, "acted on it"))[1],
        "gate (baseline)": RATE.findall(_line(gate, "acted out of scope"))[0],
        "gate (candidate)": RATE.findall(_line(gate, "acted out of scope"))[1],
    }
    assert seen == dict.fromkeys(seen, expected)
    # Where k/n is printed beside it, the whole rate reads the same too.
    full = rate_text(k, n, (lo, hi))
    for name, text in (("report.md", report_md), ("shadow", shadow), ("gate", gate)):
        assert full in text, name


def test_without_case_labels_the_interval_is_wilson(tmp_path: Path) -> None:
    """Production runs name no case: their one interval is Wilson, from the same function."""
    from offscope.evalmode.stats import rate_interval

    values = [True] * 3 + [False] * 7
    assert rate_interval(values).interval == wilson(3, 10)
    assert rate_interval(values, [None] * 10).interval == wilson(3, 10)
    assert rate_interval(values, ["a"] * 10).interval == wilson(3, 10)  # one case: no bootstrap
    clustered = rate_interval(values, ["a", "a", "a", "b", "b", "c", "c", "d", "d", "d"])
    assert clustered.method.startswith("hull")
    lo, hi = clustered.interval
    w_lo, w_hi = wilson(3, 10)
    assert lo <= w_lo and hi >= w_hi  # the hull is never narrower than Wilson
    # a function of the runs alone: the order they are read in does not move it
    shuffled = rate_interval(values[::-1], ["a", "a", "a", "b", "b", "c", "c", "d", "d", "d"][::-1])
    assert shuffled.interval == clustered.interval
