//! Fuzz targets of Polycorn. Each `pub fn NAME(data: &[u8])` is one target:
//! `src/bin/NAME.rs` runs it under honggfuzz (`cargo hfuzz run NAME`), and
//! `tests/replay.rs` runs it on the committed corpus (`corpus/NAME/`) and on
//! seeded random inputs in a plain `cargo test`. A target panics only on a
//! real bug: a panic in the code under test or a broken invariant asserted
//! here.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use polycorn_core::ctrl::CTRL_MAX;
use polycorn_core::wire::{Frame, FrameDecoder, LinkState};
use polycorn_core::{ConnId, Endpoint, EndpointConfig, Event, PathId, Recv, Registry, Role, UserId};

/// A fuzz target: takes any bytes, panics only on a bug.
pub type Target = fn(&[u8]);

/// Every target, by name (the names of the binaries and corpus directories).
pub const TARGETS: &[(&str, Target)] = &[
    ("frame_decoder", frame_decoder),
    ("endpoint_relay", endpoint_relay),
    ("endpoint_proxy", endpoint_proxy),
    ("telemetry_record", telemetry_record),
    ("failure_table", failure_table),
    ("socks5", socks5),
    ("dns", dns),
    ("gpsd", gpsd),
    ("mmcli", mmcli),
];

/// Reads structured values off the fuzz input; zeros once it is used up.
struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    fn new(data: &'a [u8]) -> Self {
        Input { data }
    }
    fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
    fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (head, tail) = self.data.split_at(n);
        self.data = tail;
        head
    }
    fn u8(&mut self) -> u8 {
        self.bytes(1).first().copied().unwrap_or(0)
    }
    fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }
    fn u16(&mut self) -> u16 {
        let mut b = [0u8; 2];
        let s = self.bytes(2);
        b[..s.len()].copy_from_slice(s);
        u16::from_le_bytes(b)
    }
    fn u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        let s = self.bytes(4);
        b[..s.len()].copy_from_slice(s);
        u32::from_le_bytes(b)
    }
    fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        let s = self.bytes(8);
        b[..s.len()].copy_from_slice(s);
        u64::from_le_bytes(b)
    }
    /// A stream offset or sequence number: mostly small (near what the
    /// endpoint has), sometimes anywhere.
    fn offset(&mut self) -> u64 {
        match self.u8() % 4 {
            0 => self.u64(),
            1 => u64::from(self.u32()),
            _ => u64::from(self.u16()),
        }
    }
}

// ------------------------------------------------------------ frame decoder

/// `FrameDecoder` over arbitrary bytes pushed in chunks the input chooses:
/// it returns frames or an error, never panics; the frames it returns are
/// the same whatever the chunking, re-encode to the bytes' length and
/// decode back to themselves; it holds at most one partial frame.
pub fn frame_decoder(data: &[u8]) {
    let Some((&seed, stream)) = data.split_first() else { return };
    let whole = decode_all(stream, &mut std::iter::once(stream.len().max(1)));
    // Chunk sizes from a small generator seeded by the first byte.
    let mut x = u32::from(seed) | 0x100;
    let mut sizes = std::iter::from_fn(move || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        Some(match x % 4 {
            0 => 1,
            1 => (x >> 8) as usize % 8 + 1,
            2 => (x >> 8) as usize % 300 + 1,
            _ => (x >> 8) as usize % 70_000 + 1,
        })
    });
    let chunked = decode_all(stream, &mut sizes);
    assert_eq!(whole, chunked, "the frames depend on how the bytes were split");
    for f in whole.0 {
        let mut enc = Vec::new();
        f.encode(&mut enc);
        assert_eq!(enc.len(), f.encoded_len(), "encoded_len disagrees with encode: {f:?}");
        let mut d = FrameDecoder::new();
        d.push(&enc);
        let back = d.next_frame().expect("a re-encoded frame decodes").expect("complete");
        assert_eq!(back.frame, f, "a decoded frame does not survive re-encoding");
        assert_eq!(back.wire_len, enc.len());
        assert_eq!(d.buffered(), 0);
    }
}

type Decoded = (Vec<Frame>, Option<polycorn_core::wire::WireError>);

