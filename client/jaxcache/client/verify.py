"""``enable_cache(verify=...)``: which entries a job may load, and a check of what it loaded.

- ``"attested"``: before anything compiles, one request to the service (``GET /v1/integrity?cache_dir=...``) for
  the entries it judged bad (:data:`jaxcache.skips.JUDGED_BAD`); JAX then loads none of exactly those, compiling
  them instead (:mod:`jaxcache.client.loads`); a node-local tier drops copies whose bytes are not the digest the
  service attests for their key (:func:`attested_digests`). The job never refuses to start because of what is in
  the cache. A setting the service refuses (token, scope, URL, cache_dir) raises: starting would skip the check
  silently. An unreachable or failing service lets the job start without the check, with one warning.
- ``"signed"``: JAX loads only an entry whose bytes, as it read them, match a signature by a key of
  ``JAXCACHE_TRUSTED_KEYS`` (its ``<key>-sig`` object beside it); any other is compiled, with why.
- ``"sample"``: after the fact, read the first entries this job hit and check each against its writer's digest
  (from the root's run and warm-up records) and its embedded program name; warn about any that differ.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace

from jaxcache import entry as fmt
from jaxcache import integrity, signing, skips
from jaxcache.client.errors import IntegrityCheckError
from jaxcache.client.loads import LoadPolicy, check_judgeable, refuse_keys
from jaxcache.client.options import ClientOptions
from jaxcache.client.reporting import ask_service
from jaxcache.scan import Entry
from jaxcache.signing import TrustedKeys
from jaxcache.storage import Storage
from jaxcache.units import plural

log = logging.getLogger("jaxcache.client")

VERIFY_MODES = ("off", "sample", "attested", "signed")
SAMPLE_HITS = 8
ASK_TIMEOUT_S = 2.0
#: What refuses a job: proof that the entry is not what its key's program compiled to (``mismatched`` is the acting
#: class only where its check is pinned). ``differs`` (against an unsigned digest) proves nothing and a corrupt
#: entry is one JAX fails to load and recompiles: the service lists both, jobs start.
_HARM = (integrity.TAMPERED, integrity.MISMATCHED)
ASK_LIMIT = 100_000  # problems the service lists at most (pending ones too): more bad entries than that load unjudged
#: A digests request's body stays under the service's default JAXCACHE_MAX_BODY_BYTES (64 KiB), with its keys at most
#: what the service takes in one (``MAX_DIGEST_KEYS``).
DIGESTS_BODY_BYTES, DIGESTS_KEYS = 60_000, 10_000
#: What a refusal by the service means, and what to change: configuration errors fail closed.
_REFUSED = {
    401: "the service does not know the token: set JAXCACHE_TOKEN (or token=) to one with the report or read scope",
    403: "the token's scope may not read integrity: give the job a token with the report or read scope",
    404: "no jaxcache integrity route there: is JAXCACHE_SERVICE_URL the jaxcache service's base URL?",
    422: "the service has no cache with this root: pass the cache_dir the service is configured with (GET /v1/caches"
         " lists the roots)",
}


def load_policy(options: ClientOptions, storage: Callable[[], Storage]) -> LoadPolicy | None:
    """What the job's verify mode lets JAX load; None where it judges no load ("sample" checks after the fact, and
    an unreachable service leaves "attested" unchecked). ``storage``: the session's root, opened when first used.
    Raises :class:`VerifyUnavailableError` first when this JAX's loads cannot be judged."""
    if options.verify in ("signed", "attested"):
        check_judgeable(options.verify)  # before JAX is pointed at the cache: a refusal changes nothing
    if options.verify == "signed":
        return signed_policy(storage, options.trusted_keys)
    if options.verify == "attested":
        assert options.service_url is not None  # resolve() refuses "attested" without one
        return attested_policy(options.service_url, options.token, options.cache_dir)
    return None


def signed_policy(storage: Callable[[], Storage], trusted: TrustedKeys) -> LoadPolicy:
    """What ``verify="signed"`` lets JAX load: an entry whose stored bytes a trusted key signed (its ``-sig``
    object, one small read beside the entry's). Anything else is compiled, with why (:mod:`jaxcache.skips`)."""

    def judge(key: str, stored: bytes) -> str | None:
        return signing.read(storage(), key, trusted).judge(stored)

    return LoadPolicy("signed", judge)


