"""Entries: the listing route and its cursors, queries and schemas."""
