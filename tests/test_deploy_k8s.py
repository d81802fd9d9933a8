"""deploy/k8s/: the manifests render, validate against Kubernetes' schemas, and wire the service, prune, warm-up
and training jobs the way the code reads its settings."""


import ast
import json
import os
import re
from pathlib import Path

import pytest

from deploy_support import (
    CLIENT_ENV,
    DEPLOY,
    DOCKERFILES,
    K8S,
    KUBERNETES_VERSION,
    KUSTOMIZATIONS,
    PLAIN_MANIFESTS,
    PRUNE,
    ROOT,
    STORE_OVERLAYS,
    by_kind,
    container_env,
    filled,
    image_env,
    image_user,
    one,
    parse_dockerfile,
    plain,
    pod_spec,
)


def the_service(docs: list[dict]) -> dict:
    """The Service jaxcache, which requests go through (the loops pod's headless jaxcache-loops is for Prometheus)."""
    (service,) = [s for s in by_kind(docs, "Service") if s["metadata"]["name"] == "jaxcache"]
    return service


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
def test_service_pods_are_hardened_probed_and_scraped(rendered, name):
    docs = rendered[name]
    for deployment in by_kind(docs, "Deployment"):
        where = f"deploy/k8s/{name}: Deployment {deployment['metadata']['name']}"
        (container,) = pod_spec(deployment)["containers"]
        (port,) = container["ports"]
        probes = {kind: container.get(kind, {}).get("httpGet", {}) for kind in ("readinessProbe", "livenessProbe")}
        assert probes == {"readinessProbe": {"path": "/readyz", "port": port["name"]},
                          "livenessProbe": {"path": "/healthz", "port": port["name"]}}, (
            f"{where}: probe /readyz (readiness) and /healthz (liveness) on the container's port, as every role "
            f"serves them: {probes}")
        annotations = deployment["spec"]["template"]["metadata"].get("annotations", {})
        scrape = {k: annotations.get(f"prometheus.io/{k}") for k in ("scrape", "port", "path")}
        assert scrape == {"scrape": "true", "port": str(port["containerPort"]), "path": "/metrics"}, (
            f"{where}: a plain Prometheus finds every pod's /metrics by its prometheus.io/* annotations: {scrape}")
        mounted = {m["mountPath"] for m in container.get("volumeMounts", [])}
        assert {"/tmp", image_env("service")["XDG_STATE_HOME"]} <= mounted, (
            f"{where}: the root filesystem is read-only: mount writable volumes at /tmp and the image's "
            "XDG_STATE_HOME"
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
    deployment = one(rendered[name], "Deployment", "jaxcache-api")
    (container,) = pod_spec(deployment)["containers"]
    (port,) = container["ports"]
    exposed = [i.args for i in parse_dockerfile(DOCKERFILES["service"]) if i.keyword == "EXPOSE"]
    assert str(port["containerPort"]) == env["JAXCACHE_PORT"] and exposed == [env["JAXCACHE_PORT"]], (
        f"containerPort {port['containerPort']}, the image's JAXCACHE_PORT {env['JAXCACHE_PORT']} and EXPOSE "
        f"{exposed} must agree"
    )
    service = the_service(rendered[name])
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
            monkeypatch.setenv(key, filled(value))
    settings = ServiceSettings()  # raises on a malformed cache map, name or interval
    assert settings.caches, f"deploy/k8s/{name}: JAXCACHE_CACHES names no cache"
    if name in STORE_OVERLAYS:
        from jaxcache.storage import scheme_of

        scheme = STORE_OVERLAYS[name][0]
        assert all(scheme_of(url) == scheme for url in settings.caches.values()), settings.caches
    if name == "overlays/nfs":
        for deployment in by_kind(rendered[name], "Deployment"):  # api and loops pods both read the cache
            (container,) = pod_spec(deployment)["containers"]
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
            for url in settings.caches.values():
                assert url in mounts, (f"{deployment['metadata']['name']}: cache root {url} is not a mounted "
                                       "volume: mount the ReadWriteMany PVC there")
                claim = volumes[mounts[url]]["persistentVolumeClaim"]["claimName"]
                pvc = one(rendered[name], "PersistentVolumeClaim", claim)
                assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    policies = json.loads(one(rendered[name], "ConfigMap", "jaxcache-prune")["data"]["policies.json"])
    assert set(policies) <= set(settings.caches), (
        f"prune policies name caches {sorted(set(policies) - set(settings.caches))} that {name} does not serve"
    )


@pytest.mark.parametrize("name", list(STORE_OVERLAYS))
def test_store_overlays_give_the_pods_one_identity_in_their_store(rendered, name):
    """Each object store's overlay gives both Deployments' pods the store's own workload identity through their
    service account (and nothing of another store's), and the settings its client library reads beside it."""
    docs = rendered[name]
    scheme, annotation = STORE_OVERLAYS[name]
    (account,) = [a for a in by_kind(docs, "ServiceAccount") if a["metadata"]["name"] == "jaxcache"]
    annotations = account["metadata"].get("annotations", {})
    assert set(annotations) == {annotation}, f"{name}: the service account's identity is {annotation} alone"
    assert account["automountServiceAccountToken"] is False  # each webhook mounts its own token, not the API's
    config = one(docs, "ConfigMap", "jaxcache-config")["data"]
    for deployment in by_kind(docs, "Deployment"):
        spec = pod_spec(deployment)
        assert spec["serviceAccountName"] == "jaxcache", deployment["metadata"]["name"]
        (container,) = spec["containers"]
        assert {"configMapRef": {"name": config_name(docs)}} in container["envFrom"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        # Azure Workload Identity's webhook mutates only pods labelled for it.
        assert (labels.get("azure.workload.identity/use") == "true") == (scheme == "az"), labels
    if scheme == "s3":
        assert re.fullmatch(r"arn:aws:iam::[A-Z0-9_]+:role/[\w+=,.@-]+", annotations[annotation])
        # boto3 reads AWS_DEFAULT_REGION; AWS_REGION alone left it without one.
        assert config.get("AWS_DEFAULT_REGION"), "boto3 needs the bucket's region (AWS_DEFAULT_REGION)"
    if scheme == "az":
        assert config.get("AZURE_STORAGE_ACCOUNT_NAME"), "az:// names no account: AZURE_STORAGE_ACCOUNT_NAME does"


def config_name(docs: list[dict]) -> str:
    """The name kustomize gave the generated jaxcache-config ConfigMap (with its content hash)."""
    return one(docs, "ConfigMap", "jaxcache-config")["metadata"]["name"]


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
def test_prune_cronjob_wiring(rendered, name):
    docs = rendered[name]
    cron = one(docs, "CronJob")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    (container,) = pod_spec(cron)["containers"]
    env = container_env(container)
    service = the_service(docs)
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


def test_tpu_warmup_job_runs_on_a_cpu_node_pool():
    from jaxcache.topology import TpuSlice, parse_any_topology

    job = one(plain(K8S / "tpu-warmup-job.yaml"), "Job")
    spec = pod_spec(job)
    (container,) = spec["containers"]
    args = _scalar_args(container)
    assert args["--platform"] == "tpu" and isinstance(parse_any_topology(args["--topology"]), TpuSlice)
    limits = {**container["resources"].get("requests", {}), **container["resources"].get("limits", {})}
    assert not [r for r in limits if "tpu" in r or "gpu" in r], "a TPU warm-up needs no accelerator"
    assert not [k for k in spec.get("nodeSelector", {}) if "tpu" in k or "accelerator" in k]
    assert spec["nodeSelector"]["kubernetes.io/arch"] == "amd64", "libtpu is x86-64 only"
    env = container_env(container)
    assert env["TPU_SKIP_MDS_QUERY"] == "1" and env["TPU_WORKER_HOSTNAMES"] == "localhost"
    gpu_job = one(plain(K8S / "warmup-job.yaml"), "Job")
    (gpu_container,) = pod_spec(gpu_job)["containers"]
    assert container["image"] == gpu_container["image"], "warm-up must run the training image"
    assert args["--cache-dir"] == _scalar_args(gpu_container)["--cache-dir"], "the same shared cache"
    assert spec["serviceAccountName"] == one(plain(K8S / "warmup-job.yaml"), "ServiceAccount")["metadata"]["name"]
    assert any(a.startswith("--libtpu-init-args=") or a == "--flags-from-job" for a in container["args"]), (
        "the slice job's flags enter every key: give them"
    )


def test_indexed_warmup_job_runs_one_target_a_pod_on_a_cpu_node_pool(tmp_path):
    """Completion index -> the target on that line of the ConfigMap's list, parsed as `warmup` parses it."""
    from jaxcache.topology import parse_any_topology
    from jaxcache.warmup import targets
    from jaxcache.warmup.cli import build_parser

    docs = plain(K8S / "warmup-targets-job.yaml")
    job, config = one(docs, "Job"), one(docs, "ConfigMap")
    spec = pod_spec(job)
    (container,) = spec["containers"]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"].get("backoffLimitPerIndex") is not None, "a failing target must not stop the others"
    assert "backoffLimit" not in job["spec"], "one failing target would end every other pod at the Job's limit"
    limits = {**container["resources"].get("requests", {}), **container["resources"].get("limits", {})}
    assert not [r for r in limits if "tpu" in r or "gpu" in r], "a CPU node pool: no accelerator"
    assert not [k for k in spec.get("nodeSelector", {}) if "tpu" in k or "accelerator" in k]
    assert spec["nodeSelector"]["kubernetes.io/arch"] == "amd64", "libtpu is x86-64 only"

    args = container["args"]
    listed = args[args.index("--targets") + 1]
    (mount,) = [m for m in container["volumeMounts"] if listed.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == config["metadata"]["name"]
    listing = tmp_path / listed.rsplit("/", 1)[1]
    listing.write_text(config["data"][listing.name])
    names = targets.read_file(str(listing))
    assert job["spec"]["completions"] == len(names), "one pod a target: completions = the targets listed"

    index_arg = args[args.index("--index") + 1]
    var = re.fullmatch(r"\$\((\w+)\)", index_arg)
    assert var, f"--index {index_arg!r}: give the completion index through an environment variable, $(NAME)"
    source = container_env(container)[var.group(1)]
    assert source == {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    parser = build_parser()
    for index, name in enumerate(names):
        argv = [str(listing) if a == listed else str(index) if a == index_arg else a for a in args]
        parsed = parser.parse_args(argv)
        (text,) = targets.from_args(parsed.topology, parsed.targets, parsed.index)
        assert str(parse_any_topology(text)) == str(parse_any_topology(name))
    assert any(parse_any_topology(n).slices > 1 for n in names), "the example shows a multi-slice target"

    tpu_job = one(plain(K8S / "tpu-warmup-job.yaml"), "Job")
    (tpu_container,) = pod_spec(tpu_job)["containers"]
    assert container["image"] == tpu_container["image"], "warm-up must run the training image"
    assert _scalar_args(container)["--cache-dir"] == _scalar_args(tpu_container)["--cache-dir"], "the shared root"
    assert spec["serviceAccountName"] == pod_spec(tpu_job)["serviceAccountName"]
    env = container_env(container)
    assert env["TPU_SKIP_MDS_QUERY"] == "1" and env["TPU_WORKER_HOSTNAMES"] == "localhost"


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


def test_the_tier_seed_daemonset_seeds_the_directory_the_training_job_reads():
    """deploy/k8s/node-tier-seed-daemonset.yaml: on the training nodes, as the training job's user, with its image,
    root, pack and node-local directory (a hostPath both mount), it runs `jaxcache tier seed --watch`, which the
    client's own parser and settings accept; only its initContainer runs as root, to hand the hostPath to that user."""
    from jaxcache.cli import build_parser
    from jaxcache.cli.plugins import load
    from jaxcache.client import options as client_options
    from jaxcache.warmup.cli import build_parser as warmup_parser

    daemonset = one(plain(K8S / "node-tier-seed-daemonset.yaml"), "DaemonSet")
    spec = pod_spec(daemonset)
    (seeder,) = spec["containers"]
    training = one(plain(K8S / "examples" / "training-job.yaml"), "Job")
    train_spec = pod_spec(training)
    (train,) = train_spec["containers"]
    env, train_env = container_env(seeder), container_env(train)

    args = build_parser(load("tier")).parse_args(seeder["command"][1:])
    assert seeder["command"][0] == "jaxcache" and args.tier_command == "seed" and args.watch > 0, seeder["command"]
    for name in ("JAXCACHE_DIR", "JAXCACHE_PACK", "JAXCACHE_LOCAL_DIR", "JAXCACHE_VERIFY", "JAXCACHE_TRUSTED_KEYS"):
        assert env.get(name) == train_env.get(name), f"{name}: the seeder must write what the job's tier reads"
    assert env["JAXCACHE_PACK"], "name the pack the training job names"
    warm = pod_spec(one(plain(K8S / "warmup-job.yaml"), "Job"))["containers"][0]
    assert warmup_parser().parse_args(warm["args"]).pack == env["JAXCACHE_PACK"], "the warm-up publishes that pack"
    # With the placeholder replaced, as deploy/README.md says to (PROJECT_ID is no bucket's name).
    placed = {k: v.replace("PROJECT_ID", "my-project") if isinstance(v, str) else v for k, v in env.items()}
    options = client_options.resolve(None, job=None, min_compile_time_secs=None, min_entry_size_bytes=None,
                                     xla_caches=None, max_size_bytes=None, service_url=None, token=None,
                                     trust="strict", default_xla_caches=None, env=placed)
    assert options.local_dirs == (env["JAXCACHE_LOCAL_DIR"],) and options.pack == env["JAXCACHE_PACK"]

    def host_path(pod: dict, container: dict, path: str) -> str:
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == path]
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        return str(volume["hostPath"]["path"])

    local = env["JAXCACHE_LOCAL_DIR"]
    assert host_path(spec, seeder, local) == host_path(train_spec, train, local), "one hostPath: the node's tier"
    for field in ("nodeSelector", "tolerations", "serviceAccountName"):
        assert spec[field] == train_spec[field], f"{field}: the training nodes, with the training identity"
    assert seeder["image"] == train["image"], "the training image: the job's jaxcache and JAX"
    context, train_context = spec["securityContext"], train_spec["securityContext"]
    user = (context["runAsUser"], context["runAsGroup"])
    assert context["runAsNonRoot"] is True and user == (train_context["runAsUser"], train_context["runAsGroup"]), (
        "the tier refuses a directory that is not its user's own: seed it as the job's user")
    assert context["seccompProfile"]["type"] == "RuntimeDefault"
    sc = seeder["securityContext"]
    assert (sc["readOnlyRootFilesystem"], sc["allowPrivilegeEscalation"], sc["capabilities"]["drop"]) == (
        True, False, ["ALL"]) and "runAsUser" not in sc and "add" not in sc["capabilities"]
    assert "cpu" in seeder["resources"]["requests"] and "memory" in seeder["resources"]["limits"]
    (init,) = spec["initContainers"]
    isc = init["securityContext"]
    assert isc["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]} and isc["readOnlyRootFilesystem"]
    assert isc["allowPrivilegeEscalation"] is False and host_path(spec, init, local) == host_path(spec, seeder, local)
    assert f"chown {user[0]}:{user[1]} {local}" in init["command"][-1] and f"chmod 0700 {local}" in init["command"][-1]
    assert "cpu" in init["resources"]["requests"] and "memory" in init["resources"]["limits"]
    assert daemonset["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"], "roll a large pool in steps"
    readme = (DEPLOY / "README.md").read_text()
    assert "node-tier-seed-daemonset.yaml" in readme and "### Node-local tiers" in readme


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


#: What a cache of files written once and never changed wants from GCSFuse (deploy/README.md explains each).
GCSFUSE_TUNED = {"metadata-cache:ttl-secs": "-1", "metadata-cache:negative-ttl-secs": "0"}
#: A million entries: gcsfuse's stat cache takes about 1.4 KB an entry, its type cache about 0.2 KB (4 MiB is
#: about 21k entries); the cache is one flat directory, whose type cache holds every name looked up.
GCSFUSE_MIN_MB = {"metadata-cache:stat-cache-max-size-mb": 1_000_000 * 1400 // 2**20,
                  "metadata-cache:type-cache-max-size-mb": 1_000_000 * 200 // 2**20}


def _mount_options(value: str) -> dict[str, str]:
    """GKE's mountOptions string as {option: value}: config-file fields are ``section:field:value``, flags
    ``name=value`` or a bare ``name``."""
    assert " " not in value, f"mountOptions {value!r}: the CSI driver wants commas and no spaces"
    out = {}
    for option in value.split(","):
        if option.count(":") >= 2:
            section, field, setting = option.split(":", 2)
            out[f"{section}:{field}"] = setting
        else:
            name, _, setting = option.partition("=")
            out[name] = setting
    return out


def test_gcsfuse_mount_is_tuned_for_entries_written_once():
    job = one(plain(K8S / "examples" / "gcsfuse-reader-job.yaml"), "Job")
    (csi,) = [v for v in pod_spec(job)["volumes"] if "csi" in v]
    options = _mount_options(csi["csi"]["volumeAttributes"]["mountOptions"])
    assert {k: options.get(k) for k in GCSFUSE_TUNED} == GCSFUSE_TUNED
    for name, least in GCSFUSE_MIN_MB.items():
        assert options.get(name) == "-1" or int(options.get(name, 0)) >= least, (
            f"{name} {options.get(name)}: size it for a million entries (>= {least} MiB, or -1)")
    security = pod_spec(job)["securityContext"]
    assert (options.get("uid"), options.get("gid")) == (str(security["runAsUser"]), str(security["runAsGroup"]))
    assert "file-cache:max-size-mb" not in options or any(
        v["name"] == "gke-gcsfuse-cache" for v in pod_spec(job)["volumes"]), (
        "a file cache needs a gke-gcsfuse-cache volume, or the sidecar's small default one fills")
    readme = (DEPLOY / "README.md").read_text()
    undocumented = [name for name in options if f"`{name}" not in readme]
    assert not undocumented, f"explain these mount options in deploy/README.md: {undocumented}"


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


def test_a_signing_key_secret_is_mounted_so_only_the_pods_group_can_read_it():
    """jaxcache refuses a signing key other users can read: every pod given JAXCACHE_SIGNING_KEY mounts its Secret
    with defaultMode 0440 and reads it as a non-root user through the pod's fsGroup (#49 item 8)."""
    found = 0
    for path in sorted(K8S.rglob("*.yaml")):
        for doc in plain(path):
            if doc.get("kind") not in ("Job", "CronJob", "Deployment", "StatefulSet", "DaemonSet"):
                continue
            spec = pod_spec(doc)
            volumes = {v["name"]: v for v in spec.get("volumes", [])}
            for container in spec["containers"]:
                key = container_env(container).get("JAXCACHE_SIGNING_KEY")
                if key is None:
                    continue
                found += 1
                mounts = [m for m in container.get("volumeMounts", []) if key.startswith(m["mountPath"] + "/")]
                assert len(mounts) == 1 and mounts[0].get("readOnly"), f"{path.name}: {key} is not on a read-only mount"
                secret = volumes[mounts[0]["name"]]["secret"]
                assert secret["defaultMode"] == 0o440, f"{path.name}: mount the signing key 0440, not 0644"
                context = spec["securityContext"]
                assert context["runAsNonRoot"] and context["fsGroup"], f"{path.name}: read the key through fsGroup"
    assert found, "no manifest mounts a signing key (deploy/README.md, 'Signing keys', says the warm-up Job does)"
