"""What the service reads into its catalog besides entries: run records, warm-up coverage, writers' digests."""
