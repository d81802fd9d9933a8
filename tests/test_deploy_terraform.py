"""deploy/terraform/, and checkov over everything deploy/ ships."""


import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from deploy_support import (
    DOCKERFILES,
    K8S,
    PLAIN_MANIFESTS,
    ROOT,
    TERRAFORM,
    plain,
)


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
