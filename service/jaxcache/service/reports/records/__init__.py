"""Record files on storage: run records read by rescans, malformed ones, retention, a changed root."""