fn decode_all(stream: &[u8], sizes: &mut dyn Iterator<Item = usize>) -> Decoded {
    let mut d = FrameDecoder::new();
    let mut frames = Vec::new();
    let mut rest = stream;
    while !rest.is_empty() {
        let n = sizes.next().unwrap_or(1).min(rest.len());
        d.push(&rest[..n]);
        rest = &rest[n..];
        loop {
            match d.next_frame() {
                Ok(Some(x)) => {
                    assert!(x.wire_len >= 3, "a frame is at least its header");
                    frames.push(x.frame);
                }
                Ok(None) => break,
                Err(e) => return (frames, Some(e)),
            }
        }
        assert!(d.buffered() < 3 + 65_536, "the decoder holds more than one partial frame: {}", d.buffered());
    }
    (frames, None)
}

// ------------------------------------------------------------ endpoint

/// Connection cap of the fuzzed endpoints (small, so the fuzzer reaches it).
pub const FUZZ_MAX_CONNS: usize = 64;
/// Paths the fuzzed endpoints use (of `MAX_PATHS`).
const FUZZ_PATHS: u8 = 4;

/// `Endpoint::handle_input` of a relay over frames and garbage from the input.
pub fn endpoint_relay(data: &[u8]) {
    endpoint(Role::Relay, data);
}

/// `Endpoint::handle_input` of a proxy over frames and garbage from the input.
pub fn endpoint_proxy(data: &[u8]) {
    endpoint(Role::Proxy, data);
}

/// One endpoint played as its shell would: input on paths (valid frames
/// built from the fuzz bytes and encoded, raw garbage), timeouts, transmits,
/// paths going up and down, passengers opening, writing, reading and
/// resetting, and the shell's reactions to events (reset some opened
/// connections, acknowledge telemetry). A subflow whose input is an error is
/// taken down, as the shell does. Checked after every step: what the
/// endpoint transmits decodes; control backlogs stay bounded; at most
/// `max_conns` connections; out-of-order bytes within the windows.
pub fn endpoint(role: Role, data: &[u8]) {
    let mut inp = Input::new(data);
    let t0 = Instant::now();
    let mut now = t0;
    let mut cfg = EndpointConfig::new(role);
    cfg.max_conns = FUZZ_MAX_CONNS;
    cfg.max_conns_per_user = FUZZ_MAX_CONNS / 2;
    // Small windows: the fuzzer's inputs are short.
    cfg.conn_window_initial_bytes = 64 * 1024;
    cfg.conn_window_min_bytes = 16 * 1024;
    cfg.conn_window_max_bytes = 256 * 1024;
    let pipeline = Registry::with_builtins().build("minrtt").expect("builtin pipeline");
    let mut ep = Endpoint::new(cfg, pipeline, now);
    for p in 0..2 {
        ep.path_up(PathId(p), now);
    }
    let mut conns: Vec<ConnId> = Vec::new();
    let mut buf = vec![0u8; 70_000];
    let mut steps = 0;
    while !inp.is_empty() && steps < 4096 {
        steps += 1;
        let path = PathId(inp.u8() % FUZZ_PATHS);
        match inp.u8() % 16 {
            0 => {
                let n = usize::from(inp.u8());
                let garbage = inp.bytes(n).to_vec();
                input(&mut ep, path, &garbage, now);
            }
            1..=7 => {
                let mut bytes = Vec::new();
                for _ in 0..=inp.u8() % 4 {
                    frame(&mut inp, &conns).encode(&mut bytes);
                }
                // Sometimes in two pieces, split anywhere.
                let at = usize::from(inp.u16()) % (bytes.len() + 1);
                input(&mut ep, path, &bytes[..at], now);
                input(&mut ep, path, &bytes[at..], now);
            }
            8 => {
                now += Duration::from_millis(u64::from(inp.u16()));
                ep.handle_timeout(now);
            }
            9 => {
                let max = usize::from(inp.u16()).max(1);
                transmit(&mut ep, path, now, max);
            }
            10 => ep.path_up(path, now),
            11 => ep.path_down(path, now),
            12 => {
                let user = UserId([inp.u8() % 4; 16]);
                let dst = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 99, 0, inp.u8())), 80);
                if let Ok(c) = ep.open(user, dst, now) {
                    conns.push(c);
                }
            }
            13 => {
                let c = pick(&mut inp, &conns);
                let n = usize::from(inp.u16()) % 40_000;
                let payload = vec![0x5a; n];
                let _ = ep.send(c, &payload, now);
                if inp.bool() {
                    let _ = ep.finish(c, now);
                }
            }
            14 => {
                let c = pick(&mut inp, &conns);
                let n = usize::from(inp.u16()) % buf.len() + 1;
                let _ = ep.recv(c, &mut buf[..n], now);
            }
            _ => {
                let c = pick(&mut inp, &conns);
                ep.reset(c, u32::from(inp.u8()), now);
            }
        }
        shell(&mut ep, &mut inp, &mut conns, &mut buf, now);
        check(&ep);
    }
    // Let it all settle: timers for a minute, everything transmitted.
    for _ in 0..4 {
        now += Duration::from_secs(15);
        ep.handle_timeout(now);
        for p in 0..FUZZ_PATHS {
            transmit(&mut ep, PathId(p), now, 1 << 20);
        }
        shell(&mut ep, &mut inp, &mut conns, &mut buf, now);
        check(&ep);
    }
}

