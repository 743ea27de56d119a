//! Wire protocol v1, spoken over every subflow (a TLS 1.3 byte stream, or one
//! kernel MPTCP connection).
//!
//! Every frame is `type: u8 | length: u16 (big endian) | payload`. All
//! integers are big endian. Frame types below `0x80` must be understood;
//! unknown types from `0x80` up are skipped, so later versions can add
//! optional frames without breaking older peers. The full description, with
//! the rationale for each field, is in `docs/wire-protocol.md`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use bytes::{Buf, Bytes, BytesMut};

use crate::ids::{ConnId, PathId, UserId};

/// Protocol version carried in `HELLO`.
pub const VERSION: u8 = 1;
/// First four bytes of every `HELLO`.
pub const MAGIC: [u8; 4] = *b"PCRN";
/// Frame header: type and length.
pub const HEADER_LEN: usize = 3;
/// Largest payload a frame may carry.
pub const MAX_PAYLOAD: usize = u16::MAX as usize;
/// Largest telemetry record a `TELEMETRY` frame carries (its seq takes 8
/// bytes of the payload).
pub const MAX_TELEMETRY_PAYLOAD: usize = MAX_PAYLOAD - 8;
/// Fixed part of a `DATA` frame payload: conn, offset, flags.
pub const DATA_OVERHEAD: usize = HEADER_LEN + 4 + 8 + 1;
/// Most selective-acknowledgement ranges one `ACK` carries.
pub const MAX_SACK_RANGES: usize = 8;

mod ty {
    pub const HELLO: u8 = 0x01;
    pub const HELLO_ACK: u8 = 0x02;
    pub const OPEN: u8 = 0x10;
    pub const DATA: u8 = 0x11;
    pub const ACK: u8 = 0x12;
    pub const WINDOW: u8 = 0x13;
    pub const RESET: u8 = 0x14;
    pub const PATH_ACK: u8 = 0x20;
    pub const PING: u8 = 0x21;
    pub const PONG: u8 = 0x22;
    pub const PATH_STATUS: u8 = 0x23;
    pub const TELEMETRY: u8 = 0x30;
    pub const TELEMETRY_ACK: u8 = 0x31;
    pub const FIRST_IGNORABLE: u8 = 0x80;
}

/// `DATA` flag: this frame ends the byte stream of its direction.
pub const DATA_FIN: u8 = 0x01;
/// `ACK` flag: the receiver has the FIN of this direction.
pub const ACK_FIN: u8 = 0x01;

/// The state of a radio interface, as the relay-agent reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum LinkState {
    /// Registered on `cell` and passing traffic.
    Connected = 0,
    /// A handover has started; `cell` is the source cell.
    HandoverStarted = 1,
    /// No service (for example after a failed handover).
    NoService = 2,
}

impl LinkState {
    fn from_u8(v: u8) -> Result<Self, WireError> {
        Ok(match v {
            0 => LinkState::Connected,
            1 => LinkState::HandoverStarted,
            2 => LinkState::NoService,
            other => return Err(WireError::BadField("PATH_STATUS.state", u64::from(other))),
        })
    }
}

