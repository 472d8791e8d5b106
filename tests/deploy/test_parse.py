"""Every deploy/ file parses; the kustomization renders."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.support.deploy_testlib import DEPLOY, K8S, REPO, load_yaml_docs

YAML_FILES = sorted(p for p in DEPLOY.rglob("*") if p.suffix in {".yml", ".yaml"})
JSON_FILES = sorted(DEPLOY.rglob("*.json"))


def test_there_is_something_to_parse():
    assert len(YAML_FILES) >= 15 and JSON_FILES


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_yaml_parses(path):
    docs = load_yaml_docs(path)
    assert docs, f"{path} is empty"
    for doc in docs:
        assert isinstance(doc, dict), f"{path}: top level must be a mapping"


@pytest.mark.parametrize("path", JSON_FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_json_parses(path):
    assert isinstance(json.loads(path.read_text()), dict)


def test_k8s_objects_are_well_formed(k8s_objects):
    kinds = {o["kind"] for o in k8s_objects}
    assert {
        "Deployment",
        "Service",
        "NetworkPolicy",
        "Job",
        "Namespace",
    } <= kinds
    for obj in k8s_objects:
        assert obj.get("apiVersion") and obj["metadata"].get("name"), obj


def test_github_workflows_have_jobs():
    for path in sorted((DEPLOY / "ci").glob("*.yml")):
        wf = yaml.safe_load(path.read_text())
        on = wf.get("on", wf.get(True))  # YAML 1.1 reads the key `on` as True
        assert on and "pull_request" in on, path
        assert wf["jobs"], path


def test_ledger_example_is_a_valid_ledger():
    from offscope.ledgers import load_ledger

    load_ledger(K8S / "config" / "ledger.yaml")


def test_policy_example_is_a_valid_policy():
    from offscope.policies import load_policy

    load_policy(K8S / "config" / "policy.yaml")


@pytest.fixture(scope="module")
def ca_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("ca") / "ca"
    subprocess.run(
        [sys.executable, str(DEPLOY / "scripts" / "make_ca.py"), str(out)],
        check=True,
        capture_output=True,
        cwd=REPO,
    )
    return out


def test_make_ca_writes_what_the_secret_needs(ca_dir):
    from mitmproxy.certs import CertStore

    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    (secret,) = kust["secretGenerator"]
    for rel in secret["files"]:
        assert (ca_dir / rel.split("/", 1)[1]).is_file(), rel
    assert (ca_dir / "mitmproxy-ca.pem").stat().st_mode & 0o077 == 0
    # The sidecar's confdir is read-only in the pod: loading must not write.
    ca_dir.chmod(0o500)
    try:
        CertStore.from_store(ca_dir, "mitmproxy", 2048)
    finally:
        ca_dir.chmod(0o700)


def test_kustomize_renders(ca_dir, tmp_path):
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl not installed")
    tree = tmp_path / "k8s"
    shutil.copytree(K8S, tree, ignore=shutil.ignore_patterns("*.pem"))
    for pem in ca_dir.glob("*.pem"):
        shutil.copy(pem, tree / "ca" / pem.name)
    out = subprocess.run(
        [kubectl, "kustomize", str(tree)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    objs = [d for d in yaml.safe_load_all(out.stdout) if d]
    by_kind = {}
    for o in objs:
        by_kind.setdefault(o["kind"], []).append(o)
        if o["kind"] != "Namespace":
            assert o["metadata"]["namespace"] == "offscope-demo", o["metadata"]
    (cm,) = [c for c in by_kind["ConfigMap"] if c["metadata"]["name"] != "offscope-grid-store"]
    assert cm["metadata"]["name"] == "offscope-config"  # unhashed: edited in place, hot-reloaded
    (secret,) = by_kind["Secret"]
    secret_name = secret["metadata"]["name"]
    (deploy,) = by_kind["Deployment"]
    refs = json.dumps(deploy["spec"]["template"]["spec"]["volumes"])
    assert secret_name in refs and '"offscope-ca"' not in refs
