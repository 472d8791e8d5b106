"""Paths and helpers shared by the deploy/ tests (imported as a plain module)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
PROM = DEPLOY / "prometheus"
K8S = DEPLOY / "k8s"
IMAGE = "ghcr.io/offscope/offscope:0.1.0"


def load_yaml_docs(path: Path) -> list:
    with path.open(encoding="utf-8") as fh:
        return [doc for doc in yaml.safe_load_all(fh) if doc is not None]


def require_tool(name: str) -> str:
    """Path of a CLI tool; skip without it, but fail under CI=true."""
    found = shutil.which(name)
    if found:
        return found
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{name} is required under CI=true (Debian: apt-get install -y prometheus)")
    pytest.skip(f"{name} not installed")
