//! Unauthenticated peers cannot hold the proxy's handshake slots without
//! bound: beyond 64 connections in their TLS handshake, a new one is closed
//! at once and counted; nor fill its log: failed handshakes are counted and
//! logged once a minute at most (runs the real binary).

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

#[test]
fn connections_beyond_the_handshake_cap_are_closed_at_once_and_counted() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (_proxy, listen, metrics) = start(dir.path(), Stdio::null());
    // The readiness probe's connection took a slot until the proxy saw it
    // close; wait for that (its failed handshake is counted), or its slot
    // could come free between the extra connections below and hold one.
    let give_up = Instant::now() + Duration::from_secs(60);
    while get(metrics, "/metrics")
        .and_then(|text| counter(&text, "polycorn_proxy_subflows_refused_total"))
        .is_none_or(|n| n < 1.0)
    {
        assert!(Instant::now() < give_up, "the probe's handshake never ended");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Hold every slot with connections that never speak TLS.
    let mut held = Vec::new();
    for _ in 0..64 {
        held.push(TcpStream::connect(listen).unwrap());
    }
    // The next ones are closed without a byte, long before the 10 s
    // handshake timeout would close a held one.
    let mut closed = 0;
    for _ in 0..5 {
        let mut c = TcpStream::connect(listen).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
        let mut buf = [0u8; 16];
        match c.read(&mut buf) {
            Ok(0) => closed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => closed += 1,
            _ => {} // held open (a read timeout) or, impossibly, data
        }
    }
    assert_eq!(closed, 5, "connections beyond the cap are closed");
    let text = get(metrics, "/metrics").expect("metrics");
    let refused = counter(&text, "polycorn_proxy_handshakes_refused_total").expect("the counter is exported");
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
