"""deploy/ uses only the metrics the sidecar exports (offscope/proxy/metric_names.py).

Rename a metric or a label value there and these tests name every rule and
panel that would silently go blank.
"""

from __future__ import annotations

import re

import pytest
import yaml

from offscope.proxy.metric_names import (
    EXPORTED_METRICS,
    HISTOGRAM_BUCKETS,
    HISTOGRAM_SUFFIXES,
    LABEL_VALUES,
    METRIC_LABELS,
    exposed_series_names,
)
from tests.support.deploy_testlib import DEPLOY, PROM

_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_SELECTOR = re.compile(r"\b(offscope_[a-z0-9_]+)\s*\{([^}]*)\}")
_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_EXTRA_LABELS = {"le", "job", "instance", "namespace", "pod"}


def metric_tokens(expr: str) -> set[str]:
    """Every identifier naming an offscope series (raw or recorded) in a PromQL expr."""
    return {t for t in _IDENT.findall(_QUOTED.sub('""', expr)) if "offscope_" in t}


def base_name(series: str) -> str:
    for suffix in HISTOGRAM_SUFFIXES:
        stem = series.removesuffix(suffix)
        if stem != series and EXPORTED_METRICS.get(stem) == "histogram":
            return stem
    return series


def dashboard_exprs(dashboard: dict) -> list[tuple[str, str]]:
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            out.append((f"variable {var['name']}", query))
    return out


@pytest.fixture(scope="module")
def recorded(rules) -> set[str]:
    return {r["record"] for r in rules if "record" in r}


@pytest.fixture(scope="module")
def all_exprs(rules, dashboard) -> list[tuple[str, str]]:
    return [(r.get("record") or r["alert"], r["expr"]) for r in rules] + dashboard_exprs(dashboard)


def test_metric_names_module_is_consistent():
    assert set(METRIC_LABELS) == set(EXPORTED_METRICS)
    for name, kind in EXPORTED_METRICS.items():
        assert name.startswith("offscope_")
        assert name.endswith("_total") == (kind == "counter"), name
        assert (name in HISTOGRAM_BUCKETS) == (kind == "histogram"), name
    for labels in METRIC_LABELS.values():
        for label in labels:
            assert label == "ledger" or label in LABEL_VALUES, label
    for buckets in HISTOGRAM_BUCKETS.values():
        assert list(buckets) == sorted(set(buckets))


def test_every_series_used_is_exported_or_recorded(all_exprs, recorded):
    exposed = exposed_series_names()
    bad = []
    for where, expr in all_exprs:
        for token in metric_tokens(expr):
            ok = token in recorded if ":" in token else token in exposed
            if not ok:
                bad.append(f"{where}: {token}")
    assert not bad, "unknown series:\n" + "\n".join(bad)


def test_label_matchers_use_exported_labels_and_values(all_exprs):
    bad = []
    for where, expr in all_exprs:
        for series, body in _SELECTOR.findall(expr):
            name = base_name(series)
            allowed = set(METRIC_LABELS.get(name, ())) | _EXTRA_LABELS
            for label, op, value in _MATCHER.findall(body):
                if label not in allowed:
                    bad.append(f"{where}: {series} has no label {label!r}")
                elif (
                    op in ("=", "!=") and label in LABEL_VALUES and value not in LABEL_VALUES[label]
                ):
                    bad.append(f"{where}: {label}={value!r} is not one of {LABEL_VALUES[label]}")
    assert not bad, "\n".join(bad)


def test_grouping_labels_exist(all_exprs):
    known = {label for labels in METRIC_LABELS.values() for label in labels} | _EXTRA_LABELS
    bad = []
    for where, expr in all_exprs:
        for group in _GROUPING.findall(expr):
            for label in filter(None, (x.strip() for x in group.split(","))):
                if label not in known:
                    bad.append(f"{where}: grouping label {label!r}")
    assert not bad, "\n".join(bad)


def test_the_dashboard_uses_every_exported_metric(dashboard):
    used = {base_name(t) for _, e in dashboard_exprs(dashboard) for t in metric_tokens(e)}
    assert set(EXPORTED_METRICS) - used == set()


