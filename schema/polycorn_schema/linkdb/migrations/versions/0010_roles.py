"""Database roles: each service gets only the privileges it needs.

LinkDB's writers must not share one credential: a service that can write
``failure_tables`` can plant a table for the trainer or the proxies. This
revision creates five group roles (NOLOGIN; cluster-wide, so created only
when missing) and grants each exactly its service's statements:

==================  ========================================================
``linkdb_owner``    owns every LinkDB table, type and function; the
                    migrations run as it (env.py sets the role)
``linkdb_ingest``   reads and writes the telemetry and the routes (trains,
                    trips, gps_fixes, signal_samples, path_stats, handovers,
                    cells, routes, route_tracks, route_segments); creates
                    month partitions only through
                    ``linkdb_ensure_month_partition`` (within ingest's
                    window with its rounding to months: 432 days back,
                    93 ahead); nothing on models or failure_tables
``linkdb_reader``   SELECT on every table (linkdb-api, Grafana)
``linkdb_trainer``  SELECT on every table; INSERT and UPDATE on models,
                    cell_models and failure_tables
``linkdb_publisher`` INSERT on failure_tables (with SELECT on it and models):
                    linkdb-api's admin ``POST /v1/failure-tables`` needs it;
                    no deployment grants it by default
==================  ========================================================

Deployments log in as LOGIN roles that are members of these groups
(``polycorn-linkdb login``); the roles here carry no password. The login
that runs this revision must be a superuser, or own the LinkDB tables, the
database's ``public`` schema and have CREATEROLE (it makes itself a member
of ``linkdb_owner``, which ALTER ... OWNER TO requires).

Month partitions: ingest cannot own the partitioned tables (an owner can do
anything to them), and ATTACH PARTITION needs ownership. The SECURITY
DEFINER function ``linkdb_ensure_month_partition(table, month)`` runs as
``linkdb_owner``, accepts only the three partitioned tables, creates the
month's partition, moves the DEFAULT partition's rows of that month into it
and attaches it, then gives the partition the privileges of its parent (so
that a partition read or written directly is governed like the parent).
Only ``linkdb_ingest`` (and the owner) may execute it. Later revisions grant
privileges on what they create explicitly: there are no default privileges,
so a new table is nobody's but the owner's until a revision says otherwise.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
from sqlalchemy import text

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OWNER = "linkdb_owner"
INGEST = "linkdb_ingest"
READER = "linkdb_reader"
TRAINER = "linkdb_trainer"
PUBLISHER = "linkdb_publisher"
ROLES = (OWNER, INGEST, READER, TRAINER, PUBLISHER)

TELEMETRY = (
    "trains",
    "trips",
    "gps_fixes",
    "signal_samples",
    "path_stats",
    "handovers",
    "cells",
    "routes",
    "route_tracks",
    "route_segments",
)
LEARNED = ("models", "cell_models", "failure_tables")
TABLES = (*TELEMETRY, *LEARNED)
PARTITIONED = ("gps_fixes", "signal_samples", "path_stats")

# role -> (privileges, tables)
GRANTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (INGEST, "SELECT, INSERT, UPDATE", TELEMETRY),
    (INGEST, "DELETE", ("trips", "routes", "route_tracks", "route_segments")),
    (READER, "SELECT", TABLES),
    (TRAINER, "SELECT", TABLES),
    (TRAINER, "INSERT, UPDATE", LEARNED),
    (PUBLISHER, "SELECT", ("models", "failure_tables")),
    (PUBLISHER, "INSERT", ("failure_tables",)),
)

FUNCTION = "linkdb_ensure_month_partition"
FUNCTION_SQL = f"""
CREATE FUNCTION public.{FUNCTION}(parent text, month timestamptz) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    lo timestamptz := date_trunc('month', month AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    hi timestamptz := (date_trunc('month', month AT TIME ZONE 'UTC') + interval '1 month')
                      AT TIME ZONE 'UTC';
    child text := parent || to_char(month AT TIME ZONE 'UTC', '"_y"YYYY"m"MM');
    g record;
BEGIN
    IF parent IS NULL OR parent NOT IN ({", ".join(f"'{t}'" for t in PARTITIONED)}) THEN
        RAISE EXCEPTION '% is not a partitioned LinkDB table', parent
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF month IS NULL THEN
        RAISE EXCEPTION 'no month' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- ingest's window (polycorn_ingest.sink: PARTITION_PAST, _FUTURE), so
    -- that its login cannot make partitions without end; the owner can.
    IF NOT pg_has_role(session_user, 'linkdb_owner', 'MEMBER')
       AND (month < now() - interval '432 days' OR month >= now() + interval '93 days') THEN
        RAISE EXCEPTION 'month % is outside ingest''s partition window', month
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('polycorn.linkdb.partitions'));
    IF EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
               WHERE i.inhparent = format('public.%I', parent)::regclass
                 AND c.relname = child) THEN
        RETURN NULL;
    END IF;
    EXECUTE format('CREATE TABLE public.%I (LIKE public.%I INCLUDING DEFAULTS)', child, parent);
    EXECUTE format('WITH moved AS (DELETE FROM public.%I WHERE time >= $1 AND time < $2 '
                   'RETURNING *) INSERT INTO public.%I SELECT * FROM moved',
                   parent || '_default', child) USING lo, hi;
    EXECUTE format('ALTER TABLE public.%I ATTACH PARTITION public.%I FOR VALUES FROM (%L) TO (%L)',
                   parent, child, lo, hi);
    FOR g IN SELECT a.grantee, a.privilege_type
             FROM pg_class p, aclexplode(p.relacl) a
             WHERE p.oid = format('public.%I', parent)::regclass
               AND a.grantee <> p.relowner AND a.grantee <> 0 LOOP
        EXECUTE format('GRANT %s ON public.%I TO %s', g.privilege_type, child,
                       g.grantee::regrole::text);
    END LOOP;
    RETURN child;
