"""promtool: the rule files lint, their unit tests pass, the scrape config loads.

Needs Debian's `prometheus` package (promtool 2.42+). Skipped without it,
except under CI=true, where a missing promtool fails the run.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.support.deploy_testlib import PROM

TEST_FILES = sorted((PROM / "tests").glob("*.test.yml"))


def _run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=PROM)


def test_there_are_rule_tests():
    assert TEST_FILES


def test_check_rules(promtool, rule_files):
    out = _run([promtool, "check", "rules", *map(str, rule_files)])
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda p: p.name)
def test_rule_unit_tests(promtool, test_file):
    out = _run([promtool, "test", "rules", str(test_file)])
    assert out.returncode == 0, out.stdout + out.stderr


def test_check_config(promtool):
    out = _run([promtool, "check", "config", str(PROM / "prometheus.yml")])
    assert out.returncode == 0, out.stdout + out.stderr