fn input(ep: &mut Endpoint, path: PathId, bytes: &[u8], now: Instant) {
    if ep.handle_input(path, bytes, now).is_err() {
        ep.path_down(path, now);
    }
}

/// What the endpoint sends must decode (the peer runs the same decoder).
fn transmit(ep: &mut Endpoint, path: PathId, now: Instant, max: usize) {
    let mut out = Vec::new();
    let n = ep.poll_transmit(path, now, &mut out, max);
    assert_eq!(n, out.len());
    let mut d = FrameDecoder::new();
    d.push(&out);
    while let Some(x) = d.next_frame().unwrap_or_else(|e| panic!("the endpoint sent undecodable bytes: {e}")) {
        let _ = x;
    }
    assert_eq!(d.buffered(), 0, "the endpoint sent a partial frame");
}

/// The shell's reactions to events.
fn shell(ep: &mut Endpoint, inp: &mut Input, conns: &mut Vec<ConnId>, buf: &mut [u8], now: Instant) {
    while let Some(ev) = ep.poll_event() {
        match ev {
            Event::ConnOpened { conn, .. } => {
                conns.push(conn);
                if inp.u8() % 4 == 0 {
                    // The upstream refused it.
                    ep.reset(conn, 1, now);
                }
            }
            Event::Readable(c) => {
                for _ in 0..4 {
                    match ep.recv(c, buf, now) {
                        Ok(Recv::Data(_)) => continue,
                        _ => break,
                    }
                }
            }
            Event::Telemetry { seq, .. } | Event::TelemetryDuplicate { seq, .. } => {
                if inp.u8() % 4 != 0 {
                    ep.ack_telemetry(seq);
                }
            }
            Event::ConnClosed(c) | Event::ConnReset { conn: c, .. } => conns.retain(|&x| x != c),
            Event::PathDead(p) => ep.path_down(p, now),
            Event::Writable(_) | Event::PathStatus { .. } | Event::TelemetryAcked { .. } => {}
        }
    }
    if conns.len() > 4 * FUZZ_MAX_CONNS {
        conns.drain(..conns.len() - FUZZ_MAX_CONNS);
    }
}

fn check(ep: &Endpoint) {
    for p in 0..FUZZ_PATHS {
        let backlog = ep.ctrl_backlog(PathId(p));
        assert!(backlog <= CTRL_MAX + 4096, "control backlog of path {p} is {backlog}");
    }
    assert!(ep.conn_count() <= FUZZ_MAX_CONNS, "{} connections, cap {FUZZ_MAX_CONNS}", ep.conn_count());
    let f = ep.flow_stats();
    assert!(
        f.out_of_order_bytes <= f.window_sum_bytes,
        "{} bytes out of order beyond the windows' {}",
        f.out_of_order_bytes,
        f.window_sum_bytes
    );
}

fn pick(inp: &mut Input, conns: &[ConnId]) -> ConnId {
    let k = inp.u8();
    if conns.is_empty() || k == 0xff {
        ConnId(u32::from(k) % 8)
    } else {
        conns[usize::from(k) % conns.len()]
    }
}

