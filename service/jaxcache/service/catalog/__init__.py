"""The catalog: the database behind the service (models, migrations, cross-replica locks, queries)."""
