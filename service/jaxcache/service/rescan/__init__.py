"""Rescans: walking a cache's root into its catalog, and the snapshots they keep."""