/// A valid frame of any type built from the input.
fn frame(inp: &mut Input, conns: &[ConnId]) -> Frame {
    let conn = if inp.u8() % 8 == 0 { ConnId(inp.u32()) } else { pick(inp, conns) };
    match inp.u8() % 14 {
        0 => Frame::Hello {
            version: inp.u8(),
            session: inp.u64(),
            path: PathId(inp.u8() % 40),
            train_id: "train".into(),
            path_name: "a".into(),
        },
        1 => {
            Frame::HelloAck { version: inp.u8(), session: inp.u64(), path: PathId(inp.u8() % 40), instance: inp.u64() }
        }
        2 => {
            let user = UserId([inp.u8() % 4; 16]);
            let dst = if inp.bool() {
                SocketAddr::new(IpAddr::V4(Ipv4Addr::from(inp.u32())), inp.u16())
            } else {
                SocketAddr::new(IpAddr::V6(Ipv6Addr::from(u128::from(inp.u64()))), inp.u16())
            };
            Frame::Open { conn, user, dst }
        }
        3..=5 => {
            let len = usize::from(inp.u16()) % 20_000;
            let payload = Bytes::from(vec![0xa5; len]);
            Frame::Data { conn, offset: inp.offset(), fin: inp.u8() % 8 == 0, payload }
        }
        6 => {
            let cumulative = inp.offset();
            let mut sack = Vec::new();
            let mut at = cumulative;
            for _ in 0..inp.u8() % 6 {
                let start = at.saturating_add(u64::from(inp.u16()) + 1);
                let end = start.saturating_add(u64::from(inp.u16()) + 1);
                sack.push((start, end));
                at = end;
            }
            Frame::Ack { conn, cumulative, fin: inp.u8() % 8 == 0, sack }
        }
        7 => Frame::Window { conn, max_data: inp.offset() },
        8 => Frame::Reset { conn, code: u32::from(inp.u8()) },
        9 => Frame::PathAck { received: inp.offset(), delay_us: inp.u32() },
        10 => {
            if inp.bool() {
                Frame::Ping { id: inp.u64(), timestamp_us: inp.u64() }
            } else {
                Frame::Pong { id: inp.u64(), timestamp_us: inp.u64() }
            }
        }
        11 => {
            let state = match inp.u8() % 3 {
                0 => LinkState::Connected,
                1 => LinkState::HandoverStarted,
                _ => LinkState::NoService,
            };
            Frame::PathStatus { path: PathId(inp.u8() % 40), state, cell: inp.u64(), seq: inp.u32() }
        }
        12 => {
            let n = usize::from(inp.u8());
            Frame::Telemetry { seq: inp.offset(), payload: Bytes::copy_from_slice(inp.bytes(n)) }
        }
        _ => Frame::TelemetryAck { seq: inp.offset() },
    }
}

// ------------------------------------------------------------ telemetry

/// The proxy's decoding of a telemetry record (`v1::Record::decode`, then
/// its checks: train, body): never panics, and a record that decodes
/// encodes to bytes that decode to the same record (NaNs included).
pub fn telemetry_record(data: &[u8]) {
    use polycorn_telemetry::v1::Record;
    use prost::Message;
    let Ok(r) = Record::decode(data) else { return };
    let _ = r.train_id == "train-0042" && r.body.is_some();
    let enc = r.encode_to_vec();
    assert_eq!(enc.len(), r.encoded_len());
    let back = Record::decode(enc.as_slice()).expect("a re-encoded record decodes");
    // Compared as bytes: a NaN coordinate is not equal to itself.
    assert_eq!(back.encode_to_vec(), enc, "a record does not survive re-encoding");
}

/// The failure-location table file (`FailureTableFile::parse`): never
/// panics; a table it accepts becomes the core's table and its JSON parses
/// back to the same table.
pub fn failure_table(data: &[u8]) {
    use polycorn_telemetry::failure_table::FailureTableFile;
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(f) = FailureTableFile::parse(text) else { return };
    let _ = f.to_table();
    let back = FailureTableFile::parse(&f.to_json()).expect("a table's own JSON parses");
    assert_eq!(back, f, "a table does not survive its JSON");
}

/// gpsd's JSON lines: bytes in chunks through `LineBuffer`, each line
/// through `parse_line`, counted as the source counts them.
pub fn gpsd(data: &[u8]) {
    use polycorn_telemetry::gpsd::{parse_line, parse_time_unix_ms, GpsdStats, LineBuffer, Message};
    let mut lines = LineBuffer::default();
    let mut stats = GpsdStats::default();
    for chunk in data.chunks(97) {
        for line in lines.push(chunk) {
            let Ok(line) = line else { continue };
            let r = parse_line(&line);
            if let Ok(Message::Fix(fix)) = &r {
                assert!((-90.0..=90.0).contains(&fix.fix.lat_deg) && (-180.0..=180.0).contains(&fix.fix.lon_deg));
            }
            stats.count(&r);
            let _ = parse_time_unix_ms(&line);
        }
    }
}

