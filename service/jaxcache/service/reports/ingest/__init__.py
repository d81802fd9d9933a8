"""Taking run reports in: the POST route, the inbox and its drain, the fold, and the usage statements."""
