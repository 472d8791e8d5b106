"""Every Kubernetes manifest validates against the Kubernetes schemas (kubernetes-validate,
offline, strict: an unknown or misspelt field is an error), raw and as kustomize renders
it; the grid's shard count is written in one place."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.deploy_testlib import K8S, load_yaml_docs

kubernetes_validate = pytest.importorskip("kubernetes_validate")

# The oldest Kubernetes the example supports (native sidecars, backoffLimitPerIndex and
# podFailurePolicy FailIndex are on by default from 1.29) and the newest the validator knows.
VERSIONS = ("1.29.0", kubernetes_validate.utils.latest_version())
CRD_GROUPS = ("monitoring.coreos.com/",)  # no built-in schema; the CRD's own (not bundled)
NOT_MANIFESTS = {"kustomization.yaml"}
MANIFESTS = sorted(
    p
    for p in K8S.rglob("*.yaml")
    if p.name not in NOT_MANIFESTS and "config" not in p.relative_to(K8S).parts
)


def _validate(obj: dict) -> None:
    for version in VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(K8S)))
def test_each_manifest_file_validates(path: Path) -> None:
    for obj in load_yaml_docs(path):
        if obj["apiVersion"].startswith(CRD_GROUPS):
            with pytest.raises(kubernetes_validate.utils.SchemaNotFoundError):
                _validate(obj)
            continue
        _validate(obj)


def test_the_validator_catches_a_misspelt_or_mistyped_field() -> None:
    (job,) = load_yaml_docs(K8S / "grid-job.yaml")
    _validate(job)
    typo = copy.deepcopy(job)
    typo["spec"]["backoffLimitPerIndx"] = typo["spec"].pop("backoffLimitPerIndex")
    with pytest.raises(kubernetes_validate.utils.ValidationError):
        _validate(typo)
    wrong = copy.deepcopy(job)
    wrong["spec"]["completions"] = "4"
    with pytest.raises(kubernetes_validate.utils.ValidationError):
        _validate(wrong)


def _render(tree: Path) -> list[dict]:
    kubectl = shutil.which("kubectl") or shutil.which("kustomize")
    if not kubectl:
        pytest.skip("neither kubectl nor kustomize installed (each file is validated above)")
    cmd = (
        [kubectl, "kustomize", str(tree)]
        if kubectl.endswith("kubectl")
        else [kubectl, "build", str(tree)]
    )
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _copy_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "k8s"
    shutil.copytree(K8S, tree, ignore=shutil.ignore_patterns("*.pem"))
    for name in ("mitmproxy-ca.pem", "mitmproxy-ca-cert.pem", "mitmproxy-dhparam.pem"):
        (tree / "ca" / name).write_text("placeholder: make_ca.py writes the real files\n")
    return tree


def test_the_rendered_kustomization_validates(tmp_path: Path) -> None:
    objs = _render(_copy_tree(tmp_path))
    assert {o["kind"] for o in objs} >= {"Job", "ConfigMap", "Deployment", "NetworkPolicy"}
    for obj in objs:
        _validate(obj)


def _grid(objs: list[dict]) -> dict:
    (job,) = [o for o in objs if o["kind"] == "Job" and o["metadata"]["name"] == "offscope-grid"]
    return job["spec"]


@pytest.mark.parametrize("shards", [4, 7])
def test_the_shard_count_is_written_once(tmp_path: Path, shards: int) -> None:
    tree = _copy_tree(tmp_path)
    job_file = tree / "grid-job.yaml"
    text = job_file.read_text()
    assert text.count("completions: 4") == 1
    job_file.write_text(text.replace("completions: 4", f"completions: {shards}"))
    spec = _grid(_render(tree))
    grid = next(c for c in spec["template"]["spec"]["initContainers"] if c["name"] == "grid")
    env = {e["name"]: e.get("value") for e in grid["env"]}
    assert spec["completions"] == spec["parallelism"] == shards
    assert env["OFFSCOPE_SHARD"] == f"$(SHARD_INDEX)/{shards}"
    # Nothing else names the count: no other "/4" in the grid and merge Jobs.
    merge = (tree / "merge-job.yaml").read_text()
    assert "shard-0" not in merge and "/4" not in merge
