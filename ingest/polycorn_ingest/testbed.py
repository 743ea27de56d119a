"""A testbed trip's ``events.jsonl`` (polycorn-tracegen) as telemetry Records.

What a relay-agent replaying the trip would send: ``gps`` → GpsFix,
``rsrp`` → CellSample, ``handover_start`` + the next ``handover_end`` of the
same carrier and source cell → HandoverEvent (outcome ``success`` or a
failure for ``rlf``/``nas``; position from the last fix at or before the
start). Carrier i is named ``carrier_names[i]`` and its cells get the data
plane's IDs, ``(i + 1) << 32 | cell``. Times are ``epoch_ms + t_ms``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polycorn_schema.telemetry.v1.telemetry_pb2 as pb


def testbed_cell_id(carrier: int, cell: int) -> int:
    return (carrier + 1) << 32 | cell


def records(
    path: Path, train: str, epoch_ms: int, carrier_names: list[str], *, gps_only: bool = False
) -> Iterator[pb.Record]:
    """The trip's records; ``gps_only``: fixes and handovers without the
    log's track position, as a train with a plain GPS receiver sends them
    (ingest then map-matches them onto LinkDB's routes)."""
    last_fix: dict[str, Any] | None = None
    starts: dict[tuple[int, int], dict[str, Any]] = {}

    def name(i: int) -> str:
        return carrier_names[i] if i < len(carrier_names) else f"carrier-{i}"

    with path.open() as f:
        for line in f:
            if not line.strip():
                continue
            e = json.loads(line)
            kind = e.get("event")
            t = epoch_ms + int(e["t_ms"])
            if kind == "gps":
                last_fix = e
                g = pb.GpsFix(
                    lat_deg=e["lat"],
                    lon_deg=e["lon"],
                    speed_mps=e["speed_mps"],
                    heading_deg=e["heading_deg"],
                    accuracy_m=e["accuracy_m"],
                    track_m=None if gps_only else e["track_m"],
                )
                yield pb.Record(train_id=train, time_unix_ms=t, gps=g)
            elif kind == "rsrp":
                c = int(e["carrier"])
                yield pb.Record(
                    train_id=train,
                    time_unix_ms=t,
                    cell=pb.CellSample(
                        path=c,
                        carrier=name(c),
                        cell_id=testbed_cell_id(c, int(e["cell"])),
                        rsrp_dbm=e["rsrp_dbm"],
                        registration=pb.REGISTRATION_STATE_REGISTERED,
                        measured_unix_ms=epoch_ms + int(e["measured_ms"]),
                    ),
                )
            elif kind == "handover_start":
                starts[(int(e["carrier"]), int(e["from_cell"]))] = {**e, "fix": last_fix}
            elif kind == "handover_end":
                c = int(e["carrier"])
                s = starts.pop((c, int(e["from_cell"])), None)
                if s is None or s["fix"] is None:
                    continue
                fix = s["fix"]
                yield pb.Record(
                    train_id=train,
                    time_unix_ms=t,
                    handover=pb.HandoverEvent(
                        path=c,
                        carrier=name(c),
                        source_cell_id=testbed_cell_id(c, int(e["from_cell"])),
                        target_cell_id=testbed_cell_id(c, int(e["to_cell"])),
                        start_unix_ms=epoch_ms + int(s["t_ms"]),
                        start_lat_deg=fix["lat"],
                        start_lon_deg=fix["lon"],
                        start_track_m=None if gps_only else s["track_m"],
                        rsrp_dbm=s.get("rsrp_dbm"),
                        outcome=pb.HANDOVER_OUTCOME_SUCCESS
                        if e["outcome"] == "success"
                        else pb.HANDOVER_OUTCOME_FAILURE,
                        duration_ms=int(e["duration_ms"]),
                    ),
                )
