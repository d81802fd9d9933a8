"""A training script as the user guide tells them to start: enable_cache() first, with a job's own settings."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxcache.client import enable_cache

session = enable_cache("./somewhere", job="train", min_compile_time_secs=5)
again = enable_cache("./somewhere", job="train", min_compile_time_secs=5)
assert again is session
print(f"script got job={session.job} cache={session.cache_dir}")
print(jax.jit(lambda v: (v * 3.0).sum())(jnp.ones((16,), jnp.float32)))
