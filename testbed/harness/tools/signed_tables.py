"""Signed failure tables, end to end: a running proxy with
``--failure-table-verify-key`` and the trainer's real table on Kafka.

    python testbed/harness/tools/signed_tables.py --bootstrap HOST:PORT --topic TOPIC \\
        --signing-key DIR/table-signing.key --verify-key DIR/table-signing.pub \\
        --metrics-cmd "ip netns exec NS curl -fsS --max-time 2 http://127.0.0.1:9464/metrics"

Run by the telemetry suite (testbed/harness/suites/telemetry) after the trainer (``run --once
--table-signing-key``) has published table V to TOPIC and the proxy, which
follows TOPIC with the public key, has loaded it. The writer here is
someone who can write the topic (the broker's PLAINTEXT listener; in a
deployment only the trainer's principal may, docs/security.md) and tries to
give the proxy a table of its own. Checks, in turn:

1. the trainer's message of version V on the topic carries a signature that
   the public key verifies over exactly its value, and the proxy uses V;
2. a table of a higher version signed with another key, one without a
   signature, and one carrying the trainer's signature of V (another
   table's) are each refused: the proxy's
   ``polycorn_failure_table_source_rejected_total{source="kafka",reason="signature"}``
   rises by one each time and V stays in use;
3. a malformed table signed with the trainer's key is refused as
   ``reason="malformed"`` (the signature is checked first, then the table),
   and so is one signed without an issue time and expiry; V stays;
4. a table signed with the trainer's key but past its expiry is refused as
   ``reason="expired"``, V stays;
5. a well-formed table signed with the trainer's key is taken (the refusals
   did not stop the topic);
6. the trainer's own message of V, produced again (a replay of a genuine,
   signed, unexpired table), is ignored: counted as not newer, the newer
   table stays.

Exit status 0 when every check holds; 1 otherwise, with the reason.
"""

# The metrics command is this script's own argument.

from __future__ import annotations

import argparse
import base64
import json
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from polycorn_schema.failure_table import HEADER_SIGNATURE, HEADER_VERSION, KAFKA_KEY
from polycorn_trainer.signing import TableSigner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prom_metric import value

REJECTED = "polycorn_failure_table_source_rejected_total"
VERSION = "polycorn_failure_table_version"
NOT_NEWER = "polycorn_failure_table_source_not_newer_total"


class CheckError(Exception):
    pass


class Proxy:
    def __init__(self, cmd: list[str]) -> None:
        self.cmd = cmd

    def metrics(self) -> str:
        r = subprocess.run(self.cmd, capture_output=True, text=True, timeout=10, check=False)
        if r.returncode != 0:
            raise CheckError(f"could not read the proxy's metrics: {r.stderr.strip()}")
        return r.stdout

    def sample(self, name: str, **labels: str) -> int:
        v = value(self.metrics(), name, labels)
        return int(v) if v is not None else 0

    def rejected(self, reason: str) -> int:
        return self.sample(REJECTED, source="kafka", reason=reason)

    def version(self) -> int:
        return self.sample(VERSION)

    def not_newer(self) -> int:
        return self.sample(NOT_NEWER, source="kafka")


