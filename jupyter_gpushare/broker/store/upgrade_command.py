"""``jupyter-gpushare upgrade-db``: bring the broker's database to this code's schema, as
``jupyterhub upgrade-db`` does for the hub's, and print what was done.

The broker migrates at start too; this is for doing it on purpose, with the broker stopped
(after a backup). The database: ``--db-url``, else ``c.BrokerApp.db_url`` of ``--config``,
else ``$GPUSHARE_DB_URL``, else the broker's default ``sqlite:///gpushare.sqlite``.
"""

from __future__ import annotations

import argparse
import os
import sys

from sqlalchemy import make_url

from ...cli import Command, register
from .db import make_engine
from .migrate import SchemaError, current_version, describe, migrate

DEFAULT_DB_URL = "sqlite:///gpushare.sqlite"


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db-url", help="the broker's database (a SQLAlchemy URL)")
    parser.add_argument(
        "--config", metavar="FILE", help="the broker's config file: its c.BrokerApp.db_url"
    )


def db_url_of(args: argparse.Namespace) -> str:
    """The database URL from the options, the config file, the environment or the default."""
    if args.db_url:
        return str(args.db_url)
    if args.config:
        from traitlets.config.loader import PyFileConfigLoader

        directory, name = os.path.split(os.path.abspath(args.config))
        config = PyFileConfigLoader(name, path=directory).load_config()
        if "db_url" in config.BrokerApp:
            return str(config.BrokerApp.db_url)
    return os.environ.get("GPUSHARE_DB_URL", DEFAULT_DB_URL)


def _upgrade_db(args: argparse.Namespace) -> int:
    url = db_url_of(args)
    shown = make_url(url).render_as_string(hide_password=True)
    engine = make_engine(url)
    try:
        before = current_version(engine)
        applied = migrate(engine)
    except SchemaError as exc:
        print(f"jupyter-gpushare upgrade-db: {shown}: {exc}", file=sys.stderr)
        return 1
    finally:
        engine.dispose()
    if not applied:
        print(f"{shown}: schema {before}, up to date (nothing to do)")
        return 0
    print(f"{shown}: schema {before} -> {applied[-1]}")
    for version in applied:
        print(f"  applied schema {version}: {describe(version)}")
    return 0


register(
    Command(
        "upgrade-db",
        "Upgrade the broker's database to this version's schema (Alembic) and say what was done",
        _arguments,
        _upgrade_db,
    )
)
