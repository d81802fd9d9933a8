"""Which backend a warm-up runs on, and whether this machine can stand in for the target topology.

A cache entry serves only nodes with the same accelerator model and count (both enter the key), so the GPU path
checks that this machine has exactly D GPUs of one model before it mocks ``S x H`` processes of them with
``jax_mock_gpu_topology`` (docs/jax-internals.md). That flag must be set before JAX's backend starts and has no
environment variable, so the local GPUs are counted in a short probe subprocess, never in this process.

On CPU, a multi-process job's keys differ per process (device ids are hashed), so only S x H = 1 can be
pre-filled; D becomes ``jax_num_cpu_devices``.

On TPU (a slice name such as ``v5e:4x8``), libtpu describes the slice's chips without any being here
(``jax.experimental.topologies``); this process's own backend stays on CPU (jaxcache.warmup.tpu).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from jaxcache.errors import InvalidInputError, JaxcacheError
from jaxcache.topology import AnyTopology, TpuSlice, is_tpu_name
from jaxcache.warmup.probe import run_probe

PLATFORMS = ("gpu", "cpu", "tpu")
PROBE_TIMEOUT_S = 120

_PROBE = """
import json, sys
def tried():
    from jax._src import xla_bridge as xb  # which backends JAX started or tried to: libtpu must not be one
    return sorted(set(getattr(xb, "_backends", {})) | set(getattr(xb, "_backend_errors", {})))
try:
    import jax
    devices = jax.devices("gpu")
except Exception as exc:  # no GPU backend: jaxlib without CUDA, no driver, no device
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}", "tried": tried()}))
    sys.exit(0)
print(json.dumps({"devices": [d.device_kind for d in devices if d.process_index == jax.process_index()],
                  "tried": tried()}))
"""


class WarmupSetupError(JaxcacheError):
    """This machine cannot warm up for the requested topology; the message names both sides of the rule."""


@dataclass(frozen=True, slots=True)
class LocalGpus:
    """What the probe found: the device kind of each local GPU, or why there are none."""

    kinds: tuple[str, ...] = ()
    error: str | None = None
    tried: tuple[str, ...] = ()  # the backends the probe's JAX started or tried to start

    @property
    def count(self) -> int:
        """Local GPU count."""
        return len(self.kinds)


@dataclass(frozen=True, slots=True)
class BackendPlan:
    """How to configure JAX for the warm-up, before its backend starts."""

    platform: str
    topology: AnyTopology
    gpu_model: str | None = None
    attached: bool = False  # TPU: this host's own chips (a node of the slice), not a compile-only description

    def jax_settings(self) -> dict[str, object]:
        """Config values to set with ``jax.config.update`` before anything initializes the backend."""
        if self.platform == "tpu":
            return {} if self.attached else {"jax_platforms": "cpu"}
        if self.platform == "gpu":
            return {"jax_platforms": "cuda", "jax_mock_gpu_topology": str(self.topology)}
        return {"jax_platforms": "cpu", "jax_num_cpu_devices": self.topology.devices}


def probe_gpus(python: str = sys.executable) -> LocalGpus:
    """Count this machine's GPUs with JAX in a subprocess, so this process's backend is still unstarted."""
    # Only CUDA's backend: with every platform allowed, an installed libtpu would start too, query the metadata
    # server and claim this host's TPU chips for the probe's life.
    data = run_probe(_PROBE, "cuda,cpu", python, PROBE_TIMEOUT_S)
    if isinstance(data, str):
        return LocalGpus(error=f"the GPU probe {data}")
    tried = tuple(data.get("tried", ()))
    if "error" in data:
        return LocalGpus(error=data["error"], tried=tried)
    return LocalGpus(kinds=tuple(data["devices"]), tried=tried)


def default_platform(gpus: LocalGpus) -> str:
    """``gpu`` when a GPU backend exists here, else ``cpu``."""
    return "gpu" if gpus.count else "cpu"


def plan_backend(topology: AnyTopology, platform: str, gpus: LocalGpus | None, *,
                 attached: bool = False) -> BackendPlan:
    """Check this machine against the topology; raise :class:`WarmupSetupError` stating the rule when it fails.
    ``attached`` (TPU only): use this host's chips, as ``--check`` on a node of the slice does."""
    if platform not in PLATFORMS:
        raise InvalidInputError(f"--platform {platform!r}: use gpu, cpu or tpu")
    if platform == "tpu" or isinstance(topology, TpuSlice):
        return _plan_tpu(topology, platform, attached)
    if platform == "cpu":
        if topology.processes > 1:
            raise WarmupSetupError(
                f"--platform cpu cannot warm up {topology} ({topology.processes} processes): JAX hashes each"
                " process's CPU device ids into its keys, so a multi-process CPU job never hits a pre-filled"
                f" entry; use a topology 1x1xD (here 1x1x{topology.devices}), or --platform gpu on a GPU machine"
            )
        return BackendPlan("cpu", topology)
    need = topology.devices
    if gpus is None or gpus.count == 0:
        why = f" ({gpus.error})" if gpus is not None and gpus.error else ""
        raise WarmupSetupError(
            f"--platform gpu needs {need} GPU(s) of the target nodes' model on this machine, and JAX sees none"
            f"{why}; install jax[cuda12] on a GPU node, or use --platform cpu for CPU jobs"
        )
    models = sorted(set(gpus.kinds))
    if len(models) > 1:
        raise WarmupSetupError(
            f"this machine mixes GPU models ({', '.join(models)}): a warm-up must run on {need} GPU(s) of exactly"
            " the training nodes' model"
        )
    if gpus.count != need:
        raise WarmupSetupError(
            f"topology {topology} needs D = {need} GPU(s) per process, but this machine has {gpus.count}"
            f" {models[0]}: D must equal the local GPU count (the cache only serves nodes with the same GPU model"
            f" and count); run on a node with {need} {models[0]} or use topology"
            f" {topology.slices}x{topology.hosts}x{gpus.count} if the training nodes have {gpus.count}"
        )
    return BackendPlan("gpu", topology, gpu_model=models[0])


