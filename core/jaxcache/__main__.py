"""``python -m jaxcache`` runs the CLI."""

from jaxcache.cli import run

run()
