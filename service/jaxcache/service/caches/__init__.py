"""Caches: the route, their totals and their schemas."""
