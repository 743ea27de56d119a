"""Kafka's SCRAM users and ACLs for Polycorn, from ``services/kafka/acls.txt``.

    python -m polycorn_schema.kafka_acl --bootstrap ADMIN_BROKERS [admin's security options]
        --acls-file services/kafka/acls.txt [--users-dir DIR]
        [--check-bootstrap SASL_BROKERS --check-ca CA.pem]

Applies the ACL file (every line an ALLOW ACL; the ACLs of the file's
principals and of the users that it does not list are deleted, so the file is
the whole truth for them), creates or updates a SCRAM-SHA-512 credential for every
``DIR/<user>.password`` (the password is the file's first line), then, with
``--check-bootstrap``, waits (bounded) until every user authenticates over
SASL_SSL there. ``scripts/infra.sh up kafka`` runs it against its broker's
PLAINTEXT listener, whose ANONYMOUS principal is a super user; on a
production cluster an admin principal runs it with the security options of
``polycorn_schema.kafka_security`` (docs/operations.md, "Kafka users and
ACLs").
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)

from polycorn_schema import kafka_security
from polycorn_schema.startup import DEFAULT_TIMEOUT_S, NotReadyError, kafka_retriable, retry

log = logging.getLogger("polycorn.kafka_acl")

#: Iterations of new SCRAM credentials (Kafka's minimum is 4096).
SCRAM_ITERATIONS = 8192


def read_acls(path: Path) -> list[AclBinding]:
    """``principal operation resource pattern name`` per line, ``#`` comments."""
    out: list[AclBinding] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) != 5 or not fields[0].startswith("User:"):
            raise ValueError(f"{path}:{n}: expected 'User:NAME OPERATION RESOURCE PATTERN NAME'")
        principal, op, res, pattern, name = fields
        try:
            out.append(
                AclBinding(
                    ResourceType[res.upper()],
                    name,
                    ResourcePatternType[pattern.upper()],
                    principal,
                    "*",
                    AclOperation[op.upper()],
                    AclPermissionType.ALLOW,
                )
            )
        except KeyError as e:
            raise ValueError(f"{path}:{n}: unknown {e}") from None
    return out


def read_users(directory: Path) -> dict[str, str]:
    """``<user>.password`` files: user → password (the first line)."""
    users = {}
    for f in sorted(directory.glob("*.password")):
        lines = f.read_text(encoding="utf-8").splitlines()
        if not lines or not lines[0]:
            raise ValueError(f"{f} is empty")
        users[f.name.removesuffix(".password")] = lines[0]
    return users


def _key(b: AclBinding) -> tuple[object, ...]:
    return (
        b.restype,
        b.name,
        b.resource_pattern_type,
        b.principal,
        b.host,
        b.operation,
        b.permission_type,
    )


def apply(
    admin: AdminClient,
    acls: list[AclBinding],
    users: dict[str, str],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> tuple[int, int]:
    """Upsert the users' credentials, create the ACLs and delete every other
    ACL of the same principals (those of the ACLs and the users). Returns
    (ACLs created or kept, deleted)."""

    def upsert() -> None:
        if not users:
            return
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS)
        alts: list[UserScramCredentialAlteration] = [
            UserScramCredentialUpsertion(u, info, pw.encode()) for u, pw in users.items()
        ]
        for f in admin.alter_user_scram_credentials(alts, request_timeout=30).values():
            f.result()

    def create() -> None:
        if acls:
            for f in admin.create_acls(acls, request_timeout=30).values():
                f.result()

    def prune() -> int:
        want = {_key(b) for b in acls}
        principals = {b.principal for b in acls} | {f"User:{u}" for u in users}
        # None matches any name, principal and host (the stubs say str).
        everything = AclBindingFilter(
            ResourceType.ANY,
            None,  # type: ignore[arg-type]
            ResourcePatternType.ANY,
            None,  # type: ignore[arg-type]
            None,  # type: ignore[arg-type]
            AclOperation.ANY,
            AclPermissionType.ANY,
        )
        have = admin.describe_acls(everything, request_timeout=30).result()
        stale = [b for b in have if b.principal in principals and _key(b) not in want]
        if not stale:
            return 0
        filters = [
            AclBindingFilter(
                b.restype,
                b.name,
                b.resource_pattern_type,
                b.principal,
                b.host,
                b.operation,
                b.permission_type,
            )
            for b in stale
        ]
        for f in admin.delete_acls(filters, request_timeout=30).values():
            f.result()
        for b in stale:
            log.warning("deleted an ACL not in the file: %s", b)
        return len(stale)

    what = "Kafka SCRAM users and ACLs"
    retry(upsert, what=what, retriable=kafka_retriable, timeout_s=timeout_s)
    retry(create, what=what, retriable=kafka_retriable, timeout_s=timeout_s)
    deleted = retry(prune, what=what, retriable=kafka_retriable, timeout_s=timeout_s)
    return len(acls), deleted


