"""Decode-and-validate: every malformed record gets a reason, nothing raises otherwise."""

from __future__ import annotations

import math

import pytest
from helpers import T0, cell, gps, handover, pathstat

import polycorn_schema.telemetry.v1.telemetry_pb2 as pb
from polycorn_ingest.records import InvalidRecordError, Rows, decode


def reason(key: bytes | None, value: bytes | None) -> str:
    with pytest.raises(InvalidRecordError) as e:
        decode(key, value, Rows())
    return e.value.reason


def test_every_kind_of_record_becomes_one_row() -> None:
    rows = Rows()
    for r in (
        gps("t", T0, 39.8, 116.3, 10.0),
        cell("t", T0, "a", 1 << 40),
        handover("t", T0, "a", 1, 2, 39.8, 116.3),
        pathstat("t", T0),
    ):
        decode(b"t", r.SerializeToString(), rows)
    assert (len(rows.fixes), len(rows.samples), len(rows.handovers), len(rows.paths)) == (
        1,
        1,
        1,
        1,
    )
    assert rows.seen["t"] == [T0, T0]
    assert rows.samples[0][4] == 1 << 40


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        (b"t", b"\xff\xff\xff", "decode_error"),
        (b"t", b"", "decode_error"),
        (b"t", pb.Record(train_id="t", time_unix_ms=T0).SerializeToString(), "no_body"),
        (b"", gps("", T0, 1, 1).SerializeToString(), "no_train_id"),
        (b"other", gps("t", T0, 1, 1).SerializeToString(), "key_mismatch"),
        (None, gps("t", T0, 1, 1).SerializeToString(), "key_mismatch"),
        (b"t", gps("t", T0 // 1000, 1, 1).SerializeToString(), "bad_time"),
        (b"t", gps("t", T0, math.nan, 1).SerializeToString(), "bad_position"),
        (b"t", gps("t", T0, 91, 1).SerializeToString(), "bad_position"),
        (b"t", gps("t", T0, 0, 0).SerializeToString(), "bad_position"),
        (b"t", gps("t", T0, 1, 1, math.inf).SerializeToString(), "bad_value"),
        (b"t", cell("t", T0, "", 1).SerializeToString(), "bad_value"),
        (b"t", cell("t", T0, "a\x00b", 1).SerializeToString(), "bad_value"),
        (b"t", cell("t", T0, "a", 2**64 - 1).SerializeToString(), "bad_value"),
        (b"t", cell("t", T0, "a", 1, path=70000).SerializeToString(), "bad_value"),
    ],
)
def test_malformed_records_are_invalid_with_a_reason(
    key: bytes | None, value: bytes, why: str
) -> None:
    assert reason(key, value) == why


def test_a_handover_without_an_outcome_is_invalid() -> None:
    r = handover("t", T0, "a", 1, 2, 39.8, 116.3)
    r.handover.outcome = pb.HANDOVER_OUTCOME_UNSPECIFIED
    assert reason(b"t", r.SerializeToString()) == "bad_value"
