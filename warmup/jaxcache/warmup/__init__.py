"""Warm-up: compile a job's programs for a cluster topology ahead of time and fill the shared cache.

``warmup --topology 4x8x1 --cache-dir gs://bucket/cache --entrypoint myjob.warm:programs`` on one machine with
the training nodes' GPU model and count. Entrypoints receive a :class:`WarmupContext`.
"""

from __future__ import annotations

from jaxcache.warmup.context import WarmupContext

__all__ = ["WarmupContext"]
