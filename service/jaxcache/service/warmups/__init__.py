"""Warm-ups: coverage records, their queries, schemas and route."""