END
$fn$
"""

# Every LinkDB relation of the public schema (tables, partitions and
# alembic_version), not the extensions' (PostGIS's spatial_ref_sys).
OURS = """
SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
  AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                  AND d.objid = c.oid AND d.deptype = 'e')
ORDER BY c.relname
"""
OUR_TYPES = """
SELECT t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
WHERE n.nspname = 'public' AND t.typtype = 'e'
  AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_type'::regclass
                  AND d.objid = t.oid AND d.deptype = 'e')
ORDER BY t.typname
"""


def _partitions(parent: str) -> list[str]:
    rows = op.get_bind().execute(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = CAST(:p AS regclass) ORDER BY c.relname"
        ),
        {"p": f"public.{parent}"},
    )
    return [r[0] for r in rows]


def _owners(to: str) -> None:
    bind = op.get_bind()
    for (name,) in bind.execute(text(OURS)).all():
        op.execute(f'ALTER TABLE public."{name}" OWNER TO {to}')
    for (name,) in bind.execute(text(OUR_TYPES)).all():
        op.execute(f'ALTER TYPE public."{name}" OWNER TO {to}')


def upgrade() -> None:
    for role in ROLES:
        # Concurrent first migrations of two databases race on the
        # cluster-wide name: either error means the role is there.
        op.execute(
            f"DO $$ BEGIN CREATE ROLE {role} NOLOGIN; "
            "EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
        )
    op.execute(
        f"DO $$ BEGIN IF NOT pg_has_role(current_user, '{OWNER}', 'MEMBER') THEN "
        f"EXECUTE format('GRANT {OWNER} TO %I', current_user); END IF; END $$"
    )
    op.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    op.execute(f"GRANT USAGE, CREATE ON SCHEMA public TO {OWNER}")
    op.execute(f"GRANT USAGE ON SCHEMA public TO {INGEST}, {READER}, {TRAINER}, {PUBLISHER}")
    _owners(OWNER)
    for table in TABLES:
        op.execute(f"REVOKE ALL ON public.{table} FROM PUBLIC")
    for role, privileges, tables in GRANTS:
        for table in tables:
            for t in (table, *(_partitions(table) if table in PARTITIONED else ())):
                op.execute(f"GRANT {privileges} ON public.{t} TO {role}")
    op.execute(FUNCTION_SQL)
    op.execute(f"ALTER FUNCTION public.{FUNCTION}(text, timestamptz) OWNER TO {OWNER}")
    op.execute(f"REVOKE ALL ON FUNCTION public.{FUNCTION}(text, timestamptz) FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION public.{FUNCTION}(text, timestamptz) TO {INGEST}")
    # What follows in this run (later revisions, alembic_version's update)
    # runs as the owner, as env.py arranges for later runs.
    op.execute(f"SET ROLE {OWNER}")


def downgrade() -> None:
    # Back to the login that runs the migrations, which gets the objects back;
    # the roles stay (other databases of the cluster may use them).
    op.execute("RESET ROLE")
    op.execute(f"DROP FUNCTION IF EXISTS public.{FUNCTION}(text, timestamptz)")
    bind = op.get_bind()
    for (name,) in bind.execute(text(OURS)).all():
        op.execute(f'REVOKE ALL ON public."{name}" FROM {INGEST}, {READER}, {TRAINER}, {PUBLISHER}')
    op.execute(f"REVOKE ALL ON SCHEMA public FROM {INGEST}, {READER}, {TRAINER}, {PUBLISHER}")
    _owners("CURRENT_USER")
    op.execute(f"REVOKE ALL ON SCHEMA public FROM {OWNER}")
