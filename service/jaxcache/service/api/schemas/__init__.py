"""Pydantic models at the API's edge, one module per resource: what clients send and receive."""
