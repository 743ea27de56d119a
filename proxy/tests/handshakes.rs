//! Unauthenticated peers cannot hold the proxy's handshake slots without
//! bound: beyond 4 connections in their TLS handshake from one source, a new
//! one is closed at once and counted; a flood from many sources holding
//! every slot does not keep the train out; nor can they fill its log:
//! failed handshakes and refused connections are counted and logged once a
//! minute at most (runs the real binary).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Proxy(Child);

/// The tests run one at a time: the cap test counts on its proxy answering
/// well within the 10 s handshake timeout, and a second proxy busy beside it
/// made that fail now and then.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// The value of an unlabelled counter in `/metrics`.
fn counter(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(&format!("{name}{{}} ")).and_then(|v| v.trim().parse().ok()))
}

/// A proxy for train t1 on free ports, writing its log to `log`; returns
/// it with its subflow and metrics addresses once both listen.
fn start(dir: &std::path::Path, log: Stdio) -> (Proxy, SocketAddr, SocketAddr) {
    start_with(dir, log, &[])
}

/// [`start`] with more flags.
fn start_with(dir: &std::path::Path, log: Stdio, extra: &[&str]) -> (Proxy, SocketAddr, SocketAddr) {
    let b = polycorn_pki::write_dev_bundle(dir, &["t1".to_string()]).unwrap();
    let (port, mport) = (free_port(), free_port());
    let listen: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let metrics: SocketAddr = format!("127.0.0.1:{mport}").parse().unwrap();
    let proxy = Proxy(
        Command::new(env!("CARGO_BIN_EXE_polycorn-proxy"))
            .args(["--train-id", "t1", "--listen", &listen.to_string(), "--metrics-listen", &metrics.to_string()])
            .arg("--ca")
            .arg(&b.ca_cert)
            .arg("--cert")
            .arg(&b.proxy_cert)
            .arg("--key")
            .arg(&b.proxy_key)
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the proxy binary starts"),
    );
    // Wait for both listeners (a hang guard, not a timing assertion).
    let give_up = Instant::now() + Duration::from_secs(60);
    while get(metrics, "/healthz").is_none() || TcpStream::connect(listen).is_err() {
        assert!(Instant::now() < give_up, "the proxy never listened");
        std::thread::sleep(Duration::from_millis(100));
    }
    (proxy, listen, metrics)
}

/// The value of `name{labels}` in `/metrics`.
fn sample(metrics: &str, name_and_labels: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(&format!("{name_and_labels} ")).and_then(|v| v.trim().parse().ok()))
}

/// A TCP connection to `to` from the loopback address `from`.
fn connect_from(from: &str, to: SocketAddr) -> std::io::Result<TcpStream> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().build()?;
    rt.block_on(async {
        let sock = tokio::net::TcpSocket::new_v4()?;
        sock.bind(SocketAddr::new(from.parse().expect("address"), 0))?;
        sock.connect(to).await?.into_std()
    })
    .and_then(|s| {
        s.set_nonblocking(false)?;
        Ok(s)
    })
}

/// Whether the proxy closed `c` without a byte within 8 s (the cap's
/// refusal), rather than holding it open.
fn closed_at_once(mut c: TcpStream) -> bool {
    c.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    let mut buf = [0u8; 16];
    match c.read(&mut buf) {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        _ => false, // held open (a read timeout) or, impossibly, data
    }
}