def authenticates(
    bootstrap: str, security: kafka_security.KafkaSecurity, *, timeout_s: float = 10.0
) -> list[str]:
    """Log in as ``security``'s user and fetch metadata; returns the topics
    the user may see. Raises ``KafkaException`` when refused."""
    errors: list[KafkaError] = []
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, **security.config()}
    admin = AdminClient(conf | {"error_cb": errors.append})
    try:
        md = admin.list_topics(timeout=timeout_s)
    except KafkaException as e:
        # The reason (authentication, TLS) is in the error callback.
        admin.poll(1)
        raise KafkaException(reason(errors, e.args[0])) from e
    return sorted(md.topics)


def reason(errors: list[KafkaError], fallback: KafkaError) -> KafkaError:
    """The most telling of a client's errors: authentication or TLS if any
    (a refused login also shows as transport errors)."""
    for code in (KafkaError._AUTHENTICATION, KafkaError._SSL):
        for e in errors:
            if e.code() == code:
                return e
    return errors[0] if errors else fallback


def wait_users(
    bootstrap: str,
    ca: Path | None,
    users: Iterable[str],
    directory: Path,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> None:
    """Every user authenticates over SASL_SSL at ``bootstrap`` (a credential
    just written may take a moment to reach the listener)."""
    for user in users:
        sec = kafka_security.KafkaSecurity(
            protocol="SASL_SSL",
            username=user,
            password_file=directory / f"{user}.password",
            ca=ca,
        )

        def attempt(s: kafka_security.KafkaSecurity = sec) -> list[str]:
            return authenticates(bootstrap, s)

        topics = retry(
            attempt,
            what=f"Kafka user {user} authenticating over SASL_SSL at {bootstrap}",
            retriable=lambda e: isinstance(e, KafkaException),
            timeout_s=timeout_s,
        )
        log.info("%s authenticates at %s and sees %d topic(s)", user, bootstrap, len(topics))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m polycorn_schema.kafka_acl",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--bootstrap", required=True, help="brokers, as an admin principal")
    kafka_security.add_arguments(p)
    p.add_argument("--acls-file", type=Path, required=True)
    p.add_argument("--users-dir", type=Path, help="<user>.password files: SCRAM credentials")
    p.add_argument("--check-bootstrap", help="SASL_SSL brokers on which every user must log in")
    p.add_argument("--check-ca", type=Path, help="CA of the --check-bootstrap brokers")
    p.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="kafka_acl: %(message)s")
    admin_conf = kafka_security.parse(p, a)
    try:
        acls = read_acls(a.acls_file)
        users = read_users(a.users_dir) if a.users_dir else {}
        admin = AdminClient({"bootstrap.servers": a.bootstrap, **admin_conf})
        kept, deleted = apply(admin, acls, users, timeout_s=a.timeout_s)
        if a.check_bootstrap and a.users_dir:
            wait_users(a.check_bootstrap, a.check_ca, users, a.users_dir, timeout_s=a.timeout_s)
    except (ValueError, OSError, NotReadyError, KafkaException) as e:
        print(f"kafka_acl: ERROR: {e}", file=sys.stderr)
        return 1
    print(
        f"kafka_acl: {len(users)} SCRAM user(s), {kept} ACL(s) in place, {deleted} stale deleted"
        + (f"; every user logs in at {a.check_bootstrap}" if a.check_bootstrap else ""),
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
