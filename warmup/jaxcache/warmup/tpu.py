"""Warming a TPU slice's cache from a machine without chips: libtpu describes the slice, JAX compiles for it.

``jax.experimental.topologies.get_topology_desc`` gives compile-only devices for a named slice; programs compiled
against them go through JAX's persistent cache like any other. What else enters the key must be the job's: the libtpu
build, the flags (XLA_FLAGS, LIBTPU_INIT_ARGS and ``--xla`` arguments, which JAX sorts and hashes as one list), the
compression library, and the host bounds and wraparound of the slice (docs/jax-internals.md).
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from jaxcache import working_set
from jaxcache.display import shown
from jaxcache.errors import InvalidInputError, JaxcacheError
from jaxcache.storage import Storage
from jaxcache.topology import TpuSlice
from jaxcache.units import plural
from jaxcache.warmup.probe import run_probe

# JAX's device_kind for each generation: an attached chip of another kind is not the slice asked for.
DEVICE_KINDS = {"v5e": "TPU v5 lite", "v5p": "TPU v5", "v6e": "TPU v6 lite"}
# Flags only libtpu knows: in XLA_FLAGS they would abort this process's own XLA ("Unknown flag in XLA_FLAGS").
_LIBTPU_PREFIXES = ("--xla_tpu", "--xla_jf", "--xla_sc", "--xla_mosaic", "--xla_enable_async", "--megascale",
                    "--tpu")


class TpuSetupError(JaxcacheError):
    """This machine cannot warm up the slice: libtpu missing, or the attached chips are not the slice."""


#: How to install libtpu from a clone of jaxcache: the `tpu` extra of warmup/pyproject.toml. jaxcache's parts are
#: not on a package index, so a hint naming a distribution (jaxcache-warmup[tpu]) would name nothing installable.
CLONE_INSTALL = "pip install ./core ./client './warmup[tpu]'"


def jax_install() -> str:
    """The command that installs the libtpu this JAX pins: it works wherever jaxcache is installed (an image too)."""
    try:
        return f"pip install 'jax[tpu]=={importlib.metadata.version('jax')}'"
    except importlib.metadata.PackageNotFoundError:
        return "pip install 'jax[tpu]'"


def install_hint() -> str:
    """How to install libtpu, in one line: :func:`jax_install`, or :data:`CLONE_INSTALL` from a clone."""
    return f"{jax_install()} (the libtpu this JAX pins), or from a jaxcache clone {CLONE_INSTALL}"


def require_libtpu() -> None:
    """Raise, in one line saying how to install it, when libtpu is not importable here."""
    if importlib.util.find_spec("libtpu") is None:
        raise TpuSetupError(f"--platform tpu needs libtpu, the TPU compiler, which is not installed here (no chip "
                            f"is needed): {install_hint()}")


def libtpu_version() -> str | None:
    """The installed libtpu's version: its build enters every key (through the platform version)."""
    try:
        return importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return None


