"""Persistence: the tables, their migrations, the hot-path writer and its group commits, and
the translation between core objects and rows."""
