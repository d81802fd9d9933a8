"""The job views: the jobs' routes, their queries, and the usage gauges."""
