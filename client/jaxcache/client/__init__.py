"""The thin client: call :func:`enable_cache` first thing in a training script.

It configures JAX's persistent compilation cache the same way in every job (so warm-up machines and jobs
compute the same keys), refuses directories others can write, counts hits, misses and compile seconds saved,
and writes a run record per process under ``<root>/.jaxcache/runs/`` (optionally sent to the service).

Imports only JAX, zstandard and the standard library (an object store's client library, such as google-cloud-storage
or boto3, once a root there is used).
"""

from __future__ import annotations

from jaxcache.client.errors import (
    CacheAlreadyInitializedError,
    CacheNotConfiguredError,
    IntegrityCheckError,
    TamperedCacheError,
    UntrustedCacheDirError,
    VerifyUnavailableError,
)
from jaxcache.client.options import check_cache_dir
from jaxcache.client.session import CacheSession, current_session, enable_cache
from jaxcache.client.telemetry import CacheStats

__all__ = [
    "CacheAlreadyInitializedError",
    "CacheNotConfiguredError",
    "IntegrityCheckError",
    "CacheSession",
    "CacheStats",
    "TamperedCacheError",
    "UntrustedCacheDirError",
    "VerifyUnavailableError",
    "check_cache_dir",
    "current_session",
    "enable_cache",
]
