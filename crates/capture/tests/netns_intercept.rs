//! Transparent interception for real, in network namespaces of its own.
//!
//! Builds four namespaces named after this process (`pccap<pid>{p,t,o,c}`,
//! never the shared `pc-*` testbed):
//!
//! ```text
//!  pccap<pid>p (passenger)     pccap<pid>t (train)               pccap<pid>o ("origin")
//!  pax0 10.67.0.2/24 ───────── lan0 10.67.0.1/24                 lo 10.67.9.9/32
//!       fd67::2/64                  fd67::1/64                       fd67:9::9/128
//!  default via 10.67.0.1,      car0 10.68.0.1/24 ─┐
//!          via fd67::1         no route to the    │  pccap<pid>c (a carrier's network)
//!                              origin, no         └─ cpx0 10.68.0.2/24
//!                              forwarding
//! ```
//!
//! The train's listeners are dual-stack (`[::]`), so IPv4 passengers arrive
//! as v4-mapped addresses (`SO_ORIGINAL_DST` on an IPv6 socket) and IPv6
//! passengers exercise `IP6T_SO_ORIGINAL_DST`.
//!
//! The train installs [`InterceptRules`] and runs `serve_transparent` and
//! `serve_dns` with a dialer that records what it is asked for and connects
//! to servers on the train's own loopback (the tunnel's stand-in). The
//! passenger then connects to the origin address, which the train cannot
//! route to: only interception can make that work. The train's own services
//! (on its LAN and carrier addresses) must be closed to the passenger but
//! for the relay's and the allow-listed ones, and a DNS query with a spoofed
//! source on the carrier's network must not be answered there. Each side runs on a
//! thread that `setns`-ed into its namespace, so sockets and the `nft` child
//! process live there.
//!
//! Skipped (passes with a note) unless root with working `ip netns` and
//! `nft`. The namespaces are deleted by a drop guard, also on failure.

use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use polycorn_capture::{
    serve_dns, serve_transparent, CaptureStats, Dialer, InterceptRules, RelayOpts, StatsSnapshot, UdpPolicy,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::time::timeout;

const PAX: Ipv4Addr = Ipv4Addr::new(10, 67, 0, 2);
const LAN: Ipv4Addr = Ipv4Addr::new(10, 67, 0, 1);
const ORIGIN: Ipv4Addr = Ipv4Addr::new(10, 67, 9, 9);
const PAX6: Ipv6Addr = Ipv6Addr::new(0xfd67, 0, 0, 0, 0, 0, 0, 2);
const LAN6: Ipv6Addr = Ipv6Addr::new(0xfd67, 0, 0, 0, 0, 0, 0, 1);
const ORIGIN6: Ipv6Addr = Ipv6Addr::new(0xfd67, 9, 0, 0, 0, 0, 0, 9);
/// The train's address on the carrier link, and the carrier side's (the
/// victim a spoofing passenger would reflect DNS answers at).
const CAR: Ipv4Addr = Ipv4Addr::new(10, 68, 0, 1);
const VICTIM: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 68, 0, 2)), 5300);
const STEP: Duration = Duration::from_secs(5);

/// Deletes the namespaces it holds when dropped.
struct Namespaces(Vec<String>);

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn run(args: &[&str]) -> io::Result<()> {
    let out = Command::new(args[0]).args(&args[1..]).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("{args:?}: {} {}", out.status, String::from_utf8_lossy(&out.stderr).trim())))
    }
}

fn sh(args: &[&str]) {
    run(args).unwrap();
}

/// Why the test cannot run here, if it cannot.
fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    if let Err(e) = run(&["ip", "netns", "list"]) {
        return Some(format!("`ip netns` unavailable: {e}"));
    }
    if let Err(e) = run(&["nft", "--version"]) {
        return Some(format!("`nft` unavailable: {e}"));
    }
    None
}

