"""How many infrastructure failures a result may hold and still count as complete.

A run that ended with reason `infra_error` is missing data, never a result
(offscope/trace/metrics.py). A result that holds any is incomplete: its rates
rest on fewer runs than planned, and on the runs the infrastructure let
through, which need not be a random subset. `--max-infra-errors N|P%` (on
`grid`, `merge` and `gate`) says how many are tolerated; the default, 0,
tolerates none: a grid with missing runs must not look clean. Above the
threshold `grid` and `merge` still write their reports (with the counts) and
exit 1; `gate` refuses the input (exit 2).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from offscope.errors import InputError
from offscope.evalmode.report.results_model import Results

DEFAULT_MAX = "0"
HELP = (
    "runs that may end on an infrastructure failure (infra_error: the model endpoint or the "
    "agent process failed after retries) before the result counts as incomplete: a count N "
    "or a share P%% of the runs (default 0: any infra error makes it incomplete)"
)


@dataclass(frozen=True)
class InfraThreshold:
    """At most `count` runs, or at most `share` (0..1) of the runs, may be infra errors."""

    count: int | None = 0
    share: float | None = None
    text: str = DEFAULT_MAX

    @classmethod
    def parse(cls, text: str) -> InfraThreshold:
        raw = text.strip()
        try:
            if raw.endswith("%"):
                share = float(raw[:-1]) / 100
                if not 0 <= share <= 1:
                    raise ValueError
                return cls(count=None, share=share, text=raw)
            count = int(raw)
            if count < 0:
                raise ValueError
            return cls(count=count, text=raw)
        except ValueError:
            raise InputError(
                f"bad --max-infra-errors {text!r}",
                hint="a count N >= 0 (e.g. 0, 5) or a share P% (e.g. 1%)",
            ) from None

    def exceeded(self, errors: int, runs: int) -> bool:
        if self.share is not None:
            return errors > self.share * runs
        return errors > (self.count or 0)


def add_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-infra-errors",
        default=DEFAULT_MAX,
        type=InfraThreshold.parse,
        metavar="N|P%",
        help=HELP,
    )


def summary(results: Results) -> str:
    """`N infra error(s) of M runs (cell a: x, cell b: y)`."""
    per_cell = ", ".join(
        f"{c}: {b.infra_errors}" for c, b in results.cells.items() if b.infra_errors
    )
    return f"{results.infra_error_count} infra error(s) of {results.planned_runs} runs ({per_cell})"


def over_threshold(results: Results, threshold: InfraThreshold) -> str | None:
    """What is wrong when `results` holds more infra errors than `threshold` allows, else None."""
    errors = results.infra_error_count
    if not threshold.exceeded(errors, results.planned_runs):
        return None
    return (
        f"{summary(results)} is above --max-infra-errors {threshold.text}: those runs are "
        "missing, not results"
    )


RESUME_HINT = (
    "fix the endpoint or the agent's infrastructure, then run the same command again into the "
    "same --out: resume re-runs exactly the infra-error runs"
)