def attested_policy(service_url: str, token: str | None, cache_dir: str) -> LoadPolicy | None:
    """What ``verify="attested"`` lets JAX load: everything but the keys the service judged bad. None when the
    service could not be asked (unreachable, failing): the job starts unchecked, after one warning. Raises
    :class:`IntegrityCheckError` on a setting the service refuses."""
    try:
        summary = ask_service(service_url, "/v1/integrity", {"cache_dir": cache_dir, "limit": ASK_LIMIT}, token,
                              ASK_TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:300].decode(errors="replace")
        if exc.code in _REFUSED or 400 <= exc.code < 500:
            fix = _REFUSED.get(exc.code, "check the service URL, token and cache_dir")
            if exc.code == 404 and "has the root" in detail:  # the route is there; the root is not one of its caches
                fix = _REFUSED[422]
            raise IntegrityCheckError(
                f"verify='attested': {service_url} refused to report on {cache_dir} (HTTP {exc.code} {detail}):"
                f" {fix}. The job does not start unchecked; verify='off' skips the check deliberately"
            ) from None
        log.warning("jaxcache: verify='attested' could not ask %s about %s (HTTP %s %s); starting without the"
                    " check", service_url, cache_dir, exc.code, detail)
        return None
    except (urllib.error.URLError, OSError, ValueError) as exc:  # unreachable, timed out, or not JSON
        log.warning("jaxcache: verify='attested' could not reach %s to ask about %s (%s); starting without the"
                    " check", service_url, cache_dir, exc)
        return None
    bad = {str(p["key"]): str(p["class"]) for p in summary.get("problems", []) if p.get("class") in skips.JUDGED_BAD}
    judged_bad = sum(int(n) for c, n in (summary.get("counts") or {}).items() if c in skips.JUDGED_BAD)
    if judged_bad > len(bad):
        log.warning("jaxcache: verify='attested': the service judged %s of %s bad but listed %d; the others"
                    " load unjudged: remove them (jaxcache prune %s --integrity %s --apply)",
                    plural(judged_bad, "entry"), cache_dir, len(bad), cache_dir, ",".join(skips.JUDGED_BAD))
    if bad:
        log.warning("jaxcache: verify='attested': the service judged %s of %s bad; JAX will compile them"
                    " instead of loading them. Remove them: %s", plural(len(bad), "entry"), cache_dir,
                    skips.removal(cache_dir, bad))
    return replace(refuse_keys("attested", bad), attested=attested_digests(service_url, token, cache_dir))


def attested_digests(service_url: str, token: str | None, cache_dir: str) -> Callable[[list[str]], Mapping[str, str]]:
    """Asks the service for the digests its verdicts on ``keys`` count (``POST /v1/integrity/digests``, as few
    requests as the body limit allows): key → sha256, for the keys it has one for. A request that fails leaves the
    keys it asked about out, after one warning: their copies load unchecked against a digest, as before."""

    def ask(keys: list[str]) -> Mapping[str, str]:
        found: dict[str, str] = {}
        chunks = list(_chunked(keys, DIGESTS_BODY_BYTES - len(json.dumps(cache_dir))))
        for i, chunk in enumerate(chunks):
            try:
                answer = ask_service(service_url, "/v1/integrity/digests", {}, token, ASK_TIMEOUT_S,
                                     body={"cache_dir": cache_dir, "keys": chunk})
                found.update((key, str(d["sha256"])) for key, d in answer["digests"].items())
            except Exception as exc:  # noqa: BLE001 - unreachable, refused or not the answer: the job goes on
                why = f"HTTP {exc.code} {exc.read()[:300].decode(errors='replace')}" if isinstance(
                    exc, urllib.error.HTTPError) else exc
                log.warning("jaxcache: verify='attested' could not ask %s for the digests of %s in the node-local"
                            " tier (%s); they load unless the service judged their keys bad, unchecked against"
                            " their writers' digests this time", service_url,
                            plural(sum(map(len, chunks[i:])), "copy"), why)
                break
        return found

    return ask


def _chunked(keys: list[str], budget: int) -> Iterator[list[str]]:
    """``keys`` in runs whose JSON fits ``budget`` bytes, and at most :data:`DIGESTS_KEYS` each."""
    chunk: list[str] = []
    used = 0
    for key in keys:
        size = len(json.dumps(key)) + 2
        if chunk and (used + size > budget or len(chunk) >= DIGESTS_KEYS):
            yield chunk
            chunk, used = [], 0
        chunk.append(key)
        used += size
    if chunk:
        yield chunk


class HitSampler:
    """Checks the first few entries a job hit, once, on a background thread."""

    def __init__(self, storage: Storage, *, sample: int = SAMPLE_HITS) -> None:
        self._storage = storage
        self._sample = sample
        self._keys: list[str] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._started = False
        self.findings: list[integrity.Verdict] = []

    def on_hit(self, key: str) -> None:
        """Collect hits; start checking once the sample is full."""
        with self._lock:
            if self._started or key in self._keys:
                return
            self._keys.append(key)
            if len(self._keys) < self._sample:
                return
        self.start()

    def start(self) -> None:
        """Check what was collected (at exit when the job hit fewer than the sample)."""
        with self._lock:
            if self._started or not self._keys:
                self._done.set()
                return
            self._started = True
        try:
            threading.Thread(target=self._run, name="jaxcache-verify", daemon=True).start()
        except RuntimeError:  # at interpreter exit Python >= 3.12 starts no threads: check here
            self._run()

    def wait(self, timeout_s: float) -> None:
        """Bounded wait for the check (at exit)."""
        self._done.wait(timeout_s)

    def _run(self) -> None:
        try:
            attested = integrity.load_attestations(self._storage)
            trusted = TrustedKeys.from_env()
            for key in self._keys:
                name = fmt.parse_name(fmt.cache_name(key))
                if name is None:
                    raise ValueError(f"{key!r} is not the shape of a key JAX gives")
                entry = Entry(key=key, module=name.module, hash=name.hash, name=name.name, size_bytes=0, mtime_s=0.0)
                verdict = integrity.judge_stored(self._storage, attested, trusted, 0.0, 0.0, entry)
                if verdict is not None and verdict.classification in _HARM:
                    self.findings.append(verdict)
                    log.warning("jaxcache: this job loaded %s from the cache and it is %s: %s. Results may be"
                                " wrong; remove it (jaxcache prune ROOT --integrity --apply)",
                                key, verdict.classification, "; ".join(verdict.reasons))
        except Exception as exc:  # noqa: BLE001 - a check that cannot run must not break the job
            log.warning("jaxcache: verify='sample' could not check the entries this job hit: %s", exc)
        finally:
            self._done.set()