/// Runs `f` on a new thread inside network namespace `ns`.
fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> JoinHandle<T> {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = File::open(&path).unwrap();
        // SAFETY: a valid namespace fd; setns(CLONE_NEWNET) only affects
        // this thread (and processes it spawns).
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns {path}: {}", io::Error::last_os_error());
        f()
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// The tunnel's stand-in: records (user, dst) and connects to `tcp` for
/// port 53 and to `echo` otherwise, both on the train's loopback.
#[derive(Clone)]
struct RecordingDialer {
    echo: SocketAddr,
    dns: SocketAddr,
    dialed: Arc<Mutex<Vec<(IpAddr, SocketAddr)>>>,
}

impl Dialer for RecordingDialer {
    type Stream = TcpStream;
    async fn dial(&self, user: IpAddr, dst: SocketAddr) -> io::Result<TcpStream> {
        self.dialed.lock().unwrap().push((user, dst));
        TcpStream::connect(if dst.port() == 53 { self.dns } else { self.echo }).await
    }
}

async fn echo_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// DNS-over-TCP upstream answering every query with itself, QR set.
async fn dns_upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut len = [0u8; 2];
                s.read_exact(&mut len).await?;
                let mut q = vec![0u8; u16::from_be_bytes(len) as usize];
                s.read_exact(&mut q).await?;
                q[2] |= 0x80;
                s.write_all(&len).await?;
                s.write_all(&q).await?;
                io::Result::Ok(())
            });
        }
    });
    addr
}

fn dns_query(id: u16) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    q.extend_from_slice(b"\x07example\x03com\x00\x00\x01\x00\x01");
    q
}

/// The train's listening ports, for the passenger.
#[derive(Clone, Copy, Debug)]
struct Ports {
    relay: u16,
    /// A service of the gateway's own (ssh, gpsd, the relay's metrics...)
    /// listening on every address: closed to passengers.
    closed: u16,
    /// The same, allow-listed by the operator.
    allowed: u16,
    /// Stands in for the relay's SOCKS5 listener.
    socks: u16,
    /// A UDP service of the gateway's own: closed to passengers.
    closed_udp: u16,
}

struct TrainReport {
    dialed: Vec<(IpAddr, SocketAddr)>,
    tcp: StatsSnapshot,
    dns: StatsSnapshot,
    table_listed: bool,
    table_gone: bool,
}

fn nft_has_table() -> bool {
    run(&["nft", "list", "table", "inet", polycorn_capture::rules::TABLE]).is_ok()
}

/// Accepts on `l` and answers `banner` to each connection.
fn serve_banner(l: TcpListener, banner: &'static [u8]) {
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let _ = s.write_all(banner).await;
        }
    });
}

/// The train side: rules, relay, DNS forwarder, and its own services: one
/// closed to passengers, one allow-listed, one standing in for SOCKS5.
fn train(ready: std::sync::mpsc::Sender<Ports>, done: tokio::sync::oneshot::Receiver<()>) -> TrainReport {
    runtime().block_on(async move {
        let dialer = RecordingDialer { echo: echo_server().await, dns: dns_upstream().await, dialed: Arc::default() };
        let listener = TcpListener::bind("[::]:0").await.unwrap();
        let dns_socket = UdpSocket::bind("[::]:0").await.unwrap();
        let bind_any = || async { TcpListener::bind("[::]:0").await.unwrap() };
        let (closed, allowed, socks) = (bind_any().await, bind_any().await, bind_any().await);
        let closed_udp = UdpSocket::bind("[::]:0").await.unwrap();
        let port = |l: &TcpListener| l.local_addr().unwrap().port();
        let ports = Ports {
            relay: port(&listener),
            closed: port(&closed),
            allowed: port(&allowed),
            socks: port(&socks),
            closed_udp: closed_udp.local_addr().unwrap().port(),
        };
        serve_banner(closed, b"closed");
        serve_banner(allowed, b"allowed");
        serve_banner(socks, b"socks");
        tokio::spawn(async move {
            let mut buf = [0u8; 512];
            while let Ok((n, from)) = closed_udp.recv_from(&mut buf).await {
                let _ = closed_udp.send_to(&buf[..n], from).await;
            }
        });
        let dns_port = dns_socket.local_addr().unwrap().port();

        // Every variant's script is accepted by the kernel; installing twice
        // replaces rather than stacks.
        InterceptRules::new("lan0", ports.relay, 0).install().expect("install without DNS");
        let mut rules = InterceptRules::new("lan0", ports.relay, dns_port);
        rules.passenger_tcp_ports = vec![ports.socks];
        rules.gateway_allow = vec![format!("tcp:{}", ports.allowed).parse().unwrap()];
        for policy in [UdpPolicy::Allow, UdpPolicy::DropAll, UdpPolicy::RejectQuic, UdpPolicy::RejectQuic] {
            rules.udp_policy = policy;
            rules.install().unwrap_or_else(|e| panic!("install {policy:?}: {e}"));
        }
        let table_listed = nft_has_table();

        let (tcp_opts, dns_opts) = (RelayOpts::default(), RelayOpts::default());
        let (tcp_stats, dns_stats): (Arc<CaptureStats>, Arc<CaptureStats>) =
            (tcp_opts.stats.clone(), dns_opts.stats.clone());
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let tcp = tokio::spawn(serve_transparent(listener, dialer.clone(), tcp_opts, stopped(stop_rx.clone())));
        let upstream = SocketAddr::new(ORIGIN.into(), 53);
        let dns = tokio::spawn(serve_dns(dns_socket, upstream, dialer.clone(), dns_opts, stopped(stop_rx)));

        ready.send(ports).unwrap();
        let _ = done.await; // also on the passenger side panicking (sender dropped)
        stop_tx.send(true).unwrap();
        let _ = timeout(STEP, tcp).await;
        let _ = timeout(STEP, dns).await;

        rules.remove().unwrap();
        rules.remove().unwrap(); // idempotent
        let table_gone = !nft_has_table();
        let dialed = dialer.dialed.lock().unwrap().clone();
        TrainReport { dialed, tcp: tcp_stats.snapshot(), dns: dns_stats.snapshot(), table_listed, table_gone }
    })
}

