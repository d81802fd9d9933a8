"""deploy/k8s/: the service's process model. Requests go to the api Deployment's pods, behind the Service; the
background loops run in the loops Deployment's one pod; each pod's CPU request matches its worker count; the
role-all Component makes them one Deployment. Read through kubectl kustomize and the service's settings model."""


import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from deploy_support import (
    K8S,
    KUSTOMIZATIONS,
    by_kind,
    container_env,
    filled,
    image_env,
    load_docs,
    one,
    plain,
    pod_spec,
)

#: The service's Deployments and the role (`JAXCACHE_ROLE`, docs/operator-guide.md, "Roles") each one's pods run:
#: requests go to the api pods, the background loops run in the loops pod (deploy/README.md, "Two Deployments").
ROLES = {"jaxcache-api": "api", "jaxcache-loops": "loops"}
#: The kustomize Component that makes it one Deployment running both (deploy/README.md, "One Deployment").
ROLE_ALL = K8S / "role-all"
#: The Prometheus Operator's objects, a Component too (deploy/README.md, "Monitoring").
MONITORING = K8S / "monitoring"


def the_service(docs: list[dict]) -> dict:
    """The Service jaxcache, which requests go through (the loops pod's headless jaxcache-loops is for Prometheus)."""
    (service,) = [s for s in by_kind(docs, "Service") if s["metadata"]["name"] == "jaxcache"]
    return service


def pod_labels(obj: dict) -> dict[str, str]:
    return obj["spec"]["template"]["metadata"]["labels"]


