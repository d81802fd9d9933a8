"""Entries: the listing route, its cursors, queries and schemas."""
