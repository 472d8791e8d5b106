"""Grid results: results.json (machine), report.md (PR comment), report.html (one page).

Everything is computed from `trajectories.jsonl`, the trace the proxy wrote,
through the same `fold` as `offscope report`, so `offscope report DIR`
rebuilds all three files without re-running anything. The file's fields are
the typed models of `results_model` (`offscope schema results`).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from offscope.errors import InputError
from offscope.evalmode import stats
from offscope.evalmode.outdir import OutdirLock, trace_events, trace_exists
from offscope.evalmode.report.results_model import (  # noqa: F401 (load_results, RESULTS_SCHEMA re-exported)
    RESULTS_SCHEMA,
    SCHEMA_VERSION,
    CapabilityVsScope,
    CellBlock,
    CellKnobs,
    Configuration,
    Contrast,
    InfraErrorRun,
    Methods,
    RateBlock,
    Results,
    RunRow,
    Survival,
    load_results,
)
from offscope.trace import catalog
from offscope.trace.events import Event, WorldEffect
from offscope.trace.metrics import Folder, RunState, oos_share, results, touches_per_1000_runs
from offscope.trace.rates import Rate
from offscope.vocab import CANNED_REPLIES, GRID_FRICTIONS, GRID_SCOPES

# Per-run outcomes reported per cell, in report order.
OUTCOMES = {m.key: m.label for m in catalog.PER_RUN}
PRIMARY = "acted"
PLAN_DRAWS = 1000  # simulated grids per power figure in a report (clustered designs)
PLAN_N_MAX = 2000  # a report plans up to this many runs per cell; beyond, "more than"
KNOBS = ("scope", "reply", "friction")


GRID_LABELS = ("case", "task_class", "cell", "scope", "reply", "friction", "rep", "seed")


def run_rows(events: Iterable[Event]) -> list[RunRow]:
    """One row per finished run that is a result: its labels, outcomes and first-touch data."""
    return grid_runs(events)[0]


def grid_runs(events: Iterable[Event]) -> tuple[list[RunRow], list[InfraErrorRun]]:
    """The grid's finished runs, split once: the results (one row each, the only runs
    any rate is computed over) and the runs that ended on an infrastructure failure
    (counted per cell, never a result: `metrics.results`).

    One pass that keeps per-run state, never the events: held as models, a trajectory's
    events take ~55 KB (11 KB on disk), and holding them all grew the report phase's
    memory with the grid (55 MB at 1,008 trajectories; 17 MB in one pass)."""
    folder = Folder()
    details: dict[str, str | None] = {}
    effects: dict[str, list[WorldEffect]] = {}
    for e in events:
        folder.add(e)
        if e.type == "run_end":
            details[e.run] = e.detail
            if e.effects is not None:
                effects[e.run] = list(e.effects)
    states = folder.finish()
    finished = {k: s for k, s in states.items() if s.ended is not None and "cell" in s.labels}
    counted = {id(s) for s in results(finished.values())}
    infra = [
        InfraErrorRun(
            run=run,
            cell=s.labels["cell"],
            case=s.labels.get("case"),
            rep=s.labels.get("rep"),
            detail=details.get(s.run),
        )
        for run, s in finished.items()
        if id(s) not in counted
    ]
    kept = {k: s for k, s in finished.items() if id(s) in counted}
    return _result_rows(kept, effects), infra


def _result_rows(
    states: dict[str, RunState], effects: dict[str, list[WorldEffect]]
) -> list[RunRow]:
    rows = []
    for run, s in states.items():
        world = effects.get(run, [])
        rows.append(
            RunRow(
                run=run,
                **{k: s.labels.get(k) for k in GRID_LABELS},
                investigated=s.investigated,
                prepared=s.prepared,
                acted=s.acted,
                self_granted=s.self_granted > 0,
                self_granted_count=s.self_granted,
                asked_operator=s.operator_asks > 0,
                world_acted_out_of_scope=any(not x.in_scope for x in world),
                task_success=bool(s.task_success),
                first_oos_step=s.first_oos_step,
                steps=s.steps,
                calls=s.calls,
                oos_calls=s.oos_calls,
                ended=s.ended,
                effects=world,
                # any other per-run outcome of the catalog is the run's attribute of that name
                **{
                    m.key: s.outcome(m.key)
                    for m in catalog.PER_RUN
                    if m.key not in RunRow.model_fields
                },
            )
        )
    return rows


def rate_block(values: list[bool], clusters: list[Any]) -> RateBlock:
    """One rate with the one interval every table and sentence prints for it
    (`interval`, from `stats.rate_interval`): the clustered interval (hull of
    Wilson and the case-level bootstrap) when the cell has several cases, else
    Wilson. `ci95` stays the plain Wilson interval, for reference."""
    rate = Rate(sum(values), len(values))
    fields: dict[str, Any] = {
        "k": rate.k,
        "n": rate.n,
        "rate": rate.value,
        "ci95": rate.interval,
        "method": "wilson",
        "interval": rate.interval,
        "interval_method": "wilson 1927",
    }
    c = stats.rate_clustering(values, clusters)
    if c is not None:
        fields.update(
            {
                "clustered_ci95": c.ci,
                "icc": c.icc,
                "design_effect": c.design_effect,
                "clustered_method": c.method,
                "interval": c.ci,
                "interval_method": c.method,
            }
        )
    return RateBlock(**fields)  # fields not passed stay out of the file


def _grid_tau(by_cell: dict[str, list[RunRow]]) -> int | None:
    """One RMST horizon for the whole grid: the last step observed in every
    cell (an RMST is comparable between cells only up to the same tau)."""
    samples = [s for rows in by_cell.values() if (s := stats.first_touch_runs(rows))]
    return stats.common_tau(*samples) if samples else None


def _cell_block(
    cell: str, rows: list[RunRow], tau: int | None = None, infra_errors: int = 0
) -> CellBlock:
    n = len(rows)
    clusters = [r.case for r in rows]
    rates = {key: rate_block([r.outcome(key) for r in rows], clusters) for key in OUTCOMES}
    calls = sum(r.calls for r in rows)
    oos = sum(r.oos_calls for r in rows)
    km_runs = stats.first_touch_runs(rows)
    survival = stats.kaplan_meier(km_runs, tau=tau) if km_runs else None
    both = CapabilityVsScope(
        success_in_scope=sum(r.task_success and not r.investigated for r in rows),
        success_out_of_scope=sum(r.task_success and r.acted for r in rows),
        failed_in_scope=sum(not r.task_success and not r.investigated for r in rows),
        failed_out_of_scope=sum(not r.task_success and r.acted for r in rows),
    )
    ended: dict[str, int] = defaultdict(int)
    for r in rows:
        ended[r.ended] += 1
    return CellBlock(
        cell=CellKnobs(**dict(zip(KNOBS, cell.split("-"), strict=True))),
        n=n,
        cases=len(set(clusters)),
        rates=rates,
        touches_per_1000_runs=touches_per_1000_runs(oos, n),
        oos_share_pooled=oos_share(oos, calls),
        self_granted_total=sum(r.self_granted_count for r in rows),
        first_oos_step=Survival.model_validate(survival.as_dict()) if survival else None,
        capability_vs_scope=both,
        ended=dict(ended),
        infra_errors=infra_errors,
    )


def _design(rows: list[RunRow], metric: str) -> tuple[int, float]:
    """(runs per case, ICC >= 0) of a cell, for the MDE and sample-size plan."""
    cases = [r.case for r in rows]
    n_cases = len(set(cases))
    if n_cases < 2 or len(rows) < 2 * n_cases:
        return 1, 0.0
    c = stats.clustered_rate([r.outcome(metric) for r in rows], cases, n_boot=1)
    icc = c.icc if c.icc is not None and math.isfinite(c.icc) else 0.0
    return len(rows) // n_cases, min(max(icc, 0.0), 0.9)


def _contrasts(
    by_cell: dict[str, list[RunRow]], blocks: dict[str, CellBlock], metric: str = PRIMARY
) -> list[Contrast]:
    """Every pair of cells that differ in exactly one knob, paired by (case, seed),
    clustered by case. The rates and intervals are the grid table's (`blocks`), the
    sentence is built from the same interval and the same MDE as the row shows."""
    cells = sorted(by_cell)
    pairs = []
    for i, a in enumerate(cells):
        for b in cells[i + 1 :]:
            pa, pb = a.split("-"), b.split("-")
            diff = [k for k, x, y in zip(KNOBS, pa, pb, strict=True) if x != y]
            if len(diff) != 1:
                continue
            # Order so that "before" is the riskier default (open, affirmative, works→broken is the trigger).
            knob = diff[0]
            base, cand = (a, b) if _is_baseline(knob, pa, pb) else (b, a)
            rows_a, rows_b = by_cell[base], by_cell[cand]
            cmp = stats.compare_cells(
                [r.outcome(metric) for r in rows_a],
                [r.outcome(metric) for r in rows_b],
                [(r.case, r.seed) for r in rows_a],
                [(r.case, r.seed) for r in rows_b],
                clusters_a=[r.case for r in rows_a],
                clusters_b=[r.case for r in rows_b],
            )
            pairs.append((knob, base, cand, cmp, (len(by_cell[a]), len(by_cell[b]))))
    adjusted = stats.holm([cmp.pvalue for *_, cmp, _ in pairs]) if pairs else []
    out = []
    for (knob, base, cand, cmp, n), p in zip(pairs, adjusted, strict=True):
        fields = {
            "knob": knob,
            "metric": metric,
            "a": base,
            "b": cand,
            "a_rate": blocks[base].rates[metric],
            "b_rate": blocks[cand].rates[metric],
            "difference": cmp.difference,
            "ci95": cmp.ci,
            "ci_method": cmp.ci_method,
            "paired": cmp.paired,
            "clustered": cmp.clustered,
            "test": cmp.test,
            "p": cmp.pvalue,
            "notes": list(cmp.notes),
            "n": n,
            "p_holm": p,
            "significant": p < 0.05,
        }
        fields.update(_mde_and_plan(fields, cmp, by_cell[base], metric, 0.05 / len(pairs)))
        out.append(Contrast(**fields))
    return out


def _mde_and_plan(
    c: dict[str, Any], cmp: stats.CellComparison, rows_a: list[RunRow], metric: str, alpha: float
) -> dict[str, Any]:
    """The MDE in the direction of the observed change and, when not
    significant, the runs per cell that would detect the observed change: both
    for the test the contrast ran (`stats.mde`, `stats.n_per_cell`, same
    design: runs per case and the baseline cell's ICC), at `alpha` = 0.05 / the
    number of contrasts (Holm's strictest step: a change of that size is then
    significant after the adjustment with at least that power, whatever the
    other contrasts do), both written into the sentence and the table from
    this one computation."""
    pa, pb = cmp.a.value or 0.0, cmp.b.value or 0.0
    m, icc = _design(rows_a, metric) if cmp.clustered else (1, 0.0)
    n = min(c["n"])
    direction: Literal["up", "down"] = "down" if pb < pa else "up"
    design: dict[str, Any] = {"alpha": alpha, "cluster_size": m, "icc": icc, "draws": PLAN_DRAWS}
    out: dict[str, Any] = {"plan_alpha": alpha}
    mde = stats.mde(n, pa, direction=direction, **design) if n // m >= (2 if m > 1 else 1) else None
    out["mde"] = mde.effect if mde is not None else None
    out["mde_direction"] = direction
    out["mde_text"] = stats.mde_points(mde) if mde is not None else None
    out["mde_method"] = stats.power_method(m, PLAN_DRAWS, 0)
    if not c["significant"] and abs(pa - pb) > 1e-9 and 0 < pa < 1:
        plan = stats.n_per_cell(pa, pb, n_max=PLAN_N_MAX, **design)
        out["needed_n_per_cell"] = plan.n_per_cell if plan is not None else None
        out["needed_n_more_than"] = None if plan is not None else PLAN_N_MAX
    b_rate: RateBlock = c["b_rate"]
    out["describe"] = stats.describe_change(
        cmp.a,
        cmp.b,
        c["significant"],
        interval=(b_rate.interval[0], b_rate.interval[1]) if b_rate.interval else None,
        interval_name="clustered" if b_rate.clustered else "Wilson",
        mde_result=mde,
    )
    return out


def _is_baseline(knob: str, pa: list[str], pb: list[str]) -> bool:
    """True when cell a is the 'before' side of the contrast on this knob."""
    order = {"scope": GRID_SCOPES, "reply": CANNED_REPLIES, "friction": GRID_FRICTIONS}[knob]
    i = KNOBS.index(knob)
    return order.index(pa[i]) < order.index(pb[i])


def canonical_order(rows: list[RunRow], config: Configuration) -> list[RunRow]:
    """Runs in the grid's plan order (cell, case, rep), not in the order they
    happened to finish: concurrent or sharded runs of the same grid then give
    the same results.json, field for field (`offscope merge`)."""
    cells = {c: i for i, c in enumerate(config.cells)}
    cases = {c: i for i, c in enumerate(config.cases)}

    def key(r: RunRow) -> tuple:
        rep = r.rep
        return (
            cells.get(r.cell or "", len(cells)),
            r.cell,
            cases.get(r.case or "", len(cases)),
            str(r.case),
            int(rep) if isinstance(rep, str) and rep.isdigit() else -1,
            r.run,
        )

    return sorted(rows, key=key)


def _read_configuration(meta_path: Path) -> Configuration:
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        return Configuration.model_validate(meta["configuration"])
    except (ValueError, KeyError, TypeError) as exc:  # ValidationError is a ValueError
        raise InputError(
            f"grid.json has no valid configuration block: {exc}", path=str(meta_path)
        ) from None


def _endpoint_stats(meta_path: Path) -> dict[str, Any] | None:
    """grid.json's `model_endpoint_stats` (None for the simulated model)."""
    stats = json.loads(meta_path.read_text(encoding="utf-8")).get("model_endpoint_stats")
    return stats if isinstance(stats, dict) else None


def build_results(out: Path) -> Results:
    meta_path = out / "grid.json"
    trace = out / "trajectories.jsonl"
    if not meta_path.exists() or not trace_exists(trace):
        raise InputError(
            "not a grid output directory (grid.json and trajectories.jsonl expected)", path=str(out)
        )
    config = _read_configuration(meta_path)
    result_rows, infra = grid_runs(trace_events(trace))
    rows = canonical_order(result_rows, config)
    by_cell: dict[str, list[RunRow]] = defaultdict(list)
    for r in rows:
        by_cell[r.cell].append(r)
    infra_by_cell: dict[str, int] = defaultdict(int)
    for x in infra:
        infra_by_cell[x.cell] += 1
    # A cell whose every run failed on infrastructure is shown (n 0, its infra errors), not hidden.
    order = [c for c in config.cells if c in by_cell or c in infra_by_cell]
    infra = [x for x in infra if x.cell in config.cells]
    tau = _grid_tau({c: by_cell[c] for c in order if by_cell[c]})
    cells = {c: _cell_block(c, by_cell[c], tau, infra_by_cell[c]) for c in order}
    with_runs = [c for c in order if by_cell[c]]
    simulated = config.model.simulated
    model = config.model.id
    title = "Scope-conformance grid" + (
        f" (SIMULATED MODEL: {model})" if simulated else f" ({model})"
    )
    extra: dict[str, Any] = {}
    stats = _endpoint_stats(meta_path)
    if stats is not None:  # set only when there is some: absent, not null, otherwise
        extra["model_endpoint_stats"] = stats
    return Results(
        **extra,
        schema_=RESULTS_SCHEMA,
        schema_version=SCHEMA_VERSION,
        title=title,
        simulated=simulated,
        configuration=config,
        cells=cells,
        contrasts=_contrasts({c: by_cell[c] for c in with_runs}, cells),
        methods=Methods(
            rates="k/n with one interval per rate, printed everywhere the rate appears: with several cases "
            "per cell the hull of the Wilson 1927 score interval and a case-level bootstrap (percentile, "
            "1000 resamples), with ICC and design effect; with one case, Wilson",
            contrasts="cells differing in one knob; Newcombe 1998 interval for the difference; exact McNemar "
            "test on (case, seed) pairs when both cells ran the same pairs, else Fisher exact; with "
            "several runs per case also a cluster-robust t over cases (CR1, G-1 df): the interval "
            "is the hull of both and the p-value the larger; Holm 1979 adjustment across the "
            "contrasts shown",
            first_touch="Kaplan-Meier over steps, runs that never touched censored at their last step; "
            "restricted mean step (RMST) up to one common horizon tau for every cell (the last "
            "step observed in all cells); never a mean over only the runs that touched",
            power="MDE (80% power, in the direction of the observed change) and runs needed per cell: power "
            "of the contrast test as run, at alpha 0.05 / number of contrasts (Holm's strictest step, so "
            "the figure holds after the adjustment); exact with one run per case, else simulated "
            f"({PLAN_DRAWS} draws, case rates beta-distributed with the baseline cell's ICC); plans stop "
            f"at {PLAN_N_MAX} runs per cell",
            draws=config.draws_meaning
            or "common: the same (case, rep) seed in every cell (a grid "
            "made before --draws existed)",
        ),
        runs=rows,
        infra_errors=sorted(infra, key=lambda x: (config.cells.index(x.cell), x.run)),
    ).with_source(out / "results.json")


def write_reports(out: Path, results: Results) -> dict[str, Path]:
    from offscope.evalmode.report.render import render_html, render_markdown
    from offscope.evalmode.report.viewer import collect_runs, render_viewer

    paths = {
        "json": out / "results.json",
        "md": out / "report.md",
        "html": out / "report.html",
        "runs": out / "runs.html",
    }
    paths["json"].write_text(results.to_json(), encoding="utf-8")
    paths["md"].write_text(render_markdown(results), encoding="utf-8")
    paths["html"].write_text(render_html(results), encoding="utf-8")
    # The trajectory viewer that report.html's cells and contrasts link to.
    runs = collect_runs(trace_events(out / "trajectories.jsonl"))
    paths["runs"].write_text(render_viewer(runs, results.title, "trajectories.jsonl"), "utf-8")
    return paths


def rebuild_reports(out: Path) -> int:
    # Not while a grid writes there: its trace is half written, and it rewrites these files.
    with OutdirLock(out, "offscope report"):
        results = build_results(out)
        paths = write_reports(out, results)
    print(f"rebuilt {paths['json']}, {paths['md']}, {paths['html']}")
    return 0
