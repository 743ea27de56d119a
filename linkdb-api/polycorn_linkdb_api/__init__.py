"""Polycorn LinkDB REST API (FastAPI) over LinkDB (PostgreSQL + PostGIS).

Module map, in call order:

- ``main``: the ``polycorn-linkdb-api`` CLI (``serve``, ``hash-key``).
- ``app``: ``create_app(settings)``, wiring routers, error handlers, metrics.
- ``settings``: typed settings from the environment, one class per concern.
- ``db``: the asyncio psycopg 3 connection pool (the ``async def``
  handlers await their query on it; ``deps.db`` lends a connection).
- ``auth``: API keys (stored as SHA-256 hashes), ``read``/``admin`` scopes.
- ``errors``: RFC 9457 problem+json for every error, one table from domain
  errors to HTTP statuses.
- ``metrics``: Prometheus request-latency histogram by route template.
- ``params``: query-parameter types (bbox, times, cursors).
- ``failure_table``: the failure-location table format (validation exactly
  like the Rust parser, canonical body, ETag).
- ``schemas``: response models (GeoJSON and plain JSON), for OpenAPI.
- ``routes``: one module per resource; SQL builds the GeoJSON so that a page
  never goes through Python objects row by row.
"""
