"""The dashboard's coverage panel across a fleet, evaluated by real Prometheus code:
`promtool test rules` runs the panel's own expressions over the series two sidecars
export (no rule file needed: a PromQL expression test)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from tests.support.deploy_testlib import REPO

DASHBOARD = REPO / "deploy" / "grafana" / "offscope-dashboard.json"


def _coverage_exprs() -> dict[str, str]:
    (panel,) = [
        p for p in json.loads(DASHBOARD.read_text())["panels"] if "coverage" in p["title"].lower()
    ]
    return {t["legendFormat"]: t["expr"].replace("$ledger", ".*") for t in panel["targets"]}


def test_coverage_panel_does_not_add_up_sidecars(promtool, tmp_path: Path) -> None:
    exprs = _coverage_exprs()
    # Two sidecars of one ledger (10 target patterns): one used 3 of them, the other 2.
    series = [
        ("offscope_ledger_entries_used", "pod-a", 3),
        ("offscope_ledger_entries_used", "pod-b", 2),
        ("offscope_ledger_entries_declared", "pod-a", 10),
        ("offscope_ledger_entries_declared", "pod-b", 10),
    ]
    test = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {
                        "series": f'{name}{{ledger="billing",entry="target",instance="{pod}"}}',
                        "values": f"{value}x5",
                    }
                    for name, pod, value in series
                ],
                "promql_expr_test": [
                    {
                        "expr": exprs["{{entry}} used"],
                        "eval_time": "2m",
                        "exp_samples": [{"labels": '{entry="target"}', "value": 3}],
                    },
                    {
                        "expr": exprs["{{entry}} declared"],
                        "eval_time": "2m",
                        "exp_samples": [{"labels": '{entry="target"}', "value": 10}],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "coverage.test.yml"
    path.write_text(yaml.safe_dump(test), encoding="utf-8")
    out = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