def _plan_tpu(topology: AnyTopology, platform: str, attached: bool) -> BackendPlan:
    from jaxcache.topology import TPU_FORMS
    from jaxcache.warmup import tpu

    if not isinstance(topology, TpuSlice):
        raise InvalidInputError(f"--platform tpu takes a TPU slice name, not {topology}: {TPU_FORMS}")
    if platform != "tpu":
        raise InvalidInputError(f"topology {topology} is a TPU slice: use --platform tpu")
    tpu.require_libtpu()
    return BackendPlan("tpu", topology, gpu_model=topology.generation, attached=attached)


def platform_for(topology_text: str, platform: str | None) -> str | None:
    """``tpu`` for a slice name given without --platform; else what was given."""
    return "tpu" if platform is None and is_tpu_name(topology_text) else platform


def configure_backend(plan: BackendPlan) -> None:
    """Apply the plan to JAX. Raises if the backend already started (the mock would silently do nothing)."""
    import jax

    from jaxcache.client.jax_internals import backend_ready

    if backend_ready():
        raise WarmupSetupError("JAX's backend started before the warm-up configured it; nothing was compiled")
    if plan.platform == "tpu" and not plan.attached:
        from jaxcache.warmup import tpu

        tpu.keep_off_metadata_server()
    for name, value in plan.jax_settings().items():
        jax.config.update(name, value)


def check_started_backend(plan: BackendPlan) -> None:
    """After the backend starts: does JAX see the topology it was asked to mock?"""
    import jax

    if plan.platform == "tpu":
        return  # the slice's devices are libtpu's description (checked when made); this process's are its CPU
    expected_local, expected_global = plan.topology.devices, plan.topology.global_devices
    local, total = jax.local_device_count(), jax.device_count()
    if (local, total) != (expected_local, expected_global) or jax.process_count() != plan.topology.processes:
        raise WarmupSetupError(
            f"JAX started with {local} local / {total} global devices and {jax.process_count()} processes, not"
            f" the {expected_local} / {expected_global} and {plan.topology.processes} of {plan.topology}"
        )
