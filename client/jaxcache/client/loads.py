"""Verified loads: JAX loads an entry only when the job's ``verify=`` mode's judge lets its bytes through.

The judge sees the bytes JAX read, before it decompresses and deserializes them
(:mod:`jaxcache.client.jax_internals.reads`); a reason makes the lookup a miss, so JAX compiles and the job runs.
The guard remembers each refused key with its reason: the run record, the summary and the service count the miss
as ``skipped`` (:mod:`jaxcache.skips`). A mode plugs in as a :class:`LoadPolicy` that
:func:`jaxcache.client.verify.load_policy` returns for it: ``verify="attested"`` refuses the keys the service
judged bad, ``verify="signed"`` those whose bytes no trusted signature covers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from jaxcache.client.errors import VerifyUnavailableError
from jaxcache.client.jax_internals import reads as jax_reads

log = logging.getLogger("jaxcache.client")

Judge = jax_reads.Judge


@dataclass(frozen=True, slots=True)
class LoadPolicy:
    """What a verify mode lets JAX load. ``judge(key, stored_bytes)``: None to load, else why not (a short,
    stable reason: :mod:`jaxcache.skips` names them)."""

    mode: str
    judge: Judge
    bad: Mapping[str, str] = field(default_factory=dict)  # keys refused whatever their bytes (→ why)
    # What vouches for keys' bytes now (key → sha256; keys without one absent), asked about the node-local tier's
    # copies at start: the service's attested digests under verify="attested".
    attested: Callable[[list[str]], Mapping[str, str]] | None = None


def refuse_keys(mode: str, bad: Mapping[str, str]) -> LoadPolicy:
    """A policy that refuses exactly the keys of ``bad`` (key → why), whatever their bytes."""
    refused = dict(bad)

    def judge(key: str, _stored: bytes) -> str | None:
        return refused.get(key)

    return LoadPolicy(mode, judge, refused)


class LoadGuard:
    """Installs a policy's judge on JAX's cache reads and remembers what it refused. Thread-safe: JAX may compile
    on several threads."""

    def __init__(self, policy: LoadPolicy) -> None:
        self.policy = policy
        self._lock = threading.Lock()
        self._skipped: dict[str, str] = {}
        self._undo: Callable[[], None] | None = None

    def install(self) -> None:
        """Judge every load from now on (:func:`check_judgeable` said this JAX can be judged)."""
        if self._undo is None:
            self._undo = jax_reads.hook_cache_reads(self.policy.judge, self.refused)

    def uninstall(self) -> None:
        """Stop judging (tests and re-configuration)."""
        if self._undo is not None:
            self._undo()
            self._undo = None

    def why(self, key: str) -> str | None:
        """Why the key's entry was refused, or None when it was not."""
        with self._lock:
            return self._skipped.get(key)

    def skipped(self) -> dict[str, str]:
        """Every refused key, with why."""
        with self._lock:
            return dict(self._skipped)

    def refused(self, key: str, why: str) -> None:
        """Remember that ``key`` was refused (the read hook, or the node-local tier, judged it)."""
        with self._lock:
            first = key not in self._skipped
            self._skipped[key] = why
        if first:
            log.warning("jaxcache: verify=%r: not loading %s from the cache (%s); JAX compiles it instead",
                        self.policy.mode, key, why)


def check_judgeable(mode: str) -> None:
    """Raise :class:`VerifyUnavailableError` when this JAX's cache reads cannot be judged: a verifying job must
    never load entries unchecked because JAX moved the code the read hook wraps."""
    moved = jax_reads.problems()
    if not moved:
        return
    import jax

    raise VerifyUnavailableError(
        f"verify={mode!r}: jaxcache cannot judge what JAX {jax.__version__} loads from its cache"
        f" ({'; '.join(moved)}), so this job would load every entry"
        " unchecked. Use a JAX version jaxcache supports (see `jaxcache doctor`), or set verify='off' to load"
        " without checks.")
