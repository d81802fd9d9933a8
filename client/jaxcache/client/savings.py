"""The compile seconds this process's hits saved, credited by the rule the service applies (jaxcache.usage_rules):
a hit is worth what compiling its program took on this platform where a run of the job measured it (this process,
or the job's earlier runs on the same device kind, from its working-set index), else the writer's time on the
writer's machine (a warm-up's measure, from the same index), else the whole seconds JAX stored in the entry (the
writer's too, truncated). Each part is said with where its seconds come from."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from jaxcache import usage_rules
from jaxcache.records import KeyUsage, RunKind
from jaxcache.usage_rules import PY
from jaxcache.working_set import Measured


@dataclass(frozen=True, slots=True)
class Savings:
    """Seconds saved, by where each hit's measure came from, and how many keys' hits each part counts."""

    platform_s: float = 0.0  # by compiles measured on this platform
    writer_s: float = 0.0  # at the writer's time, measured on its machine (machines: which)
    stored_s: float = 0.0  # at the writer's time, by the whole seconds JAX stored (no measure known)
    platform_keys: int = 0
    writer_keys: int = 0
    stored_keys: int = 0
    platform: str | None = None  # this process's device kind
    machines: tuple[str, ...] = ()

    @property
    def saved_s(self) -> float:
        return self.platform_s + self.writer_s + self.stored_s

    @property
    def at_writers_time_s(self) -> float:
        """The part credited by the writer's time (no compile of the key measured on this platform)."""
        return self.writer_s + self.stored_s

    def words(self) -> str:
        """``12.3 s saved (11.0 s measured on TPU v5 lite; 1.3 s at the writer's time, compiled on cpu, 2 cores)``."""
        parts = []
        if self.platform_keys:
            parts.append((self.platform_s, f"measured on {self.platform or 'this platform'}"))
        if self.writer_keys:
            where = "; ".join(self.machines) or "the writer's machine"
            parts.append((self.writer_s, f"at the writer's time, compiled on {where}"))
        if self.stored_keys:
            parts.append((self.stored_s, "at the writer's time: the whole seconds JAX stored"))
        total = f"{self.saved_s:.1f} s saved"
        if len(parts) <= 1:
            return total + "".join(f" ({text})" for _, text in parts)
        return f"{total} (" + "; ".join(f"{s:.1f} s {text}" for s, text in parts) + ")"


def credit(usages: Iterable[KeyUsage], measured: Measured, *, kind: RunKind, platform: str | None) -> Savings:
    """What ``usages``' hits saved (:func:`jaxcache.usage_rules.saved` per key, with the measure
    :func:`jaxcache.usage_rules.credited_measure` picks), by where the measure came from."""
    seconds = [0.0, 0.0, 0.0]
    keys = [0, 0, 0]
    machines: dict[str, None] = {}
    for u in usages:
        if not u.hits:
            continue
        # This process's own compile of the key (it compiled, then loaded it) is this platform's measure too.
        own = u.compile_s if u.compiles and u.compile_s is not None else measured.platform.get(u.key)
        writer = measured.writers.get(u.key)
        measure = usage_rules.credited_measure(PY, own, None if writer is None else writer[0])
        basis = 0 if own is not None else 1 if writer is not None else 2
        seconds[basis] += float(usage_rules.saved(PY, kind, u.hits, u.retrieval_s, u.saved_s, measure))
        keys[basis] += 1
        if basis == 1 and writer is not None and writer[1]:
            machines.setdefault(writer[1])
    return Savings(platform_s=seconds[0], writer_s=seconds[1], stored_s=seconds[2], platform_keys=keys[0],
                   writer_keys=keys[1], stored_keys=keys[2], platform=platform, machines=tuple(machines))