def selects(selector: dict, labels: dict[str, str]) -> bool:
    """Whether a LabelSelector (matchLabels and matchExpressions) picks an object with these labels, as Kubernetes
    decides it; an empty selector picks everything."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions", []):
        present, value = e["key"] in labels, labels.get(e["key"])
        ok = {"In": present and value in e.get("values", []), "NotIn": not present or value not in e["values"],
              "Exists": present, "DoesNotExist": not present}[e["operator"]]
        if not ok:
            return False
    return True


def service_selects(service: dict, deployment: dict) -> bool:
    """Whether the Service sends traffic to the Deployment's pods (a Service's selector is a plain map)."""
    selector = service["spec"].get("selector")
    return bool(selector) and selects({"matchLabels": selector}, pod_labels(deployment))


def served_settings(docs: list[dict], deployment: dict, monkeypatch):
    """The settings `jaxcache serve` reads in the Deployment's container, through the service's own settings model:
    the image's ENV, then each envFrom ConfigMap in order, then the container's env, which is Kubernetes'
    precedence. Secrets come from outside the repository (secret.template.yaml sets neither role nor workers)."""
    from jaxcache.service.settings import ServiceSettings

    (container,) = pod_spec(deployment)["containers"]
    env = dict(image_env("service"))
    for ref in container.get("envFrom", []):
        if "configMapRef" in ref:
            env |= one(docs, "ConfigMap", ref["configMapRef"]["name"])["data"]
    for e in container.get("env", []):
        assert "value" in e or "secretKeyRef" in e.get("valueFrom", {}), f"{e['name']}: unexpected valueFrom"
        if "value" in e:
            env[e["name"]] = e["value"]
    with monkeypatch.context() as m:
        for key in [k for k in os.environ if k.startswith("JAXCACHE_")]:
            m.delenv(key)
        for key, value in env.items():
            if key.startswith("JAXCACHE_"):
                m.setenv(key, filled(value))
        return ServiceSettings()


def cpus(quantity: str | int | float) -> float:
    """A Kubernetes CPU quantity in cores: "2", 1.5, "250m"."""
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def check_workers_match_cpu(docs: list[dict], deployment: dict, monkeypatch, where: str) -> None:
    (container,) = pod_spec(deployment)["containers"]
    assert "JAXCACHE_WORKERS" in container_env(container), (
        f"{where}: set JAXCACHE_WORKERS, so the worker count is the one the CPU request was sized for, not whatever "
        "the default reads from the node")
    workers = served_settings(docs, deployment, monkeypatch).workers
    resources = container["resources"]
    assert cpus(resources["requests"]["cpu"]) == workers, (
        f"{where}: {workers} workers but a CPU request of {resources['requests']['cpu']}: request one CPU per worker")
    assert cpus(resources["limits"]["cpu"]) >= workers, f"{where}: a CPU limit under the worker count throttles them"


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_the_service_runs_as_an_api_and_a_loops_deployment(rendered, name, monkeypatch):
    docs = rendered[name]
    deployments = {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")}
    assert set(deployments) == set(ROLES), f"deploy/k8s/{name}: Deployments {sorted(deployments)}, not {set(ROLES)}"
    for dname, role in ROLES.items():
        settings = served_settings(docs, deployments[dname], monkeypatch)
        assert settings.role == role, f"deploy/k8s/{name}: {dname}'s pods run --role {settings.role}, not {role}"
    assert deployments["jaxcache-api"]["spec"]["replicas"] == 2, "two api replicas: one answers while the other moves"
    assert deployments["jaxcache-loops"]["spec"]["replicas"] == 1, "one loops pod is enough (its passes take locks)"
    api, loops = pod_labels(deployments["jaxcache-api"]), pod_labels(deployments["jaxcache-loops"])
    for d in deployments.values():
        assert selects(d["spec"]["selector"], pod_labels(d))
    assert not selects(deployments["jaxcache-api"]["spec"]["selector"], loops), "the Deployments' pods must differ"
    assert not selects(deployments["jaxcache-loops"]["spec"]["selector"], api), "the Deployments' pods must differ"


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_requests_go_to_the_api_pods_only(rendered, name):
    docs = rendered[name]
    api, loops = one(docs, "Deployment", "jaxcache-api"), one(docs, "Deployment", "jaxcache-loops")
    service = the_service(docs)
    assert service_selects(service, api), "the Service must send requests to the api pods"
    receiving = [s["metadata"]["name"] for s in by_kind(docs, "Service")
                 if service_selects(s, loops) and s["spec"].get("clusterIP") != "None"]
    assert not receiving, f"requests must never wait behind the loops pod, but Services {receiving} balance to it"
    pdb = one(docs, "PodDisruptionBudget")
    assert selects(pdb["spec"]["selector"], pod_labels(api)), "the PodDisruptionBudget must keep an api pod up"
    assert not selects(pdb["spec"]["selector"], pod_labels(loops)), (
        "a PodDisruptionBudget of minAvailable 1 over the one loops pod would block every node drain")


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_cpu_requests_match_the_worker_count(rendered, name, monkeypatch):
    for deployment in by_kind(rendered[name], "Deployment"):
        check_workers_match_cpu(rendered[name], deployment, monkeypatch,
                                f"deploy/k8s/{name}: Deployment {deployment['metadata']['name']}")


def admitted(docs: list[dict], deployment: dict, port: int) -> list[dict]:
    """The ingress peers the namespace's NetworkPolicies admit to the Deployment's pods on this port."""
    peers = []
    for policy in by_kind(docs, "NetworkPolicy"):
        if not selects(policy["spec"]["podSelector"], pod_labels(deployment)):
            continue
        for rule in policy["spec"].get("ingress", []):
            if not rule.get("ports") or any(p.get("port") in (port, "http") for p in rule["ports"]):
                peers += rule.get("from", [])
    return peers


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_network_policy_admits_training_namespaces_prometheus_and_prune(rendered, name):
    docs = rendered[name]
    default_deny = one(docs, "NetworkPolicy", "default-deny")
    assert default_deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    training_ns = one(plain(K8S / "examples" / "training-job.yaml"), "Namespace")
    ns_labels = training_ns["metadata"]["labels"]
    cron = one(docs, "CronJob")
    prune_labels = cron["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]

    def training(p: dict) -> bool:
        return selects(p.get("namespaceSelector", {"matchLabels": {"-": "-"}}), ns_labels) and "podSelector" not in p

    def prune(p: dict) -> bool:
        return "namespaceSelector" not in p and selects(p.get("podSelector", {"matchLabels": {"-": "-"}}),
                                                       prune_labels)

    for dname in ROLES:
        deployment = one(docs, "Deployment", dname)
        sources = admitted(docs, deployment, 8080)
        assert any("prometheus" in json.dumps(p) for p in sources), f"{dname}: let Prometheus scrape /metrics"
        if dname == "jaxcache-api":
            assert any(map(training, sources)), (
                "the example training namespace's labels do not match the NetworkPolicy's training-namespace "
                "selector for the api pods")
            assert any(map(prune, sources)), "the NetworkPolicy must admit the prune pods to the api pods"
        else:
            assert not any(map(training, sources)) and not any(map(prune, sources)), (
                f"{dname}: the loops pod answers no one but Prometheus")


def build_with(tmp_path: Path, name: str, component: Path) -> list[dict]:
    """deploy/k8s/NAME with a Component added, as an operator's overlay does (deploy/README.md)."""
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl is not installed: install kubectl (it bundles kustomize) to render deploy/k8s")
    folder = tmp_path / f"{name.replace('/', '-')}-{component.name}"
    folder.mkdir()
    (folder / "kustomization.yaml").write_text(json.dumps({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(K8S / name, folder)], "components": [os.path.relpath(component, folder)],
    }))
    proc = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"deploy/k8s/{name} with {component.name} does not build:\n{proc.stderr}"
    return load_docs(proc.stdout)


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_service_monitor_scrapes_the_api_and_the_loops_pods(name, tmp_path):
    docs = build_with(tmp_path, name, MONITORING)
    (monitor,) = by_kind(docs, "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    namespace = monitor["metadata"]["namespace"]
    services = [s for s in by_kind(docs, "Service") if s["metadata"]["namespace"] == namespace
                and selects(monitor["spec"]["selector"], s["metadata"].get("labels", {}))]
    for dname in ROLES:
        deployment = one(docs, "Deployment", dname)
        (port,) = pod_spec(deployment)["containers"][0]["ports"]
        behind = [s for s in services if service_selects(s, deployment)]
        assert behind, f"deploy/k8s/{name}: the ServiceMonitor finds no Service in front of {dname}'s pods"
        for service in behind:
            (sport,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
            assert sport["targetPort"] in (port["name"], port["containerPort"]), (
                f"Service {service['metadata']['name']}'s {endpoint['port']} port is not {dname}'s metrics port")


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_role_all_component_makes_one_deployment_that_does_both(rendered, name, tmp_path, monkeypatch):
    docs = build_with(tmp_path, name, ROLE_ALL)
    (deployment,) = by_kind(docs, "Deployment")
    where = f"deploy/k8s/{name} with role-all: Deployment {deployment['metadata']['name']}"
    assert served_settings(docs, deployment, monkeypatch).role == "all", f"{where}: run --role all"
    assert service_selects(the_service(docs), deployment), f"{where}: the Service must select it"
    check_workers_match_cpu(docs, deployment, monkeypatch, where)
    kept = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert kept == {(d["kind"], d["metadata"]["name"]) for d in rendered[name]
                    if d["metadata"]["name"] != "jaxcache-loops"}, (
        "the component must only turn the two Deployments into one, and drop the loops pod's headless Service")
