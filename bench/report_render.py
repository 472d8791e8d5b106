"""What drawing report.html's Kaplan-Meier plot with matplotlib costs a grid.

A grid writes report.md and report.html once, at its end. matplotlib is imported
only when report.html is rendered (offscope/evalmode/report/plots.py). This runs
one small real grid (3 bundled cases, all 12 cells, 1 rep), then, each in a fresh
process (cold imports, as at the end of `offscope grid`), renders report.md alone
and report.md + report.html, and prints the median seconds of each and their
ratio, measured in the same run. `matplotlib_imported_for_md` must be false.

Usage: python bench/report_render.py [--repeat 3]
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """\
import json, sys, time
t = time.perf_counter()
from offscope.evalmode.report.results_model import load_results
from offscope.evalmode.report.render import render_html, render_markdown
results = load_results(sys.argv[1])
render_markdown(results)
if sys.argv[2] == "html":
    render_html(results)
print(json.dumps({"seconds": time.perf_counter() - t, "matplotlib": "matplotlib" in sys.modules}))
"""


def _grid(out: Path) -> None:
    from offscope.evalmode.case import BUNDLED, load_cases
    from offscope.evalmode.grid import Grid, GridConfig, parse_cells
    from offscope.evalmode.report.results import build_results, write_reports

    cfg = GridConfig(
        cases=load_cases([BUNDLED])[:3], cells=parse_cells("all"), reps=1, out=out, workers=8
    )
    asyncio.run(Grid(cfg).run())
    write_reports(out, build_results(out))


def _child(out: Path, what: str) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", CHILD, str(out), what], capture_output=True, text=True, check=True
    )
    return json.loads(p.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "grid"
        _grid(out)
        md, both, imported = [], [], []
        for _ in range(args.repeat):  # interleaved, so load on the machine hits both alike
            m = _child(out, "md")
            md.append(m["seconds"])
            imported.append(m["matplotlib"])
            both.append(_child(out, "html")["seconds"])
    md_s, both_s = statistics.median(md), statistics.median(both)
    print(
        json.dumps(
            {
                "md_only_s": round(md_s, 3),
                "md_and_html_s": round(both_s, 3),
                "html_cost_s": round(both_s - md_s, 3),
                "ratio_md_and_html_to_md_only": round(both_s / md_s, 2),
                "matplotlib_imported_for_md": any(imported),
                "repeat": args.repeat,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
