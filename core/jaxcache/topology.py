"""Cluster topologies as JAX's ``jax_mock_gpu_topology`` spells them: ``S x H x D``.

S slices x H hosts per slice = processes; D devices per process (docs/jax-internals.md). Warm-up fills a cache for a
topology it is not running on, and run records carry the topology a job ran with, so both share this parser.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from jaxcache.errors import InvalidInputError

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
        raise InvalidInputError(f"topology {text!r}: {_FORM}")
    parts = text.strip().lower().split("x")
    if len(parts) != 3 or _RE.fullmatch(text) is None:
        raise InvalidInputError(f"topology {text!r} has {len(parts)} part(s), not 3: {_FORM}")
    values = []
    for label, part in zip(("slices", "hosts", "devices"), parts, strict=True):
        part = part.strip()
        if not part.isdigit() or not part.isascii():
            raise InvalidInputError(f"topology {text!r}: {label} {part!r} is not a positive integer; {_FORM}")
        value = int(part)
        if value < 1:
            raise InvalidInputError(f"topology {text!r}: {label} must be at least 1; {_FORM}")
        values.append(value)
    topology = Topology(*values)
    if topology.processes > MAX_PROCESSES:
        raise InvalidInputError(
            f"topology {text!r}: {topology.processes} processes is more than {MAX_PROCESSES}; is it a typo?"
        )
    if topology.devices > MAX_DEVICES_PER_PROCESS:
        raise InvalidInputError(
            f"topology {text!r}: {topology.devices} devices per process is more than {MAX_DEVICES_PER_PROCESS};"
            " D is the GPU count of one node"
        )
    return topology
