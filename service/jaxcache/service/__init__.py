"""jaxcache.service: the catalog service over cache roots (REST API, dashboard, metrics, prune). No JAX here."""
