"""What :func:`jaxcache.client.enable_cache` was asked for: arguments first, then ``JAXCACHE_*`` variables.

Resolution happens before JAX is touched, so every mistake here is reported before anything changes.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from jaxcache.client import trust as trust_mod
from jaxcache.client.errors import CacheNotConfiguredError, UntrustedCacheDirError
from jaxcache.client.trust import TRUST_MODES
from jaxcache.errors import InvalidInputError, InvalidRootError
from jaxcache.numbers import parse_float, parse_int
from jaxcache.packs import check_name as check_pack_name
from jaxcache.records import check_job, check_run_id
from jaxcache.signing import SigningKey, TrustedKeys, key_from_env
from jaxcache.storage import ROOT_FORMS, is_object_store, normalise_root, spelled_root

DEFAULT_RECORD_EVERY_S = 300.0

# Every environment variable the client reads (docs/user-guide.md documents each; deploy/ tests check manifests use
# only these and the service's settings).
ENV_VARS = (
    "JAXCACHE_DIR",
    "JAX_COMPILATION_CACHE_DIR",
    "JAXCACHE_JOB",
    "JAXCACHE_RUN_ID",
    "JAXCACHE_SERVICE_URL",
    "JAXCACHE_TOKEN",
    "JAXCACHE_MIN_COMPILE_TIME_S",
    "JAXCACHE_MIN_ENTRY_SIZE_BYTES",
    "JAXCACHE_RECORD_EVERY_S",
    "JAXCACHE_VERIFY",
    "JAXCACHE_SIGNING_KEY",
    "JAXCACHE_KEY_PARTS",
    "JAXCACHE_LOCAL_DIR",
    "JAXCACHE_UPLOAD_WAIT_S",
    "JAXCACHE_PREFETCH",
    "JAXCACHE_LOOKUP_DEADLINE_S",
    "JAXCACHE_PACK",
    "JAXCACHE_SUMMARY",
)
#: The node-local tier's size cap when ``max_size_bytes`` is unset (JAX's own LRU on the local directory).
DEFAULT_LOCAL_MAX_BYTES = 16 * 1024**3
DEFAULT_UPLOAD_WAIT_S = 30.0  # at exit: uploads still running; bounded so exit never hangs on storage
DEFAULT_PREFETCH = 8  # parallel fetches of the working set: enough to hide a remote root's per-request latency
# The longest the node-local tier waits for the root's answers to one lookup (or one request of its own), beyond
# which the root is taken as not answering for a while: about ten round trips of a busy store, far below its
# library's retries (minutes).
DEFAULT_LOOKUP_DEADLINE_S = 10.0
_OFF = ("off", "none", "0", "false")


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """Resolved settings of one session."""

    cache_dir: str  # normalised (storage.normalise_root): an absolute local path, or scheme://bucket/prefix
    job: str
    run_id: str
    min_compile_time_secs: float | None = None  # None: keep JAX's default
    min_entry_size_bytes: int | None = None
    # jax_persistent_cache_enable_xla_caches; None: leave it; always "none" on an object store without a local tier
    xla_caches: str | None = None
    max_size_bytes: int | None = None
    service_url: str | None = None
    token: str | None = None
    trust: str = "strict"
    record_every_s: float = DEFAULT_RECORD_EVERY_S
    verify: str = "off"
    signing_key: SigningKey | None = field(default=None, repr=False)  # JAXCACHE_SIGNING_KEY: signs what JAX puts
    # JAXCACHE_TRUSTED_KEYS: the writers whose signatures verify='signed' (and 'sample') take as proof
    trusted_keys: TrustedKeys = field(default_factory=TrustedKeys)
    key_parts: bool = True  # capture what went into each key (JAXCACHE_KEY_PARTS=off turns it off)
    # The node-local tier's directory, by preference (the first writable one is used); empty: JAX reads cache_dir.
    local_dirs: tuple[str, ...] = ()
    local_dir_named: bool = False  # local_dirs is the one the user named (judged strictly), not the defaults
    # cache_dir as the user named it (storage.spelled_root: links unresolved), which the trust judgement walks
    cache_dir_spelled: str = ""
    upload_wait_s: float = DEFAULT_UPLOAD_WAIT_S
    prefetch: int = DEFAULT_PREFETCH  # parallel fetches of the job's working set into the tier at start; 0: none
    lookup_deadline_s: float = DEFAULT_LOOKUP_DEADLINE_S  # JAXCACHE_LOOKUP_DEADLINE_S
    pack: str | None = None  # JAXCACHE_PACK: the pack in the root that seeds the node-local tier (jaxcache.packs)

    @property
    def in_object_store(self) -> bool:
        """True for a root in an object store (``gs://``, ``s3://``, ``az://``), which JAX reads through a library of
        its own (etils epath and fsspec) and XLA cannot write."""
        return is_object_store(self.cache_dir)

    def jax_settings(self, jax_dir: str | None = None) -> dict[str, object]:
        """The JAX config values this session sets: the part that must match when it is called twice.
        ``jax_dir``: the node-local directory JAX reads instead of ``cache_dir``."""
        values: dict[str, object] = {"jax_compilation_cache_dir": jax_dir or self.cache_dir}
        if self.min_compile_time_secs is not None:
            values["jax_persistent_cache_min_compile_time_secs"] = self.min_compile_time_secs
        if self.min_entry_size_bytes is not None:
            values["jax_persistent_cache_min_entry_size_bytes"] = self.min_entry_size_bytes
        if self.xla_caches is not None:
            values["jax_persistent_cache_enable_xla_caches"] = self.xla_caches
        if jax_dir is None and self.in_object_store:  # no local tier after all: XLA must not be handed a bucket
            values["jax_persistent_cache_enable_xla_caches"] = "none"
        if jax_dir is not None:  # JAX's own LRU keeps the node-local tier's -atime files; the client evicts too
            values["jax_compilation_cache_max_size"] = self.max_size_bytes or DEFAULT_LOCAL_MAX_BYTES
        elif self.max_size_bytes is not None and not self.in_object_store:  # a bucket, no local tier: no LRU
            values["jax_compilation_cache_max_size"] = self.max_size_bytes
        return values


def resolve(
    cache_dir: str | os.PathLike[str] | None,
    *,
    job: str | None,
    min_compile_time_secs: float | None,
    min_entry_size_bytes: int | None,
    xla_caches: str | None,
    max_size_bytes: int | None,
    service_url: str | None,
    token: str | None,
    trust: str,
    default_xla_caches: str | None,
    verify: str | None = None,
    env: Mapping[str, str] | None = None,
    local_dir: str | os.PathLike[str] | None = None,
    pack: str | None = None,
) -> ClientOptions:
    """Resolve arguments against the environment and check each value."""
    env = os.environ if env is None else env
    raw_dir = cache_dir if cache_dir is not None else env.get("JAXCACHE_DIR") or env.get("JAX_COMPILATION_CACHE_DIR")
    if raw_dir is None or not os.fspath(raw_dir).strip():
        raise CacheNotConfiguredError(
            f"no cache directory: pass enable_cache() {ROOT_FORMS}, or set JAXCACHE_DIR (or JAX_COMPILATION_CACHE_DIR)"
        )
    # One spelling per root, as the service and the CLI spell it, so every process configures JAX with one string.
    spelled = spelled_root(raw_dir)  # judged as named (trust.check), then read where it leads
    directory = normalise_root(spelled)
    if trust not in TRUST_MODES:
        raise InvalidInputError(f"trust={trust!r}: use one of {', '.join(TRUST_MODES)}")
    min_time = min_compile_time_secs
    if min_time is None and env.get("JAXCACHE_MIN_COMPILE_TIME_S"):
        min_time = _float("JAXCACHE_MIN_COMPILE_TIME_S", env["JAXCACHE_MIN_COMPILE_TIME_S"])
    if min_time is not None and (not _is_number(min_time) or min_time < 0):
        raise InvalidInputError(f"min_compile_time_secs={min_time!r}: use a number of seconds >= 0")
    min_size = min_entry_size_bytes
    if min_size is None and env.get("JAXCACHE_MIN_ENTRY_SIZE_BYTES"):
        min_size = _int("JAXCACHE_MIN_ENTRY_SIZE_BYTES", env["JAXCACHE_MIN_ENTRY_SIZE_BYTES"])
    if min_size is not None and (not isinstance(min_size, int) or isinstance(min_size, bool) or min_size < -1):
        raise InvalidInputError(f"min_entry_size_bytes={min_size!r}: use bytes >= 0, or -1 for no limit")
    local_dirs = local_candidates(directory, local_dir, env)
    if max_size_bytes is not None:
        if not isinstance(max_size_bytes, int) or isinstance(max_size_bytes, bool) or max_size_bytes < 1:
            raise InvalidInputError(f"max_size_bytes={max_size_bytes!r}: use a positive number of bytes")
        if is_object_store(directory) and not local_dirs:
            raise InvalidInputError(
                f"max_size_bytes turns on JAX's own LRU, which does not work on a bucket ({directory}: it cannot"
                " evict there); leave it unset and let the jaxcache service prune the bucket"
                " (POST /v1/caches/NAME/prune), or give the job a node-local tier (local_dir=, JAXCACHE_LOCAL_DIR),"
                " which it then caps"
            )

    if xla_caches is not None and (not isinstance(xla_caches, str) or not xla_caches):
        raise InvalidInputError(f"xla_caches={xla_caches!r}: use 'none', 'all' or a comma-separated list")
    if is_object_store(directory) and not local_dirs:
        # JAX hands XLA's C++ layer "<root>/xla_gpu_per_fusion_autotune_cache_dir" (and a kernel cache file), which
        # it can only write on a local path: a GPU job on a bucket would fail or lose its autotuning results. With
        # a node-local tier they live there, per node (on jax < 0.11 default_xla_caches keeps them off anyway).
        if xla_caches is not None and xla_caches != "none":
            raise InvalidInputError(
                f"xla_caches={xla_caches!r} hands XLA's own sub-caches a path under the bucket, which XLA cannot"
                " write; leave it unset for a bucket (the client turns them off there), or give the job a"
                " node-local tier (local_dir=, JAXCACHE_LOCAL_DIR)"
            )
        default_xla_caches = "none"
    every_s = _float("JAXCACHE_RECORD_EVERY_S", env.get("JAXCACHE_RECORD_EVERY_S") or str(DEFAULT_RECORD_EVERY_S))
    if every_s <= 0:
        raise InvalidInputError("JAXCACHE_RECORD_EVERY_S must be a positive number of seconds")
    url = service_url if service_url is not None else env.get("JAXCACHE_SERVICE_URL") or None
    if url is not None and not url.startswith(("http://", "https://")):
        raise InvalidInputError(f"service_url={url!r}: use http://host:port or https://host")
    check = verify if verify is not None else env.get("JAXCACHE_VERIFY") or "off"
    if check not in ("off", "sample", "attested", "signed"):
        raise InvalidInputError(f"verify={check!r}: use off, sample, attested or signed")
    if check == "attested" and url is None:
        raise InvalidInputError("verify='attested' asks the jaxcache service: set service_url (JAXCACHE_SERVICE_URL)")
    trusted_keys = TrustedKeys.from_env(env)
    if check == "signed" and not trusted_keys:
        raise InvalidInputError("verify='signed' loads only entries a trusted key signed: set JAXCACHE_TRUSTED_KEYS to"
                                " the public keys (NAME:base64, as `jaxcache keys new` prints them) of your writers")
    wait_s = _float("JAXCACHE_UPLOAD_WAIT_S", env.get("JAXCACHE_UPLOAD_WAIT_S") or str(DEFAULT_UPLOAD_WAIT_S))
    if wait_s < 0:
        raise InvalidInputError("JAXCACHE_UPLOAD_WAIT_S must be a number of seconds >= 0")
    text = (env.get("JAXCACHE_PREFETCH") or str(DEFAULT_PREFETCH)).strip().lower()
    prefetch = 0 if text in _OFF else _int("JAXCACHE_PREFETCH", text)
    if not 0 <= prefetch <= 64:
        raise InvalidInputError(f"JAXCACHE_PREFETCH={text!r}: use a number of parallel fetches from 0 (off) to 64")
    deadline_s = _float("JAXCACHE_LOOKUP_DEADLINE_S",
                        env.get("JAXCACHE_LOOKUP_DEADLINE_S") or str(DEFAULT_LOOKUP_DEADLINE_S))
    if not 0 < deadline_s <= 3600:
        raise InvalidInputError("JAXCACHE_LOOKUP_DEADLINE_S must be a number of seconds above 0, at most 3600")
    named_pack = pack if pack is not None else env.get("JAXCACHE_PACK") or None
    if named_pack is not None:
        if not isinstance(named_pack, str):
            raise InvalidInputError(f"pack={named_pack!r}: give the name of a pack in the cache root")
        check_pack_name(named_pack)
        if not local_dirs:
            raise InvalidInputError(
                f"pack={named_pack!r} seeds the node-local tier, which this job has none of ({directory} is read"
                " directly): give it one (local_dir=, JAXCACHE_LOCAL_DIR), or name no pack")
    parts = (env.get("JAXCACHE_KEY_PARTS") or "on").strip().lower()
    if parts not in ("on", "off"):
        raise InvalidInputError(f"JAXCACHE_KEY_PARTS={parts!r}: use on or off")
    return ClientOptions(
        cache_dir=directory,
        cache_dir_spelled=spelled,
        job=check_job(job if job is not None else env.get("JAXCACHE_JOB") or _default_job()),
        run_id=check_run_id(env.get("JAXCACHE_RUN_ID") or _new_run_id()),
        min_compile_time_secs=None if min_time is None else float(min_time),
        min_entry_size_bytes=min_size,
        xla_caches=xla_caches if xla_caches is not None else default_xla_caches,
        max_size_bytes=max_size_bytes,
        service_url=url.rstrip("/") if url else None,
        token=token if token is not None else env.get("JAXCACHE_TOKEN") or None,
        trust=trust,
        record_every_s=every_s,
        verify=check,
        signing_key=key_from_env(env),
        trusted_keys=trusted_keys,
        key_parts=parts == "on",
        local_dirs=local_dirs,
        # Defaults come only when neither names one.
        local_dir_named=bool(local_dirs) and (local_dir is not None or bool(env.get("JAXCACHE_LOCAL_DIR", "").strip())),
        upload_wait_s=wait_s,
        prefetch=prefetch,
        lookup_deadline_s=deadline_s,
        pack=named_pack,
    )


def local_candidates(root: str, local_dir: str | os.PathLike[str] | None, env: Mapping[str, str]) -> tuple[str, ...]:
    """Where the node-local tier may live, by preference: ``local_dir`` (else ``JAXCACHE_LOCAL_DIR``) when given;
    for a root in an object store by default ``$XDG_CACHE_HOME/jaxcache/local/<root hash>``, else under ``~/.cache``,
    else the temp dir; nothing for a local root by default, or when set to ``off``."""
    raw = os.fspath(local_dir) if local_dir is not None else env.get("JAXCACHE_LOCAL_DIR")
    if raw is not None and raw.strip():
        if raw.strip().lower() in _OFF:
            return ()
        try:
            # As named: tier_dir judges its links and folders before resolving it.
            chosen = None if is_object_store(raw) else spelled_root(raw)
        except InvalidRootError:
            chosen = None
        if chosen is None:
            raise InvalidInputError(f"local_dir={raw!r}: the node-local tier is a directory on this node")
        if os.path.realpath(chosen) == root:
            raise InvalidInputError(f"local_dir={raw!r} is the cache root itself: give a directory of its own")
        return (chosen,)
    if not is_object_store(root):
        return ()
    import hashlib
    import tempfile

    tail = os.path.join("jaxcache", "local", hashlib.sha256(root.encode()).hexdigest()[:16])
    bases = [env.get("XDG_CACHE_HOME") or "", os.path.join(os.path.expanduser("~"), ".cache"),
             os.path.join(tempfile.gettempdir(), f"jaxcache-{os.getuid()}")]
    found: list[str] = []
    for base in bases:
        if base and os.path.isabs(base) and (path := os.path.join(base, tail)) not in found:
            found.append(path)
    return tuple(found)


def _default_job() -> str:
    """The script's name (``train`` for ``python train.py``), so records are never anonymous."""
    argv0 = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    name = argv0.removesuffix(".py")
    return name if name and name not in ("-c", "-m", "") else "unnamed"


def _new_run_id() -> str:
    """Time-ordered and unique; processes of one run share JAXCACHE_RUN_ID when their launcher sets it."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + os.urandom(4).hex()


def _is_number(value: object) -> bool:
    # A finite one: float("nan") < 0 is False, so a NaN threshold would pass a range check and reach JAX.
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _float(name: str, text: str) -> float:
    return parse_float(text, name)  # finite, ASCII, bounded: float() takes "nan", "inf" and "١"


def _int(name: str, text: str) -> int:
    return parse_int(text, name)


log = logging.getLogger("jaxcache.client")
_xla_caches_notice_given = False


def say_xla_caches_off(options: ClientOptions, jax_dir: str | None = None) -> None:
    """Once per process, at INFO: a root in an object store read without a node-local tier (``jax_dir``) gets no XLA
    sub-caches (resolve or jax_settings turned them off)."""
    global _xla_caches_notice_given
    if not options.in_object_store or jax_dir is not None or _xla_caches_notice_given:
        return
    _xla_caches_notice_given = True
    log.info("jaxcache: %s is a bucket: XLA's own sub-caches (GPU autotuning results, kernels) are off"
             " (jax_persistent_cache_enable_xla_caches='none'), since XLA cannot write a bucket's path; GPU jobs"
             " autotune the programs they compile, and load tuned ones from the cache", options.cache_dir)


def check_cache_dir(cache_dir: str | os.PathLike[str], *, trust: str = "strict") -> str:
    """Normalise and judge a cache directory as :func:`enable_cache` would, changing nothing (dry runs): judged as
    named, links unresolved (:func:`jaxcache.storage.spelled_root`), then resolved.

    Returns the normalised directory; raises :class:`UntrustedCacheDirError` in strict mode.
    """
    spelled = spelled_root(cache_dir)
    if trust != "off" and not is_object_store(spelled):
        found = trust_mod.problems(spelled)
        if found and trust == "strict":
            raise UntrustedCacheDirError(trust_mod.untrusted_message(spelled, found))
    return normalise_root(spelled)
