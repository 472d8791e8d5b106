"""The sidecar's Prometheus metrics: the public interface, named in one place.

The exporter registers exactly these families; `deploy/` (recording and alert
rules, the Grafana dashboard) may use only these names, and
`tests/deploy/test_metric_names.py` enforces it, so renaming a metric here
breaks the deploy tests instead of silently blanking a dashboard or an alert.

Names are the family names as `prometheus_client` takes them, except that
counters carry their `_total` suffix as exposed. Histograms are exposed as
`<name>_bucket`, `<name>_sum` and `<name>_count`.

Label values come only from the ledger id and the fixed enums below, so the
series count is bounded by (ledgers x enum products), never by traffic.
"""

from __future__ import annotations

from typing import Literal

from offscope.vocab import CANNED_REPLIES, DECISIONS, FRICTION_KINDS, SCOPES, SOURCES, STAGES

MetricType = Literal["counter", "gauge", "histogram"]

#: name -> Prometheus type. The exporter's registry and deploy/ both read this.
EXPORTED_METRICS: dict[str, MetricType] = {
    "offscope_runs_total": "counter",
    "offscope_run_ends_total": "counter",
    "offscope_active_runs": "gauge",
    "offscope_tool_calls_total": "counter",
    "offscope_runs_reached_total": "counter",
    "offscope_operator_replies_total": "counter",
    "offscope_self_granted_permissions_total": "counter",
    "offscope_first_out_of_scope_step": "histogram",
    "offscope_first_out_of_scope_act_step": "histogram",
    "offscope_harness_approvals_total": "counter",
    "offscope_tag_seconds": "histogram",
    "offscope_events_dropped_total": "counter",
    "offscope_trace_write_failures_total": "counter",
    "offscope_friction_injected_total": "counter",
    "offscope_scope_expansion_requests_total": "counter",
    "offscope_reload_failures_total": "counter",
    "offscope_response_coherence": "histogram",
    "offscope_response_words": "histogram",
    "offscope_otel_spans_dropped_total": "counter",
}

#: name -> label names, in the order the exporter declares them.
METRIC_LABELS: dict[str, tuple[str, ...]] = {
    "offscope_runs_total": ("ledger",),
    "offscope_run_ends_total": ("ledger", "reason"),
    "offscope_active_runs": ("ledger",),
    "offscope_tool_calls_total": ("ledger", "source", "scope", "stage", "decision"),
    "offscope_runs_reached_total": ("ledger", "stage"),
    "offscope_operator_replies_total": ("ledger", "provenance"),
    "offscope_self_granted_permissions_total": ("ledger",),
    "offscope_first_out_of_scope_step": ("ledger",),
    "offscope_first_out_of_scope_act_step": ("ledger",),
    "offscope_harness_approvals_total": ("ledger",),
    "offscope_tag_seconds": (),
    "offscope_events_dropped_total": (),
    "offscope_trace_write_failures_total": (),
    "offscope_friction_injected_total": ("ledger", "kind"),
    "offscope_scope_expansion_requests_total": ("ledger",),
    "offscope_reload_failures_total": ("file",),
    "offscope_response_coherence": ("ledger",),
    "offscope_response_words": ("ledger",),
    "offscope_otel_spans_dropped_total": ("cause",),
}

#: label -> the only values it takes (`ledger` is the ledger id: free-form, bounded).
LABEL_VALUES: dict[str, tuple[str, ...]] = {
    # the reasons a live proxy ends a run; the others (timeout, crash, ...) are the grid's
    # and are counted as "exit".
    "reason": ("end", "idle", "exit"),
    "source": SOURCES,
    "scope": SCOPES,
    "stage": STAGES,
    "decision": DECISIONS,
    # human; or the harness: a canned reply by policy, or a passed-through reply on
    # a route the ledger does not declare reaches a person ("harness").
    "provenance": ("human", *CANNED_REPLIES, "harness"),
    "kind": FRICTION_KINDS,
    "file": ("ledger", "policy"),
    # OpenTelemetry spans that did not reach the collector (offscope/proxy/otel.py).
    "cause": ("queue_full", "export_failed", "error"),
}

_UNIT = tuple(round(0.1 * i, 1) for i in range(1, 11))

#: histogram name -> bucket upper bounds (+Inf implied).
HISTOGRAM_BUCKETS: dict[str, tuple[float, ...]] = {
    "offscope_first_out_of_scope_step": (1, 2, 3, 5, 8, 13, 21, 34, 55),
    "offscope_first_out_of_scope_act_step": (1, 2, 3, 5, 8, 13, 21, 34, 55),
    "offscope_tag_seconds": (
        0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    ),
    "offscope_response_coherence": _UNIT,
    "offscope_response_words": (10, 25, 50, 100, 200, 400, 800, 1600),
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
