"""Write schema/telemetry/v1/vectors.jsonl: the shared test vectors of the
telemetry schema. Each line is one Record as protobuf JSON (`json`) and its
encoding (`hex`). The Python tests (schema/tests/test_vectors.py) and the Rust
tests (crates/telemetry, `vectors` test) both check that they decode every
vector to the same values and encode those values to the same bytes, so the
two languages cannot drift apart. Run after an additive schema change:

    uv run --all-packages python schema/gen_vectors.py
"""

from __future__ import annotations

import json
from pathlib import Path

from google.protobuf import json_format

from polycorn_schema.telemetry.v1 import telemetry_pb2 as pb

OUT = Path(__file__).parent / "telemetry" / "v1" / "vectors.jsonl"


def vectors() -> list[tuple[str, pb.Record]]:
    v: list[tuple[str, pb.Record]] = []
    r = pb.Record(train_id="train-0001", time_unix_ms=1_795_000_000_123)
    r.gps.CopyFrom(
        pb.GpsFix(
            lat_deg=39.865,
            lon_deg=116.378,
            speed_mps=83.3,
            heading_deg=171.5,
            accuracy_m=4.5,
            track_m=12_345.6,
        )
    )
    v.append(("gps_with_track", r))
    r = pb.Record(train_id="train-0001", time_unix_ms=1_795_000_000_500)
    r.gps.CopyFrom(pb.GpsFix(lat_deg=-33.9, lon_deg=-70.6, speed_mps=0.0, heading_deg=359.9))
    v.append(("gps_without_track", r))
    r = pb.Record(train_id="train-0002", time_unix_ms=1_795_000_001_000)
    r.cell.CopyFrom(
        pb.CellSample(
            path=1,
            carrier="carrier-b",
            cell_id=(2 << 32) | 7,
            rsrp_dbm=-101.5,
            registration=pb.REGISTRATION_STATE_REGISTERED,
            measured_unix_ms=1_795_000_000_800,
        )
    )
    v.append(("cell_sample", r))
    r = pb.Record(train_id="train-0002", time_unix_ms=1_795_000_001_100)
    r.cell.CopyFrom(
        pb.CellSample(path=0, carrier="carrier-a", registration=pb.REGISTRATION_STATE_SEARCHING)
    )
    v.append(("cell_sample_no_service", r))
    r = pb.Record(train_id="train-0003", time_unix_ms=1_795_000_010_000)
    r.handover.CopyFrom(
        pb.HandoverEvent(
            path=0,
            carrier="carrier-a",
            source_cell_id=(1 << 32) | 41,
            target_cell_id=(1 << 32) | 42,
            start_unix_ms=1_795_000_007_900,
            start_lat_deg=39.7,
            start_lon_deg=116.4,
            start_track_m=30_512.25,
            rsrp_dbm=-112.0,
            outcome=pb.HANDOVER_OUTCOME_FAILURE,
            duration_ms=2_100,
        )
    )
    v.append(("handover_failure", r))
    r = pb.Record(train_id="train-0003", time_unix_ms=1_795_000_020_000)
    r.handover.CopyFrom(
        pb.HandoverEvent(
            path=2,
            carrier="carrier-c",
            source_cell_id=268_435_455,
            target_cell_id=1,
            start_unix_ms=1_795_000_019_950,
            start_lat_deg=39.6,
            start_lon_deg=116.5,
            outcome=pb.HANDOVER_OUTCOME_SUCCESS,
            duration_ms=50,
        )
    )
    v.append(("handover_success_no_track", r))
    r = pb.Record(train_id="train-0004", time_unix_ms=1_795_000_030_000)
    r.path.CopyFrom(
        pb.PathStatistics(
            path=1,
            carrier="carrier-b",
            up=True,
            srtt_us=48_000,
            rate_bps=25_000_000,
            bytes_sent=10_000_000_000,
            bytes_acked=9_999_000_000,
            reinjected_bytes=123_456,
            redundant_bytes=7_890,
            rto_count=3,
        )
    )
    v.append(("path_statistics", r))
    v.append(("empty_body", pb.Record(train_id="train-0004", time_unix_ms=0)))
    return v


def main() -> None:
    lines = []
    for name, rec in vectors():
        lines.append(
            json.dumps(
                {
                    "name": name,
                    "hex": rec.SerializeToString(deterministic=True).hex(),
                    "json": json_format.MessageToDict(rec),
                },
                sort_keys=True,
            )
        )
    OUT.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
