//! Passengers' DNS, answered through the tunnel.
//!
//! The tunnel carries byte streams only, and the train has no resolver of
//! its own that it may use (its links are the carriers, reached only through
//! the relay). So the UDP queries that nftables redirects here are forwarded
//! as DNS-over-TCP (RFC 1035 §4.2.2 / RFC 7766: each message prefixed with
//! its 2-byte big-endian length) to a resolver reachable from the proxy side,
//! over a stream dialed through the [`Dialer`] on behalf of the querying
//! passenger, and the answer goes back over UDP.
//!
//! Messages are handled as raw bytes: only the 12-byte header is looked at
//! (the ID for logging and matching, QR to tell queries from garbage).
//!
//! Design choices:
//! - One stream per query, not one per passenger with pipelining: no ID
//!   rewriting across clients that share an address, no head-of-line
//!   blocking, and a broken stream costs one query. The price is one stream
//!   open per query, which the tunnel does without a handshake to the origin
//!   of its own. At most [`RelayOpts::dns_max_inflight`] queries are in
//!   flight; more are dropped (the client retries), so a flood cannot tie up
//!   the tunnel.
//! - A query that cannot be forwarded (dial failure, timeout after
//!   [`RelayOpts::dns_timeout`], bad response) is answered with SERVFAIL made
//!   from the query itself (QR set, RCODE 2), so applications fail over at
//!   once instead of waiting for their own timeout.
//! - Responses are sent back as they come, even over 512 bytes: the querier's
//!   EDNS0 buffer size travels to the upstream inside the query, so
//!   truncation (TC) is left to the upstream. A client without EDNS0 whose
//!   upstream answers large over TCP may get a datagram bigger than it asked
//!   for.
//! - Answers to each source are rate-limited in bytes ([`AnswerBudget`],
//!   [`RelayOpts::dns_answer_rate`]): a passenger who spoofs another's
//!   address on the LAN (the gateway's reverse-path check stops only
//!   sources from outside it) can reflect answers, larger than the queries,
//!   at that passenger only up to the budget. A source whose budget is
//!   spent has its queries dropped (counted) until it refills; the client
//!   retries, as after a lost datagram.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UdpSocket;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::debug;

use crate::relay::with_timeout;
use crate::{canonical, CaptureStats, Dialer, RelayOpts};

/// Length of the fixed DNS header.
pub const HEADER_LEN: usize = 12;
/// Largest DNS message that fits the 2-byte TCP length prefix.
const MAX_MESSAGE: usize = u16::MAX as usize;

/// Sources an [`AnswerBudget`] keeps at most; beyond, idle ones (their
/// budget full again) are forgotten, and while none is, a new source's
/// queries are dropped. The gateway's reverse-path check lets only LAN
/// addresses in, and IPv6 sources count per /64, so a LAN of up to a /20
/// fits.
pub const ANSWER_BUDGET_SOURCES: usize = 4096;

/// Bytes of answers each source may receive: a token bucket of `rate`
/// bytes a second holding [`AnswerBudget::BURST_SECONDS`] of them, per
/// IPv4 address or IPv6 /64. Pure: `now` is a parameter.
#[derive(Debug)]
pub struct AnswerBudget {
    rate: f64,
    /// Per source: bytes left (negative: owed after an answer larger than
    /// what was left) and when that was.
    sources: HashMap<IpAddr, (f64, Instant)>,
}

impl AnswerBudget {
    /// The bucket holds this many seconds of the rate: a page's burst of
    /// lookups passes whole.
    pub const BURST_SECONDS: f64 = 4.0;

    pub fn new(rate_bytes_per_s: u64) -> AnswerBudget {
        AnswerBudget { rate: rate_bytes_per_s as f64, sources: HashMap::new() }
    }

    fn burst(&self) -> f64 {
        self.rate * Self::BURST_SECONDS
    }

    /// Who a source counts as: an IPv4 address, or an IPv6 /64.
    pub fn key(ip: IpAddr) -> IpAddr {
        match ip.to_canonical() {
            IpAddr::V6(v6) => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
            v4 => v4,
        }
    }

