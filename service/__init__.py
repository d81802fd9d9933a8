"""jaxcache.service: the FastAPI catalog of cache roots (list, stats, prune, dashboard, metrics).

Lands with the service issue; until then ``jaxcache ls`` and ``jaxcache stats`` are the main job.
"""
