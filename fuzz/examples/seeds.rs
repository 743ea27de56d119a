//! Writes the generated part of the seed corpus (`corpus/`): encoded frames
//! for the decoder, shell scripts for the endpoints, records for the
//! telemetry decoder, DNS and SOCKS5 messages. The text corpora (gpsd,
//! mmcli, failure tables) are copies of the repository's fixtures.
//! `cargo run --example seeds` from fuzz/ rewrites them.

use std::path::Path;

use bytes::Bytes;
use polycorn_core::wire::{Frame, LinkState, VERSION};
use polycorn_core::{ConnId, PathId, UserId};
use polycorn_telemetry::v1;
use prost::Message;

fn write(target: &str, name: &str, data: &[u8]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), data).unwrap();
}

fn frames() -> Vec<Frame> {
    vec![
        Frame::Hello {
            version: VERSION,
            session: 0xdead_beef,
            path: PathId(1),
            train_id: "train-0042".into(),
            path_name: "carrier-a".into(),
        },
        Frame::HelloAck { version: VERSION, session: 9, path: PathId(1), instance: 77 },
        Frame::Open { conn: ConnId(1), user: UserId([1; 16]), dst: "10.99.0.10:80".parse().unwrap() },
        Frame::Open { conn: ConnId(3), user: UserId([2; 16]), dst: "[2001:db8::2]:443".parse().unwrap() },
        Frame::Window { conn: ConnId(1), max_data: 1 << 20 },
        Frame::Data { conn: ConnId(1), offset: 0, fin: false, payload: Bytes::from_static(b"GET / HTTP/1.1\r\n\r\n") },
        Frame::Data { conn: ConnId(1), offset: 100, fin: true, payload: Bytes::from_static(b"tail") },
        Frame::Ack { conn: ConnId(1), cumulative: 18, fin: false, sack: vec![(100, 104)] },
        Frame::Reset { conn: ConnId(3), code: 2 },
        Frame::PathAck { received: 40, delay_us: 17 },
        Frame::Ping { id: 1, timestamp_us: 2 },
        Frame::Pong { id: 1, timestamp_us: 2 },
        Frame::PathStatus { path: PathId(0), state: LinkState::HandoverStarted, cell: 0x1234_5678, seq: 9 },
        Frame::Telemetry { seq: 5, payload: Bytes::from(record().encode_to_vec()) },
        Frame::TelemetryAck { seq: 5 },
    ]
}

fn record() -> v1::Record {
    v1::Record {
        train_id: "train-0042".into(),
        time_unix_ms: 1_700_000_000_000,
        body: Some(v1::record::Body::Gps(v1::GpsFix {
            lat_deg: 39.9,
            lon_deg: 116.4,
            speed_mps: 83.3,
            heading_deg: 160.0,
            accuracy_m: 11.6,
            track_m: Some(12_345.0),
        })),
    }
}

fn main() {
    // Frame decoder: first byte seeds the chunking, then the stream.
    let mut all = vec![7u8];
    for (i, f) in frames().iter().enumerate() {
        let mut one = vec![i as u8];
        f.encode(&mut one);
        write("frame_decoder", &format!("frame-{i:02}"), &one);
        f.encode(&mut all);
    }
    write("frame_decoder", "all-frames", &all);
    let mut ignorable = vec![1u8, 0x85, 0, 2, 9, 9];
    Frame::TelemetryAck { seq: 1 }.encode(&mut ignorable);
    write("frame_decoder", "ignorable-then-ack", &ignorable);

    // Endpoints: [path, op, ...] steps (see polycorn_fuzz::endpoint).
    // Op 1 = frames: count-1, then per frame [conn selector, pick, type, fields].
    let open = [0u8, 1, 0, 1, 1, 2, 1, 1, 10, 0, 99, 10, 80, 0, 0, 0];
    let data = [0u8, 1, 0, 1, 1, 3, 18, 0, 2, 0, 0, 1, 0, 0];
    let ack = [0u8, 1, 0, 1, 1, 6, 2, 18, 0, 1, 4, 0, 4, 0, 1, 0, 0];
    let timeout_transmit = [1u8, 8, 200, 0, 0, 9, 0, 16, 1, 9, 0, 16];
    let ping = [1u8, 1, 0, 1, 1, 10, 1, 5, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let telemetry = [0u8, 1, 0, 1, 1, 12, 3, 1, 2, 3, 0, 5, 0, 0, 0];
    let paths = [2u8, 10, 2, 11, 0, 11, 0, 10];
    let relay_open = [0u8, 12, 1, 10, 0, 13, 0, 0, 4, 1, 0, 9, 0, 0, 64];
    for (name, steps) in [
        ("open", &open[..]),
        ("data", &data[..]),
        ("ack", &ack[..]),
        ("timeout-transmit", &timeout_transmit[..]),
        ("ping", &ping[..]),
        ("telemetry", &telemetry[..]),
        ("paths", &paths[..]),
        ("relay-open-send", &relay_open[..]),
    ] {
        write("endpoint_relay", name, steps);
        write("endpoint_proxy", name, steps);
    }
    let mut session = Vec::new();
    for s in [&open[..], &data, &ack, &timeout_transmit, &ping, &telemetry, &paths] {
        session.extend_from_slice(s);
    }
    write("endpoint_relay", "session", &session);
    write("endpoint_proxy", "session", &session);
    // Raw encoded frames as garbage input (op 0).
    let mut raw = vec![0u8, 0];
    let mut enc = Vec::new();
    frames()[2].encode(&mut enc);
    frames()[5].encode(&mut enc);
    raw.push(enc.len() as u8);
    raw.extend_from_slice(&enc);
    write("endpoint_proxy", "raw-open-data", &raw);

    // Telemetry records.
    write("telemetry_record", "gps", &record().encode_to_vec());
    let mut r = record();
    r.body = None;
    write("telemetry_record", "no-body", &r.encode_to_vec());

    // DNS: a query for example.com A with EDNS0, and a response.
    let query: &[u8] = &[
        0x12, 0x34, 0x01, 0x20, 0, 1, 0, 0, 0, 0, 0, 1, 7, b'e', b'x', b'a', b'm', b'p', b'l', b'e', 3, b'c', b'o',
        b'm', 0, 0, 1, 0, 1, 0, 0, 0x29, 0x10, 0, 0, 0, 0, 0, 0, 0,
    ];
    write("dns", "query-a-edns", query);
    let mut resp = query.to_vec();
    resp[2] |= 0x80;
    write("dns", "response", &resp);

    // SOCKS5: greeting, then a CONNECT by IPv4, IPv6, name; then data.
    write("socks5", "connect-v4", b"\x05\x01\x00\x05\x01\x00\x01\x0a\x63\x00\x0a\x00\x50GET / HTTP/1.0\r\n\r\n");
    write("socks5", "connect-v4-refused", b"\x05\x01\x00\x05\x01\x00\x01\x0a\x63\x00\x0a\x00\x0b");
    let mut v6 = b"\x05\x02\x02\x00\x05\x01\x00\x04".to_vec();
    v6.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0x01, 0xbb]);
    write("socks5", "connect-v6", &v6);
    write("socks5", "connect-name", b"\x05\x01\x00\x05\x01\x00\x03\x0bexample.com\x00\x50hello");
    write("socks5", "connect-name-literal", b"\x05\x01\x00\x05\x01\x00\x03\x0910.0.0.1:\x00\x50");
    write("socks5", "no-acceptable-method", b"\x05\x01\x02");
    write("socks5", "bind", b"\x05\x01\x00\x05\x02\x00\x01\x0a\x63\x00\x0a\x00\x50");
}
