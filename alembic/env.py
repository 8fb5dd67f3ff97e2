"""Alembic environment: Calve's SQLModel metadata, URL from the caller or from settings."""

from __future__ import annotations

from sqlalchemy import engine_from_config, pool
from sqlmodel import SQLModel

import service.core.models  # noqa: F401 - registers the tables on SQLModel.metadata
from alembic import context
from service.core.config import get_settings

config = context.config
target_metadata = SQLModel.metadata
url = config.get_main_option("sqlalchemy.url") or get_settings().resolved_database_url()


def run_offline() -> None:
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connectable = engine_from_config({"sqlalchemy.url": url}, prefix="sqlalchemy.", poolclass=pool.NullPool)
    with connectable.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
