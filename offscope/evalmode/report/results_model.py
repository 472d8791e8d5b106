"""The results file (`results.json`, `offscope.results/1`) as typed, versioned models.

`offscope grid`, `offscope merge` and `offscope report DIR` write it
(`results.build_results`); the gate, shadow-compare and the renderer read it
through `load_results`, so all of them see the same fields with the same types,
and a malformed or foreign file is refused once, at the door, with its file,
line and field. `offscope schema results` prints the JSON Schema.

Versioning. `schema` names the format; `schema_version` counts its revisions.
A reader accepts every version up to `SCHEMA_VERSION` and refuses newer ones
with a message saying what to do. Files written before the field existed have
the same fields as version 1 and load as version 1.

Byte-identical output. A field that the builder leaves out (the clustered part
of a rate with one case, a contrast's sample-size plan when it is significant)
stays out of the file: files are dumped with `exclude_unset`, so "absent" and
"null" remain different, and a file read and written back is unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from offscope.errors import InputError
from offscope.trace import catalog
from offscope.trace.events import WorldEffect
from offscope.trace.rates import Rate

RESULTS_SCHEMA: Final = "offscope.results/1"
# Bump on every change to the fields below; teach `_migrate` to read the older ones.
# 2: runs that ended on an infrastructure failure are counted (`infra_errors` per cell and
# the list at the top); a version 1 file has neither and loads with none.
# 3: `model_endpoint_stats` (what the grid, or its merged shards, paid the model endpoint);
# absent for the simulated model and in older files.
SCHEMA_VERSION = 3
REBUILD_HINT = (
    "rebuild it from its trace with `offscope report GRID_DIR` (recomputes results.json from "
    "trajectories.jsonl), or pass the results.json that `offscope grid` or `offscope merge` wrote"
)

# Integers stay integers and floats floats when read and written back (pydantic
# would turn a 0 into 0.0 in a plain float field).
Number = int | float
Interval = tuple[Number, Number]


class _Strict(BaseModel):
    """Every block of the file: unknown keys are errors (a typo, or a newer writer)."""

    model_config = ConfigDict(extra="forbid")


class _Open(BaseModel):
    """Blocks that record the run's environment: keys beyond the known ones are kept
    (e.g. `credentials`, `prompt_template` from other harnesses)."""

    model_config = ConfigDict(extra="allow")


# --------------------------------------------------------------------------- #
# Configuration block (what was run)
# --------------------------------------------------------------------------- #


class ModelInfo(_Open):
    id: str
    simulated: bool
    disposition: str | None = None
    disposition_sha256: str | None = None
    effort: str | None = None
    endpoint: str | None = None


class OperatorReply(_Open):
    policies: list[str]
    texts: dict[str, str]
    timeout_seconds: Number


class Harness(_Open):
    offscope: str
    agent: str
    max_steps: int | None = None
    timeout_seconds: Number | None = None
    stream: bool | None = None


class Configuration(_Open):
    """The configuration block printed beside every result (`GridConfig.configuration`).
    `offscope grid` writes every field; a grid.json from another runner needs only
    the model, cells, cases and seed (the report shows "–" for what it lacks)."""

    model: ModelInfo
    cells: list[str]
    cases: list[str]
    seed: int
    reps: int | None = None
    safeguards: str | None = None
    scope_clause: dict[str, str] | None = None
    operator_reply: OperatorReply | None = None
    friction: dict[str, list[str]] | None = Field(
        None, description="case id -> friction kinds injected"
    )
    tool_surface_hash: str | None = None
    harness: Harness | None = None
    case_set_hash: str | None = Field(
        None, description="the gate refuses to compare different case sets"
    )
    draws: Literal["independent", "common"] | None = Field(
        None, description="absent in grids made before --draws existed (then: common)"
    )
    draws_meaning: str | None = None
    shard: str | None = Field(
        None, description="I/N for one shard of a grid; null for the whole grid"
    )

    def as_dict(self) -> dict[str, Any]:
        """The block as written, extra keys included (for diffing two configurations)."""
        return self.model_dump(mode="python", exclude_unset=True)


# --------------------------------------------------------------------------- #
# Per run, per rate, per cell
# --------------------------------------------------------------------------- #


class RunRow(BaseModel):
    """One finished run: its grid labels, per-run outcomes and first-touch data.
    A per-run outcome added to the metric catalog (offscope/trace/catalog.py)
    later is a further yes/no key of the row; any other key is an error."""

    model_config = ConfigDict(
        extra="allow", json_schema_extra={"additionalProperties": {"type": "boolean"}}
    )

    run: str
    case: str | None
    task_class: str | None
    cell: str
    scope: str | None
    reply: str | None
    friction: str | None
    rep: str | None
    seed: str | None
    investigated: bool
    prepared: bool
    acted: bool
    self_granted: bool
    self_granted_count: int
    asked_operator: bool
    world_acted_out_of_scope: bool
    task_success: bool
    first_oos_step: int | None
    steps: int
    calls: int
    oos_calls: int
    ended: str
    effects: list[WorldEffect]

    @model_validator(mode="after")
    def _extra_keys_are_catalog_outcomes(self) -> RunRow:
        for key, value in (self.model_extra or {}).items():
            metric = catalog.BY_KEY.get(key)
            if metric is None or metric.per != "run":
                raise ValueError(
                    f"unknown key {key!r} (not a per-run outcome of the metric catalog)"
                )
            if not isinstance(value, bool):
                raise ValueError(f"{key}: a per-run outcome is true or false, got {value!r}")
        return self

    def outcome(self, metric: str, touch_step: int | None = None) -> bool:
        """A per-run outcome by its key (`OUTCOMES` in results.py), or
        `touched_by_step`: the first out-of-scope touch came at or before `touch_step`."""
        if metric == "touched_by_step":
            if touch_step is None:
                raise ValueError("touched_by_step needs a touch_step")
            return self.first_oos_step is not None and self.first_oos_step <= touch_step
        value = getattr(self, metric, None)
        if not isinstance(value, bool):
            raise KeyError(f"no per-run outcome {metric!r}")
        return value


class RateBlock(_Strict):
    """k of n with the one interval every table and sentence prints (`interval`)."""

    k: int
    n: int
    rate: float | None
    ci95: Interval = Field(description="the plain Wilson interval, for reference")
    method: str
    interval: Interval = Field(
        description="the interval to print: clustered when the cell has several cases"
    )
    interval_method: str
    # Present only when the cell has several cases (the clustered interval).
    clustered_ci95: Interval | None = None
    icc: float | None = None
    design_effect: float | None = None
    clustered_method: str | None = None

    @property
    def clustered(self) -> bool:
        return "clustered_ci95" in self.model_fields_set

    def as_rate(self) -> Rate:
        """k/n with the interval printed for it (not a fresh Wilson one)."""
        lo, hi = self.interval
        return Rate(self.k, self.n, ci=(lo, hi), method=self.interval_method)


class CellKnobs(_Strict):
    scope: str
    reply: str
    friction: str


class KMPoint(_Strict):
    step: int
    at_risk: int
    events: int
    censored: int
    survival: Number
    ci: tuple[Number | None, Number | None]


class Survival(_Strict):
    """Kaplan-Meier curve of "no out-of-scope touch yet" over steps (`stats.Survival`)."""

    n_runs: int
    n_events: int
    n_censored: int
    curve: list[KMPoint]
    median: int | None
    tau: int
    rmst: Number | None
    rmst_se: Number | None
    confidence: float
    method: str


class CapabilityVsScope(_Strict):
    success_in_scope: int
    success_out_of_scope: int
    failed_in_scope: int
    failed_out_of_scope: int


class CellBlock(_Strict):
    cell: CellKnobs
    n: int
    cases: int
    rates: dict[str, RateBlock] = Field(description="per-run outcome key -> its rate")
    touches_per_1000_runs: float | None
    oos_share_pooled: float | None
    self_granted_total: int
    first_oos_step: Survival | None
    capability_vs_scope: CapabilityVsScope
    ended: dict[str, int] = Field(description="end reason -> runs (results only)")
    infra_errors: int = Field(
        0,
        description="runs of this cell that ended on an infrastructure failure (reason "
        "infra_error): not results, in no rate and not in n; resume runs them again. "
        "Absent in version 1 files (read as 0)",
    )


class Contrast(_Strict):
    """Two cells that differ in one knob, on one metric; "a" is the riskier default."""

    knob: Literal["scope", "reply", "friction"]
    metric: str
    a: str
    b: str
    a_rate: RateBlock
    b_rate: RateBlock
    difference: float
    ci95: Interval
    ci_method: str
    paired: bool
    clustered: bool
    test: str
    p: float
    notes: list[str]
    n: tuple[int, int]
    p_holm: float
    significant: bool
    plan_alpha: float
    mde: float | None
    mde_direction: Literal["up", "down"]
    mde_text: str | None
    mde_method: str
    # Present only when the contrast is not significant and a plan was computed.
    needed_n_per_cell: int | None = None
    needed_n_more_than: int | None = None
    describe: str


class InfraErrorRun(_Strict):
    """A run that ended on an infrastructure failure (the model endpoint or the agent
    process failed after its retries): missing data, never a result."""

    run: str
    cell: str
    case: str | None
    rep: str | None
    detail: str | None = None


class Methods(_Strict):
    rates: str
    contrasts: str
    first_touch: str
    power: str
    draws: str


# --------------------------------------------------------------------------- #
# The file
# --------------------------------------------------------------------------- #


class Results(_Strict):
    """results.json: one grid's configuration, per-cell rates, contrasts and runs."""

    schema_: Literal["offscope.results/1"] = Field(RESULTS_SCHEMA, alias="schema")
    schema_version: int = Field(
        SCHEMA_VERSION,
        ge=1,
        description=(
            f"revision of the format; this offscope reads up to {SCHEMA_VERSION}. Absent in files written "
            "before it existed (read as 1)"
        ),
    )
    title: str
    simulated: bool
    configuration: Configuration
    cells: dict[str, CellBlock] = Field(
        description="cell id -> its block, in the grid's cell order"
    )
    contrasts: list[Contrast]
    methods: Methods
    runs: list[RunRow] = Field(
        description="every finished run that is a result, in plan order (cell, case, rep)"
    )
    infra_errors: list[InfraErrorRun] = Field(
        default_factory=list,
        description="runs that ended on an infrastructure failure (never results), in cell "
        "order; absent in version 1 files",
    )
    model_endpoint_stats: dict[str, Any] | None = Field(
        None,
        description="what the grid paid its --model-url endpoint (from grid.json): calls, "
        "failures by status, stalls, limiter (429s, slowdowns, peak in flight), cache hits and "
        "misses, agent retries, infra errors; a merge sums its shards' (peaks: the largest). "
        "Absent for the simulated model and before version 3",
    )

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    # Where the file was read from (never written into it): the gate and
    # shadow-compare name it in their reports and errors.
    _source: str | None = PrivateAttr(None)

    @property
    def source(self) -> str | None:
        return self._source

    def with_source(self, source: str | Path | None) -> Results:
        self._source = str(source) if source is not None else None
        return self

    def runs_by_cell(self) -> dict[str, list[RunRow]]:
        out: dict[str, list[RunRow]] = {}
        for r in self.runs:
            out.setdefault(r.cell, []).append(r)
        return out

    @property
    def infra_error_count(self) -> int:
        return sum(c.infra_errors for c in self.cells.values())

    @property
    def planned_runs(self) -> int:
        """Runs the grid holds: results plus infra errors."""
        return len(self.runs) + self.infra_error_count

    def to_json(self) -> str:
        """The file's text: key-sorted, two-space indent, absent fields left out."""
        data = self.model_dump(mode="python", by_alias=True, exclude_unset=True)
        data["schema"], data["schema_version"] = self.schema_, self.schema_version
        return json.dumps(data, indent=2, sort_keys=True, default=_default)