def test_llm_proposed_steps_are_never_dropped(rules):
    """`offscope_tool_calls_total{source="llm"}` holds only the tool calls a model
    proposed that the ledger counts as steps (`llm.tool_calls_are_steps`); LLM API
    calls are never in it. A rule that filtered them out would read 0 where
    `offscope report` counts them."""
    for rule in rules:
        for series, body in _SELECTOR.findall(rule["expr"]):
            if series == "offscope_tool_calls_total":
                assert 'source!="llm"' not in body.replace(" ", ""), (
                    rule.get("record") or rule["alert"]
                )


def test_every_rule_has_a_promtool_unit_test(rules):
    recorded_tested: set[str] = set()
    fired: set[str] = set()
    quiet: set[str] = set()
    for path in sorted((PROM / "tests").glob("*.test.yml")):
        for case in yaml.safe_load(path.read_text())["tests"]:
            for t in case.get("promql_expr_test", []):
                recorded_tested |= {tok for tok in metric_tokens(t["expr"]) if ":" in tok}
            for t in case.get("alert_rule_test", []):
                (fired if t.get("exp_alerts") else quiet).add(t["alertname"])
    records = {r["record"] for r in rules if "record" in r}
    alerts = {r["alert"] for r in rules if "alert" in r}
    assert records - recorded_tested == set(), "recording rules without a promtool test"
    assert alerts - fired == set(), "alerts never tested firing"
    assert alerts - quiet == set(), "alerts never tested quiet (just under the threshold)"


def test_alerts_are_routable_and_say_what_to_do(rules):
    readme = (PROM / "README.md").read_text().lower()
    for rule in (r for r in rules if "alert" in r):
        name = rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert rule["labels"]["team"] and rule["labels"]["component"] == "offscope", name
        ann = rule["annotations"]
        assert ann["summary"] and "First" in ann["description"], name
        # runbook_url (the key Alertmanager templates and Grafana link): the runbook
        # section of this alert, relative to the repository root.
        page, _, anchor = ann["runbook_url"].partition("#")
        assert page == "deploy/prometheus/README.md", name
        assert f"### {name.lower()}" in readme and anchor == name.lower(), name


def test_every_alert_is_in_the_deploy_docs_table(rules):
    """docs/deploy.md's alert table lists exactly the alerts deploy/prometheus defines,
    each with its severity."""
    rows = {}
    for line in (DEPLOY.parent / "docs" / "deploy.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`Offscope"):
            rows[cells[0].strip("`")] = cells[1]
    defined = {r["alert"]: r["labels"]["severity"] for r in rules if "alert" in r}
    assert rows == defined


def test_divisions_are_guarded(rules):
    """Every `/` in a recording rule divides by a `> 0`-filtered denominator."""
    for rule in (r for r in rules if "record" in r):
        expr = " ".join(rule["expr"].split())
        if " / " in expr:
            denominator = expr.rsplit(" / ", 1)[1]
            assert "> 0)" in denominator, rule["record"]


def test_touches_threshold_matches_the_documented_baseline(rules):
    import importlib.util

    spec = importlib.util.spec_from_file_location("threshold", PROM / "threshold.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    (alert,) = [r for r in rules if r.get("alert") == "OffscopeOutOfScopeTouchesHigh"]
    threshold = int(re.search(r"ratio1h > (\d+)", alert["expr"]).group(1))
    assert threshold == mod.threshold(2, 100)  # 2 of 100 runs in the baseline cell
    assert f"bound of {threshold}" in alert["annotations"]["summary"]


def test_deploy_yaml_mentions_no_unknown_offscope_metric():
    """Catch names in comments and other files (compose, k8s, docs) too."""
    exposed = exposed_series_names() | set(EXPORTED_METRICS)
    recorded = {
        r["record"]
        for g in yaml.safe_load((PROM / "recording.rules.yml").read_text())["groups"]
        for r in g["rules"]
    }
    pattern = re.compile(r"(?<![A-Za-z0-9_])(?:[a-z_]+:)?offscope_[a-z0-9_]+(?::[a-z0-9_]+)?")
    bad = []
    for path in sorted(DEPLOY.rglob("*")):
        if path.suffix not in {".yml", ".yaml", ".json", ".md"}:
            continue
        for token in set(pattern.findall(path.read_text())):
            if ":" in token:
                # Docs may abbreviate the window: `...:ratio{5m,1h}`.
                ok = token in recorded or (
                    path.suffix == ".md" and any(r.startswith(token) for r in recorded)
                )
            else:
                ok = token in exposed
            if not ok:
                bad.append(f"{path.relative_to(DEPLOY)}: {token}")
    assert not bad, "\n".join(bad)