    fn level(&self, key: &IpAddr, now: Instant) -> Option<f64> {
        self.sources
            .get(key)
            .map(|&(left, at)| (left + now.saturating_duration_since(at).as_secs_f64() * self.rate).min(self.burst()))
    }

    /// Whether a query from `ip` may be forwarded at `now`: its budget is
    /// not spent (a new source starts full).
    pub fn may_ask(&mut self, ip: IpAddr, now: Instant) -> bool {
        let key = Self::key(ip);
        if !self.sources.contains_key(&key) && self.sources.len() >= ANSWER_BUDGET_SOURCES {
            let burst = self.burst();
            let rate = self.rate;
            self.sources
                .retain(|_, (left, at)| *left + now.saturating_duration_since(*at).as_secs_f64() * rate < burst);
            if self.sources.len() >= ANSWER_BUDGET_SOURCES {
                return false;
            }
        }
        self.level(&key, now).is_none_or(|left| left > 0.0)
    }

    /// An answer of `bytes` went to `ip` at `now`.
    pub fn charge(&mut self, ip: IpAddr, bytes: usize, now: Instant) {
        let key = Self::key(ip);
        let left = self.level(&key, now).unwrap_or(self.burst());
        self.sources.insert(key, (left - bytes as f64, now));
    }

    /// Sources known now.
    pub fn sources(&self) -> usize {
        self.sources.len()
    }
}