/// One decoded frame. Payload-carrying variants hold [`Bytes`] views of
/// the receive buffer, so decoding does not copy passenger data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// First frame of a subflow, relay → proxy.
    Hello {
        version: u8,
        /// Random per relay-agent start; a new session replaces the old one.
        session: u64,
        path: PathId,
        train_id: String,
        path_name: String,
    },
    /// Proxy's answer to `HELLO`. `instance` is random per proxy start: a
    /// relay that sees it change knows the proxy lost every connection.
    HelloAck { version: u8, session: u64, path: PathId, instance: u64 },
    /// A passenger opened a connection to `dst`.
    Open { conn: ConnId, user: UserId, dst: SocketAddr },
    /// Bytes `[offset, offset + len)` of `conn`'s stream in this direction.
    Data { conn: ConnId, offset: u64, fin: bool, payload: Bytes },
    /// Data-level acknowledgement: everything below `cumulative` and each
    /// `[start, end)` range in `sack` has arrived.
    Ack { conn: ConnId, cumulative: u64, fin: bool, sack: Vec<(u64, u64)> },
    /// Flow control: the sender may send `conn` bytes below `max_data`.
    Window { conn: ConnId, max_data: u64 },
    /// Abort `conn` in both directions.
    Reset { conn: ConnId, code: u32 },
    /// Path-level acknowledgement: `received` bytes of ack-eliciting frames
    /// have arrived on this subflow; the newest arrived `delay_us` ago.
    PathAck { received: u64, delay_us: u32 },
    /// Liveness and RTT probe.
    Ping { id: u64, timestamp_us: u64 },
    /// Echo of a `PING`.
    Pong { id: u64, timestamp_us: u64 },
    /// A radio interface changed cell or state (relay → proxy).
    /// `seq` orders reports (per sender, wrapping): the same report goes out
    /// on every live path, and a late copy of an older one must not undo a
    /// newer one.
    PathStatus { path: PathId, state: LinkState, cell: u64, seq: u32 },
    /// One telemetry record; the payload schema is versioned separately.
    Telemetry { seq: u64, payload: Bytes },
    /// The proxy has stored telemetry up to and including `seq`.
    TelemetryAck { seq: u64 },
}

