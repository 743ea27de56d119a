//! The telemetry schema's shared test vectors (schema/telemetry/v1/vectors.jsonl),
//! Rust side; schema/tests/test_vectors.py is the Python side. Every vector
//! must decode to the record built here by hand and encode back to the same
//! bytes, so field numbers, types and encodings cannot drift between the
//! two languages.

use polycorn_telemetry::v1::{self, record::Body};
use prost::Message as _;

fn expected(name: &str) -> v1::Record {
    let rec = |train: &str, t: i64, body: Option<Body>| v1::Record { train_id: train.into(), time_unix_ms: t, body };
    match name {
        "gps_with_track" => rec(
            "train-0001",
            1_795_000_000_123,
            Some(Body::Gps(v1::GpsFix {
                lat_deg: 39.865,
                lon_deg: 116.378,
                speed_mps: 83.3,
                heading_deg: 171.5,
                accuracy_m: 4.5,
                track_m: Some(12_345.6),
            })),
        ),
        "gps_without_track" => rec(
            "train-0001",
            1_795_000_000_500,
            Some(Body::Gps(v1::GpsFix {
                lat_deg: -33.9,
                lon_deg: -70.6,
                speed_mps: 0.0,
                heading_deg: 359.9,
                accuracy_m: 0.0,
                track_m: None,
            })),
        ),
        "cell_sample" => rec(
            "train-0002",
            1_795_000_001_000,
            Some(Body::Cell(v1::CellSample {
                path: 1,
                carrier: "carrier-b".into(),
                cell_id: (2 << 32) | 7,
                rsrp_dbm: Some(-101.5),
                registration: v1::RegistrationState::Registered as i32,
                measured_unix_ms: 1_795_000_000_800,
            })),
        ),
        "cell_sample_no_service" => rec(
            "train-0002",
            1_795_000_001_100,
            Some(Body::Cell(v1::CellSample {
                path: 0,
                carrier: "carrier-a".into(),
                cell_id: 0,
                rsrp_dbm: None,
                registration: v1::RegistrationState::Searching as i32,
                measured_unix_ms: 0,
            })),
        ),
        "handover_failure" => rec(
            "train-0003",
            1_795_000_010_000,
            Some(Body::Handover(v1::HandoverEvent {
                path: 0,
                carrier: "carrier-a".into(),
                source_cell_id: (1 << 32) | 41,
                target_cell_id: (1 << 32) | 42,
                start_unix_ms: 1_795_000_007_900,
                start_lat_deg: 39.7,
                start_lon_deg: 116.4,
                start_track_m: Some(30_512.25),
                rsrp_dbm: Some(-112.0),
                outcome: v1::HandoverOutcome::Failure as i32,
                duration_ms: 2_100,
            })),
        ),
        "handover_success_no_track" => rec(
            "train-0003",
            1_795_000_020_000,
            Some(Body::Handover(v1::HandoverEvent {
                path: 2,
                carrier: "carrier-c".into(),
                source_cell_id: 268_435_455,
                target_cell_id: 1,
                start_unix_ms: 1_795_000_019_950,
                start_lat_deg: 39.6,
                start_lon_deg: 116.5,
                start_track_m: None,
                rsrp_dbm: None,
                outcome: v1::HandoverOutcome::Success as i32,
                duration_ms: 50,
            })),
        ),
        "path_statistics" => rec(
            "train-0004",
            1_795_000_030_000,
            Some(Body::Path(v1::PathStatistics {
                path: 1,
                carrier: "carrier-b".into(),
                up: true,
                srtt_us: 48_000,
                rate_bps: 25_000_000,
                bytes_sent: 10_000_000_000,
                bytes_acked: 9_999_000_000,
                reinjected_bytes: 123_456,
                redundant_bytes: 7_890,
                rto_count: 3,
            })),
        ),
        "empty_body" => rec("train-0004", 0, None),
        other => panic!("vector {other:?} has no expected record here: add it to this test"),
    }
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
}

#[test]
fn every_shared_vector_decodes_to_the_same_record_and_encodes_to_the_same_bytes() {
    let text = include_str!("../../../schema/telemetry/v1/vectors.jsonl");
    let mut n = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).expect("a vector is JSON");
        let name = v["name"].as_str().expect("name");
        let bytes = hex(v["hex"].as_str().expect("hex"));
        let decoded = v1::Record::decode(bytes.as_slice()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = expected(name);
        assert_eq!(decoded, want, "{name}: decoded values differ");
        assert_eq!(want.encode_to_vec(), bytes, "{name}: Rust encodes different bytes than Python");
        n += 1;
    }
    assert_eq!(n, 8, "every vector was checked");
}
