"""Work the service does beside requests: rescans, integrity passes, prunes, and the loops that run them."""
