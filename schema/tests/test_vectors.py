"""The telemetry schema's shared test vectors (schema/telemetry/v1/vectors.jsonl),
Python side; crates/telemetry/tests/vectors.rs is the Rust side."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import json_format

from polycorn_schema.telemetry.v1 import telemetry_pb2 as pb

SCHEMA = Path(__file__).resolve().parents[1]
VECTORS = [
    json.loads(line)
    for line in (SCHEMA / "telemetry" / "v1" / "vectors.jsonl").read_text().splitlines()
    if line.strip()
]


@pytest.mark.parametrize("v", VECTORS, ids=[v["name"] for v in VECTORS])
def test_each_vector_decodes_to_its_values_and_encodes_to_its_bytes(v: dict[str, object]) -> None:
    decoded = pb.Record.FromString(bytes.fromhex(str(v["hex"])))
    assert json_format.MessageToDict(decoded) == v["json"]
    built = json_format.ParseDict(v["json"], pb.Record())
    assert built.SerializeToString(deterministic=True).hex() == v["hex"]


def test_the_vectors_cover_every_record_kind() -> None:
    kinds = {pb.Record.FromString(bytes.fromhex(v["hex"])).WhichOneof("body") for v in VECTORS}
    assert kinds == {"gps", "cell", "handover", "path", None}


def test_the_generated_python_bindings_are_up_to_date(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{SCHEMA}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            str(SCHEMA / "telemetry" / "v1" / "telemetry.proto"),
        ],
        check=True,
    )
    for name in ("telemetry_pb2.py", "telemetry_pb2.pyi"):
        fresh = (tmp_path / "telemetry" / "v1" / name).read_text()
        committed = (SCHEMA / "polycorn_schema" / "telemetry" / "v1" / name).read_text()
        assert fresh == committed, (
            f"{name} is stale: regenerate with `uv run --all-packages python -m grpc_tools.protoc "
            "-I schema --python_out=schema/polycorn_schema --pyi_out=schema/polycorn_schema "
            "schema/telemetry/v1/telemetry.proto`"
        )