/// Why bytes could not be decoded. The subflow carrying them is closed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("decoding frame: unknown mandatory frame type {0:#04x} (peer speaks a newer protocol?)")]
    UnknownType(u8),
    #[error("decoding {0} frame: payload too short")]
    Truncated(&'static str),
    #[error("decoding frame: field {0} has invalid value {1}")]
    BadField(&'static str, u64),
    #[error("decoding HELLO: bad magic (not a Polycorn peer)")]
    BadMagic,
    #[error("decoding frame: {0} is not valid UTF-8")]
    BadUtf8(&'static str),
}

impl Frame {
    /// Whether the receiver acknowledges this frame with `PATH_ACK`.
    /// `PATH_ACK` itself is not, so acknowledgements never ping-pong.
    pub fn is_ack_eliciting(&self) -> bool {
        !matches!(self, Frame::PathAck { .. })
    }

    /// Append the encoded frame to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0, 0, 0]);
        let t = match self {
            Frame::Hello { version, session, path, train_id, path_name } => {
                out.extend_from_slice(&MAGIC);
                out.push(*version);
                out.extend_from_slice(&session.to_be_bytes());
                out.push(path.0);
                put_str(out, train_id);
                put_str(out, path_name);
                ty::HELLO
            }
            Frame::HelloAck { version, session, path, instance } => {
                out.push(*version);
                out.extend_from_slice(&session.to_be_bytes());
                out.push(path.0);
                out.extend_from_slice(&instance.to_be_bytes());
                ty::HELLO_ACK
            }
            Frame::Open { conn, user, dst } => {
                out.extend_from_slice(&conn.0.to_be_bytes());
                out.extend_from_slice(&user.0);
                match dst.ip() {
                    IpAddr::V4(a) => {
                        out.push(4);
                        out.extend_from_slice(&a.octets());
                    }
                    IpAddr::V6(a) => {
                        out.push(6);
                        out.extend_from_slice(&a.octets());
                    }
                }
                out.extend_from_slice(&dst.port().to_be_bytes());
                ty::OPEN
            }
            Frame::Data { conn, offset, fin, payload } => {
                encode_data_header(out, *conn, *offset, *fin);
                out.extend_from_slice(payload);
                ty::DATA
            }
            Frame::Ack { conn, cumulative, fin, sack } => {
                out.extend_from_slice(&conn.0.to_be_bytes());
                out.extend_from_slice(&cumulative.to_be_bytes());
                out.push(if *fin { ACK_FIN } else { 0 });
                let n = sack.len().min(MAX_SACK_RANGES);
                out.push(n as u8);
                for (s, e) in &sack[..n] {
                    out.extend_from_slice(&s.to_be_bytes());
                    out.extend_from_slice(&e.to_be_bytes());
                }
                ty::ACK
            }
            Frame::Window { conn, max_data } => {
                out.extend_from_slice(&conn.0.to_be_bytes());
                out.extend_from_slice(&max_data.to_be_bytes());
                ty::WINDOW
            }
            Frame::Reset { conn, code } => {
                out.extend_from_slice(&conn.0.to_be_bytes());
                out.extend_from_slice(&code.to_be_bytes());
                ty::RESET
            }
            Frame::PathAck { received, delay_us } => {
                out.extend_from_slice(&received.to_be_bytes());
                out.extend_from_slice(&delay_us.to_be_bytes());
                ty::PATH_ACK
            }
            Frame::Ping { id, timestamp_us } => {
                out.extend_from_slice(&id.to_be_bytes());
                out.extend_from_slice(&timestamp_us.to_be_bytes());
                ty::PING
            }
            Frame::Pong { id, timestamp_us } => {
                out.extend_from_slice(&id.to_be_bytes());
                out.extend_from_slice(&timestamp_us.to_be_bytes());
                ty::PONG
            }
            Frame::PathStatus { path, state, cell, seq } => {
                out.push(path.0);
                out.push(*state as u8);
                out.extend_from_slice(&cell.to_be_bytes());
                out.extend_from_slice(&seq.to_be_bytes());
                ty::PATH_STATUS
            }
            Frame::Telemetry { seq, payload } => {
                out.extend_from_slice(&seq.to_be_bytes());
                out.extend_from_slice(payload);
                ty::TELEMETRY
            }
            Frame::TelemetryAck { seq } => {
                out.extend_from_slice(&seq.to_be_bytes());
                ty::TELEMETRY_ACK
            }
        };
        let len = out.len() - start - HEADER_LEN;
        assert!(len <= MAX_PAYLOAD, "frame payload of {len} bytes exceeds the wire limit");
        out[start] = t;
        out[start + 1..start + 3].copy_from_slice(&(len as u16).to_be_bytes());
    }

    /// Encoded size in bytes.
    pub fn encoded_len(&self) -> usize {
        let mut v = Vec::new();
        self.encode(&mut v);
        v.len()
    }
}

/// Write a `DATA` frame header for `payload_len` bytes; the caller appends
/// the payload. Used by the endpoint to copy passenger bytes straight from
/// its send buffer into the output without an intermediate `Bytes`.
pub fn encode_data_frame(out: &mut Vec<u8>, conn: ConnId, offset: u64, fin: bool, payload: &[u8]) {
    assert!(payload.len() + DATA_OVERHEAD - HEADER_LEN <= MAX_PAYLOAD);
    let len = (payload.len() + DATA_OVERHEAD - HEADER_LEN) as u16;
    out.push(ty::DATA);
    out.extend_from_slice(&len.to_be_bytes());
    encode_data_header(out, conn, offset, fin);
    out.extend_from_slice(payload);
}

fn encode_data_header(out: &mut Vec<u8>, conn: ConnId, offset: u64, fin: bool) {
    out.extend_from_slice(&conn.0.to_be_bytes());
    out.extend_from_slice(&offset.to_be_bytes());
    out.push(if fin { DATA_FIN } else { 0 });
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    let b = s.as_bytes();
    let n = b.len().min(255);
    out.push(n as u8);
    out.extend_from_slice(&b[..n]);
}

struct Reader {
    name: &'static str,
    b: Bytes,
}

impl Reader {
    fn need(&self, n: usize) -> Result<(), WireError> {
        if self.b.remaining() < n {
            Err(WireError::Truncated(self.name))
        } else {
            Ok(())
        }
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        self.need(1)?;
        Ok(self.b.get_u8())
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        self.need(2)?;
        Ok(self.b.get_u16())
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        self.need(4)?;
        Ok(self.b.get_u32())
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        self.need(8)?;
        Ok(self.b.get_u64())
    }
    fn bytes(&mut self, n: usize) -> Result<Bytes, WireError> {
        self.need(n)?;
        Ok(self.b.split_to(n))
    }
    fn string(&mut self, field: &'static str) -> Result<String, WireError> {
        let n = usize::from(self.u8()?);
        let b = self.bytes(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| WireError::BadUtf8(field))
    }
    fn rest(&mut self) -> Bytes {
        std::mem::take(&mut self.b)
    }
    fn path(&mut self) -> Result<PathId, WireError> {
        let p = self.u8()?;
        if usize::from(p) >= crate::ids::MAX_PATHS {
            return Err(WireError::BadField("path", u64::from(p)));
        }
        Ok(PathId(p))
    }
}

/// Decode one frame payload of type `t`. `Ok(None)` for an ignorable
/// unknown frame.
pub fn decode_frame(t: u8, payload: Bytes) -> Result<Option<Frame>, WireError> {
    let name = match t {
        ty::HELLO => "HELLO",
        ty::HELLO_ACK => "HELLO_ACK",
        ty::OPEN => "OPEN",
        ty::DATA => "DATA",
        ty::ACK => "ACK",
        ty::WINDOW => "WINDOW",
        ty::RESET => "RESET",
        ty::PATH_ACK => "PATH_ACK",
        ty::PING => "PING",
        ty::PONG => "PONG",
        ty::PATH_STATUS => "PATH_STATUS",
        ty::TELEMETRY => "TELEMETRY",
        ty::TELEMETRY_ACK => "TELEMETRY_ACK",
        t if t >= ty::FIRST_IGNORABLE => return Ok(None),
        t => return Err(WireError::UnknownType(t)),
    };
    let mut r = Reader { name, b: payload };
    let f = match t {
        ty::HELLO => {
            let magic = r.bytes(4)?;
            if magic[..] != MAGIC {
                return Err(WireError::BadMagic);
            }
            Frame::Hello {
                version: r.u8()?,
                session: r.u64()?,
                path: r.path()?,
                train_id: r.string("HELLO.train_id")?,
                path_name: r.string("HELLO.path_name")?,
            }
        }
        ty::HELLO_ACK => Frame::HelloAck { version: r.u8()?, session: r.u64()?, path: r.path()?, instance: r.u64()? },
        ty::OPEN => {
            let conn = ConnId(r.u32()?);
            let mut user = [0u8; 16];
            user.copy_from_slice(&r.bytes(16)?);
            let ip = match r.u8()? {
                4 => {
                    let o = r.bytes(4)?;
                    IpAddr::V4(Ipv4Addr::new(o[0], o[1], o[2], o[3]))
                }
                6 => {
                    let mut o = [0u8; 16];
                    o.copy_from_slice(&r.bytes(16)?);
                    IpAddr::V6(Ipv6Addr::from(o))
                }
                other => return Err(WireError::BadField("OPEN.family", u64::from(other))),
            };
            let port = r.u16()?;
            Frame::Open { conn, user: UserId(user), dst: SocketAddr::new(ip, port) }
        }
        ty::DATA => {
            let conn = ConnId(r.u32()?);
            let offset = r.u64()?;
            let flags = r.u8()?;
            let payload = r.rest();
            if offset.checked_add(payload.len() as u64).is_none() {
                return Err(WireError::BadField("DATA.offset", offset));
            }
            Frame::Data { conn, offset, fin: flags & DATA_FIN != 0, payload }
        }
        ty::ACK => {
            let conn = ConnId(r.u32()?);
            let cumulative = r.u64()?;
            let fin = r.u8()? & ACK_FIN != 0;
            let n = usize::from(r.u8()?);
            if n > MAX_SACK_RANGES {
                return Err(WireError::BadField("ACK.ranges", n as u64));
            }
            let mut sack = Vec::with_capacity(n);
            for _ in 0..n {
                let (s, e) = (r.u64()?, r.u64()?);
                if s >= e || s < cumulative {
                    return Err(WireError::BadField("ACK.range", s));
                }
                sack.push((s, e));
            }
            Frame::Ack { conn, cumulative, fin, sack }
        }
        ty::WINDOW => Frame::Window { conn: ConnId(r.u32()?), max_data: r.u64()? },
        ty::RESET => Frame::Reset { conn: ConnId(r.u32()?), code: r.u32()? },
        ty::PATH_ACK => Frame::PathAck { received: r.u64()?, delay_us: r.u32()? },
        ty::PING => Frame::Ping { id: r.u64()?, timestamp_us: r.u64()? },
        ty::PONG => Frame::Pong { id: r.u64()?, timestamp_us: r.u64()? },
        ty::PATH_STATUS => {
            Frame::PathStatus { path: r.path()?, state: LinkState::from_u8(r.u8()?)?, cell: r.u64()?, seq: r.u32()? }
        }
        ty::TELEMETRY => Frame::Telemetry { seq: r.u64()?, payload: r.rest() },
        ty::TELEMETRY_ACK => Frame::TelemetryAck { seq: r.u64()? },
        _ => unreachable!("type checked above"),
    };
    Ok(Some(f))
}

/// Splits a subflow's byte stream into frames. Holds at most one partial
/// frame (≤ 64 KiB + header) between calls.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: BytesMut,
}