def trainer_message(bootstrap: str, topic: str, version: int) -> tuple[bytes, bytes]:
    """(value, signature header) of the topic's message of ``version``."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"signed-tables-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    try:
        tp = TopicPartition(topic, 0)
        lo, hi = c.get_watermark_offsets(tp, timeout=10)
        tp.offset = lo
        c.assign([tp])
        found: tuple[bytes, bytes] | None = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is None or m.error() is not None:
                continue
            headers = dict(m.headers() or [])
            if m.key() == KAFKA_KEY and headers.get(HEADER_VERSION) == str(version).encode():
                value_ = m.value()
                sig = headers.get(HEADER_SIGNATURE)
                if value_ is None or sig is None:
                    raise CheckError(f"the trainer's message of v{version} has no signature")
                found = (value_, sig if isinstance(sig, bytes) else sig.encode())
            if (m.offset() or 0) + 1 >= hi:
                break
    finally:
        c.close()
    if found is None:
        raise CheckError(f"no message of version {version} under key fleet on {topic}")
    return found


def table(
    version: int, source: str, cell: int = 1, valid_s: float = 3600.0, stamped: bool = True
) -> bytes:
    """A well-formed table (cell 0 is out of range: malformed), issued a
    minute ago and valid ``valid_s`` from then (negative: expired)."""
    now = int(time.time())
    body: dict[str, object] = {
        "format": "polycorn-failure-table/1",
        "version": version,
        "source": source,
        "entries": [{"cell": cell, "direction": "increasing", "position_m": 100.0}],
    }
    if stamped:
        body["issued_unix_s"] = now - 60
        body["expires_unix_s"] = now - 60 + int(valid_s)
    return json.dumps(body, separators=(",", ":")).encode()


def produce(bootstrap: str, topic: str, body: bytes, signature: bytes | None) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "compression.type": "lz4"})
    headers: list[tuple[str, str | bytes | None]] = []
    if signature is not None:
        headers.append((HEADER_SIGNATURE, signature))
    p.produce(topic, key=KAFKA_KEY, value=body, headers=headers)
    if p.flush(30) != 0:
        raise CheckError("the test's table was not delivered to Kafka")


def wait_for(what: str, cond: Callable[[], bool], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.5)
    raise CheckError(f"after {seconds:.0f} s: {what}")


def run(a: argparse.Namespace) -> None:
    proxy = Proxy(shlex.split(a.metrics_cmd))
    signer = TableSigner.load(a.signing_key)
    public = load_pem_public_key(a.verify_key.read_bytes())
    if not isinstance(public, Ed25519PublicKey):
        raise CheckError(f"{a.verify_key} is not an Ed25519 public key")
    v = proxy.version()
    if v < 1:
        raise CheckError("the proxy has no table in use (the trainer's should be)")

    # 1. The trainer's own table: signed over exactly the bytes on the topic.
    body, sig = trainer_message(a.bootstrap, a.topic, v)
    try:
        public.verify(base64.b64decode(sig, validate=True), body)
    except InvalidSignature:
        raise CheckError(f"the trainer's v{v} on the topic does not verify") from None
    print(f"proxy: the trainer's signed table v{v} from Kafka in use (signature verified here too)")

    # 2. Refused for their signature, each counted; v stays.
    forged = table(v + 1, "other-key")
    other = base64.b64encode(Ed25519PrivateKey.generate().sign(forged))
    attempts: list[tuple[str, bytes, bytes | None]] = [
        ("signed with another key", forged, other),
        ("unsigned", table(v + 2, "unsigned"), None),
        ("carrying the trainer's signature of another table", table(v + 3, "replayed"), sig),
    ]
    for what, t, s in attempts:
        before = proxy.rejected("signature")
        produce(a.bootstrap, a.topic, t, s)

        def counted(b: int = before) -> bool:
            return proxy.rejected("signature") >= b + 1

        wait_for(f"a table {what} was not counted as reason=signature ({before} before)", counted)
        if proxy.rejected("signature") != before + 1 or proxy.version() != v:
            raise CheckError(
                f"a table {what}: signature refusals {before} -> {proxy.rejected('signature')}, "
                f"version {v} -> {proxy.version()}"
            )
        print(f"proxy: a table {what} refused (reason=signature, now {before + 1}); v{v} stays")

    # 3. Signed by the trainer's key but malformed (cell 0; no issue time
    # and expiry): refused as malformed.
    for what, broken in (
        ("malformed", table(v + 4, "broken", cell=0)),
        ("without issue time and expiry", table(v + 4, "unstamped", stamped=False)),
    ):
        before = proxy.rejected("malformed")
        produce(a.bootstrap, a.topic, broken, signer.sign(broken).encode())

        def malformed(b: int = before) -> bool:
            return proxy.rejected("malformed") >= b + 1

        wait_for(
            f"a table {what} signed with the trainer's key was not counted as reason=malformed",
            malformed,
        )
        if proxy.version() != v:
            raise CheckError(f"the proxy left v{v} for a table {what} ({proxy.version()})")
        print(f"proxy: a table {what} with the trainer's signature refused (malformed); v{v} stays")

    # 4. Signed by the trainer's key but expired: refused as expired.
    before = proxy.rejected("expired")
    stale = table(v + 4, "expired", valid_s=30)
    produce(a.bootstrap, a.topic, stale, signer.sign(stale).encode())
    wait_for(
        "an expired table signed with the trainer's key was not counted as reason=expired",
        lambda: proxy.rejected("expired") >= before + 1,
    )
    if proxy.version() != v:
        raise CheckError(f"the proxy left v{v} for an expired table ({proxy.version()})")
    print(f"proxy: an expired table with the trainer's signature refused (expired); v{v} stays")

    # 5. And a good one with the trainer's key is still taken.
    good = table(v + 5, "signed-after-refusals")
    produce(a.bootstrap, a.topic, good, signer.sign(good).encode())
    wait_for(f"the signed v{v + 5} was not taken", lambda: proxy.version() == v + 5)
    print(f"proxy: a table signed with the trainer's key after them taken (v{v + 5})")

    # 6. The trainer's own v, replayed: ignored, v + 5 stays.
    before = proxy.not_newer()
    produce(a.bootstrap, a.topic, body, sig)
    wait_for(
        f"the replayed v{v} was not counted as not newer",
        lambda: proxy.not_newer() >= before + 1,
    )
    if proxy.version() != v + 5:
        raise CheckError(f"the replayed v{v} moved the proxy to {proxy.version()}")
    print(f"proxy: the trainer's own v{v} replayed: ignored (not newer); v{v + 5} stays")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bootstrap", required=True, help="a listener the test may write the topic on")
    p.add_argument("--topic", required=True, help="the table topic the proxy follows")
    p.add_argument("--signing-key", type=Path, required=True, help="the trainer's private key")
    p.add_argument("--verify-key", type=Path, required=True, help="the proxy's verify-key file")
    p.add_argument("--metrics-cmd", required=True, help="prints the proxy's /metrics")
    a = p.parse_args(argv)
    try:
        run(a)
    except CheckError as e:
        print(f"signed_tables: FAIL: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
