"""Service settings: flags of `jaxcache serve`, or the same names as ``JAXCACHE_*`` environment variables."""

from __future__ import annotations

import ipaddress
import math
import os
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from jaxcache.display import excerpt
from jaxcache.errors import InvalidInputError
from jaxcache.signing import TrustedKeys
from jaxcache.storage import normalise_root
from jaxcache.storage.named import read_named

SCOPES = ("read", "report", "admin")
MAX_TOKENS_FILE_BYTES = 1 << 20  # some 80 bytes a token: thousands of tokens
MAX_PERIOD_S = 366 * 86400.0
_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")


def default_db_url() -> str:
    """An SQLite file under the user's state directory (``$XDG_STATE_HOME/jaxcache``, else ``~/.local/state``)."""
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "jaxcache"
    return f"sqlite:///{state / 'catalog.sqlite'}"


def default_snapshot_dir() -> Path:
    """Under the user's cache directory (``$XDG_CACHE_HOME/jaxcache``, else ``~/.cache``): it can be lost."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "jaxcache" / "service"


#: The most workers the default takes: each holds its own connections and cached statistics.
DEFAULT_MAX_WORKERS = 4


def cpu_limit() -> int:
    """The CPUs this process may use: its affinity, capped by its cgroup's CPU quota (rounded up)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(cpus, math.ceil(quota)) if quota is not None else cpus)


