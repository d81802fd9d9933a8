"""jaxcache.client: what a training script calls before its first compile.

``enable_cache()`` (configure JAX identically everywhere, refuse untrusted directories, count hits and
misses) lands with the client issue; today this package only reserves the import path.
"""
