"""Alembic environment for LinkDB (run through ``polycorn-linkdb``)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine, pool, text

from polycorn_schema.linkdb.models import Base

config = context.config
target_metadata = Base.metadata


def include_object(
    obj: object, name: str | None, type_: str, reflected: bool, compare_to: object
) -> bool:
    # PostGIS's own tables (spatial_ref_sys, topology) are not ours.
    return not (type_ == "table" and name in {"spatial_ref_sys"})


OWNER = "linkdb_owner"


def run_as_owner(connection: Connection) -> None:
    """Once revision 0010 has run (it gives alembic_version to the owner role),
    every migration runs as ``linkdb_owner``, so that what it creates is
    owned like the rest. The login must be a superuser or a member of it."""
    owner = connection.execute(
        text(
            "SELECT pg_get_userbyid(relowner) FROM pg_class "
            "WHERE oid = to_regclass('public.alembic_version')"
        )
    ).scalar()
    if owner == OWNER:
        allowed = connection.execute(
            text("SELECT pg_has_role(session_user, :r, 'MEMBER')"), {"r": OWNER}
        ).scalar()
        if not allowed:
            raise RuntimeError(
                f"LinkDB's objects belong to role {OWNER}: run the migrations as a superuser "
                f"or a member of {OWNER} (GRANT {OWNER} TO <login>)"
            )
        connection.execute(text(f"SET ROLE {OWNER}"))
    # SET (not LOCAL) outlives this transaction; Alembic must find none open.
    connection.commit()


def run_migrations_online() -> None:
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("sqlalchemy.url is not set: run migrations through polycorn-linkdb")
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        run_as_owner(connection)
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