def _cgroup_quota() -> float | None:
    """CPUs of quota (quota / period) from cgroup v2's ``cpu.max`` or v1's CFS files; None where there is none."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period_us = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us


class ServiceSettings(BaseSettings):
    """Every setting of the catalog service. Environment variables use the ``JAXCACHE_`` prefix."""

    # No inf or nan in any number (a wait of inf seconds raises inside a loop, far from the setting).
    model_config = SettingsConfigDict(env_prefix="JAXCACHE_", extra="ignore", allow_inf_nan=False)

    caches: dict[str, str] = Field(default_factory=dict, description='cache roots by name, e.g. {"prod": '
                                   '"gs://bucket/jax-cache", "aws": "s3://bucket/jax-cache", "ci": "/mnt/nfs/jax"}')
    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8080, ge=0, le=65535, description="port to listen on (0: any free port)")
    db: SecretStr = Field(
        default_factory=lambda: SecretStr(default_db_url()),
        description="catalog database: an SQLite URL (sqlite:///path) or PostgreSQL (postgresql+psycopg://...), "
                    "which several replicas can share; a secret (its password is never printed)")
    workers: int = Field(
        default_factory=lambda: min(cpu_limit(), DEFAULT_MAX_WORKERS), ge=1, le=64,
        description="processes serving requests, started and restarted by uvicorn (each the whole app; with "
        "loops, each pass runs in one of them at a time); default: the CPUs this process may use (its cgroup's "
        "CPU quota, a pod's limits.cpu, counts), at most 4")
    role: Literal["all", "api", "loops"] = Field(
        "all", description="what this process does: `api` answers requests only; `loops` runs the background "
        "loops (the report drain, rescans, verification, retention) and answers requests too (its /readyz and "
        "/metrics show the loops); `all` both. Several processes on one catalog: as many `api` ones as the "
        "requests need and one `loops`")
    rescan_s: float = Field(300.0, gt=0, description="seconds between background rescans of every cache")
    stuck_after_s: float | None = Field(
        None, gt=0, description="seconds a background pass (rescan, verify, drain) may run before /readyz, the "
        "dashboard and jaxcache_loop_stuck call it stuck; default: 3 of its loop's periods, at least 600 (a stuck "
        "pass never makes the replica unready)")
    usage_metrics_s: float = Field(
        30.0, gt=0, description="seconds between reads of the usage gauges (jaxcache_hit_rate, jaxcache_saved_seconds "
        "and the like) from the catalog, in each process; a scrape answers the last read")
    shutdown_wait_s: float = Field(
        20.0, ge=0, description="on SIGTERM or Ctrl-C, seconds to wait for background passes still running; past "
        "that the service logs which one and exits without it (under Kubernetes' default 30 s grace period, so "
        "the line is written before a SIGKILL would come)")
    records_retain_d: float = Field(
        30.0, ge=1, description="days run records are kept: older runs are compacted into per-key aggregates (hits, "
        "seconds saved and first writers keep counting them) and their record files deleted by the service; job "
        "lists, usage windows and stale_jaxlib see only the runs kept")
    root_changed: Literal["keep", "drop"] = Field(
        "keep", description="what a cache's job history becomes when the cache is served from another root than "
        "the catalog last served it from (a cache 'demo' once at ./a, now at ./b): `keep` shows the old root's runs "
        "with the new one's; `drop` deletes them (runs, usage, per-key hits and first writers) at start, and the "
        "next rescan reads the new root's run records. `jaxcache serve` says which at start")
    tokens: dict[str, str] = Field(default_factory=dict, description='bearer tokens as {"<sha256 hex of token>": '
                                   '"read|report|admin"}; never the tokens themselves')
    tokens_file: Path | None = Field(None, description="file of lines '<sha256 hex> <scope>' (a mounted Secret)")
    insecure_no_auth: bool = Field(False, description="serve every route without tokens, on any address (labs only)")
    verify_bytes_per_s: float = Field(
        20e6, gt=0, description="background integrity verification reads at most this many bytes per second")
    verify_cpu_share: float = Field(0.2, gt=0, le=1, description="background integrity verification uses at most "
                                    "this share of one CPU core (it shares the process with the API)")
    verify_min_age_s: float = Field(
        3600.0, ge=0, description="entries younger than this that look broken are 'pending', not corrupt/tampered")
    trusted_keys: str = Field(
        "", description="public keys whose signatures prove an entry's bytes (NAME:base64, space-separated, as "
        "`jaxcache keys new` prints them); without any, no verdict is `tampered`")
    snapshot_dir: Path | None = Field(
        default_factory=default_snapshot_dir, description="local directory where rescans keep the listing they "
        "last saw, so a restarted process's first rescan of an unchanged cache reads no catalog row (losing it "
        "costs one slower rescan); empty: keep it in memory only")
    report_inbox: int = Field(
        10_000, ge=1, description="run records that may wait in the catalog's inbox for the drain to fold them (all "
        "caches, every replica); more are answered 503 with Retry-After, and their record files reach the catalog "
        "at the next rescan")
    max_body_bytes: int = Field(64 * 1024, gt=0, description="largest request body accepted")
    max_report_bytes: int = Field(
        8 * 1024 * 1024, gt=0, description="largest run record accepted by POST /v1/reports (records list every key)")
    release_memory_from_entries: int = Field(
        100_000, ge=1, description="a prune plan or a rescan over at least this many entries, once done, hands its "
        "memory back to the system (a full garbage collection, then malloc_trim where the C library has it): a plan "
        "or rescan of a million entries makes an object or more for each; smaller ones leave too little to be worth "
        "the pause")

    @field_validator("snapshot_dir", mode="before")
    @classmethod
    def _no_snapshot_dir(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("rescan_s", "stuck_after_s", "usage_metrics_s", "shutdown_wait_s", "verify_min_age_s")
    @classmethod
    def _seconds(cls, value: float | None) -> float | None:
        # A timer past the platform's time_t (1e12 s) raises inside a loop: no period here is longer than a year.
        if value is not None and value > MAX_PERIOD_S:
            raise ValueError(f"{value:g} seconds is more than a year ({MAX_PERIOD_S:g})")
        return value

    @field_validator("caches")
    @classmethod
    def _names(cls, caches: dict[str, str]) -> dict[str, str]:
        for name, url in caches.items():
            if not _NAME_RE.fullmatch(name):
                raise ValueError(f"cache name {name!r}: use 1-63 lower-case letters, digits, '.', '_' or '-'")
            try:  # a root spelled amiss (s3:/b) is refused before any catalog is opened for it
                normalise_root(url)
            except InvalidInputError as exc:
                raise ValueError(f"cache {name!r}: {exc}") from None
        return caches

    @field_validator("trusted_keys")
    @classmethod
    def _trusted(cls, text: str) -> str:
        try:
            TrustedKeys.parse(text)
        except InvalidInputError as exc:
            raise ValueError(str(exc)) from None
        return text

    @field_validator("tokens")
    @classmethod
    def _tokens(cls, tokens: dict[str, str]) -> dict[str, str]:
        for digest, scope in tokens.items():
            _check_token(digest, scope)
        return tokens

    def token_scopes(self) -> dict[str, str]:
        """Every configured token hash with its scope, from ``tokens`` and ``tokens_file``."""
        merged = dict(self.tokens)
        if self.tokens_file is not None:
            # Judged and read as every file a user names is: no link of another user's, no FIFO, bounded.
            data = read_named(self.tokens_file, "the tokens file (JAXCACHE_TOKENS_FILE)", MAX_TOKENS_FILE_BYTES)
            text = data.decode(errors="replace")
            for n, line in enumerate(text.splitlines(), 1):
                parts = line.split("#", 1)[0].split()
                if not parts:
                    continue
                if len(parts) != 2:
                    raise InvalidInputError(f"{self.tokens_file}:{n}: expected '<sha256 hex> <scope>'")
                try:
                    _check_token(*parts)
                except ValueError as exc:
                    raise InvalidInputError(f"{self.tokens_file}:{n}: {exc}") from None
                merged[parts[0]] = parts[1]
        return merged

    @property
    def catalog_url(self) -> str:
        """The catalog database's URL, password included: only for connecting, never for printing."""
        return self.db.get_secret_value()

    @property
    def records_retain_s(self) -> float:
        return self.records_retain_d * 86400.0

    @property
    def trusted(self) -> TrustedKeys:
        return TrustedKeys.parse(self.trusted_keys)

    def listens_on_loopback(self) -> bool:
        """True when only this machine can reach the service."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def _check_token(digest: str, scope: str) -> None:
    if not _SHA256_RE.fullmatch(digest):
        raise ValueError("token entries are SHA-256 hex digests of the token (64 lower-case hex), not tokens")
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {excerpt(scope)}: use one of {', '.join(SCOPES)}")
