//! Transparent interception for real, in network namespaces of its own.
//!
//! Builds three namespaces named after this process (`pccap<pid>{p,t,o}`,
//! never the shared `pc-*` testbed):
//!
//! ```text
//!  pccap<pid>p (passenger)     pccap<pid>t (train)               pccap<pid>o ("origin")
//!  pax0 10.67.0.2/24 ───────── lan0 10.67.0.1/24                 lo 10.67.9.9/32
//!       fd67::2/64                  fd67::1/64                       fd67:9::9/128
//!  default via 10.67.0.1,      no route to the origin, no forwarding
//!          via fd67::1
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
//! route to: only interception can make that work. Each side runs on a
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

/// The train side: rules, relay, DNS forwarder, and a local service on
/// `local_port` that must stay reachable (not intercepted).
fn train(
    ready: std::sync::mpsc::Sender<(u16, u16, u16, u16)>,
    done: tokio::sync::oneshot::Receiver<()>,
) -> TrainReport {
    runtime().block_on(async move {
        let dialer = RecordingDialer { echo: echo_server().await, dns: dns_upstream().await, dialed: Arc::default() };
        let listener = TcpListener::bind("[::]:0").await.unwrap();
        let dns_socket = UdpSocket::bind("[::]:0").await.unwrap();
        let local = TcpListener::bind("[::]:0").await.unwrap();
        // Like the relay's metrics endpoint: the train's, not the passengers'.
        let guarded = TcpListener::bind("[::]:0").await.unwrap();
        let ports = (
            listener.local_addr().unwrap().port(),
            dns_socket.local_addr().unwrap().port(),
            local.local_addr().unwrap().port(),
            guarded.local_addr().unwrap().port(),
        );
        tokio::spawn(async move {
            while let Ok((mut s, _)) = guarded.accept().await {
                let _ = s.write_all(b"metrics").await;
            }
        });
        tokio::spawn(async move {
            while let Ok((mut s, _)) = local.accept().await {
                let _ = s.write_all(b"local").await;
            }
        });

        // Every variant's script is accepted by the kernel; installing twice
        // replaces rather than stacks.
        InterceptRules::new("lan0", ports.0, 0).install().expect("install without DNS");
        let mut rules = InterceptRules::new("lan0", ports.0, ports.1);
        rules.guard_tcp_ports = vec![ports.3];
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

/// The passenger side; panics on the first wrong behaviour.
fn passenger((relay_port, _dns_port, local_port, guarded_port): (u16, u16, u16, u16)) {
    runtime().block_on(async move {
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

        // The train's own services are not intercepted.
        let mut c = timeout(STEP, TcpStream::connect((LAN, local_port))).await.unwrap().unwrap();
        let mut back = Vec::new();
        timeout(STEP, c.read_to_end(&mut back)).await.unwrap().unwrap();
        assert_eq!(back, b"local");

        // A guarded service of the train (the relay's metrics) is reset.
        match timeout(STEP, TcpStream::connect((LAN, guarded_port))).await.expect("a reset, not a timeout") {
            Ok(mut c) => {
                let mut back = Vec::new();
                let _ = timeout(STEP, c.read_to_end(&mut back)).await;
                assert!(back.is_empty(), "a passenger read {back:?} from a guarded port");
            }
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}"),
        }

        // Straight to the relay port: not redirected, so refused (loop
        // protection), without data. The reset may even beat the end of
        // connect().
        match timeout(STEP, TcpStream::connect((LAN, relay_port))).await.unwrap() {
            Ok(mut c) => {
                let mut back = Vec::new();
                let r = timeout(STEP, c.read_to_end(&mut back)).await.unwrap();
                assert!(r.is_err() || back.is_empty(), "direct connection to relay: {r:?} {back:?}");
            }
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "direct connection to relay: {e}"),
        }

        // QUIC is rejected with ICMP(v6) port unreachable.
        let mut buf = [0u8; 512];
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
    let [p, t, o] = ["p", "t", "o"].map(|s| format!("pccap{pid}{s}"));
    let mut guard = Namespaces(Vec::new());
    for ns in [&p, &t, &o] {
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
    assert_eq!((tcp.accepted, tcp.refused, tcp.dial_failed, tcp.active, tcp.relay_errors), (4, 1, 0, 0, 0), "{tcp:?}");
    let sent = ["10.67.9.9:80", "10.67.9.9:8443", "[fd67:9::9]:80"]
        .iter()
        .map(|d| format!("hello {d} over the tunnel").len() as u64)
        .sum::<u64>();
    assert_eq!((tcp.bytes_up, tcp.bytes_down), (sent, sent));
    let dns = report.dns;
    assert_eq!((dns.dns_queries, dns.dns_answered, dns.dns_failed, dns.dns_dropped), (4, 4, 0, 0), "{dns:?}");
    assert!(report.table_listed, "table inet polycorn_relay not present after install");
    assert!(report.table_gone, "table inet polycorn_relay still present after remove");
}
