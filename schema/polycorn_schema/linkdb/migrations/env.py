"""Alembic environment for LinkDB (run through ``polycorn-linkdb``)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from polycorn_schema.linkdb.models import Base

config = context.config
target_metadata = Base.metadata


def include_object(
    obj: object, name: str | None, type_: str, reflected: bool, compare_to: object
) -> bool:
    # PostGIS's own tables (spatial_ref_sys, topology) are not ours.
    return not (type_ == "table" and name in {"spatial_ref_sys"})


def run_migrations_online() -> None:
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("sqlalchemy.url is not set: run migrations through polycorn-linkdb")
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            include_object=include_object,
            transaction_per_migration=True,
        )
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