/// Connects to `dst` and requires a refusal: a reset during connect, or at
/// the latest a reset or close before any byte.
async fn assert_closed(dst: SocketAddr, what: &str) {
    match timeout(STEP, TcpStream::connect(dst))
        .await
        .unwrap_or_else(|_| panic!("{what} {dst}: a reset, not a timeout"))
    {
        Ok(mut c) => {
            let mut back = Vec::new();
            let r = timeout(STEP, c.read_to_end(&mut back)).await.unwrap_or_else(|_| panic!("{what} {dst}: no end"));
            assert!(r.is_err() || back.is_empty(), "{what} {dst} answered a passenger: {r:?} {back:?}");
        }
        Err(e) => assert!(
            matches!(e.kind(), io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset),
            "{what} {dst}: {e}"
        ),
    }
}

async fn read_banner(dst: SocketAddr) -> Vec<u8> {
    let mut c = timeout(STEP, TcpStream::connect(dst)).await.expect("connect timed out").unwrap();
    let mut back = Vec::new();
    timeout(STEP, c.read_to_end(&mut back)).await.unwrap().unwrap();
    back
}

/// The passenger side; panics on the first wrong behaviour.
fn passenger(ports: Ports) {
    runtime().block_on(async move {
        // A DNS query from a source on the carrier's network (the victim's):
        // the source check drops it, so it is neither counted nor answered
        // (the train's report says). It goes first, so the forwarder would
        // have read it before any of the queries below.
        let spoofed = UdpSocket::bind(VICTIM).await.unwrap();
        spoofed.send_to(&dns_query(0x6666), (LAN, 53)).await.unwrap();

        // Intercepted TCP to an address the train cannot route to, with a
        // half-close: the echo comes back after our FIN.
        let dsts: [SocketAddr; 3] = [(ORIGIN, 80).into(), (ORIGIN, 8443).into(), (ORIGIN6, 80).into()];
        for dst in dsts {
            let mut c = timeout(STEP, TcpStream::connect(dst)).await.expect("connect timed out").unwrap();
            let msg = format!("hello {dst} over the tunnel");
            c.write_all(msg.as_bytes()).await.unwrap();
            c.shutdown().await.unwrap();
            let mut back = Vec::new();
            timeout(STEP, c.read_to_end(&mut back)).await.unwrap().unwrap();
            assert_eq!(back, msg.as_bytes(), "echo through the relay for {dst}");
        }

        // The gateway's own services are closed to passengers on every one
        // of its addresses (LAN v4 and v6, the carrier's)...
        for ip in [IpAddr::from(LAN), LAN6.into(), CAR.into()] {
            assert_closed((ip, ports.closed).into(), "a gateway service").await;
        }
        // ... UDP ones too (ICMP port unreachable)...
        let mut buf = [0u8; 512];
        let u = UdpSocket::bind("0.0.0.0:0").await.unwrap();
        u.connect((LAN, ports.closed_udp)).await.unwrap();
        u.send(b"udp service").await.unwrap();
        let r = timeout(STEP, u.recv(&mut buf)).await.expect("a closed UDP service: no ICMP reject");
        assert_eq!(r.map_err(|e| e.kind()), Err(io::ErrorKind::ConnectionRefused), "UDP to the gateway");
        // ... but for the relay's SOCKS5 port and the operator's allow-list.
        assert_eq!(read_banner((LAN, ports.socks).into()).await, b"socks");
        assert_eq!(read_banner((LAN, ports.allowed).into()).await, b"allowed");
        assert_eq!(read_banner((LAN6, ports.allowed).into()).await, b"allowed");
        // ICMP echo to the gateway still works.
        let ping = Command::new("ping").args(["-c", "1", "-W", "5", &LAN.to_string()]).output().expect("running ping");
        assert!(ping.status.success(), "ping the gateway: {}", String::from_utf8_lossy(&ping.stdout));

        // Straight to the relay port: not redirected, so closed like the
        // gateway's other ports.
        assert_closed((LAN, ports.relay).into(), "the relay port").await;

        // QUIC is rejected with ICMP(v6) port unreachable.
        for origin in [IpAddr::from(ORIGIN), ORIGIN6.into()] {
            let u = UdpSocket::bind("[::]:0").await.unwrap();
            u.connect((origin, 443)).await.unwrap();
            u.send(b"quic initial").await.unwrap();
            let r = timeout(STEP, u.recv(&mut buf)).await.expect("UDP/443 got no ICMP reject");
            assert_eq!(r.unwrap_err().kind(), io::ErrorKind::ConnectionRefused, "UDP/443 to {origin}");
        }

        // Other UDP is dropped silently, not rejected.
        let u = UdpSocket::bind("0.0.0.0:0").await.unwrap();
        u.connect((ORIGIN, 9999)).await.unwrap();
        u.send(b"x").await.unwrap();
        assert!(timeout(Duration::from_millis(300), u.recv(&mut buf)).await.is_err(), "UDP/9999 answered");

        // DNS to any address, including the train's own, is answered through
        // the dialer, from the address it was sent to (conntrack un-NATs).
        let servers = [IpAddr::from(ORIGIN), LAN.into(), ORIGIN6.into(), LAN6.into()];
        for (i, server) in servers.into_iter().enumerate() {
            let u = UdpSocket::bind("[::]:0").await.unwrap();
            u.connect((server, 53)).await.unwrap();
            let id = 0x5000 + i as u16;
            u.send(&dns_query(id)).await.unwrap();
            let n = timeout(STEP, u.recv(&mut buf)).await.expect("DNS answer").unwrap();
            let mut expect = dns_query(id);
            expect[2] |= 0x80;
            assert_eq!(&buf[..n], &expect[..], "DNS via {server}");
        }
    });
}

