"""jaxcache: a managed, observable, trustworthy JAX persistent compilation cache.

The core (this package's top-level modules) holds what every part shares: the entry format
(:mod:`jaxcache.entry`), storage backends (:mod:`jaxcache.storage`), scanning (:mod:`jaxcache.scan`).
It imports nothing heavy: no JAX, no FastAPI, google-cloud-storage only for gs:// roots.
"""

from __future__ import annotations

__version__ = "0.1.0"