/// ModemManager's three `mmcli -J` outputs, separated by NUL bytes in the
/// input: each parser, then the observation and cell sample built from them.
pub fn mmcli(data: &[u8]) {
    use polycorn_telemetry::mmcli::{cell_sample, observation, parse_location, parse_modem, parse_signal};
    let mut parts = data.split(|&b| b == 0).map(String::from_utf8_lossy);
    let (modem, location, signal) =
        (parts.next().unwrap_or_default(), parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    let m = parse_modem(&modem);
    let l = parse_location(&location);
    let s = parse_signal(&signal);
    if let (Ok(m), Ok(l), Ok(s)) = (m, l, s) {
        let obs = observation(1_700_000_000_000, &m, &l, s);
        let _ = cell_sample(1, "carrier", &obs);
    }
}

// ------------------------------------------------------------ capture

/// DNS helpers: `is_query`, `message_id`, `servfail`. A SERVFAIL is the
/// query with only flags changed, is not a query itself, and has none.
pub fn dns(data: &[u8]) {
    use polycorn_capture::dns::{is_query, message_id, servfail};
    let id = message_id(data);
    if data.len() < 2 {
        assert_eq!(id, 0);
    }
    let q = is_query(data);
    if let Some(r) = servfail(data) {
        assert!(q, "SERVFAIL for a message that is not a query");
        assert_eq!(r.len(), data.len());
        assert_eq!(message_id(&r), id);
        assert_eq!(r[4..], data[4..], "SERVFAIL changed more than the flags");
        assert_eq!(r[3] & 0x0f, 2, "RCODE is not SERVFAIL");
        assert!(!is_query(&r), "a SERVFAIL reads as a query");
        assert!(servfail(&r).is_none());
    }
}

/// The SOCKS5 server (`handle_socks5`) over an in-memory stream carrying the
/// input, on a current-thread runtime with paused time (timeouts pass at
/// once): never panics, never hangs, and what it answers first is a method
/// selection.
pub fn socks5(data: &[u8]) {
    use polycorn_capture::socks5::handle_socks5;
    use polycorn_capture::RelayOpts;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().expect("runtime");
    rt.block_on(async {
        let (mut client, mut server) = tokio::io::duplex(4096);
        let opts = RelayOpts { buf_size: 1024, keepalive: None, ..Default::default() };
        let serve = async {
            let _ = handle_socks5(&mut server, IpAddr::V4(Ipv4Addr::LOCALHOST), &MemDialer, &MemResolver, &opts).await;
            drop(server);
        };
        let talk = async {
            let _ = client.write_all(data).await;
            let _ = client.shutdown().await;
            let mut answer = Vec::new();
            let _ = client.read_to_end(&mut answer).await;
            answer
        };
        let (_, answer) = tokio::join!(serve, talk);
        if answer.len() >= 2 {
            assert_eq!(answer[0], 5, "SOCKS5 answer with version {}", answer[0]);
            assert!(matches!(answer[1], 0x00 | 0xff), "method selection {:#04x}", answer[1]);
        }
    });
}

/// Dials in memory: ports ending in 1 are refused, 2 unreachable; otherwise
/// a stream whose far end echoes a little and closes.
#[derive(Clone)]
struct MemDialer;

impl polycorn_capture::Dialer for MemDialer {
    type Stream = tokio::io::DuplexStream;
    async fn dial(&self, _user: IpAddr, dst: SocketAddr) -> std::io::Result<Self::Stream> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        match dst.port() % 10 {
            1 => Err(std::io::ErrorKind::ConnectionRefused.into()),
            2 => Err(std::io::ErrorKind::HostUnreachable.into()),
            _ => {
                let (near, mut far) = tokio::io::duplex(1024);
                tokio::spawn(async move {
                    let mut b = [0u8; 64];
                    if let Ok(n) = far.read(&mut b).await {
                        let _ = far.write_all(&b[..n]).await;
                    }
                });
                Ok(near)
            }
        }
    }
}

/// Resolves names in memory: names starting with `x` fail, `e` give no
/// address, others one address.
#[derive(Clone)]
struct MemResolver;

impl polycorn_capture::socks5::Resolver for MemResolver {
    async fn resolve(&self, _user: IpAddr, host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
        match host.as_bytes().first() {
            Some(b'x') => Err(std::io::ErrorKind::NotFound.into()),
            Some(b'e') => Ok(Vec::new()),
            _ => Ok(vec![SocketAddr::new(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)), port)]),
        }
    }
}
