"""What /metrics serves: the exporter's families, without `_created` series."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, make_wsgi_app

from offscope.proxy.exporter import Exporter
from offscope.trace.catalog import PROMETHEUS


def _scrape(registry: CollectorRegistry) -> str:
    """The body /metrics answers (the control listener serves this very WSGI app)."""
    status: list[str] = []
    body = make_wsgi_app(registry)(
        {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": ""},
        lambda s, headers: status.append(s),
    )
    assert status == ["200 OK"]
    return b"".join(body).decode()


def test_metrics_have_no_created_series() -> None:
    exporter = Exporter(CollectorRegistry())
    counters = [p for p in PROMETHEUS if p.type == "counter"]
    assert counters
    for family in counters:
        child = exporter.m[family.name]
        if family.labels:
            child = child.labels(**{name: "x" for name in family.labels})
        child.inc()  # type: ignore[union-attr]
    text = _scrape(exporter.registry)
    assert "_created" not in text
    for family in counters:  # every counter is there, and was moved
        assert f"{family.name}{{" in text or f"{family.name} 1.0" in text, family.name
