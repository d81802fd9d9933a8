"""The prune CronJob's script and the image's HEALTHCHECK, against a real `jaxcache serve`."""


import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from conftest import jaxcache_serve
from deploy_support import (
    DOCKERFILES,
    PRUNE,
    parse_dockerfile,
)
from ports import free_port

ADMIN_TOKEN = "deploy-test-admin-token"



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
    # What deploy ships removes proven-bad entries, and only those: `differs` proves nothing.
    assert all(policy.get("integrity") == ["tampered", "corrupt"] for policy in policies.values()), policies
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
    dead = subprocess.run([sys.executable, *cmd[1:]], env=env | {"JAXCACHE_PORT": str(free_port())},
                          capture_output=True, timeout=30)
    assert dead.returncode != 0, "the HEALTHCHECK command passed with no service listening"


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
def test_probed_paths_answer_without_a_token(served, path):
    base, _ = served
    with urllib.request.urlopen(f"{base}{path}", timeout=10) as r:
        assert r.status == 200, f"{path}: the probes and Prometheus call it without a token"
