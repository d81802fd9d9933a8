"""Cluster topologies: ``S x H x D`` as JAX's ``jax_mock_gpu_topology`` spells them, and TPU slices as JAX's
``get_topology_desc`` names them (``v5e:4x8``).

S slices x H hosts per slice = processes; D devices per process (docs/jax-internals.md). Warm-up fills a cache for a
topology it is not running on, and run records carry the topology a job ran with, so both share this parser.

A TPU slice's name says its chips, not its hosts, yet the chips per host enter the cache key (so does the torus
wraparound): :func:`parse_tpu_slice` fills both in from Cloud TPU's standard slice shapes unless told otherwise. Its
spelling is the name alone when the host bounds are the standard ones (``v5e:4x8``), else the name and the bounds
(``v5e:2x4@2x4x1``): one spelling per slice, in records and in the service. A multi-slice job, N slices joined over the
data-centre network, is spelled with the slice count first, as ``SxHxD`` has it: ``2xv5e:16x16``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from jaxcache.display import excerpt
from jaxcache.errors import InvalidInputError
from jaxcache.numbers import MAX_NUMBER_CHARS, whole

# Beyond these the string is a typo, not a cluster: the largest GPU jobs today are ~10^5 devices.
MAX_PROCESSES = 65536
MAX_DEVICES_PER_PROCESS = 256
_RE = re.compile(r"\s*(\S+?)\s*x\s*(\S+?)\s*x\s*(\S+?)\s*", re.IGNORECASE)
_FORM = "write it as SLICESxHOSTSxDEVICES, three positive integers, e.g. 4x8x1 (4 slices x 8 hosts, 1 GPU each)"


@dataclass(frozen=True, slots=True)
class Topology:
    """``slices`` x ``hosts`` per slice processes, each with ``devices`` local devices."""

    slices: int
    hosts: int
    devices: int

    @property
    def processes(self) -> int:
        """How many processes the job runs (JAX's ``process_count()``)."""
        return self.slices * self.hosts

    @property
    def global_devices(self) -> int:
        """Devices across the whole job."""
        return self.processes * self.devices

    def __str__(self) -> str:
        return f"{self.slices}x{self.hosts}x{self.devices}"


def parse_topology(text: str) -> Topology:
    """Parse ``"4x8x1"``; raises :class:`InvalidInputError` naming what is wrong and the accepted form."""
    if not isinstance(text, str):
        raise InvalidInputError(f"topology {excerpt(text)}: {_FORM}")
    parts = text.strip().lower().split("x")
    if len(parts) != 3 or _RE.fullmatch(text) is None:
        raise InvalidInputError(f"topology {excerpt(text)} has {len(parts)} part(s), not 3: {_FORM}")
    values = []
    for label, part in zip(("slices", "hosts", "devices"), parts, strict=True):
        value = whole(part)
        if value is None or not part.strip().isdigit():
            raise InvalidInputError(f"topology {excerpt(text)}: {label} {excerpt(part.strip())} is not a positive"
                                    f" integer; {_FORM}")
        if value < 1:
            raise InvalidInputError(f"topology {excerpt(text)}: {label} must be at least 1; {_FORM}")
        values.append(value)
    topology = Topology(*values)
    if topology.processes > MAX_PROCESSES:
        raise InvalidInputError(
            f"topology {excerpt(text)}: {topology.processes} processes is more than {MAX_PROCESSES}; is it a typo?"
        )
    if topology.devices > MAX_DEVICES_PER_PROCESS:
        raise InvalidInputError(
            f"topology {excerpt(text)}: {topology.devices} devices per process is more than {MAX_DEVICES_PER_PROCESS};"
            " D is the GPU count of one node"
        )
    return topology


# Chips along each axis that each generation makes, and the torus wraparound of the standard shapes (Cloud TPU's
# slice shapes, as MaxText's accelerator_to_spec_map lists them). v4 is left out: its megacore chips show to a
# compile-only topology as two devices each, and what a real v4 job's devices look like was not checked.
_LITE_SHAPES: dict[tuple[int, ...], tuple[bool, bool, bool]] = {
    (1, 1): (False, False, False), (2, 2): (False, False, False), (2, 4): (False, False, False),
    (4, 4): (False, False, False), (4, 8): (False, False, False), (8, 8): (False, False, False),
    (8, 16): (False, True, False), (16, 16): (True, True, False),
}
GENERATIONS = ("v5e", "v5p", "v6e")
MAX_V5P_CHIPS = 8960
# Slices of a multi-slice job (joined over the data-centre network): beyond this the count is a typo, not a job.
MAX_SLICES = 1024
# ASCII digits only ([0-9]: \d takes every script's), each number read by numbers.whole, which bounds its length.
_TPU_RE = re.compile(r"(?:([0-9]+)x)?(v5e|v5p|v6e):([0-9]+(?:x[0-9]+)+)(?:@([0-9]+x[0-9]+(?:x[0-9]+)?))?")
TPU_FORMS = ("v5e:AxB or v6e:AxB with AxB one of " + ", ".join(f"{a}x{b}" for a, b in _LITE_SHAPES)
             + "; v5p:AxBxC (2x2x1, 2x2x2, 2x2x4, 2x4x4, or multiples of 4 such as 4x4x8);"
             " optionally @XxYxZ chips per host; N slices of one: Nx before it, e.g. 2xv5e:16x16")


@dataclass(frozen=True, slots=True)
class TpuSlice:
    """A TPU slice: ``shape`` chips along each axis, ``chips_per_host`` (3 axes) on each host; each chip is one
    JAX device (v5e, v6e: one TensorCore; v5p: megacore). ``num_slices`` > 1: a multi-slice job of that many such
    slices (``chips``, ``hosts`` are one slice's; ``global_devices``, ``processes`` the job's)."""

    generation: str
    shape: tuple[int, ...]
    chips_per_host: tuple[int, int, int]
    wrap: tuple[bool, bool, bool]
    num_slices: int = 1

    @property
    def name(self) -> str:
        """The name JAX's ``get_topology_desc(topology_name=...)`` takes."""
        return f"{self.generation}:{'x'.join(map(str, self.shape))}"

    @property
    def chips(self) -> int:
        """Chips (JAX devices) in one slice."""
        return math.prod(self.shape)

    @property
    def hosts(self) -> int:
        """Hosts of one slice: one JAX process each."""
        return self.chips // math.prod(self.chips_per_host)

    @property
    def slices(self) -> int:
        """Slices of the job (joined over the data-centre network when more than one)."""
        return self.num_slices

    @property
    def processes(self) -> int:
        """How many processes the job runs (JAX's ``process_count()``): every host of every slice."""
        return self.hosts * self.num_slices

    @property
    def devices(self) -> int:
        """Devices per process (chips per host)."""
        return math.prod(self.chips_per_host)

    @property
    def global_devices(self) -> int:
        """Devices across the whole job: every chip of every slice."""
        return self.chips * self.num_slices

    @property
    def one_slice(self) -> TpuSlice:
        """One of the job's slices (itself when it has one)."""
        return TpuSlice(self.generation, self.shape, self.chips_per_host, self.wrap)

    @property
    def standard_hosts(self) -> tuple[int, int, int]:
        """The chips per host of Cloud TPU's standard slice of this shape."""
        return standard_chips_per_host(self.generation, self.shape)

    def __str__(self) -> str:
        slices = f"{self.num_slices}x" if self.num_slices > 1 else ""
        if self.chips_per_host == self.standard_hosts:
            return slices + self.name
        return f"{slices}{self.name}@{'x'.join(map(str, self.chips_per_host))}"


AnyTopology = Topology | TpuSlice


def standard_chips_per_host(generation: str, shape: tuple[int, ...]) -> tuple[int, int, int]:
    """Cloud TPU's standard host bounds: a single chip is its own host; every other slice has 2x2 chips a host."""
    return (1, 1, 1) if math.prod(shape) == 1 else (2, 2, 1)


def is_tpu_name(text: str) -> bool:
    """Whether ``text`` is spelled like a TPU slice (``gen:AxB``) rather than ``SxHxD``."""
    return isinstance(text, str) and ":" in text


def parse_tpu_slice(text: str, chips_per_host: str | None = None, num_slices: int | None = None) -> TpuSlice:
    """Parse ``v5e:4x8`` (or ``v5e:2x4@2x4x1``, ``2xv5e:4x8``); ``chips_per_host`` (``2x4`` or ``2x4x1``) overrides
    the standard bounds, ``num_slices`` sets the slice count. Raises :class:`InvalidInputError` naming the valid
    forms."""
    form = f"TPU topologies are {TPU_FORMS}"
    if isinstance(text, str) and re.match(r"([0-9]+x)?v4:", text.strip().lower()):
        raise InvalidInputError(f"topology {excerpt(text)}: v4 is not supported yet (its megacore chips show to a"
                                f" compile-only topology as two devices each, unchecked against a real v4 job); {form}")
    match = _TPU_RE.fullmatch(text.strip().lower()) if isinstance(text, str) else None
    if match is None:
        raise InvalidInputError(f"topology {excerpt(text)} is not a TPU slice name: {form}")
    slices_text, generation, dims_text, at = match.groups()
    slices = _slice_count(text, slices_text, num_slices)
    shape = _numbers(text, dims_text, "chips")
    lite = generation in ("v5e", "v6e")
    if lite and shape not in _LITE_SHAPES:
        raise InvalidInputError(f"topology {excerpt(text)}: {generation} makes no {dims_text} slice; {form}")
    if not lite and not _v5p_shape_ok(shape):
        raise InvalidInputError(f"topology {excerpt(text)}: v5p makes no {dims_text} slice; {form}")
    if chips_per_host is not None and at is not None and chips_per_host != at:
        raise InvalidInputError(f"topology {excerpt(text)} names chips per host @{excerpt(at)}, --chips-per-host says"
                                f" {excerpt(chips_per_host)}")
    bounds_text = chips_per_host or at
    bounds = _host_bounds(text, bounds_text, shape) if bounds_text else standard_chips_per_host(generation, shape)
    wrap = _LITE_SHAPES[shape] if lite else _v5p_wrap(shape)
    return TpuSlice(generation, shape, bounds, wrap, slices)


def _slice_count(text: str, slices_text: str | None, num_slices: int | None) -> int:
    named = _numbers(text, slices_text, "slices")[0] if slices_text is not None else None
    if named is not None and num_slices is not None and named != num_slices:
        raise InvalidInputError(f"topology {excerpt(text)} names {named} slices, --num-slices says {num_slices}")
    count = named if named is not None else (num_slices if num_slices is not None else 1)
    if not 1 <= count <= MAX_SLICES:
        raise InvalidInputError(f"topology {excerpt(text)}: {count} slices; a multi-slice job has 1 to {MAX_SLICES}"
                                " (write N slices of one as Nxv5e:16x16)")
    return count


def parse_any_topology(text: str) -> AnyTopology:
    """``SxHxD`` or a TPU slice name, each in its one spelling."""
    return parse_tpu_slice(text) if is_tpu_name(text) else parse_topology(text)


def _numbers(text: str, numbers_text: str, what: str) -> tuple[int, ...]:
    """The ``x``-separated numbers of a slice name (``4x8``): at most three, each of bounded length."""
    values = [whole(d) for d in numbers_text.split("x")]
    if len(values) > 3:
        raise InvalidInputError(f"topology {excerpt(text)}: no slice has {len(values)} axes; TPU topologies are"
                                f" {TPU_FORMS}")
    if not all(v is not None for v in values):
        raise InvalidInputError(f"topology {excerpt(text)}: {what} {excerpt(numbers_text)}: a number of more than"
                                f" {MAX_NUMBER_CHARS} digits is no slice's; TPU topologies are {TPU_FORMS}")
    return tuple(v for v in values if v is not None)


def _v5p_shape_ok(shape: tuple[int, ...]) -> bool:
    if len(shape) != 3 or any(d < 1 for d in shape) or math.prod(shape) > MAX_V5P_CHIPS:
        return False
    return shape in ((2, 2, 1), (2, 2, 2), (2, 2, 4), (2, 4, 4)) or (
        all(d % 4 == 0 for d in shape) and list(shape) == sorted(shape))


def _v5p_wrap(shape: tuple[int, ...]) -> tuple[bool, bool, bool]:
    full = all(d % 4 == 0 for d in shape)
    return (full, full, full)


def _host_bounds(text: str, bounds_text: str, shape: tuple[int, ...]) -> tuple[int, int, int]:
    parts = bounds_text.strip().lower().split("x")
    values = [whole(p) if p.isdigit() else None for p in parts]
    if not 2 <= len(parts) <= 3 or not all(v is not None and v >= 1 for v in values):
        raise InvalidInputError(f"topology {excerpt(text)}: chips per host {excerpt(bounds_text)}: write them as XxY or"
                                " XxYxZ, positive integers, e.g. 2x2 (4 chips a host)")
    bounds = tuple(v for v in values if v is not None) + (1,) * (3 - len(parts))
    full = shape + (1,) * (3 - len(shape))
    if any(s % b for s, b in zip(full, bounds, strict=True)):
        raise InvalidInputError(f"topology {excerpt(text)}: {'x'.join(map(str, shape))} chips do not divide into"
                                f" hosts of {'x'.join(map(str, bounds))} chips")
    return bounds  # type: ignore[return-value]
