"""The copies of the metric catalog that must stay outside Python agree with it.

offscope/trace/catalog.py declares every scope metric and every Prometheus
family. The Prometheus recording and alert rules and the Grafana dashboard
are YAML and JSON that Prometheus and Grafana read as they are; these tests
fail when they drift from the catalog (a metric exported live but recorded
under another name, a funnel stage the rules zero-fill that is not a stage).
"""

from __future__ import annotations

import re

from offscope.proxy.metric_names import LABEL_VALUES
from offscope.trace.catalog import BY_NAME, METRICS, PROMETHEUS
from offscope.vocab import STAGES
from tests.deploy.test_metric_names import dashboard_exprs, metric_tokens
from tests.support.deploy_testlib import DEPLOY

WINDOWS = ("5m", "1h")
_LABEL_REPLACE = re.compile(r'label_replace\([^)]*?"(\w+)",\s*"([^"]*)"')


def _records(rules) -> dict[str, str]:
    return {r["record"]: r["expr"] for r in rules if "record" in r}


def test_every_live_metric_is_an_exported_family():
    for m in METRICS:
        for name in m.live:
            assert name in BY_NAME, f"{m.key}: {name} is not in PROMETHEUS"


def test_every_recorded_metric_has_both_windows_built_from_its_families(rules):
    records = _records(rules)
    for m in (m for m in METRICS if m.recorded):
        for window in WINDOWS:
            name = f"{m.recorded}{window}"
            assert name in records, f"{m.key}: no recording rule {name}"
            # the rule (through the recorded series it builds on) reads the metric's live families
            used, todo = set(), [records[name]]
            while todo:
                for token in metric_tokens(todo.pop()):
                    if ":" in token and token in records and token not in used:
                        todo.append(records[token])
                    used.add(token)
            assert set(m.live) <= used, f"{name} does not read {set(m.live) - used}"


def test_the_dashboard_shows_every_live_metric(dashboard):
    used = {t for _, e in dashboard_exprs(dashboard) for t in metric_tokens(e)}
    for m in (m for m in METRICS if m.live):
        shown = (m.recorded and any(t.startswith(m.recorded) for t in used)) or set(m.live) <= {
            t.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count") for t in used
        }
        assert shown, f"{m.key}: neither {m.recorded}* nor {m.live} is on a panel"


def test_funnel_rules_zero_fill_exactly_the_stages(rules):
    for name, expr in _records(rules).items():
        if name.startswith("ledger_stage:offscope_runs_reached:share"):
            filled = [v for label, v in _LABEL_REPLACE.findall(expr) if label == "stage"]
            assert tuple(filled) == STAGES, name


def test_help_texts_are_unique_and_present():
    helps = [p.help for p in PROMETHEUS]
    assert all(helps) and len(set(helps)) == len(helps)
    assert len({p.name for p in PROMETHEUS}) == len(PROMETHEUS)


def test_the_metrics_docs_list_every_label_value():
    docs = (DEPLOY.parent / "docs" / "metrics.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(\w+)` \| (.*) \|$", docs, re.MULTILINE))
    for label, values in LABEL_VALUES.items():
        assert label in rows, f"docs/metrics.md has no row for the label {label!r}"
        listed = re.findall(r"`([^`]+)`", rows[label].split("(")[0])
        assert tuple(listed) == values, f"docs/metrics.md, label {label!r}: {listed} vs {values}"
