"""HTTP plumbing shared by the routes: middleware, errors, dependencies, fields, conditional answers, docs."""
