"""Run inside the trainer's container by the compose suite (piped to ``python3 -``):
produce a failure table to the table topic as the trainer does
(``polycorn_trainer.kafka.produce_table``), signed with the key the pki job gave
the trainer (``POLYCORN_TRAINER_TABLE_SIGNING_KEY``), unsigned, or signed with
another key. A signed table must carry its issue time and expiry; every kind
carries them, so the unsigned and other-key tables are refused for their
signature alone.

    python3 - KIND VERSION      KIND: signed | unsigned | other
"""

import base64
import json
import os
import sys
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from polycorn_trainer.kafka import produce_table
from polycorn_trainer.signing import TableSigner

kind, version = sys.argv[1], int(sys.argv[2])
issued = int(time.time())
body = json.dumps(
    {
        "format": "polycorn-failure-table/1",
        "version": version,
        "source": f"compose-{kind}",
        "issued_unix_s": issued,
        "expires_unix_s": issued + 3600,
        "entries": [{"cell": 1, "direction": "increasing", "position_m": 100.0}],
    },
    separators=(",", ":"),
).encode()
signer = TableSigner.load(Path(os.environ["POLYCORN_TRAINER_TABLE_SIGNING_KEY"]))
sig = {
    "signed": signer.sign(body),
    "unsigned": None,
    "other": base64.b64encode(Ed25519PrivateKey.generate().sign(body)).decode(),
}[kind]
produce_table(
    os.environ["POLYCORN_KAFKA_BOOTSTRAP"],
    "polycorn.failure-tables.v1",
    body,
    version=version,
    etag=f'"{kind}-{version}"',
    signature=sig,
)
