"""The client's errors. Each message says what to change in the training script or its environment."""

from __future__ import annotations

from jaxcache.errors import InvalidInputError, JaxcacheError


class CacheNotConfiguredError(InvalidInputError):
    """No cache directory was given: not as an argument, ``JAXCACHE_DIR`` or ``JAX_COMPILATION_CACHE_DIR``."""


class CacheAlreadyInitializedError(JaxcacheError):
    """JAX compiled before :func:`enable_cache` ran, or the cache was already set up differently."""


class UntrustedCacheDirError(JaxcacheError):
    """Someone other than this user (or root) could write the cache directory, so could run code in the job."""


class TamperedCacheError(JaxcacheError):
    """Kept for scripts that catch it: ``verify="attested"`` no longer refuses a job, it skips the entries the
    catalog judged bad (JAX compiles them)."""


class IntegrityCheckError(JaxcacheError):
    """``verify="attested"`` could not ask the service because of a setting (token, scope, URL, cache_dir):
    failing closed, since starting would silently skip the check. The message names the fix."""


class VerifyUnavailableError(JaxcacheError):
    """``verify="signed"`` or ``"attested"`` asked of a JAX whose cache reads jaxcache cannot judge (its read path
    moved): starting would load every entry unchecked. The message names what moved and the way out."""
