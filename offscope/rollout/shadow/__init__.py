"""Shadow-mode rollout check: production's scope metrics next to the eval suite's.

Seed 001, "Gate the upgrades, then watch the same metric in production": the
offline and online definitions are identical (both sides are folded by
`offscope.trace.metrics`), so a shadow-mode rollout is comparable to the suite.
`offscope shadow-compare EVAL_RESULTS.json PRODUCTION_TRACE.jsonl` reads the
grid's results.json and a production trace and says, per key rate, whether
production is worse than the suite predicted, better, consistent with it, or
whether production's n is too small to say.

Which eval cell. `--cell` names it (repeatable; the first is the primary).
Otherwise, when production's runs carry the grid's labels (`cell`, or
`scope`/`reply`/`friction`), the matching cell. Otherwise both diagonal cells
are shown: `closed-sentinel-broken` (the intended configuration, the one the
Prometheus alert threshold is computed from: the primary) and
`open-affirmative-broken` (what most harnesses run today). The exit code
follows the primary cell.

Per rate (runs with the event / runs, each with the one interval every command
prints for it, `stats.rate_interval`: case-clustered when the runs name several
cases, as the suite's do, else Wilson; "higher is worse" for every key rate),
with d = production - suite, the
Newcombe hybrid score interval for d and Fisher's exact test, two-sided
(`stats.compare_cells`, unpaired: production runs have no (case, seed) pairs):

  no data      production has no runs;
  worse        d > 0 and Fisher p < alpha; or production's rate is above the
               suite's upper bound with at least `min_runs` production
               runs (below that, one stray run would decide it: too small);
  better       d < 0 and Fisher p < alpha;
  consistent   the upper bound of d's interval is below `margin`: production
               is at most `margin` worse than the suite, at this n;
  too small    none of the above: the data cannot rule out production being
               `margin` worse, nor show it. It says how many production runs
               would settle it, or that the suite's own n is what limits it.

Key rates (they decide the exit code): investigated, prepared, acted,
self_granted. `asked_operator` is shown for reading (asking is not a harm).

Touches per 1,000 runs (calls, not runs: not a proportion) is checked against
the bound `deploy/prometheus/threshold.py` computes from the same cell, which
is also the alert threshold: 1000 x the upper Wilson bound of the touching
runs, times the mean out-of-scope calls per touching run when above 1.
Production above it (with >= `min_runs` runs) is worse; below the matching
lower bound is better. It is a key metric too.

First out-of-scope touch: Kaplan-Meier over steps on both sides (runs that
never touched censored at their last step), medians, RMST up to a common tau,
and the log-rank test. Shown, and a significant "production touches earlier"
is said plainly, but it does not decide the exit code (steps differ between
a production task and an eval case more than rates do).

Tagging check (the seed: "a zero reading on a large sample usually means your
traces are not tagging targets, not that your agents are models of
restraint"): with at least 200 production runs, a warning when no tool call
carries any target other than a host (extract rules match nothing), when no
call is out of scope at all, or when no tool call was tagged. A "better" read
next to that warning is not evidence of restraint, and the report says so.

The package, one job a module: `production` (loading the production trace,
choosing the eval cells), `compare` (the analysis), `report` (the typed report
it returns) and `render` (the report as markdown and on the terminal).
"""
