"""Integrity: attestations, verification passes, their verdicts and route."""
