"""How the cloud services' Kafka clients reach the brokers: TLS, SASL/SCRAM, mTLS.

Every Kafka client of ingest and the trainer takes the same options, with the
same names as the proxy's (``docs/security.md``, "Kafka"):

    --kafka-security-protocol PLAINTEXT|SSL|SASL_PLAINTEXT|SASL_SSL
    --kafka-sasl-mechanism SCRAM-SHA-512|SCRAM-SHA-256
    --kafka-sasl-username NAME          the principal User:NAME of the ACLs
    --kafka-sasl-password-file FILE     the password is never a flag
    --kafka-ssl-ca FILE                 CA of the brokers' certificates (PEM)
    --kafka-ssl-cert FILE --kafka-ssl-key FILE   mutual TLS

each defaulting to an environment variable (``POLYCORN_KAFKA_SECURITY_PROTOCOL``,
``POLYCORN_KAFKA_SASL_MECHANISM``, ``POLYCORN_KAFKA_SASL_USERNAME``,
``POLYCORN_KAFKA_SASL_PASSWORD_FILE``, ``POLYCORN_KAFKA_SSL_CA``,
``POLYCORN_KAFKA_SSL_CERT``, ``POLYCORN_KAFKA_SSL_KEY``), like
``--bootstrap`` defaults to ``POLYCORN_KAFKA_BOOTSTRAP``. A combination that
cannot mean what was asked (a user name without SASL, a CA without TLS, a
certificate without its key) is refused rather than ignored.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")

#: (flag, attribute, environment variable, help)
_OPTIONS = (
    (
        "--kafka-security-protocol",
        "kafka_security_protocol",
        "POLYCORN_KAFKA_SECURITY_PROTOCOL",
        "PLAINTEXT (default), SSL, SASL_PLAINTEXT or SASL_SSL",
    ),
    (
        "--kafka-sasl-mechanism",
        "kafka_sasl_mechanism",
        "POLYCORN_KAFKA_SASL_MECHANISM",
        "SCRAM-SHA-512 (default with SASL) or SCRAM-SHA-256",
    ),
    (
        "--kafka-sasl-username",
        "kafka_sasl_username",
        "POLYCORN_KAFKA_SASL_USERNAME",
        "SASL user: the Kafka principal User:NAME",
    ),
    (
        "--kafka-sasl-password-file",
        "kafka_sasl_password_file",
        "POLYCORN_KAFKA_SASL_PASSWORD_FILE",
        "file holding the SASL password (its first line)",
    ),
    (
        "--kafka-ssl-ca",
        "kafka_ssl_ca",
        "POLYCORN_KAFKA_SSL_CA",
        "CA certificate(s) of the brokers, PEM (default: the system's)",
    ),
    (
        "--kafka-ssl-cert",
        "kafka_ssl_cert",
        "POLYCORN_KAFKA_SSL_CERT",
        "client certificate, PEM, for mutual TLS",
    ),
    (
        "--kafka-ssl-key",
        "kafka_ssl_key",
        "POLYCORN_KAFKA_SSL_KEY",
        "the client certificate's private key, PEM",
    ),
)


@dataclass(frozen=True)
class KafkaSecurity:
    """The options, checked. :meth:`config` reads the password file."""

    protocol: str = "PLAINTEXT"
    mechanism: str | None = None
    username: str | None = None
    password_file: Path | None = None
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    def __post_init__(self) -> None:
        protocol = self.protocol.upper()
        if protocol not in PROTOCOLS:
            raise ValueError(
                f"--kafka-security-protocol must be one of {', '.join(PROTOCOLS)}, "
                f"got {self.protocol!r}"
            )
        object.__setattr__(self, "protocol", protocol)
        if self.sasl:
            mechanism = (self.mechanism or MECHANISMS[0]).upper()
            if mechanism not in MECHANISMS:
                raise ValueError(
                    f"--kafka-sasl-mechanism must be one of {', '.join(MECHANISMS)}, "
                    f"got {self.mechanism!r}"
                )
            object.__setattr__(self, "mechanism", mechanism)
            if not self.username:
                raise ValueError(
                    f"--kafka-security-protocol {protocol} needs --kafka-sasl-username"
                )
            if self.password_file is None:
                raise ValueError(
                    f"--kafka-security-protocol {protocol} needs --kafka-sasl-password-file"
                )
        else:
            for value, flag in (
                (self.mechanism, "--kafka-sasl-mechanism"),
                (self.username, "--kafka-sasl-username"),
                (self.password_file, "--kafka-sasl-password-file"),
            ):
                if value:
                    raise ValueError(
                        f"{flag} needs --kafka-security-protocol SASL_SSL (or SASL_PLAINTEXT)"
                    )
        if not self.tls:
            for path, flag in (
                (self.ca, "--kafka-ssl-ca"),
                (self.cert, "--kafka-ssl-cert"),
                (self.key, "--kafka-ssl-key"),
            ):
                if path is not None:
                    raise ValueError(f"{flag} needs --kafka-security-protocol SSL or SASL_SSL")
        if (self.cert is None) != (self.key is None):
            raise ValueError("--kafka-ssl-cert and --kafka-ssl-key go together (mutual TLS)")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol.endswith("SSL")

    def password(self) -> str:
        """The first line of the password file."""
        if self.password_file is None:
            raise ValueError("no --kafka-sasl-password-file")
        try:
            text = self.password_file.read_text(encoding="utf-8")
        except OSError as e:
            raise ValueError(f"reading --kafka-sasl-password-file {self.password_file}: {e}") from e
        lines = text.splitlines()
        if not lines or not lines[0]:
            raise ValueError(f"--kafka-sasl-password-file {self.password_file} is empty")
        return lines[0]

    def config(self) -> dict[str, str]:
        """librdkafka (confluent-kafka) settings; empty for the default
        PLAINTEXT, so a client configured as before is unchanged."""
        if self.protocol == "PLAINTEXT":
            return {}
        c = {"security.protocol": self.protocol.lower()}
        if self.sasl:
            c |= {
                "sasl.mechanism": str(self.mechanism),
                "sasl.username": str(self.username),
                "sasl.password": self.password(),
            }
        if self.ca is not None:
            c["ssl.ca.location"] = str(self.ca)
        if self.cert is not None and self.key is not None:
            c["ssl.certificate.location"] = str(self.cert)
            c["ssl.key.location"] = str(self.key)
        if self.tls:
            # librdkafka's default, stated: the broker's certificate must name
            # the host dialled.
            c["ssl.endpoint.identification.algorithm"] = "https"
        return c

    def describe(self) -> str:
        """For logs: the protocol and the user, never the password."""
        return f"{self.protocol} as {self.username}" if self.sasl else self.protocol


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options above, each defaulting to its environment variable."""
    for flag, dest, env, what in _OPTIONS:
        p.add_argument(
            flag, dest=dest, default=os.environ.get(env) or None, help=f"{what} (env {env})"
        )


def from_args(a: argparse.Namespace) -> KafkaSecurity:
    """The options of :func:`add_arguments`; ``ValueError`` when inconsistent."""

    def path(v: str | None) -> Path | None:
        return Path(v) if v else None

    return KafkaSecurity(
        protocol=a.kafka_security_protocol or "PLAINTEXT",
        mechanism=a.kafka_sasl_mechanism,
        username=a.kafka_sasl_username,
        password_file=path(a.kafka_sasl_password_file),
        ca=path(a.kafka_ssl_ca),
        cert=path(a.kafka_ssl_cert),
        key=path(a.kafka_ssl_key),
    )


def parse(p: argparse.ArgumentParser, a: argparse.Namespace) -> dict[str, str]:
    """The librdkafka settings of the parsed options; a usage error (exit 2)
    when they are inconsistent or the password file cannot be read."""
    try:
        return from_args(a).config()
    except ValueError as e:
        p.error(str(e))
