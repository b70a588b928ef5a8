"""The Alembic environment of the broker's schema: ``env.py`` and one revision per schema
version in ``versions/`` (``rev0001_initial.py`` is revision ``0001``, schema 1). Run by
:func:`jupyter_gpushare.broker.store.migrate.migrate` at start and by
``jupyter-gpushare upgrade-db``; no ``alembic.ini`` is needed.

A new revision: copy the last file to ``revNNNN_<what>.py`` with ``revision = "NNNN"`` (the next
number: the schema version it makes) and ``down_revision`` the previous one, and write its DDL
with ``op`` (``op.add_column``...). Revision 0001 creates its tables as :mod:`..tables` has
them now, so a column a later revision adds must be added only where it is missing
(:func:`..schema_steps.add_missing_column`).
"""