def chips_here() -> bool:
    """Whether this host has TPU chips (their device files): ``--check`` then looks up with the real ones."""
    return bool(glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"))


_ATTACHED_PROBE = """
import json
import jax
devices = jax.devices()
print(json.dumps({"kinds": sorted({d.device_kind for d in devices}), "devices": len(devices),
                  "local": jax.local_device_count(), "processes": jax.process_count(),
                  "slices": len({getattr(d, "slice_index", 0) for d in devices})}))
"""
PROBE_TIMEOUT_S = 300


@dataclass(frozen=True, slots=True)
class AttachedChips:
    """What JAX sees of this host's chips (a job on them sees the same), or why it saw none."""

    kinds: tuple[str, ...] = ()
    devices: int = 0
    local: int = 0
    processes: int = 0
    slices: int = 0
    error: str | None = None

    def __str__(self) -> str:
        if self.error:
            return f"no chips ({self.error})"
        return (f"{self.devices} {', '.join(self.kinds)} device(s) in {self.slices} slice(s), {self.local} on each of"
                f" {self.processes} host(s)")


def probe_attached(python: str = sys.executable) -> AttachedChips:
    """Start JAX on this host's chips in a subprocess (a slice's hosts each run it, as they run the job) and say
    what it sees; the chips are free again when it returns."""
    data = run_probe(_ATTACHED_PROBE, "tpu", python, PROBE_TIMEOUT_S)
    if isinstance(data, str):
        return AttachedChips(error=f"JAX on the chips {data}")
    return AttachedChips(tuple(data["kinds"]), data["devices"], data["local"], data["processes"], data["slices"])


def attached_slice(slices: Sequence[TpuSlice], chips: AttachedChips) -> TpuSlice | None:
    """The target that the attached chips are: same device kind, devices, devices a host and hosts. Never a
    multi-slice job: its --check runs against compile-only devices."""
    for slice_ in slices:
        if (slice_.num_slices == 1 and chips.kinds == (DEVICE_KINDS[slice_.generation],)
                and chips.devices == slice_.chips and chips.local == slice_.devices
                and chips.processes == slice_.hosts and chips.slices == 1):
            return slice_
    return None


def keep_off_metadata_server() -> None:
    """Keep libtpu from asking a metadata server about a TPU this host does not have, and JAX's own backend on
    CPU; an explicit setting of the TPU variables is left alone. With no chip to share, libtpu's one-process lock
    would only stop --verify's process (and parallel warm-ups) while this one runs."""
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ["JAX_PLATFORMS"] = "cpu"


def slice_devices(slice_: TpuSlice, attached: bool) -> list[Any]:
    """The job's devices, as it sees them (``jax.devices()`` there): compile-only ones from libtpu (every slice's,
    for a multi-slice job: each device's ``slice_index`` says which), or with ``attached`` this host's chips,
    checked to be that slice."""
    import jax

    if attached:
        devices = list(jax.devices())
        kinds = {d.device_kind for d in devices}
        want = DEVICE_KINDS[slice_.generation]
        if kinds != {want} or len(devices) != slice_.global_devices:
            raise TpuSetupError(
                f"this host's JAX sees {len(devices)} device(s) of kind {', '.join(sorted(kinds)) or 'none'}, not"
                f" the {slice_.global_devices} {want} chips of {slice_}: run --check on a node of that slice"
            )
        return devices
    from jax.experimental import topologies

    # libtpu takes the slice count as MaxText's train_compile.py gives it (compile_topology_num_slices).
    slices = {"num_slices": slice_.num_slices} if slice_.num_slices > 1 else {}
    try:
        desc = topologies.get_topology_desc(topology_name=slice_.name, platform="tpu",
                                            chips_per_host_bounds=slice_.chips_per_host, wrap=slice_.wrap, **slices)
    except Exception as exc:  # noqa: BLE001 - libtpu's refusal, in its own words, as one line
        raise TpuSetupError(f"libtpu cannot describe {slice_}: {str(exc).splitlines()[0]}") from None
    return list(desc.devices)


@dataclass(frozen=True, slots=True)
class TargetFlags:
    """The target job's flags, each where libtpu or XLA reads it, and where they came from."""

    xla_flags: tuple[str, ...] = ()
    libtpu_init_args: tuple[str, ...] = ()
    source: str = "this machine's environment"
    #: A record's flags not taken: JAX leaves them out of its key (dump flags and the like), so they change no hit.
    left_out: tuple[str, ...] = ()

    @property
    def all(self) -> tuple[str, ...]:
        """Every flag as JAX hashes them: one sorted list."""
        return tuple(sorted(self.xla_flags + self.libtpu_init_args))

    def apply(self, env: MutableMapping[str, str] | None = None) -> None:
        """Replace XLA_FLAGS and LIBTPU_INIT_ARGS in ``env`` (default: this process's) with the target's."""
        env = os.environ if env is None else env
        for name, values in (("XLA_FLAGS", self.xla_flags), ("LIBTPU_INIT_ARGS", self.libtpu_init_args)):
            if values:
                env[name] = " ".join(values)
            else:
                env.pop(name, None)

    def to_json(self) -> str:
        """As a command hands them to a target's process (``--checked-flags``): ASCII JSON, so a record's flag that
        holds a control character travels as an escape."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TargetFlags:
        """The flags :meth:`to_json` wrote; raises :class:`InvalidInputError` for anything else."""
        try:
            data = json.loads(text)
            lists = {name: tuple(data[name]) for name in ("xla_flags", "libtpu_init_args", "left_out")}
            source = data["source"]
            if not (isinstance(source, str) and all(isinstance(f, str) for v in lists.values() for f in v)):
                raise TypeError(source)
        except (ValueError, KeyError, TypeError):
            raise InvalidInputError("--checked-flags: not the target's flags as a warm-up command hands them to a"
                                    " target's process") from None
        return cls(source=source, **lists)


def split_flags(flags: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(XLA_FLAGS, LIBTPU_INIT_ARGS)``: libtpu's own flags (``--xla_tpu*`` and the like, anything not
    ``--xla_``) to LIBTPU_INIT_ARGS, the rest to XLA_FLAGS. JAX hashes both as one sorted list, so where a flag
    goes changes what reads it, never the key."""
    xla: list[str] = []
    libtpu: list[str] = []
    for flag in flags:
        (libtpu if flag.startswith(_LIBTPU_PREFIXES) or not flag.startswith("--xla_") else xla).append(flag)
    return tuple(xla), tuple(libtpu)


def explicit_flags(xla_flags: str | None, libtpu_init_args: str | None) -> TargetFlags | None:
    """``--target-xla-flags`` and ``--libtpu-init-args`` as given (None when neither was)."""
    if xla_flags is None and libtpu_init_args is None:
        return None
    xla = tuple((xla_flags or "").split())
    bad = [f for f in xla if f.startswith(_LIBTPU_PREFIXES)]
    if bad:
        raise InvalidInputError(f"--target-xla-flags {bad[0]}: a libtpu flag, which this process's XLA would refuse;"
                                " give it in --libtpu-init-args")
    return TargetFlags(xla, tuple((libtpu_init_args or "").split()), source="--target-xla-flags/--libtpu-init-args")


# A value that names a file or a place: a path (absolute, relative with a folder, home, "..") or a URL.
_PLACE = re.compile(r"[/\\~]|\.\.|[A-Za-z][A-Za-z0-9+.-]*:/")
_ALTERNATIVE = "give the job's flags with --libtpu-init-args and --target-xla-flags instead"


def flags_from_job(storage: Storage, job: str) -> TargetFlags:
    """The flags JAX hashed in ``job``'s newest run record that lists them (key parts on), split as
    :func:`split_flags` does. Records are read as the working set reads them (its process-0 job records, newest day
    first, within :data:`working_set.DEFAULT_DAYS` days), so the answer comes from the first few however many the
    root holds. A record proves nothing (whoever can write the bucket can plant one): see :func:`_screened`.
    Raises :class:`InvalidInputError` saying why a record cannot supply them."""
    malformed: list[tuple[str, str]] = []
    seen = 0
    found = None
    for record in working_set.job_runs(storage, job, malformed=malformed):
        seen += 1
        if record.fingerprint.xla_flags is not None:
            found = record
            break
    named = f"--flags-from-job '{shown(job)}'"
    if found is None:
        why = (f"none of its {plural(seen, 'run record')} lists the flags JAX hashed (they are recorded only with key"
               " parts on, JAXCACHE_KEY_PARTS)" if seen
               else f"it has no run record in this cache in the last {working_set.DEFAULT_DAYS} days")
        skipped = f" ({plural(len(malformed), 'malformed record')} skipped)" if malformed else ""
        raise InvalidInputError(f"{named}: {why}{skipped}; {_ALTERNATIVE}")
    try:
        taken, left_out = _screened(found.fingerprint.xla_flags or ())
    except InvalidInputError as exc:
        raise InvalidInputError(f"{named}: run {found.run_id} lists {exc}; {_ALTERNATIVE}") from None
    xla, libtpu = split_flags(taken)
    return TargetFlags(xla, libtpu, source=f"run {found.run_id} of job {job!r}", left_out=left_out)


def _screened(flags: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(taken, left out)`` of a record's flags: only flags that enter JAX's key can change a hit, so those JAX
    leaves out (its own list: the dump flags among them) are left out. A flag that could make the warm-up, which
    holds the signing key, read or write a place the record chose is refused (:class:`InvalidInputError` naming it):
    a value that is a path or a URL, a dump flag (libtpu's are in the key), or text that is not one flag."""
    from jaxcache.client.jax_internals import flags_outside_key

    outside = flags_outside_key()
    if outside is None:
        raise InvalidInputError("flags, but this JAX does not say which flags stay out of its cache key, so they cannot"
                                " be screened")
    # JAX compares the text before "=" with its list; XLA and libtpu also read "-name" as "--name".
    outside_names = {f.lstrip("-") for f in outside}
    taken: list[str] = []
    left_out: list[str] = []
    for flag in flags:
        name, sep, value = flag.partition("=")
        if not flag or any(ch.isspace() for ch in flag):  # JAX splits its variables on whitespace
            raise InvalidInputError(f"'{shown(flag)}', which is not one flag as JAX hashes them (it holds whitespace,"
                                    " or nothing)")
        if name.lstrip("-") in outside_names:
            left_out.append(flag)
        elif "dump" in name:
            raise InvalidInputError(f"{shown(flag)}, a dump flag: a run record may not make the warm-up write files")
        elif sep and _PLACE.search(value):
            raise InvalidInputError(f"{shown(flag)}, whose value is a path or a URL: a run record may not choose where"
                                    " the warm-up reads or writes")
        else:
            taken.append(flag)
    return tuple(taken), tuple(left_out)


# Run in a child with the target's flags, as the warm-up will run: this process's XLA parses XLA_FLAGS as the CPU
# backend starts, libtpu parses LIBTPU_INIT_ARGS as it describes the slice, and a compile reads the rest. A flag
# either refuses ends the process (a CHECK failure, or libtpu's exit), which must not be the warm-up's.
_FLAG_CHECK = """
import sys
from jaxcache.topology import parse_tpu_slice
from jaxcache.warmup import tpu
tpu.keep_off_metadata_server()
import jax
import jax.numpy as jnp
jax.devices()
devices = tpu.slice_devices(parse_tpu_slice(sys.argv[1], sys.argv[2] or None), attached=False)
shape = jax.ShapeDtypeStruct((8,), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(devices[0]))
jax.jit(lambda x: x + 1).lower(shape).compile()
"""
_FLAG_CHECK_TIMEOUT_S = 300.0
# What XLA (glog: "F1206 06:18:17.511717 10811 file.cc:234] why") and libtpu ("ERROR: why") say before they stop.
_REFUSAL = re.compile(r"^(?:[EF]\d{4} [^\]]*\] |ERROR: )(.+)$", re.MULTILINE)


def check_flags(flags: TargetFlags, slice_: TpuSlice) -> None:
    """Raise :class:`InvalidInputError`, in one line with XLA's or libtpu's own reason, when the target's flags
    would stop the warm-up (an unknown flag, a value XLA cannot parse), found in a child process first."""
    env = dict(os.environ)
    flags.apply(env)
    bounds = "x".join(map(str, slice_.chips_per_host))
    try:
        proc = subprocess.run([sys.executable, "-c", _FLAG_CHECK, slice_.name, bounds], env=env,
                              capture_output=True, text=True, errors="replace", timeout=_FLAG_CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise TpuSetupError(f"checking the target's flags ({flags.source}) took over {_FLAG_CHECK_TIMEOUT_S:g} s:"
                            " libtpu did not describe the slice") from None
    if proc.returncode == 0:
        return
    said = _REFUSAL.search(proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    why = said.group(1) if said else (lines[-1] if lines else f"exit status {proc.returncode}")
    raise InvalidInputError(f"XLA or libtpu would stop on the target's flags ({flags.source}): {shown(why[:300])};"
                            " fix them, or give the job's flags with --libtpu-init-args and --target-xla-flags")


def from_environment() -> TargetFlags:
    """This machine's own XLA_FLAGS and LIBTPU_INIT_ARGS (used when no target flags were given)."""
    return TargetFlags(tuple(os.environ.get("XLA_FLAGS", "").split()),
                       tuple(os.environ.get("LIBTPU_INIT_ARGS", "").split()))


def key_inputs(slice_: TpuSlice, flags: TargetFlags, compression: str, chips_per_host_default: bool) -> list[str]:
    """What enters every key besides the program, as lines to print before compiling (every flag escaped: a flag
    from a record could hold a terminal's control sequences)."""
    bounds = "x".join(map(str, slice_.chips_per_host))
    how = "Cloud TPU's standard shape; --chips-per-host overrides" if chips_per_host_default else "as given"
    wrap = ",".join(a for a, w in zip("xyz", slice_.wrap, strict=True) if w) or "none"
    slices = (f"{slice_.num_slices} slices of {slice_.name} over the data-centre network ({slice_.global_devices}"
              " devices), each " if slice_.num_slices > 1 else f"{slice_.name}: ")
    lines = [
        f"  topology        {slices}{slice_.chips} chips, {slice_.hosts} host(s) of {bounds} ({how});"
        f" wraparound {wrap}",
        f"  flags           {_listed(flags.all) or '(none)'}  [from {shown(flags.source)}]",
        f"    XLA_FLAGS        {_listed(flags.xla_flags) or '(unset)'}",
        f"    LIBTPU_INIT_ARGS {_listed(flags.libtpu_init_args) or '(unset)'}",
    ]
    if flags.left_out:
        lines.append(f"    not taken        {_listed(flags.left_out)} (JAX leaves them out of its key)")
    return [*lines, f"  libtpu          {libtpu_version() or 'not installed'}", f"  compression     {compression}"]


def _listed(flags: Sequence[str]) -> str:
    return " ".join(shown(f) for f in flags)
