"""Run inside the trainer's container by the compose suite (piped to ``python3 -``):
produce a failure table to the table topic as the trainer does
(``polycorn_trainer.kafka.produce_table``), signed with the key the pki job gave
the trainer (``POLYCORN_TRAINER_TABLE_SIGNING_KEY``), unsigned, or signed with
another key.

    python3 - KIND VERSION      KIND: signed | unsigned | other
"""

import base64
import json
import os
import sys
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from polycorn_trainer.kafka import produce_table
from polycorn_trainer.signing import TableSigner

kind, version = sys.argv[1], int(sys.argv[2])
body = json.dumps(
    {
        "format": "polycorn-failure-table/1",
        "version": version,
        "source": f"compose-{kind}",
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
