"""Typed settings from the environment, one class per concern.

=================================  ==========================================
``POLYCORN_DATABASE_URL``           ``postgresql://user@host:port/db`` (required)
``POLYCORN_DATABASE_POOL_SIZE``     connections per worker process (default 8)
``POLYCORN_DATABASE_STATEMENT_TIMEOUT_MS``  per-query limit (default 5000)
``POLYCORN_DATABASE_POOL_MAX_WAITING``  requests waiting for a connection, then 503 (default 256)
``POLYCORN_DATABASE_PREPARE_THRESHOLD``  runs of a query before it is prepared (default 2)
``POLYCORN_API_KEYS``               ``name:scope:sha256hex,...`` (see ``auth``)
``POLYCORN_API_KEYS_FILE``          a file with one ``name:scope:sha256hex`` a line
``POLYCORN_API_METRICS_PUBLIC``     ``/metrics`` without a key (default true)
``POLYCORN_API_TABLE_MAX_AGE_S``    ``Cache-Control: max-age`` of the table (default 10)
=================================  ==========================================
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class DatabaseSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="POLYCORN_DATABASE_", extra="ignore")

    url: str = Field(description="libpq-style URL, postgresql://user@host:port/db")
    pool_size: int = Field(default=8, ge=1, le=100)
    statement_timeout_ms: int = Field(default=5000, ge=100)
    pool_max_waiting: int = Field(default=256, ge=0)
    prepare_threshold: int | None = Field(default=2, ge=0)


class ApiSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="POLYCORN_API_", extra="ignore")

    keys: str = Field(default="", description="name:scope:sha256hex entries, comma separated")
    keys_file: Path | None = None
    metrics_public: bool = True
    table_max_age_s: int = Field(default=10, ge=0)


class Settings:
    """Everything the app needs; built from the environment by default."""

    def __init__(self, database: DatabaseSettings, api: ApiSettings) -> None:
        self.database = database
        self.api = api

    @classmethod
    def from_env(cls) -> Settings:
        return cls(DatabaseSettings(), ApiSettings())  # type: ignore[call-arg]
