"""What the routes and the loops do to a cache's catalog, a module per concern, on the shared ``State``."""
