"""Pruning: the route, the run, its candidates and its audit."""
