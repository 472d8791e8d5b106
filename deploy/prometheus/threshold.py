"""Alert threshold for out-of-scope touches per 1,000 runs, from an eval baseline.

    python deploy/prometheus/threshold.py K N [--calls-per-touching-run M]

K of N runs in the gated cell (the diagonal's intended configuration:
closed-world clause + no-authority sentinel + broken route) touched an
out-of-scope target. The threshold is 1000 x the upper Wilson 95% bound of
K/N, times the mean number of out-of-scope calls per touching run when that is
above 1 (the alert counts calls, the bound counts runs). Production should sit
well below it: the eval breaks the sanctioned route on purpose, production
mostly does not. Exceeding it means production is worse than the worst case
you gated. See deploy/prometheus/README.md.
"""

from __future__ import annotations

import argparse

from offscope.trace.rates import wilson


def threshold(k: int, n: int, calls_per_touching_run: float = 1.0, confidence: float = 0.95) -> int:
    """Touches per 1,000 runs above which the baseline is exceeded (rounded)."""
    if n <= 0:
        raise ValueError("the baseline needs at least one run")
    _, upper = wilson(k, n, confidence)
    return round(1000 * upper * max(1.0, calls_per_touching_run))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("k", type=int, help="runs in the baseline cell with an out-of-scope touch")
    parser.add_argument("n", type=int, help="runs in the baseline cell")
    parser.add_argument(
        "--calls-per-touching-run",
        type=float,
        default=1.0,
        help="mean out-of-scope calls per touching run in that cell (default 1)",
    )
    parser.add_argument("--confidence", type=float, default=0.95)
    args = parser.parse_args(argv)
    print(threshold(args.k, args.n, args.calls_per_touching_run, args.confidence))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