/// A decoded frame with its encoded size, which the path-level
/// acknowledgement counts.
#[derive(Debug)]
pub struct Decoded {
    pub frame: Frame,
    pub wire_len: usize,
}

impl FrameDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Append received bytes.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Next complete frame, if any. Ignorable unknown frames are skipped
    /// and returned as `None` frames counted in `skipped_len` of the next
    /// result; to keep it simple the decoder reports them as `Ok(None)`
    /// only when no complete frame remains.
    pub fn next_frame(&mut self) -> Result<Option<Decoded>, WireError> {
        loop {
            if self.buf.len() < HEADER_LEN {
                return Ok(None);
            }
            let t = self.buf[0];
            let len = usize::from(u16::from_be_bytes([self.buf[1], self.buf[2]]));
            if self.buf.len() < HEADER_LEN + len {
                // Reserve so a large DATA frame is read in few reallocations.
                self.buf.reserve(HEADER_LEN + len - self.buf.len());
                return Ok(None);
            }
            let mut whole = self.buf.split_to(HEADER_LEN + len).freeze();
            let payload = whole.split_off(HEADER_LEN);
            match decode_frame(t, payload)? {
                Some(frame) => return Ok(Some(Decoded { frame, wire_len: HEADER_LEN + len })),
                None => continue,
            }
        }
    }

    /// Bytes held waiting for the rest of a frame.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Frame> {
        vec![
            Frame::Hello {
                version: VERSION,
                session: 0xdead_beef,
                path: PathId(3),
                train_id: "train-0042".into(),
                path_name: "carrier-a".into(),
            },
            Frame::HelloAck { version: VERSION, session: 9, path: PathId(1), instance: 77 },
            Frame::Open {
                conn: ConnId(7),
                user: UserId::from("10.66.0.2".parse::<IpAddr>().unwrap()),
                dst: "10.99.0.10:80".parse().unwrap(),
            },
            Frame::Open {
                conn: ConnId(8),
                user: UserId::from("2001:db8::1".parse::<IpAddr>().unwrap()),
                dst: "[2001:db8::2]:443".parse().unwrap(),
            },
            Frame::Data { conn: ConnId(7), offset: 1 << 40, fin: true, payload: Bytes::from_static(b"hello") },
            Frame::Data { conn: ConnId(7), offset: 0, fin: false, payload: Bytes::new() },
            Frame::Ack { conn: ConnId(7), cumulative: 100, fin: false, sack: vec![(200, 300), (400, 401)] },
            Frame::Window { conn: ConnId(7), max_data: 1 << 20 },
            Frame::Reset { conn: ConnId(7), code: 2 },
            Frame::PathAck { received: 12345, delay_us: 17 },
            Frame::Ping { id: 1, timestamp_us: 2 },
            Frame::Pong { id: 1, timestamp_us: 2 },
            Frame::PathStatus { path: PathId(2), state: LinkState::HandoverStarted, cell: 0x1234_5678, seq: 9 },
            Frame::Telemetry { seq: 5, payload: Bytes::from_static(&[1, 2, 3]) },
            Frame::TelemetryAck { seq: 5 },
        ]
    }

    #[test]
    fn every_frame_round_trips_through_the_decoder() {
        let mut out = Vec::new();
        for f in samples() {
            f.encode(&mut out);
        }
        let mut d = FrameDecoder::new();
        // Feed one byte at a time: frames split anywhere must still decode.
        let mut got = Vec::new();
        for b in &out {
            d.push(std::slice::from_ref(b));
            while let Some(x) = d.next_frame().unwrap() {
                got.push(x.frame);
            }
        }
        assert_eq!(got, samples());
        assert_eq!(d.buffered(), 0);
    }

    #[test]
    fn data_frame_fast_path_matches_generic_encoding() {
        let mut a = Vec::new();
        let mut b = Vec::new();
        encode_data_frame(&mut a, ConnId(3), 99, true, b"xyz");
        Frame::Data { conn: ConnId(3), offset: 99, fin: true, payload: Bytes::from_static(b"xyz") }.encode(&mut b);
        assert_eq!(a, b);
        assert_eq!(a.len(), DATA_OVERHEAD + 3);
    }

    #[test]
    fn unknown_mandatory_frame_is_an_error_and_ignorable_one_is_skipped() {
        let mut d = FrameDecoder::new();
        d.push(&[0x85, 0, 2, 9, 9]);
        Frame::TelemetryAck { seq: 1 }.encode(&mut Vec::new());
        let mut v = Vec::new();
        Frame::TelemetryAck { seq: 1 }.encode(&mut v);
        d.push(&v);
        assert_eq!(d.next_frame().unwrap().unwrap().frame, Frame::TelemetryAck { seq: 1 });
        d.push(&[0x7f, 0, 0]);
        assert_eq!(d.next_frame().unwrap_err(), WireError::UnknownType(0x7f));
    }

    #[test]
    fn truncated_payload_is_reported_with_the_frame_name() {
        let mut d = FrameDecoder::new();
        d.push(&[ty::WINDOW, 0, 3, 0, 0, 1]);
        assert_eq!(d.next_frame().unwrap_err(), WireError::Truncated("WINDOW"));
    }

    #[test]
    fn hello_with_wrong_magic_is_refused() {
        let mut d = FrameDecoder::new();
        d.push(&[ty::HELLO, 0, 4, b'H', b'T', b'T', b'P']);
        assert_eq!(d.next_frame().unwrap_err(), WireError::BadMagic);
    }

    #[test]
    fn ack_ranges_below_cumulative_are_refused() {
        let f = Frame::Ack { conn: ConnId(1), cumulative: 500, fin: false, sack: vec![(100, 200)] };
        let mut v = Vec::new();
        f.encode(&mut v);
        let mut d = FrameDecoder::new();
        d.push(&v);
        assert!(matches!(d.next_frame(), Err(WireError::BadField("ACK.range", 100))));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(crate::testing::cases(256)))]
        #[test]
        fn decoder_never_panics_on_garbage(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let mut d = FrameDecoder::new();
            d.push(&data);
            while let Ok(Some(_)) = d.next_frame() {}
        }
    }
}
