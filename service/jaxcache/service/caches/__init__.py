"""Caches: the route, their summaries and statistics, and their schemas."""
