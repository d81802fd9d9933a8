"""Run reports: the route, the inbox and its drain, the fold, and the jobs and usage queries."""