def _default(value: Any) -> Any:
    if isinstance(value, set | tuple):
        return list(value)
    return str(value)


# --------------------------------------------------------------------------- #
# Reading
# --------------------------------------------------------------------------- #


def load_results(path: str | Path) -> Results:
    """An `offscope.results/1` file (or the grid directory holding results.json).
    Raises InputError naming the file, line and field when it is not one."""
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError("no such results file", path=str(p), hint=REBUILD_HINT) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read results: {exc}", path=str(p)) from None
    return parse_results(text, str(p))


def parse_results(text: str, path: str) -> Results:
    try:
        data = json.loads(text)
    except ValueError as exc:
        line = getattr(exc, "lineno", None)
        raise InputError(
            f"cannot read results: not JSON ({getattr(exc, 'msg', exc)})", path=path, line=line
        ) from None
    _check_header(data, path)
    data.setdefault("schema_version", 1)  # files from before versioning: version 1
    try:
        return Results.model_validate(data).with_source(path)
    except ValidationError as exc:
        raise _field_errors(exc, text, path) from None


def _check_header(data: Any, path: str) -> None:
    """The format and its version, before any field: a foreign or newer file gets
    one clear message instead of a list of field errors."""
    if not isinstance(data, dict) or data.get("schema") != RESULTS_SCHEMA:
        raise InputError(f"not an {RESULTS_SCHEMA} file", path=path, line=1, hint=REBUILD_HINT)
    version = data.get("schema_version", 1)  # files from before versioning: version 1
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise InputError(
            f"schema_version {version!r} is not a positive integer", path=path, hint=REBUILD_HINT
        )
    if version > SCHEMA_VERSION:
        raise InputError(
            f"results schema_version {version} was written by a newer offscope (this one reads "
            f"up to {SCHEMA_VERSION})",
            path=path,
            hint="upgrade offscope, or rebuild the file with this version: `offscope report GRID_DIR`",
        )


def _field_errors(exc: ValidationError, text: str, path: str) -> InputError:
    """Every field problem as `file:line: field: what is wrong`, lines found by
    re-reading the JSON as YAML (JSON is YAML; only done on error)."""
    from offscope.yamlio import InputErrors, _explain, _line_of, parse_yaml

    try:
        _, node = parse_yaml(text, path)
    except InputError:
        node = None
    errors = [
        InputError(_explain(err), path=path, line=_line_of(node, tuple(err["loc"])))
        for err in exc.errors(include_url=False)[:20]
    ]
    errors[-1].hint = REBUILD_HINT
    return InputErrors(errors)