#[test]
fn passenger_traffic_is_intercepted_in_netns() {
    if let Some(why) = skip_reason() {
        eprintln!("note: skipping netns interception test: {why}");
        return;
    }
    let pid = std::process::id();
    let [p, t, o, c] = ["p", "t", "o", "c"].map(|s| format!("pccap{pid}{s}"));
    let mut guard = Namespaces(Vec::new());
    for ns in [&p, &t, &o, &c] {
        if let Err(e) = run(&["ip", "netns", "add", ns]) {
            if guard.0.is_empty() {
                eprintln!("note: skipping netns interception test: cannot create a namespace: {e}");
                return;
            }
            panic!("{e}");
        }
        guard.0.push(ns.clone());
        sh(&["ip", "-n", ns, "link", "set", "lo", "up"]);
    }
    sh(&["ip", "-n", &t, "link", "add", "lan0", "type", "veth", "peer", "name", "pax0", "netns", &p]);
    sh(&["ip", "-n", &t, "addr", "add", &format!("{LAN}/24"), "dev", "lan0"]);
    sh(&["ip", "-n", &p, "addr", "add", &format!("{PAX}/24"), "dev", "pax0"]);
    sh(&["ip", "-n", &t, "link", "set", "lan0", "up"]);
    sh(&["ip", "-n", &p, "link", "set", "pax0", "up"]);
    sh(&["ip", "-n", &p, "route", "add", "default", "via", &LAN.to_string(), "dev", "pax0"]);
    sh(&["ip", "-n", &o, "addr", "add", &format!("{ORIGIN}/32"), "dev", "lo"]);
    sh(&["ip", "-n", &t, "-6", "addr", "add", &format!("{LAN6}/64"), "dev", "lan0", "nodad"]);
    sh(&["ip", "-n", &p, "-6", "addr", "add", &format!("{PAX6}/64"), "dev", "pax0", "nodad"]);
    sh(&["ip", "-n", &p, "-6", "route", "add", "default", "via", &LAN6.to_string(), "dev", "pax0"]);
    sh(&["ip", "-n", &o, "-6", "addr", "add", &format!("{ORIGIN6}/128"), "dev", "lo"]);
    sh(&["ip", "netns", "exec", &t, "sysctl", "-qw", "net.ipv4.ip_forward=0"]);
    // The carrier link, and the victim's address also on the passenger (who
    // may claim any source it likes).
    sh(&["ip", "-n", &t, "link", "add", "car0", "type", "veth", "peer", "name", "cpx0", "netns", &c]);
    sh(&["ip", "-n", &t, "addr", "add", &format!("{CAR}/24"), "dev", "car0"]);
    sh(&["ip", "-n", &c, "addr", "add", &format!("{}/24", VICTIM.ip()), "dev", "cpx0"]);
    sh(&["ip", "-n", &t, "link", "set", "car0", "up"]);
    sh(&["ip", "-n", &c, "link", "set", "cpx0", "up"]);
    sh(&["ip", "-n", &p, "addr", "add", &format!("{}/32", VICTIM.ip()), "dev", "pax0"]);
    let victim = in_netns(&c, || {
        let v = std::net::UdpSocket::bind(VICTIM).unwrap();
        v.set_nonblocking(true).unwrap();
        v
    })
    .join()
    .unwrap();

    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let train_side = in_netns(&t, move || train(ready_tx, done_rx));
    let ports = match ready_rx.recv_timeout(Duration::from_secs(20)) {
        Ok(p) => p,
        Err(_) => {
            drop(done_tx);
            let err = train_side.join().err();
            panic!("train side did not come up: {err:?}");
        }
    };
    let pax_result = in_netns(&p, move || passenger(ports)).join();
    let _ = done_tx.send(());
    let report = train_side.join().expect("train side panicked");
    if let Err(panic) = pax_result {
        std::panic::resume_unwind(panic);
    }

    let dialed = &report.dialed;
    let (o4, o6) = (IpAddr::from(ORIGIN), IpAddr::from(ORIGIN6));
    let expected = [(PAX.into(), (o4, 80)), (PAX.into(), (o4, 8443)), (PAX6.into(), (o6, 80)), (PAX.into(), (o4, 53))];
    for (user, dst) in expected {
        let (user, dst): (IpAddr, SocketAddr) = (user, dst.into());
        assert!(dialed.contains(&(user, dst)), "{dst} not dialed for {user}: {dialed:?}");
    }
    // DNS queries go to the configured upstream whatever their destination,
    // on behalf of the querier (v4 or v6).
    let dns_users: Vec<IpAddr> = dialed.iter().filter(|(_, d)| d.port() == 53).map(|(u, _)| *u).collect();
    assert_eq!(dns_users, [IpAddr::from(PAX), PAX.into(), PAX6.into(), PAX6.into()], "{dialed:?}");
    assert_eq!(dialed.len(), 7, "three relays, four DNS queries: {dialed:?}");
    let tcp = report.tcp;
    // The direct connection to the relay port never reached it.
    assert_eq!((tcp.accepted, tcp.refused, tcp.dial_failed, tcp.active, tcp.relay_errors), (3, 0, 0, 0, 0), "{tcp:?}");
    let sent = ["10.67.9.9:80", "10.67.9.9:8443", "[fd67:9::9]:80"]
        .iter()
        .map(|d| format!("hello {d} over the tunnel").len() as u64)
        .sum::<u64>();
    assert_eq!((tcp.bytes_up, tcp.bytes_down), (sent, sent));
    let dns = report.dns;
    // The spoofed query was dropped before the forwarder, so nothing was
    // reflected at the carrier side.
    assert_eq!((dns.dns_queries, dns.dns_answered, dns.dns_failed, dns.dns_dropped), (4, 4, 0, 0), "{dns:?}");
    let mut buf = [0u8; 512];
    let reflected = victim.recv_from(&mut buf);
    assert!(reflected.is_err(), "a DNS answer reached the spoofed source: {reflected:?}");
    assert!(report.table_listed, "table inet polycorn_relay not present after install");
    assert!(report.table_gone, "table inet polycorn_relay still present after remove");
}
