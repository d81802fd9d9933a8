"""What the deploy/ tests share: where things are, and readers of Dockerfiles, manifests and the parts' pyprojects."""


import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from jaxcache.client import options as client_options

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
DOCKERFILES = {p.name.removesuffix(".Dockerfile"): p for p in sorted((DEPLOY / "docker").glob("*.Dockerfile"))}
K8S = DEPLOY / "k8s"
KUSTOMIZATIONS = ["base", "overlays/gcs", "overlays/nfs", "overlays/s3", "overlays/azure"]
#: The overlays over an object store: the scheme of their roots and the annotation of the service account that gives
#: the pods their identity there (GKE Workload Identity, IRSA, Azure Workload Identity).
STORE_OVERLAYS = {
    "overlays/gcs": ("gs", "iam.gke.io/gcp-service-account"),
    "overlays/s3": ("s3", "eks.amazonaws.com/role-arn"),
    "overlays/azure": ("az", "azure.workload.identity/client-id"),
}
# Manifests applied as they are, outside kustomize.
PLAIN_MANIFESTS = [
    K8S / "warmup-job.yaml",
    K8S / "tpu-warmup-job.yaml",
    K8S / "warmup-targets-job.yaml",
    K8S / "node-tier-seed-daemonset.yaml",
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


def filled(value: str) -> str:
    """A manifest's value with its placeholders replaced, as deploy/README.md tells an operator to: ``PROJECT_ID`` in
    capitals names no bucket, and the service checks each root's spelling when it reads its settings."""
    return value.replace("PROJECT_ID", "my-project")


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


