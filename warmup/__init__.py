"""jaxcache.warmup: compile a job's programs ahead of time for a cluster topology and fill the cache.

Lands with the warm-up issue; this package reserves the import path.
"""
