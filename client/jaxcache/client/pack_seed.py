"""The node-local tier seeded from the job's named pack (:mod:`jaxcache.packs`): a fleet's start costs each node one
stat of the pack, plus its ranged reads where the tier does not hold that version yet, not a request per entry.

One stat of ``<root>/.jaxcache/packs/<name>.tar``; where the tier's record of the pack (``.jaxcache/packs/<name>.json``:
the version it holds and its keys) names that version, this process vouches for the pack's copies without asking
more. Else one process of the node at a time reads the pack with parallel ranged reads into a temporary file, checks
it whole as ``bundle import`` checks an archive, and admits its entries; a pack refused is recorded so and not read
again while it is that version. Lookups of keys the pack brings wait for it within their deadline. A pack's copies
load while the pack is that object, not checked against the root's entries one by one (a release artifact's trade);
once it is replaced or removed they are checked as any copy is (:mod:`jaxcache.client.copy_checks`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator

import filelock
import msgspec

from jaxcache import packs, skips
from jaxcache.bundle_import import BundleRefusedError, Checked, accepted_entries, check_archive
from jaxcache.client.local_tier import PENDING_DIR, LocalTier, Pulled
from jaxcache.client.origins import Origin, PackRef, same, stat_of
from jaxcache.errors import InvalidInputError, TooLargeError, UnreachableError
from jaxcache.records import LocalTierCounts
from jaxcache.signing import TrustedKeys
from jaxcache.storage.base import ObjectInfo, Stat
from jaxcache.units import format_bytes, plural

log = logging.getLogger("jaxcache.client")

PACKS_DIR = os.path.join(".jaxcache", "packs")  # in the tier: each pack's record, its turn's lock, its download
MAX_RECORD_BYTES = 128 * 1024 * 1024  # a record lists the pack's keys: a million keys take some 70 MB
SEED_TURN_S = 600.0  # the longest a process waits for another's seeding of the same pack before seeding itself
ATTEMPTS = 2  # a pack replaced while it was read is read again once, as it is then
#: A signed job admits the pack's other entries where some are refused only for their signature; anything else
#: refused (bytes not the manifest's, a bad or forged signature, an entry that does not decompress) refuses it all.
POLICY_REFUSALS = (skips.UNSIGNED, skips.UNTRUSTED_KEY)

# What a start found (Seeded.outcome).
CURRENT, SEEDED, REFUSED, ABSENT, UNANSWERED, FAILED = "current", "seeded", "refused", "absent", "unanswered", "failed"


class PackRecord(msgspec.Struct, frozen=True):
    """What the tier holds of a pack: the version it was seeded from (or refused) and the keys it brought."""

    object: Stat
    keys: list[str] = []
    refused: str | None = None


class PackSeeder:
    """One process's look at the job's named pack, and the tier's seeding from it where needed. Thread-safe."""

    def __init__(self, tier: LocalTier, name: str, *, trusted: TrustedKeys, workers: int,
                 max_bytes: int | None = None, say: bool = True) -> None:
        self._tier = tier
        self.name = packs.check_name(name)
        self.object_name = packs.object_name(name)
        self._say = say  # warn about a pack that is not used (a command says it in its own words)
        self._trusted = trusted if tier.signed else TrustedKeys()  # a signed directory admits only what they sign
        self._workers = max(1, workers)
        self._max_bytes = max_bytes
        quoted = urllib.parse.quote(self.name, safe="")
        self._record = f"{PACKS_DIR}/{quoted}.json"  # a name under the tier's storage root
        self._dir = os.path.join(tier.directory, PACKS_DIR)
        self._turn = os.path.join(self._dir, f"{quoted}.lock")
        os.makedirs(self._dir, mode=0o700, exist_ok=True)
        self._lock = threading.Lock()
        self._seeding = False
        self._incoming: frozenset[str] = frozenset()  # the keys the pack being seeded brings
        self._here: set[str] = set()  # the pack's copies this process vouched for (current, or seeded by it)
        self._asked: set[str] = set()
        self._started = time.monotonic()
        #: Set once the pack's stat was answered (or could not be); then, where it is seeded, once its keys are known,
        #: and once the start is done with it.
        self.looked, self.keys_known, self.done = threading.Event(), threading.Event(), threading.Event()
        self.outcome = ""
        self.why = ""  # why it was refused, absent or not read
        self.info: ObjectInfo | None = None
        self.seeded = 0  # entries this process admitted
        self.seeded_bytes = 0
        self.seeded_s = 0.0

    # -- the start ------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Look at the pack and seed from it where needed, off the caller's thread."""
        threading.Thread(target=self.run, name="jaxcache-pack", daemon=True).start()

    def run(self, *, on_bytes: Callable[[int], None] | None = None) -> str:
        """Look at the pack and seed from it where needed (on this thread); the outcome (:data:`CURRENT`,
        :data:`SEEDED`, ...). ``on_bytes`` is told the bytes of each range read."""
        try:
            for attempt in range(ATTEMPTS):
                try:
                    self._run(on_bytes)
                    break
                except packs.PackChangedError as exc:
                    if attempt + 1 == ATTEMPTS:
                        self._end(FAILED, str(exc))
        except UnreachableError as exc:
            self._end(UNANSWERED, str(exc))
        except Exception as exc:  # noqa: BLE001 - the job fetches on demand, or compiles, as without a pack
            self._end(FAILED, f"{type(exc).__name__}: {exc}")
        finally:
            self.looked.set()
            self.keys_known.set()
            self.done.set()
        return self.outcome

    def _end(self, outcome: str, why: str = "") -> None:
        self.outcome, self.why = outcome, why
        if not self._say:
            return
        if outcome == ABSENT:
            log.warning("jaxcache: the pack %r this job names is not in %s (%s): the node-local tier fetches what the"
                        " job asks for one entry at a time", self.name, self._tier.calls.url, self.object_name)
        elif outcome == REFUSED:
            log.warning("jaxcache: the pack %r in %s is refused whole: %s. Nothing of it is used (it is not read"
                        " again while it is this version); the node-local tier fetches what the job asks for one"
                        " entry at a time", self.name, self._tier.calls.url, why)
        elif outcome in (UNANSWERED, FAILED):
            log.warning("jaxcache: could not read the pack %r from %s (%s); the node-local tier fetches what the"
                        " job asks for one entry at a time", self.name, self._tier.calls.url, why)

    def _run(self, on_bytes: Callable[[int], None] | None) -> None:
        tier = self._tier
        info = tier.calls.ask(lambda root: root.stat(self.object_name), what=f"a look at the pack {self.name!r}")
        self.info = info
        if info is None:
            self._end(ABSENT)
            return
        ref = PackRef(self.name, stat_of(info))
        if self._current(ref, self._read_record()):
            return
        with self._lock:
            self._seeding = True
        self.looked.set()
        turn = filelock.FileLock(self._turn, timeout=SEED_TURN_S)
        with contextlib.suppress(filelock.Timeout), turn:  # another process of the node seeds it meanwhile
            if not self._current(ref, self._read_record()):  # seeded by another while this one waited
                self._seed(info, ref, on_bytes)
            return
        self._seed(info, ref, on_bytes)  # its turn took too long: this process seeds it itself

    def _read_record(self) -> PackRecord | None:
        try:
            data = self._tier.storage.read_bounded(self._record, MAX_RECORD_BYTES)
            return None if data is None else msgspec.json.decode(data, type=PackRecord)
        except (msgspec.DecodeError, msgspec.ValidationError, TooLargeError, InvalidInputError):
            return None

    def _current(self, ref: PackRef, record: PackRecord | None) -> bool:
        """Whether the tier's record names this version of the pack; then its copies are vouched for."""
        if record is None or not same(record.object, ref.object):
            return False
        self._incoming = frozenset(record.keys)
        self.keys_known.set()
        if record.refused is not None:
            self._end(REFUSED, record.refused)
            return True
        tier = self._tier
        for key in record.keys:
            origin = tier.origins.read(key)
            if origin is not None and origin.pack is not None and origin.pack.name == self.name and same(
                    origin.pack.object, ref.object):
                self._vouch(key)
        tier.add(prefetch_wanted=len(record.keys))
        self._end(CURRENT)
        return True

    def _vouch(self, key: str) -> None:
        with self._lock:
            self._here.add(key)
        self._tier.checks.vouch(key)

    def _seed(self, info: ObjectInfo, ref: PackRef, on_bytes: Callable[[int], None] | None) -> None:
        tier = self._tier
        if self._max_bytes is not None and info.size_bytes > self._max_bytes:
            return self._refuse(ref, f"it is {format_bytes(info.size_bytes)}, more than the node-local tier holds"
                                     f" ({format_bytes(self._max_bytes)}: max_size_bytes)")
        for name in os.listdir(self._dir):  # a download a killed process left: this one holds the turn now
            if name.startswith(".download-"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self._dir, name))
        started = time.monotonic()
        fd, path = tempfile.mkstemp(dir=self._dir, prefix=".download-")
        try:
            packs.download(lambda offset, length: tier.calls.ask(
                lambda root: root.read_range(self.object_name, offset, length),
                what=f"a read of the pack {self.name!r}"), info.size_bytes, fd, workers=self._workers,
                first=self._head, done=on_bytes)
            try:
                checked = check_archive(path, self._trusted)
            except BundleRefusedError as exc:
                return self._refuse(ref, str(exc).removeprefix(f"{path}: ").removesuffix("; nothing was imported"))
            refused = checked.result.refused
            bad = {key: why for key, why in refused.items() if why not in POLICY_REFUSALS}
            if bad:
                key, why = next(iter(bad.items()))
                return self._refuse(ref, f"its entry {key}: {why}" + (
                    f" (and {plural(len(bad) - 1, 'other')})" if len(bad) > 1 else ""))
            self._incoming = frozenset(a.key for a in checked.accepted)
            self.keys_known.set()
            tier.add(prefetch_wanted=len(checked.result.manifest.entries))
            try:
                pending = set(os.listdir(os.path.join(tier.directory, PENDING_DIR)))
            except FileNotFoundError:  # no job ran here yet: nothing waits for its upload
                pending = set()
            placed = tier.admit_all(self._entries(checked, ref), keep=pending)
        finally:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self._write_record(PackRecord(ref.object, placed))
        for key in placed:
            self._vouch(key)
        self.seeded_s = time.monotonic() - started
        tier.add(prefetched=self.seeded, prefetched_bytes=self.seeded_bytes)
        if refused:
            log.info("jaxcache: %s of the pack %r not admitted: no trusted signature covers them (%s)",
                     plural(len(refused), "entry"), self.name, ", ".join(sorted(refused)[:5]))
        self._end(SEEDED)
        return None

    def _entries(self, checked: Checked, ref: PackRef) -> Iterator[tuple[str, bytes, Origin]]:
        tier = self._tier
        for key, data, sha256, _sig in accepted_entries(checked):
            why = None if tier.signed else tier.reason(key, data)  # signed: judged by the pack's signatures
            if why is not None:
                continue  # judged bad (verify="attested"): the job's lookup refuses it, and says why
            self.seeded += 1
            self.seeded_bytes += len(data)
            yield key, data, Origin(None, None, sha256, ref)

    def _head(self, head: bytes) -> None:
        keys = packs.head_keys(head)
        if keys is not None:
            self._incoming = keys
            self.keys_known.set()

    def _refuse(self, ref: PackRef, why: str) -> None:
        self._write_record(PackRecord(ref.object, refused=why))
        self._end(REFUSED, why)

    def _write_record(self, record: PackRecord) -> None:
        self._tier.storage.write_atomic(self._record, msgspec.json.encode(record))

    # -- lookups --------------------------------------------------------------------------------------------------

    def settle(self, key: str, until: float | None) -> bool:
        """Wait for the look at the pack and, where it is being seeded and brings ``key``, for the seeding, until
        halfway to ``until`` (``time.monotonic()``): the other half is left to fetch or check the key on its own,
        which costs a request, where the pack is not in by then (a large one on a node's first start), rather than
        a compile. False when it did not end in time."""
        if until is not None:
            until = (time.monotonic() + until) / 2
        if not _wait(self.looked, until):
            return False
        with self._lock:
            seeding = self._seeding
        if not seeding:
            return True
        if not _wait(self.keys_known, until):
            return False
        return key not in self._incoming or _wait(self.done, until)

    def take(self, key: str, until: float) -> Pulled | None:
        """A lookup of ``key`` with no copy here: the pack's copy once it is in (waited for halfway to ``until``);
        None when the pack does not bring it, or not in time (JAX's lookup fetches it)."""
        with self._lock:
            self._asked.add(key)
        waiting = not self.done.is_set()
        if not self.settle(key, until):
            return None  # not in yet: JAX's lookup fetches this entry itself, within the rest of its deadline
        with self._lock:
            here = key in self._here
        if not here:
            return None
        if waiting:
            self._tier.add(prefetch_waited=1)
        return Pulled(None, None, True)

    def asked(self, key: str) -> None:
        """JAX loaded ``key`` locally."""
        with self._lock:
            self._asked.add(key)

    def fill(self, counts: LocalTierCounts) -> LocalTierCounts:
        """``counts`` with the seconds the seeding took and the pack's keys JAX has not asked for."""
        with self._lock:
            counts.prefetched_s = self.seeded_s
            counts.prefetch_unused = len(self._here - self._asked)
        return counts

    def summary(self) -> str:
        """What the start did with the pack, in a few words."""
        said = {CURRENT: "held already (1 stat)",
                SEEDED: f"seeded {plural(self.seeded, 'entry')} ({format_bytes(self.seeded_bytes)}) in"
                        f" {self.seeded_s:.1f} s",
                REFUSED: f"refused: {self.why}", ABSENT: "not in the root",
                UNANSWERED: "not read: the root did not answer", FAILED: f"not read: {self.why}"}
        return f"pack {self.name!r} {said.get(self.outcome, 'not looked at yet')}"


def _wait(event: threading.Event, until: float | None) -> bool:
    return event.wait(None if until is None else max(0.0, until - time.monotonic()))