#[test]
fn connections_beyond_the_per_source_cap_are_closed_at_once_and_counted() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (_proxy, listen, metrics) = start(dir.path(), Stdio::null());
    // Hold one source's slots with connections that never speak TLS (not
    // the readiness probe's 127.0.0.1, whose slot may still be held).
    let held: Vec<_> = (0..4).map(|_| connect_from("127.0.5.1", listen).unwrap()).collect();
    // The next ones from that source are closed without a byte, long before
    // the handshake timeout would close a held one; another source still
    // gets a slot.
    let closed = (0..5).filter(|_| closed_at_once(connect_from("127.0.5.1", listen).unwrap())).count();
    assert_eq!(closed, 5, "connections beyond the per-source cap are closed");
    let other = connect_from("127.0.5.2", listen).unwrap();
    other.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let mut buf = [0u8; 1];
    let r = (&other).read(&mut buf);
    assert!(r.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock), "another source is held: {r:?}");
    let text = get(metrics, "/metrics").expect("metrics");
    let refused = sample(&text, r#"polycorn_proxy_handshakes_refused_total{reason="per_source"}"#).expect("exported");
    assert!(refused >= 5.0, "refused {refused}");
    drop(held);
}

#[test]
fn failed_handshakes_are_counted_and_logged_once_a_minute_at_most() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("proxy.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let (proxy, listen, metrics) = start(dir.path(), Stdio::from(log));
    // The readiness probe's connection fails its handshake too (it closes
    // without a byte); 30 more speak HTTP instead of TLS.
    for _ in 0..30 {
        let mut c = TcpStream::connect(listen).unwrap();
        c.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 64];
        let _ = c.read(&mut buf); // the proxy's TLS alert, then EOF
    }
    let give_up = Instant::now() + Duration::from_secs(60);
    let refused = loop {
        let text = get(metrics, "/metrics").expect("metrics");
        let n = counter(&text, "polycorn_proxy_subflows_refused_total").expect("the counter is exported");
        if n >= 31.0 || Instant::now() > give_up {
            break n;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(refused, 31.0, "every failed handshake counts");
    drop(proxy);
    let text = std::fs::read_to_string(&log_path).unwrap();
    let lines = text.lines().filter(|l| l.contains("subflow refused") && l.contains("WARN")).count();
    assert_eq!(lines, 1, "one line for 31 failures within a minute:\n{text}");
}

/// One subflow of train t1 from the loopback address `from`: TLS with the
/// train's certificate, then HELLO until its HELLO_ACK.
async fn train_subflow(
    listen: SocketAddr,
    from: &str,
    tls: std::sync::Arc<rustls::ClientConfig>,
    session: u64,
) -> Result<(), String> {
    train_subflow_behind(listen, from, None, tls, session).await
}

/// A PROXY protocol v2 header, as the Envoy edge sends it, naming `client`
/// as the source.
fn edge_header(client: std::net::Ipv4Addr) -> Vec<u8> {
    use ppp::v2::{Builder, Command, IPv4, Protocol, Version};
    let a = IPv4::new(client, std::net::Ipv4Addr::LOCALHOST, 40000, 4433);
    Builder::with_addresses(Version::Two | Command::Proxy, Protocol::Stream, a).build().expect("header")
}

/// [`train_subflow`], its connection starting with `header` (through the edge).
async fn train_subflow_behind(
    listen: SocketAddr,
    from: &str,
    header: Option<&[u8]>,
    tls: std::sync::Arc<rustls::ClientConfig>,
    session: u64,
) -> Result<(), String> {
    use tokio::io::AsyncWriteExt;
    let guard = Duration::from_secs(15);
    let sock = tokio::net::TcpSocket::new_v4().map_err(|e| e.to_string())?;
    sock.bind(SocketAddr::new(from.parse().expect("address"), 0)).map_err(|e| e.to_string())?;
    let tcp = tokio::time::timeout(guard, sock.connect(listen)).await.map_err(|_| "connect timed out")?;
    let mut tcp = tcp.map_err(|e| e.to_string())?;
    if let Some(h) = header {
        tcp.write_all(h).await.map_err(|e| e.to_string())?;
    }
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let tls = tokio::time::timeout(guard, tokio_rustls::TlsConnector::from(tls).connect(name, tcp))
        .await
        .map_err(|_| "TLS timed out")?;
    let mut tls = tls.map_err(|e| format!("TLS: {e}"))?;
    let hello = polycorn_net::subflow::Hello {
        session,
        path: polycorn_core::PathId(0),
        train_id: "t1".into(),
        path_name: "car0".into(),
    };
    polycorn_net::subflow::client_hello(&mut tls, &hello, guard).await.map_err(|e| format!("HELLO: {e}"))?;
    Ok(())
}

/// Attempts of [`train_subflow`], as a relay retries, until one completes
/// its HELLO (or the failure guard): the attempts it took.
async fn train_connects(
    listen: SocketAddr,
    from: &str,
    tls: &std::sync::Arc<rustls::ClientConfig>,
    session: u64,
) -> Result<u32, String> {
    let give_up = Instant::now() + Duration::from_secs(30);
    let mut attempts = 0;
    loop {
        attempts += 1;
        match train_subflow(listen, from, tls.clone(), session).await {
            Ok(()) => return Ok(attempts),
            Err(e) if Instant::now() > give_up => return Err(format!("{attempts} attempts, the last: {e}")),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// One flooder: a connection from `from` that never finishes its
/// handshake (silent, or a TLS record header announcing more than it
/// sends), opened again each time the proxy closes it, until `stop`.
async fn flooder(listen: SocketAddr, from: std::net::IpAddr, half_tls: bool, stop: tokio::sync::watch::Receiver<bool>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    while !*stop.borrow() {
        let Ok(sock) = tokio::net::TcpSocket::new_v4() else { return };
        if sock.bind(SocketAddr::new(from, 0)).is_err() {
            return;
        }
        if let Ok(mut c) = sock.connect(listen).await {
            if half_tls {
                // A handshake record of 512 bytes, 9 of them sent.
                let _ = c.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc]).await;
            }
            let mut buf = [0u8; 64];
            let mut stop = stop.clone();
            // Held until the proxy closes it (or the test ends).
            tokio::select! {
                _ = async { while matches!(c.read(&mut buf).await, Ok(n) if n > 0) {} } => {}
                _ = stop.changed() => return,
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn the_train_connects_while_a_flood_from_many_sources_holds_the_slots() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("proxy.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let (proxy, listen, metrics) = start(dir.path(), Stdio::from(log));
    let b = dir.path();
    let tls = polycorn_pki::client_config(&b.join("ca.crt"), &b.join("t1.crt"), &b.join("t1.key")).expect("train TLS");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        // The train's carrier has connected from 127.0.0.1 before.
        train_connects(listen, "127.0.0.1", &tls, 1).await.expect("the train connects before the flood");
        // 8 connections from one source (its per-source cap), then 96
        // sources with one connection each; half of them half-done TLS
        // handshakes.
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        let mut flood = Vec::new();
        for i in 0..104u32 {
            let from = if i < 8 { [127, 4, 0, 1].into() } else { std::net::Ipv4Addr::new(127, 3, 0, i as u8) };
            flood.push(tokio::spawn(flooder(listen, from.into(), i % 2 == 1, stop.clone())));
        }
        // Until the flood holds every slot a stranger may take (48).
        let give_up = Instant::now() + Duration::from_secs(60);
        loop {
            let text = tokio::task::spawn_blocking(move || get(metrics, "/metrics")).await.unwrap();
            let n = text.as_deref().and_then(|t| counter(t, "polycorn_proxy_handshakes_in_flight"));
            if n.is_some_and(|n| n >= 48.0) {
                break;
            }
            assert!(Instant::now() < give_up, "the flood never filled the slots: {n:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let t = Instant::now();
        let known = train_connects(listen, "127.0.0.1", &tls, 2).await;
        println!("the train from a known address: {known:?} in {:?}", t.elapsed());
        let t = Instant::now();
        let new = train_connects(listen, "127.0.0.2", &tls, 3).await;
        println!("the train from a new address: {new:?} in {:?}", t.elapsed());
        let _ = stop_tx.send(true);
        for f in flood {
            let _ = f.await;
        }
        // The slots kept for known sources let it in at once; a new address
        // waits for a stranger's slot to come free (displaced or timed out).
        assert_eq!(known, Ok(1), "a train reconnecting from its known address gets in at its first attempt");
        new.expect("a train from a new address gets in during the flood");
    });
    let text = get(metrics, "/metrics").expect("metrics");
    let refused = [r#"{reason="busy"}"#, r#"{reason="per_source"}"#]
        .map(|l| sample(&text, &format!("polycorn_proxy_handshakes_refused_total{l}")).expect("exported"));
    let evicted = counter(&text, "polycorn_proxy_handshakes_evicted_total").expect("exported");
    println!("refused (busy, per source) {refused:?}, displaced {evicted}");
    assert!(refused[1] >= 1.0, "the 8 connections of one source hit its cap");
    drop(proxy);
    let text = std::fs::read_to_string(&log_path).unwrap();
    let lines = text.lines().filter(|l| l.contains("refused before its handshake") && l.contains("WARN")).count();
    assert!((1..=2).contains(&lines), "at most a line a minute for {refused:?} refusals: {lines}");
}

/// Behind the edge (`--proxy-protocol-from`) every connection comes from
/// the edge's address, and the per-source limit applies to the client each
/// PROXY protocol header names: a stranger's connections beyond its cap are
/// closed at once while another client still gets a slot, the train gets
/// in at its first attempt, and a connection from the edge without a
/// header is closed.
#[test]
fn behind_the_edge_the_header_names_the_source_the_limit_counts() {
    use std::net::Ipv4Addr;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (_proxy, listen, metrics) = start_with(dir.path(), Stdio::null(), &["--proxy-protocol-from", "127.0.0.0/8"]);
    let via_edge = |client: Ipv4Addr| {
        let mut c = connect_from("127.0.0.1", listen).unwrap();
        c.write_all(&edge_header(client)).unwrap();
        c
    };
    let stranger = Ipv4Addr::new(203, 0, 113, 7);
    let held: Vec<_> = (0..4).map(|_| via_edge(stranger)).collect();
    // The edge's connections are admitted once their headers are read, in
    // any order: wait until the four hold their slots.
    let give_up = Instant::now() + Duration::from_secs(60);
    while get(metrics, "/metrics").and_then(|t| counter(&t, "polycorn_proxy_handshakes_in_flight")) < Some(4.0) {
        assert!(Instant::now() < give_up, "the stranger's four connections never held their slots");
        std::thread::sleep(Duration::from_millis(50));
    }
    let closed = (0..5).filter(|_| closed_at_once(via_edge(stranger))).count();
    assert_eq!(closed, 5, "the stranger's connections beyond its cap are closed, though all come from the edge");
    let other = via_edge(Ipv4Addr::new(203, 0, 113, 8));
    other.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let mut buf = [0u8; 1];
    let r = (&other).read(&mut buf);
    assert!(r.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock), "another client is held: {r:?}");

    let b = dir.path();
    let tls = polycorn_pki::client_config(&b.join("ca.crt"), &b.join("t1.crt"), &b.join("t1.key")).expect("train TLS");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let header = edge_header(Ipv4Addr::new(198, 51, 100, 1));
    rt.block_on(train_subflow_behind(listen, "127.0.0.1", Some(&header), tls, 1)).expect("the train gets in");

    let mut bare = connect_from("127.0.0.1", listen).unwrap();
    bare.write_all(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03abcdefghijkl").unwrap();
    assert!(closed_at_once(bare), "the edge's connection without a header is closed");
    let text = get(metrics, "/metrics").expect("metrics");
    let refused = sample(&text, r#"polycorn_proxy_handshakes_refused_total{reason="per_source"}"#).expect("exported");
    assert!(refused >= 5.0, "refused {refused}");
    drop(held);
}
