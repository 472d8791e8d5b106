"""Compose, Kubernetes, Dockerfile and CI agree on image, ports and paths."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.support.deploy_testlib import DEPLOY, IMAGE, K8S

LEDGER_DIR = "/etc/offscope"
CONFDIR = "/etc/offscope/ca"
TRACE = "/var/lib/offscope/trace.jsonl"
CA_CERT_VARS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS")


def flag(args: list[str], name: str) -> str:
    assert name in args, f"{name} missing from {args}"
    return str(args[args.index(name) + 1])


def check_proxy_args(args: list[str]) -> None:
    assert args[0] == "proxy"
    assert flag(args, "--listen").endswith(":8080")
    assert flag(args, "--metrics") == "0.0.0.0:9464"
    assert flag(args, "--trace") == TRACE
    assert flag(args, "--confdir") == CONFDIR
    for opt, name in (("--ledger", "ledger.yaml"), ("--policy", "policy.yaml")):
        path = flag(args, opt)
        assert path.startswith(LEDGER_DIR + "/") and path.endswith("/" + name), path


# --- Kubernetes ---------------------------------------------------------------


def kind(objs, k, name=None):
    found = [o for o in objs if o["kind"] == k and (name is None or o["metadata"]["name"] == name)]
    assert found, (k, name)
    return found


@pytest.fixture(scope="module")
def pod(k8s_objects) -> dict:
    (dep,) = kind(k8s_objects, "Deployment", "agent")
    return dep["spec"]["template"]


def containers(pod_spec) -> dict[str, dict]:
    return {c["name"]: c for c in pod_spec.get("initContainers", []) + pod_spec["containers"]}


def test_k8s_sidecar_runs_the_image_with_the_documented_cli(pod):
    spec = pod["spec"]
    sidecar = containers(spec)["offscope"]
    assert sidecar["image"] == IMAGE
    check_proxy_args(sidecar["args"])
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    assert ports == {"proxy": 8080, "metrics": 9464}
    # native sidecar: starts before the agent, restarts on its own
    assert sidecar in spec["initContainers"] and sidecar["restartPolicy"] == "Always"
    assert spec["initContainers"][0]["name"] == "egress-lock"


def test_k8s_probes(pod):
    sidecar = containers(pod["spec"])["offscope"]
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert sidecar["startupProbe"]["httpGet"]["path"] == "/readyz"
    assert sidecar["resources"]["requests"]["cpu"] and sidecar["resources"]["requests"]["memory"]


def test_k8s_config_is_a_directory_mount_and_ca_key_stays_in_the_sidecar(pod):
    spec = pod["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    cs = containers(spec)
    for c in cs.values():
        for m in c.get("volumeMounts", []):
            assert "subPath" not in m, f"{c['name']}: subPath mounts never see ConfigMap updates"
    (etc,) = [m for m in cs["offscope"]["volumeMounts"] if m["mountPath"] == LEDGER_DIR]
    sources = volumes[etc["name"]]["projected"]["sources"]
    paths = {i["path"] for s in sources for i in (s.get("configMap") or s.get("secret"))["items"]}
    assert {
        "ledger.yaml",
        "policy.yaml",
        "ca/mitmproxy-ca.pem",
        "ca/mitmproxy-ca-cert.pem",
        "ca/mitmproxy-dhparam.pem",
    } <= paths
    # the agent sees the public certificate only
    agent = cs["agent"]
    for m in agent.get("volumeMounts", []):
        assert "mitmproxy-ca.pem" not in yaml.safe_dump(volumes[m["name"]]), m
    env = {e["name"]: e["value"] for e in agent["env"]}
    (ca_mount,) = [m for m in agent["volumeMounts"] if m["name"] == "offscope-ca-public"]
    for var in CA_CERT_VARS:
        assert env[var] == ca_mount["mountPath"] + "/mitmproxy-ca-cert.pem"
    assert volumes[ca_mount["name"]]["secret"]["items"] == [
        {"key": "mitmproxy-ca-cert.pem", "path": "mitmproxy-ca-cert.pem"}
    ]


def test_k8s_agent_goes_through_the_sidecar(pod):
    spec = pod["spec"]
    cs = containers(spec)
    agent = cs["agent"]
    env = {e["name"]: e["value"] for e in agent["env"]}
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        assert env[var] == "http://127.0.0.1:8080"
    assert set(env["NO_PROXY"].split(",")) <= {"localhost", "127.0.0.1", "::1"}
    # the egress lock pins the agent's uid to loopback; the sidecar runs as another uid
    lock = cs["egress-lock"]
    script = lock["args"][0]
    agent_uid = agent["securityContext"]["runAsUser"]
    assert f"AGENT_UID={agent_uid}" in script and "-o lo" in script and "REJECT" in script
    assert "ip6tables" in script
    assert cs["offscope"]["securityContext"]["runAsUser"] != agent_uid
    assert "NET_ADMIN" in lock["securityContext"]["capabilities"]["add"]
    assert "add" not in agent["securityContext"]["capabilities"]
    assert agent["securityContext"]["allowPrivilegeEscalation"] is False
    assert spec["automountServiceAccountToken"] is False


def test_k8s_control_api_is_for_the_harness_only(pod):
    """The control API listens on loopback, on its own port, with a token that is
    mounted into the sidecar and the harness, never the agent; the agent's uid may
    reach only the proxy port."""
    spec = pod["spec"]
    cs = containers(spec)
    args = cs["offscope"]["args"]
    assert flag(args, "--control-listen") == "127.0.0.1:9465"
    token_dir = flag(args, "--control-token-file").rsplit("/", 1)[0]
    volumes = {v["name"]: v for v in spec["volumes"]}
    holders = {
        c["name"]
        for c in cs.values()
        for m in c.get("volumeMounts", [])
        if volumes[m["name"]].get("secret", {}).get("secretName") == "offscope-control-token"
    }
    assert holders == {"offscope", "harness"}
    assert any(m["mountPath"] == token_dir for m in cs["offscope"]["volumeMounts"])
    script = cs["egress-lock"]["args"][0]
    agent_uid = cs["agent"]["securityContext"]["runAsUser"]
    assert '-o lo -p tcp --dport 8080 -m owner --uid-owner "$AGENT_UID" -j ACCEPT' in script
    assert f"AGENT_UID={agent_uid}" in script and "--dport 9465" in script
    assert cs["agent"]["securityContext"]["runAsGroup"] != spec["securityContext"]["fsGroup"]


def test_k8s_scraping(pod, k8s_objects):
    ann = pod["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/port"] == "9464"
    assert ann["prometheus.io/path"] == "/metrics"
    (svc,) = kind(k8s_objects, "Service", "offscope")  # job="offscope" for ServiceMonitor
    assert [(p["name"], p["port"]) for p in svc["spec"]["ports"]] == [("metrics", 9464)]
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    sm = yaml.safe_load((K8S / "prometheus-operator" / "servicemonitor.yaml").read_text())
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    kube = yaml.safe_load((DEPLOY / "prometheus" / "prometheus-kubernetes.yml").read_text())
    (job,) = kube["scrape_configs"]
    assert job["job_name"] == "offscope"
    keep = {
        tuple(r["source_labels"]): r["regex"]
        for r in job["relabel_configs"]
        if r.get("action") == "keep"
    }
    assert (
        keep[("__meta_kubernetes_pod_label_offscope_sidecar",)]
        == pod["metadata"]["labels"]["offscope/sidecar"]
    )
    assert keep[("__meta_kubernetes_pod_container_port_number",)] == "9464"


def test_k8s_network_policy_selects_the_agent_pod(pod, k8s_objects):
    pol = kind(k8s_objects, "NetworkPolicy", "agent-with-offscope")[0]["spec"]
    assert pol["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert set(pol["policyTypes"]) == {"Ingress", "Egress"}
    ingress_ports = {p["port"] for rule in pol["ingress"] for p in rule["ports"]}
    assert ingress_ports == {9464}, "the proxy port must not be reachable from outside the pod"
    blocks = [t["ipBlock"] for rule in pol["egress"] for t in rule["to"] if "ipBlock" in t]
    v4 = next(b for b in blocks if b["cidr"] == "0.0.0.0/0")
    assert "169.254.0.0/16" in v4["except"] and "10.0.0.0/8" in v4["except"]


def _container(spec: dict, name: str) -> dict:
    every = (
        spec["template"]["spec"].get("initContainers", []) + spec["template"]["spec"]["containers"]
    )
    (c,) = [c for c in every if c["name"] == name]
    return c


def test_k8s_grid_job_is_indexed_and_sharded(k8s_objects):
    (job,) = kind(k8s_objects, "Job", "offscope-grid")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    n = spec["completions"]
    assert spec["parallelism"] == n
    # failures are per index: one flaky pod retries its own shard, not the whole grid
    assert "backoffLimit" not in spec and spec["backoffLimitPerIndex"] >= 1
    assert spec["maxFailedIndexes"] == 0
    grid = _container(spec, "grid")
    assert grid["image"] == IMAGE
    script = " ".join(grid["args"])
    assert script.startswith("offscope grid ") and "--cells diagonal" in script
    assert '--shard "$OFFSCOPE_SHARD"' in script and "--out /out" in script
    shard = {e["name"]: e for e in grid["env"]}["OFFSCOPE_SHARD"]["value"]
    assert shard == f"$(SHARD_INDEX)/{n}"
    # the grid's exit code outlives the init container; the upload reports it
    assert "echo $? > /out/.grid-exit-code" in script
    upload = _container(spec, "upload")
    assert 'exit "$(cat /out/.grid-exit-code)"' in " ".join(upload["args"])
    assert "$OFFSCOPE_RESULTS_URL/shard-$SHARD_INDEX/" in " ".join(upload["args"])
    fetch = _container(spec, "fetch")  # a retried index resumes what it uploaded before
    assert '"$OFFSCOPE_RESULTS_URL/shard-$SHARD_INDEX/" /out/' in " ".join(fetch["args"])
    # no shared volume: the shard's --out is the pod's own emptyDir
    for j in (job, kind(k8s_objects, "Job", "offscope-merge")[0]):
        for v in j["spec"]["template"]["spec"]["volumes"]:
            assert "persistentVolumeClaim" not in v, v
    (merge,) = kind(k8s_objects, "Job", "offscope-merge")
    m = _container(merge["spec"], "merge")
    assert m["image"] == IMAGE
    assert " ".join(m["args"]).startswith("offscope merge /results/shard-* --out /results/merged")
    assert merge["spec"]["suspend"] is True  # started once the grid completed
    # grid pods reach DNS and HTTPS (the upload) only, never the metadata endpoint
    pol = kind(k8s_objects, "NetworkPolicy", "offscope-grid-egress")[0]["spec"]
    assert pol["ingress"] == []
    assert (
        pol["podSelector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    )
    ports = {p["port"] for rule in pol["egress"] for p in rule["ports"]}
    assert ports == {53, 443}
    blocks = [t["ipBlock"] for rule in pol["egress"] for t in rule["to"] if "ipBlock" in t]
    assert all("169.254.0.0/16" in b["except"] for b in blocks)


def test_k8s_config_files_exist_for_generators():
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    for gen in kust["configMapGenerator"]:
        for f in gen.get("files", []):
            assert (K8S / f).is_file(), f
    assert (K8S / "ca" / ".gitignore").is_file()


# --- docker compose -------------------------------------------------------------


def test_compose_sidecar(compose):
    svc = compose["services"]
    off = svc["offscope"]
    assert (
        off["image"] == IMAGE
        and svc["ca-init"]["build"]["dockerfile"] == "deploy/docker/Dockerfile"
    )
    check_proxy_args(off["command"])
    assert flag(off["command"], "--listen") == "0.0.0.0:8080"
    assert "/readyz" in " ".join(off["healthcheck"]["test"]) and ":9464" in " ".join(
        off["healthcheck"]["test"]
    )
    mounts = {m.split(":")[1]: m.split(":")[0] for m in off["volumes"]}
    assert mounts[CONFDIR] == "offscope-ca"
    config_dir = flag(off["command"], "--ledger").rsplit("/", 1)[0]
    assert (DEPLOY / "compose" / mounts[config_dir]).resolve() == (K8S / "config").resolve()


def test_compose_agent_reaches_only_the_proxy(compose):
    svc = compose["services"]
    agent = svc["agent"]
    env = agent["environment"]
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        assert env[var] == "http://offscope:8080"
    for var in CA_CERT_VARS:
        assert env[var] == "/etc/offscope-ca/mitmproxy-ca-cert.pem"
    assert agent["volumes"] == ["offscope-ca-public:/etc/offscope-ca:ro"]
    assert agent["networks"] == ["agent-net"]
    assert compose["networks"]["agent-net"]["internal"] is True
    assert "agent-net" in svc["offscope"]["networks"]


def test_compose_prometheus_and_grafana_files_exist(compose):
    base = DEPLOY / "compose"
    for name in ("prometheus", "grafana"):
        for vol in compose["services"][name]["volumes"]:
            src = vol.split(":")[0]
            if src.startswith("."):
                assert (base / src).exists(), vol
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (job,) = [j for j in prom["scrape_configs"] if j["job_name"] == "offscope"]
    assert job["static_configs"][0]["targets"] == ["offscope:9464"]
    ds = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"
    prov = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/offscope.yaml").read_text())
    dash_dir = prov["providers"][0]["options"]["path"]
    assert any(
        v.endswith(f"{dash_dir}/offscope-dashboard.json:ro")
        for v in compose["services"]["grafana"]["volumes"]
    )


# --- Dockerfile, dashboard, CI ------------------------------------------------------


def test_dockerfile():
    text = (DEPLOY / "docker" / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user and not user[-1].startswith(("0", "root"))
    assert 'ENTRYPOINT ["offscope"]' in text
    assert re.search(r"^EXPOSE 8080 9464$", text, re.M)
    cmd = re.search(r"^CMD (\[.*?\])$", text, re.M | re.S).group(1)
    check_proxy_args(yaml.safe_load(cmd.replace("\\\n", " ")))


def test_dashboard_is_provisioning_ready(dashboard):
    assert dashboard["uid"] and dashboard.get("id") is None
    assert "__inputs" not in dashboard  # provisioning does not substitute import inputs
    names = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "ledger"} <= names
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        if panel["type"] == "heatmap":
            assert all(t.get("format") == "heatmap" for t in panel["targets"])
            assert all("_bucket" in t["expr"] for t in panel["targets"])
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for want in (
        "touches per 1,000 runs",
        "funnel",
        "first out-of-scope step",
        "self-granted",
        "provenance",
        "friction",
        "blocks",
        "latency",
        "coherence",
        "first out-of-scope act step",
        "verbosity",
    ):
        assert want in titles, want


def test_ci_workflows():
    single = yaml.safe_load((DEPLOY / "ci" / "scope-gate.yml").read_text())
    text = yaml.safe_dump(single)
    assert "--cells diagonal" in text and "offscope gate" in text and "gh pr comment" in text
    sharded = yaml.safe_load((DEPLOY / "ci" / "scope-gate-sharded.yml").read_text())
    grid = sharded["jobs"]["grid"]
    shards = grid["strategy"]["matrix"]["shard"]
    assert shards == list(range(len(shards)))
    assert f"--shard ${{{{ matrix.shard }}}}/{len(shards)}" in yaml.safe_dump(grid)
    merge = sharded["jobs"]["merge-and-gate"]
    assert merge["needs"] == "grid" and "offscope merge" in yaml.safe_dump(merge)
