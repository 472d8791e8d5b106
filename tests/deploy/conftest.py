"""Fixtures for the deploy/ tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support.deploy_testlib import DEPLOY, K8S, PROM, load_yaml_docs, require_tool


@pytest.fixture(scope="session")
def promtool() -> str:
    return require_tool("promtool")


@pytest.fixture(scope="session")
def rule_files() -> list[Path]:
    files = sorted(PROM.glob("*.rules.yml"))
    assert files, "no rule files in deploy/prometheus"
    return files


@pytest.fixture(scope="session")
def rules(rule_files) -> list[dict]:
    """Every rule of every group of every rule file (with its file name)."""
    out = []
    for path in rule_files:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                out.append({**rule, "_file": path.name, "_group": group["name"]})
    return out


@pytest.fixture(scope="session")
def dashboard() -> dict:
    return json.loads((DEPLOY / "grafana" / "offscope-dashboard.json").read_text())


@pytest.fixture(scope="session")
def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())


@pytest.fixture(scope="session")
def k8s_objects() -> list[dict]:
    """The objects the kustomization lists (raw files, no kustomize needed)."""
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    objs = []
    for res in kust["resources"]:
        objs.extend(load_yaml_docs(K8S / res))
    return objs
