"""Why this process's misses missed, as far as the client can tell on its own; ``jaxcache explain`` tells the rest.

First, skips: the entry was there and this process's ``verify=`` mode refused it (:mod:`jaxcache.skips`). Three
more causes need nothing but this process: JAX said it would not write the program (a threshold, host callbacks,
not process 0, the cache disabled), so no run before wrote it either; JAX tried and its entry is not there whole
(a full disk: :mod:`jaxcache.client.written`); or the key's entry is in the cache but could not be read (corrupt or
torn: JAX warns, recompiles, and never rewrites an entry that exists). Everything else (a new program, or a part of
the key that changed since the entry was written) needs other runs' records.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from jaxcache import skips, unreadable
from jaxcache.records import COMPILED, KeyUsage
from jaxcache.storage import ObjectInfo
from jaxcache.units import plural

#: Entries looked at per process, local and in an object store (one request each there): bounds what a summary costs.
MAX_CHECKED, MAX_CHECKED_REMOTE = 1000, 100
_THRESHOLD = re.compile(r", (under \S+=\S+)$")


@dataclass(frozen=True, slots=True)
class MissCauses:
    """The misses of one process by cause. ``not_written``: (what JAX said, misses), grouped by threshold.
    ``failed_writes``: (why, misses) of programs JAX tried to write whose entry is not there whole, by cause."""

    misses: int
    not_written: tuple[tuple[str, int], ...] = ()
    unreadable: int = 0
    #: The keys of those misses: the advice removes exactly their entries.
    unreadable_keys: tuple[str, ...] = ()
    failed_writes: tuple[tuple[str, int], ...] = ()
    #: key → why, of the entries this process refused to load (``verify=``); their misses are ``skipped_misses``.
    skipped: tuple[tuple[str, str], ...] = ()
    skipped_misses: int = 0

    @property
    def unexplained(self) -> int:
        """Misses the client cannot explain on its own."""
        explained = sum(n for _, n in self.not_written) + sum(n for _, n in self.failed_writes) + self.unreadable
        return max(self.misses - explained - self.skipped_misses, 0)

    def describe(self, cache_dir: str, run_id: str) -> str:
        """The causes in words, with the command that explains the rest; empty without misses."""
        if not self.misses:
            return ""
        said = []
        if self.skipped:
            said.append(_skipped_text(self.skipped, self.skipped_misses, cache_dir))
        if self.not_written:
            said.append(f"{sum(n for _, n in self.not_written)} not written, as JAX said ("
                        + "; ".join(f"{n}: {why}" for why, n in self.not_written) + ")")
        if self.failed_writes:
            said.append(f"{sum(n for _, n in self.failed_writes)} compiled, not written ("
                        + "; ".join(f"{n}: {why}" for why, n in self.failed_writes) + ")")
        if self.unreadable:
            said.append(f"{self.unreadable} unreadable ({unreadable.fix(cache_dir, self.unreadable_keys)})")
        if self.unexplained:
            said.append(f"{self.unexplained} to explain: jaxcache explain {shlex.quote(cache_dir)} --run"
                        f" {shlex.quote(run_id)}")
        return f"of {plural(self.misses, 'miss')}: " + ", ".join(said)


class MissCheck:
    """Sorts misses by cause; remembers which entries it looked at, so a second summary stats nothing again."""

    def __init__(self, stat: Callable[[str], ObjectInfo | None], limit: int = MAX_CHECKED) -> None:
        self._stat = stat  # an entry's metadata by file name, None when it is not there
        self._limit = limit  # beyond it, misses go unchecked: `jaxcache explain` looks at them
        self._unreadable: dict[str, bool] = {}

    def causes(self, misses: int, usages: Iterable[KeyUsage], failed: Mapping[str, str] | None = None) -> MissCauses:
        """``failed``: the keys whose write left no whole entry, with why (``Recorder.failed_writes()``)."""
        groups: dict[str, list[KeyUsage]] = {}
        failures: dict[str, tuple[str, int]] = {}  # cause -> (the first such reason, misses)
        unreadable_misses = skipped_misses = 0
        unreadable_keys: list[str] = []
        skipped: dict[str, str] = {}
        for usage in usages:
            if not usage.compiles:
                continue
            why = skips.why_skipped(usage.reason)
            if why is not None:  # first: this process refused the entry that was there (verify=)
                skipped[usage.key] = why
                skipped_misses += usage.compiles
                continue
            # First: an entry there before the lookup is why it missed, whatever JAX then said about writing it.
            if not usage.hits and self._is_unreadable(usage):
                unreadable_misses += usage.compiles
                unreadable_keys.append(usage.key)
            elif failed and usage.key in failed:
                why = failed[usage.key]
                first, n = failures.get(_cause(why), (why, 0))
                failures[_cause(why)] = (first, n + usage.compiles)
            elif usage.event == COMPILED and usage.reason:
                m = _THRESHOLD.search(usage.reason)
                groups.setdefault(m.group(1) if m else usage.reason, []).append(usage)
        not_written = tuple((_said(why, found), sum(u.compiles for u in found)) for why, found in groups.items())
        return MissCauses(misses=misses, not_written=not_written, unreadable=unreadable_misses,
                          unreadable_keys=tuple(sorted(unreadable_keys)),
                          failed_writes=tuple(failures.values()), skipped=tuple(sorted(skipped.items())),
                          skipped_misses=skipped_misses)

    def _is_unreadable(self, usage: KeyUsage) -> bool:
        if unreadable.said(usage.reason):  # the write check found the entry there as JAX went to put it
            return True
        known = self._unreadable.get(usage.key)
        if known is not None or len(self._unreadable) >= self._limit:
            return bool(known)
        try:
            info = self._stat(usage.key + "-cache")  # JAX's entry name for a key
        except Exception:  # noqa: BLE001 - storage trouble: unknown, ask again next time
            return False
        # An entry this process wrote is newer than its lookup; one there before the lookup could not be read.
        self._unreadable[usage.key] = info is not None and unreadable.there_before(info.mtime_s, usage.first_at)
        return self._unreadable[usage.key]


def _skipped_text(skipped: tuple[tuple[str, str], ...], misses: int, cache_dir: str) -> str:
    """The skipped entries: how many for each reason, which keys, and the command that removes them."""
    by_why: dict[str, list[str]] = {}
    for key, why in skipped:
        by_why.setdefault(why, []).append(key)
    keys = "; ".join(f"{why}: {', '.join(found[:5])}" + (f" and {len(found) - 5} more" if len(found) > 5 else "")
                     for why, found in sorted(by_why.items()))
    return (f"{misses} skipped: entries this job's verify mode refused to load ({keys}); JAX compiled them and"
            f" never overwrites an entry, so they stay misses until removed: {skips.removal(cache_dir, dict(skipped))}")


def _cause(reason: str) -> str:
    """A failed write's cause: its reason up to the first ": " (``disk full``, :mod:`jaxcache.client.written`)."""
    return reason.partition(": ")[0]


def _said(why: str, found: list[KeyUsage]) -> str:
    """JAX's reason, with the range of the measured values when it is a threshold."""
    if not why.startswith("under "):
        return why
    if "compile_time" in why:
        values = [u.compile_s for u in found if u.compile_s is not None]
        what, unit, shown = "compiled in", " s", "{:.2f}".format
    else:
        values = [float(u.size_bytes) for u in found if u.size_bytes is not None]
        what, unit, shown = "entries of", " bytes", "{:.0f}".format
    if not values:
        return why
    low, high = min(values), max(values)
    span = shown(low) if shown(low) == shown(high) else f"{shown(low)}-{shown(high)}"
    return f"{what} {span}{unit}, {why}"
