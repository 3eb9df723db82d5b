"""Alembic environment: relay_api's models, and the URL from the caller or the settings."""

from __future__ import annotations

import logging.config

from alembic import context

from relay_api import models
from relay_api.db import make_engine
from relay_api.settings import Settings

config = context.config
if config.config_file_name is not None and not config.attributes.get("quiet"):
    logging.config.fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = models.Base.metadata


def database_url() -> str:
    return config.attributes.get("database_url") or Settings().database_url


def run_migrations_offline() -> None:
    context.configure(
        url=database_url(), target_metadata=target_metadata, literal_binds=True, render_as_batch=True
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = make_engine(database_url(), pool_size=1)
    with engine.connect() as connection:
        # Batch mode lets later migrations alter tables on SQLite too.
        context.configure(
            connection=connection, target_metadata=target_metadata, compare_type=True, render_as_batch=True
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