/// Answers DNS queries arriving on `socket` by forwarding each over TCP,
/// through `dialer`, to `upstream`, until `shutdown` resolves. Garbage
/// datagrams are counted in [`CaptureStats::dns_dropped`] and dropped.
pub async fn serve_dns<D: Dialer>(
    socket: UdpSocket,
    upstream: SocketAddr,
    dialer: D,
    opts: RelayOpts,
    shutdown: impl Future,
) {
    let socket = Arc::new(socket);
    let stats = opts.stats.clone();
    let sem = Arc::new(Semaphore::new(opts.dns_max_inflight.clamp(1, Semaphore::MAX_PERMITS)));
    let budget = Arc::new(Mutex::new(AnswerBudget::new(opts.dns_answer_rate)));
    let mut tasks = JoinSet::new();
    let mut shutdown = pin!(shutdown);
    let mut buf = vec![0u8; MAX_MESSAGE];
    debug!(local = ?socket.local_addr().ok(), %upstream, "serving DNS");
    loop {
        while tasks.try_join_next().is_some() {}
        let (len, from) = tokio::select! {
            biased;
            _ = &mut shutdown => break,
            r = socket.recv_from(&mut buf) => match r {
                Ok(x) => x,
                Err(e) => {
                    // Transient (ENOBUFS, a pending ICMP error); back off a
                    // little in case it persists.
                    debug!(error = %e, "DNS recv_from");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let query = &buf[..len];
        if !is_query(query) {
            debug!(%from, len, "dropping datagram that is not a DNS query");
            CaptureStats::inc(&stats.dns_dropped);
            continue;
        }
        CaptureStats::inc(&stats.dns_queries);
        let from = canonical(from);
        if !budget.lock().unwrap_or_else(|e| e.into_inner()).may_ask(from.ip(), Instant::now()) {
            debug!(%from, id = message_id(query), "answers to this source over their budget; dropping");
            CaptureStats::inc(&stats.dns_limited);
            continue;
        }
        let Ok(permit) = sem.clone().try_acquire_owned() else {
            debug!(%from, id = message_id(query), "too many DNS queries in flight; dropping");
            CaptureStats::inc(&stats.dns_dropped);
            continue;
        };
        let (query, socket, dialer, opts) = (query.to_vec(), socket.clone(), dialer.clone(), opts.clone());
        let budget = budget.clone();
        tasks.spawn(async move {
            let _permit = permit;
            if let Some(sent) = answer(query, from, &socket, upstream, &dialer, &opts).await {
                budget.lock().unwrap_or_else(|e| e.into_inner()).charge(from.ip(), sent, Instant::now());
            }
        });
    }
    tasks.shutdown().await;
}

async fn answer<D: Dialer>(
    query: Vec<u8>,
    from: SocketAddr,
    socket: &UdpSocket,
    upstream: SocketAddr,
    dialer: &D,
    opts: &RelayOpts,
) -> Option<usize> {
    let stats = &opts.stats;
    let id = message_id(&query);
    let response = match with_timeout(opts.dns_timeout, "DNS query", forward(&query, from, upstream, dialer)).await {
        Ok(r) => {
            CaptureStats::inc(&stats.dns_answered);
            r
        }
        Err(e) => {
            debug!(%from, id, %upstream, error = %e, "DNS forwarding failed");
            CaptureStats::inc(&stats.dns_failed);
            servfail(&query)?
        }
    };
    if let Err(e) = socket.send_to(&response, from).await {
        // The passenger may be gone; nothing to do but note it.
        debug!(%from, id, error = %e, "DNS send_to");
    }
    Some(response.len())
}

/// One query over one fresh stream: write it length-prefixed, read one
/// length-prefixed response with the same ID.
async fn forward<D: Dialer>(query: &[u8], from: SocketAddr, upstream: SocketAddr, dialer: &D) -> io::Result<Vec<u8>> {
    let mut stream = dialer.dial(from.ip(), upstream).await?;
    let mut msg = Vec::with_capacity(2 + query.len());
    msg.extend_from_slice(&(query.len() as u16).to_be_bytes());
    msg.extend_from_slice(query);
    stream.write_all(&msg).await?;
    stream.flush().await?;
    let mut len = [0u8; 2];
    stream.read_exact(&mut len).await?;
    let mut response = vec![0u8; u16::from_be_bytes(len) as usize];
    stream.read_exact(&mut response).await?;
    if response.len() < HEADER_LEN || message_id(&response) != message_id(query) {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "upstream response does not match the query"));
    }
    // Tell the upstream we are done; errors here do not matter.
    let _ = stream.shutdown().await;
    Ok(response)
}

/// Resolves SOCKS5 domain names through the tunnel, as the forwarder
/// answers passengers' own queries: an A and an AAAA query, each over its
/// own stream dialed through the [`Dialer`] to `upstream` (DNS over TCP) on
/// behalf of the passenger who asked, so its per-passenger limits count
/// them as that passenger's; built and parsed with `hickory-proto`. Without it, SOCKS5 names would be
/// resolved by the train's own resolver, outside the tunnel (which the train
/// may not have, and which would leak the passenger's names to whatever
/// network the train is on).
#[derive(Clone)]
pub struct TunnelResolver<D> {
    dialer: D,
    upstream: SocketAddr,
}

impl<D: Dialer> TunnelResolver<D> {
    pub fn new(dialer: D, upstream: SocketAddr) -> Self {
        TunnelResolver { dialer, upstream }
    }

    async fn query(&self, user: std::net::IpAddr, name: &Name, rtype: RecordType) -> io::Result<Vec<std::net::IpAddr>> {
        static NEXT_ID: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(1);
        let mut msg = Message::new();
        msg.set_id(NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
            .set_message_type(MessageType::Query)
            .set_op_code(OpCode::Query)
            .set_recursion_desired(true)
            .add_query(Query::query(name.clone(), rtype));
        let bytes = msg.to_vec().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let from = SocketAddr::new(user, 0);
        let response = forward(&bytes, from, self.upstream, &self.dialer).await?;
        let answer =
            Message::from_vec(&response).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        if answer.response_code() != ResponseCode::NoError && answer.response_code() != ResponseCode::NXDomain {
            return Err(io::Error::other(format!("{rtype} {name}: the resolver answered {}", answer.response_code())));
        }
        Ok(answer
            .answers()
            .iter()
            .filter_map(|r| match r.data() {
                RData::A(a) => Some(std::net::IpAddr::V4(a.0)),
                RData::AAAA(a) => Some(std::net::IpAddr::V6(a.0)),
                _ => None,
            })
            .collect())
    }
}

impl<D: Dialer> crate::socks5::Resolver for TunnelResolver<D> {
    async fn resolve(&self, user: std::net::IpAddr, host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        if let Ok(ip) = host.parse::<std::net::IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        let mut name = Name::from_ascii(host)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{host:?}: {e}")))?;
        name.set_fqdn(true);
        let (v4, v6) = tokio::join!(self.query(user, &name, RecordType::A), self.query(user, &name, RecordType::AAAA));
        // IPv4 first (the carriers' networks are mostly IPv4), then IPv6;
        // one family failing is fine if the other answered.
        let mut out: Vec<SocketAddr> = Vec::new();
        let mut err = None;
        for r in [v4, v6] {
            match r {
                Ok(ips) => out.extend(ips.into_iter().map(|ip| SocketAddr::new(ip, port))),
                Err(e) => err = Some(e),
            }
        }
        match (out.is_empty(), err) {
            (true, Some(e)) => Err(e),
            _ => Ok(out),
        }
    }
}

/// A datagram that can be a DNS query: a full header with QR = 0.
pub fn is_query(msg: &[u8]) -> bool {
    msg.len() >= HEADER_LEN && msg[2] & 0x80 == 0
}

/// The ID of a DNS message (first two bytes); 0 for anything shorter.
pub fn message_id(msg: &[u8]) -> u16 {
    match msg {
        [a, b, ..] => u16::from_be_bytes([*a, *b]),
        _ => 0,
    }
}

/// SERVFAIL for `query`: the query itself with QR and RA set, AA and TC
/// cleared, RCODE 2. Question and EDNS0 OPT stay, so stub resolvers accept
/// it as the answer to their question. `None` when the query carries answer
/// or authority records (not a plain query; better silent than wrong).
pub fn servfail(query: &[u8]) -> Option<Vec<u8>> {
    if !is_query(query) || query[6..10] != [0, 0, 0, 0] {
        return None;
    }
    let mut r = query.to_vec();
    r[2] = (r[2] | 0x80) & !0x06; // QR=1, keep opcode and RD, clear AA and TC
    r[3] = 0x80 | 0x02; // RA=1, Z=0, RCODE=SERVFAIL
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::Mutex;
    use tokio::net::{TcpListener, TcpStream};

    /// Stands in for the tunnel: connects to `target` whatever the
    /// destination, records (user, dst).
    #[derive(Clone)]
    struct LocalDialer {
        target: SocketAddr,
        dialed: Arc<Mutex<Vec<(IpAddr, SocketAddr)>>>,
    }

    impl Dialer for LocalDialer {
        type Stream = TcpStream;
        async fn dial(&self, user: IpAddr, dst: SocketAddr) -> io::Result<TcpStream> {
            self.dialed.lock().unwrap().push((user, dst));
            TcpStream::connect(self.target).await
        }
    }

    /// A DNS-over-TCP upstream that answers each query on a connection with
    /// the query echoed, QR set and `extra` bytes appended (so responses can
    /// be made large). Queries whose ID is 0xdead get no answer.
    async fn fake_upstream(extra: usize) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    loop {
                        let mut len = [0u8; 2];
                        if s.read_exact(&mut len).await.is_err() {
                            return;
                        }
                        let mut q = vec![0u8; u16::from_be_bytes(len) as usize];
                        if s.read_exact(&mut q).await.is_err() {
                            return;
                        }
                        if message_id(&q) == 0xdead {
                            tokio::time::sleep(Duration::from_secs(60)).await;
                            return;
                        }
                        q[2] |= 0x80;
                        q.extend(std::iter::repeat_n(0xAB, extra));
                        let mut out = (q.len() as u16).to_be_bytes().to_vec();
                        out.extend_from_slice(&q);
                        if s.write_all(&out).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    fn query(id: u16) -> Vec<u8> {
        let mut q = id.to_be_bytes().to_vec();
        q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]); // RD, QDCOUNT=1
        q.extend_from_slice(b"\x07example\x03com\x00\x00\x01\x00\x01"); // example.com A IN
        q
    }

    struct Server {
        addr: SocketAddr,
        stats: Arc<CaptureStats>,
        dialed: Arc<Mutex<Vec<(IpAddr, SocketAddr)>>>,
        stop: tokio::sync::oneshot::Sender<()>,
        task: tokio::task::JoinHandle<()>,
    }

    const UPSTREAM: &str = "192.0.2.53:53";

    async fn start(target: SocketAddr, opts: RelayOpts) -> Server {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let dialer = LocalDialer { target, dialed: Arc::default() };
        let dialed = dialer.dialed.clone();
        let stats = opts.stats.clone();
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve_dns(socket, UPSTREAM.parse().unwrap(), dialer, opts, rx));
        Server { addr, stats, dialed, stop, task }
    }

    async fn client(server: SocketAddr) -> UdpSocket {
        let c = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        c.connect(server).await.unwrap();
        c
    }

    async fn recv(c: &UdpSocket) -> Vec<u8> {
        let mut buf = vec![0u8; 65536];
        let n = tokio::time::timeout(Duration::from_secs(5), c.recv(&mut buf)).await.unwrap().unwrap();
        buf.truncate(n);
        buf
    }

    async fn stop(s: Server) -> crate::StatsSnapshot {
        s.stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), s.task).await.unwrap().unwrap();
        s.stats.snapshot()
    }

    #[tokio::test]
    async fn dns_query_forwarded_over_tcp_and_answered() {
        let s = start(fake_upstream(0).await, RelayOpts::default()).await;
        let c = client(s.addr).await;
        c.send(&query(0x1234)).await.unwrap();
        let r = recv(&c).await;
        let mut expect = query(0x1234);
        expect[2] |= 0x80;
        assert_eq!(r, expect);
        let dialed = s.dialed.lock().unwrap().clone();
        assert_eq!(dialed, [(IpAddr::V4(Ipv4Addr::LOCALHOST), UPSTREAM.parse().unwrap())]);
        let st = stop(s).await;
        assert_eq!((st.dns_queries, st.dns_answered, st.dns_failed, st.dns_dropped), (1, 1, 0, 0));
    }

    #[tokio::test]
    async fn dns_large_response_sent_as_is() {
        let s = start(fake_upstream(3000).await, RelayOpts::default()).await;
        let c = client(s.addr).await;
        c.send(&query(7)).await.unwrap();
        let r = recv(&c).await;
        assert_eq!(r.len(), query(7).len() + 3000);
        assert_eq!(message_id(&r), 7);
        stop(s).await;
    }

    #[tokio::test]
    async fn dns_concurrent_queries_from_many_clients() {
        let s = start(fake_upstream(0).await, RelayOpts::default()).await;
        let mut joins = Vec::new();
        for i in 0..20u16 {
            let addr = s.addr;
            joins.push(tokio::spawn(async move {
                let c = client(addr).await;
                c.send(&query(i)).await.unwrap();
                assert_eq!(message_id(&recv(&c).await), i);
            }));
        }
        for j in joins {
            j.await.unwrap();
        }
        let st = stop(s).await;
        assert_eq!((st.dns_queries, st.dns_answered), (20, 20));
    }

    #[tokio::test]
    async fn dns_garbage_datagram_dropped_and_counted() {
        let s = start(fake_upstream(0).await, RelayOpts::default()).await;
        let c = client(s.addr).await;
        c.send(b"").await.unwrap();
        c.send(b"hello").await.unwrap();
        let mut response = query(9);
        response[2] |= 0x80; // a response, not a query
        c.send(&response).await.unwrap();
        // The server still works afterwards, and answered nothing before.
        c.send(&query(10)).await.unwrap();
        assert_eq!(message_id(&recv(&c).await), 10);
        assert!(s.dialed.lock().unwrap().len() == 1);
        let st = stop(s).await;
        assert_eq!((st.dns_dropped, st.dns_queries, st.dns_answered), (3, 1, 1));
    }

    #[tokio::test]
    async fn dns_upstream_unreachable_yields_servfail() {
        // A port nothing listens on.
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let s = start(closed, RelayOpts::default()).await;
        let c = client(s.addr).await;
        c.send(&query(0x4242)).await.unwrap();
        let r = recv(&c).await;
        assert_eq!(message_id(&r), 0x4242);
        assert_eq!(r[2] & 0x80, 0x80, "QR");
        assert_eq!(r[3] & 0x0F, 2, "RCODE SERVFAIL");
        assert_eq!(&r[4..], &query(0x4242)[4..], "question kept");
        let st = stop(s).await;
        assert_eq!((st.dns_queries, st.dns_failed), (1, 1));
    }

    #[tokio::test]
    async fn dns_upstream_timeout_yields_servfail() {
        let opts = RelayOpts { dns_timeout: Duration::from_millis(200), ..Default::default() };
        let s = start(fake_upstream(0).await, opts).await;
        let c = client(s.addr).await;
        c.send(&query(0xdead)).await.unwrap();
        let r = recv(&c).await;
        assert_eq!((message_id(&r), r[3] & 0x0F), (0xdead, 2));
        let st = stop(s).await;
        assert_eq!(st.dns_failed, 1);
    }

    #[tokio::test]
    async fn dns_over_inflight_limit_dropped() {
        let opts = RelayOpts { dns_max_inflight: 1, dns_timeout: Duration::from_secs(2), ..Default::default() };
        let s = start(fake_upstream(0).await, opts).await;
        let c = client(s.addr).await;
        c.send(&query(0xdead)).await.unwrap(); // holds the only slot
        tokio::time::sleep(Duration::from_millis(100)).await;
        c.send(&query(1)).await.unwrap(); // dropped
        let r = recv(&c).await;
        assert_eq!((message_id(&r), r[3] & 0x0F), (0xdead, 2));
        let st = stop(s).await;
        assert_eq!((st.dns_queries, st.dns_dropped, st.dns_failed, st.dns_answered), (2, 1, 1, 0));
    }

    /// A passenger can have only so many answer bytes a second sent to its
    /// address, whoever asks (a spoofer on the LAN included): past the
    /// budget its queries are dropped and counted. (The refill is
    /// [`AnswerBudget`]'s test, in virtual time.)
    #[tokio::test]
    async fn dns_answers_to_one_source_are_limited_in_bytes() {
        // A budget of 100 bytes a second (a 400-byte burst) and answers of
        // over 1000 bytes: the first is sent, and the next not for 6 s.
        let opts = RelayOpts { dns_answer_rate: 100, ..Default::default() };
        let s = start(fake_upstream(1000).await, opts).await;
        let c = client(s.addr).await;
        c.send(&query(1)).await.unwrap();
        assert_eq!(message_id(&recv(&c).await), 1);
        for i in 2..10u16 {
            c.send(&query(i)).await.unwrap();
        }
        let mut buf = vec![0u8; 65536];
        let late = tokio::time::timeout(Duration::from_millis(500), c.recv(&mut buf)).await;
        assert!(late.is_err(), "an answer past the budget");
        let st = stop(s).await;
        assert_eq!((st.dns_queries, st.dns_answered, st.dns_limited), (9, 1, 8), "{st:?}");
    }

    #[test]
    fn the_answer_budget_refills_keys_ipv6_by_prefix_and_stays_bounded() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut b = AnswerBudget::new(1000);
        let a: IpAddr = "10.66.0.20".parse().unwrap();
        assert!(b.may_ask(a, at(0)), "a new source starts full");
        b.charge(a, 4000, at(0));
        assert!(!b.may_ask(a, at(0)), "spent");
        assert!(!b.may_ask(a, at(0)), "still spent");
        assert!(b.may_ask(a, at(10)), "10 ms later: 10 bytes back");
        b.charge(a, 3000, at(10));
        assert!(!b.may_ask(a, at(2000)), "owes 2990, got 1990 back");
        assert!(b.may_ask(a, at(3100)));
        assert!(b.may_ask("10.66.0.21".parse().unwrap(), at(0)), "another passenger has its own budget");

        let (v6a, v6b): (IpAddr, IpAddr) =
            ("2001:db8:1:2::a".parse().unwrap(), "2001:db8:1:2:ffff::1".parse().unwrap());
        b.charge(v6a, 5000, at(0));
        assert!(!b.may_ask(v6b, at(0)), "one /64 is one source");
        assert!(b.may_ask("2001:db8:1:3::a".parse().unwrap(), at(0)), "another /64 is another");
        let mapped: IpAddr = "::ffff:10.66.0.20".parse().unwrap();
        assert_eq!(AnswerBudget::key(mapped), a);

        // Spoofed sources from every address of a /16: the table stays
        // bounded, idle sources (budget full again) make room, and while
        // every known source is busy a new one is refused.
        let mut b = AnswerBudget::new(1000);
        for i in 0..(2 * ANSWER_BUDGET_SOURCES as u32) {
            let ip = IpAddr::V4(std::net::Ipv4Addr::from(0x0a42_0000 + i));
            if b.may_ask(ip, at(0)) {
                b.charge(ip, 100, at(0));
            }
            assert!(b.sources() <= ANSWER_BUDGET_SOURCES);
        }
        assert!(!b.may_ask("10.99.0.1".parse().unwrap(), at(0)), "all busy: refused");
        assert!(b.may_ask("10.99.0.1".parse().unwrap(), at(1000)), "once they refilled, forgotten");
        assert_eq!(b.sources(), 0);
    }

    #[test]
    fn servfail_refuses_non_queries() {
        assert_eq!(servfail(b"short"), None);
        let mut q = query(1);
        q[7] = 1; // ANCOUNT=1
        assert_eq!(servfail(&q), None);
        let r = servfail(&query(1)).unwrap();
        assert_eq!(&r[..4], &[0, 1, 0x81, 0x82]);
    }

    /// A DNS-over-TCP upstream that answers `train.example.` with one A and
    /// one AAAA record and every other name with NXDOMAIN.
    async fn resolving_upstream() -> SocketAddr {
        use hickory_proto::rr::rdata::{A, AAAA};
        use hickory_proto::rr::Record;
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut len = [0u8; 2];
                    s.read_exact(&mut len).await.unwrap();
                    let mut q = vec![0u8; u16::from_be_bytes(len) as usize];
                    s.read_exact(&mut q).await.unwrap();
                    let q = Message::from_vec(&q).unwrap();
                    let question = q.queries()[0].clone();
                    let mut r = Message::new();
                    r.set_id(q.id()).set_message_type(MessageType::Response).add_query(question.clone());
                    if question.name().to_ascii() == "train.example." {
                        let data = match question.query_type() {
                            RecordType::A => RData::A(A::new(10, 99, 0, 10)),
                            _ => RData::AAAA(AAAA::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 10)),
                        };
                        r.add_answer(Record::from_rdata(question.name().clone(), 60, data));
                    } else {
                        r.set_response_code(ResponseCode::NXDomain);
                    }
                    let body = r.to_vec().unwrap();
                    let mut out = (body.len() as u16).to_be_bytes().to_vec();
                    out.extend_from_slice(&body);
                    s.write_all(&out).await.unwrap();
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn socks5_names_are_resolved_through_the_tunnel() {
        use crate::socks5::Resolver;
        let dialed = Arc::new(Mutex::new(Vec::new()));
        let dialer = LocalDialer { target: resolving_upstream().await, dialed: dialed.clone() };
        let upstream: SocketAddr = UPSTREAM.parse().unwrap();
        let r = TunnelResolver::new(dialer, upstream);
        let pax: IpAddr = "10.66.0.2".parse().unwrap();
        let got = r.resolve(pax, "train.example", 443).await.unwrap();
        assert_eq!(got, vec!["10.99.0.10:443".parse::<SocketAddr>().unwrap(), "[2001:db8::a]:443".parse().unwrap()]);
        // Both queries went through the dialer (the tunnel) to the upstream,
        // on behalf of the passenger who asked.
        let d = dialed.lock().unwrap().clone();
        assert_eq!(d, [(pax, upstream), (pax, upstream)]);
        // An unknown name resolves to nothing (host unreachable for SOCKS5);
        // a literal address needs no query; a bad name is an error.
        let other: IpAddr = "2001:db8:66::7".parse().unwrap();
        assert!(r.resolve(other, "nowhere.example", 80).await.unwrap().is_empty());
        let literal = r.resolve(pax, "192.0.2.7", 80).await.unwrap();
        assert_eq!(literal, vec!["192.0.2.7:80".parse::<SocketAddr>().unwrap()]);
        let d = dialed.lock().unwrap().clone();
        assert_eq!(d[2..], [(other, upstream), (other, upstream)], "each lookup is its asker's");
        assert!(r.resolve(pax, &"a".repeat(300), 80).await.is_err());
    }
}
