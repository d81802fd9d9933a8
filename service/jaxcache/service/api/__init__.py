"""The REST API: one router per resource, the request dependencies they share, and the models at the edge."""
