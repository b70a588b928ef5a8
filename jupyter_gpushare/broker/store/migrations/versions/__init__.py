"""Alembic revisions of the broker's schema, one per schema version (see the package above)."""
