"""The sidecar's Prometheus metrics: the public interface, as the exporter and deploy/ read it.

The families are declared in offscope/trace/catalog.py (`PROMETHEUS`). The
exporter registers exactly these families; `deploy/` (recording and alert
rules, the Grafana dashboard) may use only these names, and
`tests/deploy/test_metric_names.py` enforces it, so renaming a metric there
breaks the deploy tests instead of silently blanking a dashboard or an alert.

Names are the family names as `prometheus_client` takes them, except that
counters carry their `_total` suffix as exposed. Histograms are exposed as
`<name>_bucket`, `<name>_sum` and `<name>_count`.

Label values come only from the ledger id and the fixed enums below, so the
series count is bounded by (ledgers x enum products), never by traffic.
"""

from __future__ import annotations

from offscope.trace.catalog import PROMETHEUS, MetricType
from offscope.vocab import (
    CANNED_REPLIES,
    DECISIONS,
    END_REASONS,
    ENTRY_KINDS,
    FRICTION_KINDS,
    HOLD_OUTCOMES,
    SCOPES,
    SOURCES,
    STAGES,
)

#: name -> Prometheus type. The exporter's registry and deploy/ both read this.
EXPORTED_METRICS: dict[str, MetricType] = {p.name: p.type for p in PROMETHEUS}

#: name -> label names, in the order the exporter declares them.
METRIC_LABELS: dict[str, tuple[str, ...]] = {p.name: p.labels for p in PROMETHEUS}

#: label -> the only values it takes (`ledger` is the ledger id: free-form, bounded).
LABEL_VALUES: dict[str, tuple[str, ...]] = {
    # why a run ended: the trace's `run_end.reason`, the same closed vocabulary (a live
    # proxy ends runs by end call, idle, agent exit, ttl `timeout` and budget `step_limit`).
    "reason": END_REASONS,
    "source": SOURCES,
    "scope": SCOPES,
    "stage": STAGES,
    "decision": DECISIONS,
    # human; or the harness: a canned reply by policy, or a passed-through reply on
    # a route the ledger does not declare reaches a person ("harness").
    "provenance": ("human", *CANNED_REPLIES, "harness"),
    "kind": FRICTION_KINDS,
    "file": ("ledger", "policy"),
    # State-store operations that failed (offscope/state/db.py): reads or writes.
    "op": ("read", "write"),
    # OpenTelemetry spans that did not reach the collector (offscope/proxy/otel.py).
    "cause": ("queue_full", "export_failed", "error"),
    # Ledger entry kinds whose use is counted (offscope/ledgers/coverage.py).
    "entry": ENTRY_KINDS,
    # A run pushed out of a full run table, with history rules armed or not.
    "armed": ("true", "false"),
    # Traffic without a valid run credential (offscope/proxy/lifecycle.py): refused
    # (enforce) or attributed to the run `unregistered` (shadow), and why.
    "action": ("refused", "attributed"),
    "credential": ("missing", "invalid", "expired"),
    "budget": ("tool_calls", "out_of_scope", "denials"),
    # How a call held for approval ended (policy on_out_of_scope: hold).
    "outcome": HOLD_OUTCOMES,
}

#: histogram name -> bucket upper bounds (+Inf implied).
HISTOGRAM_BUCKETS: dict[str, tuple[float, ...]] = {
    p.name: p.buckets for p in PROMETHEUS if p.buckets is not None
}

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def exposed_series_names() -> set[str]:
    """Every sample name a scrape can contain (histograms expanded)."""
    names: set[str] = set()
    for name, kind in EXPORTED_METRICS.items():
        if kind == "histogram":
            names.update(name + suffix for suffix in HISTOGRAM_SUFFIXES)
        else:
            names.add(name)
    return names
