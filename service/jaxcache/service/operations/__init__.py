"""What the routes and the loops do to a cache's catalog (rescan it, fold its reports, verify and prune its
entries), a module per concern, each on the :class:`~jaxcache.service.state.State` they share."""
