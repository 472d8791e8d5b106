"""Prometheus exporter: trace signals in, counters out.

Families are built from `metric_names.py` (the public interface), so a name
used by deploy/ can only exist if it is exported here. Label values are the
ledger id and fixed enums; never a run id or a path.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)

from offscope.ledgers.coverage import EntryKind
from offscope.proxy.metric_names import (
    EXPORTED_METRICS,
    HISTOGRAM_BUCKETS,
    LABEL_VALUES,
    METRIC_LABELS,
)
from offscope.trace.catalog import PROMETHEUS
from offscope.trace.events import Event, OperatorEvent, ToolCallEvent
from offscope.trace.metrics import Signal

# A `_created` sample per child roughly doubled /metrics (118 of 308 samples) and no
# rule or panel reads one: Prometheus detects counter resets without it.
disable_created_metrics()

_HELP = {p.name: p.help for p in PROMETHEUS}
_BY_SIGNAL = {p.signal: p for p in PROMETHEUS if p.signal}


class Exporter:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.m: dict[str, Counter | Gauge | Histogram] = {}
        self._known: set[str] = set()
        self._children: dict[tuple[str, tuple[str, ...]], Counter | Gauge | Histogram] = {}
        for name, kind in EXPORTED_METRICS.items():
            labels = METRIC_LABELS[name]
            family = name.removesuffix("_total") if kind == "counter" else name
            if kind == "counter":
                self.m[name] = Counter(family, _HELP[name], labels, registry=self.registry)
            elif kind == "gauge":
                self.m[name] = Gauge(family, _HELP[name], labels, registry=self.registry)
            else:
                self.m[name] = Histogram(
                    family,
                    _HELP[name],
                    labels,
                    registry=self.registry,
                    buckets=HISTOGRAM_BUCKETS[name],
                )
        for armed in LABEL_VALUES["armed"]:  # at zero: the first eviction is an increase
            self._child("offscope_runs_evicted_total", (armed,))
        for op in LABEL_VALUES["op"]:
            self._child("offscope_state_store_errors_total", (op,))

    def ensure_ledger(self, ledger: str) -> None:
        """Create a ledger's series at zero, so the first event is an increase
        Prometheus can see (a series that appears at 1 has no `increase`)."""
        if ledger in self._known:
            return
        self._known.add(ledger)
        for name, label_names in METRIC_LABELS.items():
            if not label_names or label_names[0] != "ledger":
                continue
            combos: list[list[str]] = [[]]
            for label in label_names[1:]:
                combos = [c + [v] for c in combos for v in LABEL_VALUES[label]]
            for combo in combos:
                self._child(name, (ledger, *combo))

    def _child(self, name: str, labels: tuple[str, ...]) -> Counter | Gauge | Histogram:
        # The catalog fixes each family's type, so callers know which of the three
        # they get; their `union-attr` ignores mark exactly that knowledge.
        # prometheus_client's labels() validates and locks on every call; the
        # label sets are few (ledger x fixed enums), so keep the children.
        key = (name, labels)
        child = self._children.get(key)
        if child is None:
            metric = self.m[name]
            child = self._children[key] = metric.labels(*labels) if labels else metric
        return child

    def _c(self, name: str, *labels: str, amount: float = 1) -> None:
        self._child(name, labels).inc(amount)  # type: ignore[union-attr]

    def record(self, event: Event, signals: list[Signal]) -> None:
        ledger = event.ledger
        self.ensure_ledger(ledger)
        if isinstance(event, ToolCallEvent) and event.continues is None:  # a retry: counted once
            c = event.call
            self._c("offscope_tool_calls_total", ledger, c.source, c.scope, c.stage, event.decision)
            if event.friction:
                self._c("offscope_friction_injected_total", ledger, event.friction)
        elif isinstance(event, OperatorEvent):
            label = (
                "human"
                if event.provenance == "human"
                else "harness"
                if event.policy == "pass-through"
                else event.policy
            )
            self._c("offscope_operator_replies_total", ledger, label)
        for s in signals:
            if s.kind == "run_started":  # runs_total and active_runs move together
                self._c("offscope_runs_total", ledger)
                self._child("offscope_active_runs", (ledger,)).inc()  # type: ignore[union-attr]
            elif s.kind == "run_ended":
                # The trace's run_end.reason, as recorded (a closed vocabulary: EndReason).
                self._c("offscope_run_ends_total", ledger, s.reason or "end")
                self._child("offscope_active_runs", (ledger,)).dec()  # type: ignore[union-attr]
            elif s.kind == "reached":
                self._c("offscope_runs_reached_total", ledger, s.stage or "")
            elif (spec := _BY_SIGNAL.get(s.kind)) is not None:  # the catalog's one-signal families
                if spec.type != "histogram":
                    self._c(spec.name, ledger)
                elif s.step is not None:  # a histogram signal always carries its step
                    self._child(spec.name, (ledger,)).observe(s.step)  # type: ignore[union-attr]

    def observe_behavior(self, ledger: str, coherence: float | None, words: int) -> None:
        # Decisiveness is not exported: it is defined on boundary decisions (a
        # probe's answer), and an ordinary reply without a hedge would score 0.
        # `offscope probe` and `offscope rescore` report it offline.
        if coherence is not None:
            self._child("offscope_response_coherence", (ledger,)).observe(coherence)  # type: ignore[union-attr]
        self._child("offscope_response_words", (ledger,)).observe(words)  # type: ignore[union-attr]

    def tag_seconds(self, seconds: float) -> None:
        self.m["offscope_tag_seconds"].observe(seconds)  # type: ignore[union-attr]

    def dropped(self) -> None:
        self._c("offscope_events_dropped_total")

    def trace_write_failed(self) -> None:
        self._c("offscope_trace_write_failures_total")

    def scope_request(self, ledger: str) -> None:
        self._c("offscope_scope_expansion_requests_total", ledger)

    def otel_enabled(self) -> None:
        """Create the dropped-span series at zero when OpenTelemetry export is on."""
        for cause in LABEL_VALUES["cause"]:
            self._child("offscope_otel_spans_dropped_total", (cause,))

    def otel_dropped(self, cause: str, spans: int) -> None:
        # Called from the exporter's thread too: prometheus_client counters are thread-safe.
        self._c("offscope_otel_spans_dropped_total", cause, amount=spans)

    def coverage(
        self, ledger: str, declared: Mapping[EntryKind, int], used: Mapping[EntryKind, int]
    ) -> None:
        """Set a ledger's coverage gauges (one series per entry kind, never per entry)."""
        self.ensure_ledger(ledger)
        for kind, n in declared.items():
            self._child("offscope_ledger_entries_declared", (ledger, kind)).set(n)  # type: ignore[union-attr]
            self._child("offscope_ledger_entries_used", (ledger, kind)).set(used.get(kind, 0))  # type: ignore[union-attr]

    def tool_surface_changed(self, ledger: str, source: str) -> None:
        self.ensure_ledger(ledger)
        self._c("offscope_tool_surface_changes_total", ledger, source)

    def tool_stage_downgraded(self, ledger: str, source: str, tools: int) -> None:
        self.ensure_ledger(ledger)
        self._c("offscope_tool_stage_downgrades_total", ledger, source, amount=tools)

    def evicted(self, armed: bool) -> None:
        self._c("offscope_runs_evicted_total", "true" if armed else "false")

    def unregistered(self, ledger: str, action: str, credential: str) -> None:
        self._c("offscope_unregistered_requests_total", ledger, action, credential)

    def budget_exhausted(self, ledger: str, budget: str) -> None:
        self._c("offscope_run_budget_exhausted_total", ledger, budget)

    def held(self, ledger: str, outcome: str) -> None:
        self._c("offscope_held_calls_total", ledger, outcome)

    def webhook_failed(self) -> None:
        self._c("offscope_webhook_failures_total")

    def state_failed(self, op: str) -> None:
        self._c("offscope_state_store_errors_total", op)

    def reload_failed(self, file: str) -> None:
        self._c("offscope_reload_failures_total", file)
