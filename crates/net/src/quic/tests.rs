use super::*;
use crate::subflow::{client_hello, server_ack, server_read_hello, Hello};
use crate::{Session, SessionEvent};
use polycorn_core::{Endpoint, EndpointConfig, Registry, Role, UserId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Pki {
    _dir: tempfile::TempDir,
    client: crate::subflow::ClientTls,
    server: crate::subflow::ServerTls,
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let b = polycorn_pki::write_dev_bundle(dir.path(), &["train-0001".into()]).unwrap();
    let (cert, key) = &b.trains["train-0001"];
    let client = polycorn_pki::client_config(&b.ca_cert, cert, key).unwrap();
    let server =
        polycorn_pki::server_config(&b.ca_cert, &b.proxy_cert, &b.proxy_key, &["train-0001".to_string()]).unwrap();
    Pki { _dir: dir, client, server }
}

fn session(role: Role) -> (Session, crate::Events) {
    let pipeline = Registry::with_builtins().build("minrtt").unwrap();
    Session::new(Endpoint::new(EndpointConfig::new(role), pipeline, std::time::Instant::now()))
}

#[test]
fn controller_names_parse_and_unknown_ones_list_the_choices() {
    for c in QuicCc::ALL {
        assert_eq!(c.to_string().parse::<QuicCc>().ok(), Some(c));
    }
    let e = "vegas".parse::<QuicCc>().unwrap_err().to_string();
    assert!(e.contains("railway-nohints"), "{e}");
    assert_eq!("railway-q250".parse::<QuicCc>().ok(), Some(QuicCc::Railway { hints: true, queue_ms: Some(250) }));
    let c = "railway-nohints-q0".parse::<QuicCc>().unwrap();
    assert_eq!(c, QuicCc::Railway { hints: false, queue_ms: Some(0) });
    assert_eq!(c.to_string(), "railway-nohints-q0");
    for bad in ["railway-q", "railway-q+5", "railway-q2001", "bbr-q100", "railway-q-1", "railway-q05x"] {
        assert!(bad.parse::<QuicCc>().is_err(), "{bad}");
    }
}

#[test]
fn a_hint_reaches_the_controller_once_per_change() {
    let board = HintBoard::default();
    let h = board.path(PathId(1));
    let read = || h.state.load(Ordering::Relaxed);
    assert_eq!(read(), 0);
    board.report(PathId(1), LinkState::Connected);
    assert_eq!(read(), 0, "no change, no new generation");
    board.report(PathId(1), LinkState::NoService);
    assert_eq!(read() & 1, 1);
    let g = read();
    board.report(PathId(1), LinkState::HandoverStarted);
    assert_eq!(read(), g, "still interrupted");
    board.report(PathId(1), LinkState::Connected);
    assert_eq!(read() & 1, 0);
    assert!(read() > g);
    board.report(PathId(200), LinkState::NoService); // out of range: ignored
}

/// A relay and a proxy session over one QUIC subflow each way: the HELLO
/// exchange, the train's identity from its certificate, and a passenger's
/// bytes intact in both directions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_over_a_quic_subflow_carries_passenger_bytes_intact() {
    let pki = pki();
    let (endpoint, crypto) = listen("127.0.0.1:0".parse().unwrap(), &pki.server).unwrap();
    let addr = endpoint.local_addr().unwrap();
    let stats = Arc::new(CcStats::default());
    let (proxy, mut proxy_events) = session(Role::Proxy);
    let proxy_side = {
        let (proxy, stats) = (proxy.clone(), stats.clone());
        tokio::spawn(async move {
            let incoming = endpoint.accept().await.expect("an incoming connection");
            let (mut sub, slot) = accept(incoming, &crypto, QuicCc::DEFAULT, stats).await.unwrap();
            assert_eq!(sub.peer_train().unwrap(), "train-0001");
            let hello = server_read_hello(&mut sub, Duration::from_secs(5)).await.unwrap();
            slot.bind(HintBoard::default().path(hello.path));
            server_ack(&mut sub, &hello, 77).await.unwrap();
            let _ = proxy.run_path(hello.path, sub, None).await;
            drop(endpoint);
        })
    };
    let (relay, _relay_events) = session(Role::Relay);
    let board = HintBoard::default();
    let mut sub =
        connect(addr, None, "proxy.polycorn", &pki.client, QuicCc::DEFAULT, board.path(PathId(0)), stats.clone())
            .await
            .unwrap();
    let hello = Hello { session: 5, path: PathId(0), train_id: "train-0001".into(), path_name: "c0".into() };
    assert_eq!(client_hello(&mut sub, &hello, Duration::from_secs(5)).await.unwrap(), 77);
    let relay_side = {
        let relay = relay.clone();
        tokio::spawn(async move { relay.run_path(PathId(0), sub, None).await })
    };
    // A passenger connection: 3 MB up, echoed back by the proxy's shell.
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    let mut up = relay.open(UserId([1; 16]), "10.0.0.1:80".parse().unwrap()).unwrap();
    let echo = tokio::spawn({
        let proxy = proxy.clone();
        async move {
            while let Some(ev) = proxy_events.recv().await {
                if let SessionEvent::ConnOpened { conn, .. } = ev {
                    let mut s = proxy.stream(conn);
                    let mut buf = vec![0u8; 1 << 16];
                    loop {
                        let n = s.read(&mut buf).await.unwrap();
                        if n == 0 {
                            break;
                        }
                        s.write_all(&buf[..n]).await.unwrap();
                    }
                    s.shutdown().await.unwrap();
                    // Keep the stream until the relay has read it all.
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    return;
                }
            }
        }
    });
    let (mut rd, mut wr) = tokio::io::split(&mut up);
    let send = async {
        wr.write_all(&data).await.unwrap();
        wr.shutdown().await.unwrap();
    };
    let recv = async {
        let mut back = Vec::new();
        rd.read_to_end(&mut back).await.unwrap();
        back
    };
    let (_, back) = tokio::time::timeout(Duration::from_secs(60), async { tokio::join!(send, recv) })
        .await
        .expect("the echo completes (hang guard)");
    assert!(back == data, "{} bytes back of {}", back.len(), data.len());
    relay.close();
    proxy.close();
    let _ = relay_side.await;
    let _ = proxy_side.await;
    echo.abort();
}

/// A fleet certificate of a train the proxy does not serve fails the QUIC
/// handshake (the proxy's verifier checks the CA and its one train).
#[tokio::test]
async fn a_train_the_proxy_does_not_serve_fails_the_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let b = polycorn_pki::write_dev_bundle(dir.path(), &["train-0001".into(), "train-0099".into()]).unwrap();
    let (cert, key) = &b.trains["train-0099"];
    let other = polycorn_pki::client_config(&b.ca_cert, cert, key).unwrap();
    let server =
        polycorn_pki::server_config(&b.ca_cert, &b.proxy_cert, &b.proxy_key, &["train-0001".to_string()]).unwrap();
    let (endpoint, crypto) = listen("127.0.0.1:0".parse().unwrap(), &server).unwrap();
    let addr = endpoint.local_addr().unwrap();
    let stats = Arc::new(CcStats::default());
    let server_side = {
        let stats = stats.clone();
        tokio::spawn(async move {
            let incoming = endpoint.accept().await.expect("an incoming connection");
            accept(incoming, &crypto, QuicCc::DEFAULT, stats).await.map(|_| ())
        })
    };
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        connect(addr, None, "proxy.polycorn", &other, QuicCc::DEFAULT, Arc::default(), stats),
    )
    .await
    .expect("hang guard");
    assert!(server_side.await.unwrap().is_err(), "the proxy accepted a train it does not serve");
    // TLS 1.3 ends the client's handshake before the server has checked
    // the client's certificate: the refusal reaches the relay at its HELLO.
    if let Ok(mut sub) = r {
        let hello = Hello { session: 1, path: PathId(0), train_id: "train-0099".into(), path_name: "c0".into() };
        assert!(client_hello(&mut sub, &hello, Duration::from_secs(10)).await.is_err());
    }
}

#[tokio::test]
async fn the_pacer_hands_quinn_no_small_writes() {
    // quinn keeps each write as a segment of the stream's send buffer and
    // walks them per frame: the pacer must not slice a long write into
    // the few bytes each millisecond refills.
    let slot = Arc::new(HintSlot::default());
    slot.pacing.store(20 << 20, Ordering::Relaxed);
    let mut pacer = Pacer::new(slot);
    let mut left = 2usize << 20;
    let mut writes = Vec::new();
    while left > 0 {
        let n = std::future::poll_fn(|cx| pacer.poll_allow(cx, left)).await;
        assert!(n > 0 && n <= left);
        writes.push(n);
        left -= n;
    }
    let small: Vec<_> = writes.iter().filter(|&&n| n < PACER_MIN_WRITE).collect();
    assert!(small.is_empty(), "{} writes under {PACER_MIN_WRITE} bytes: {small:?}", small.len());
    // A short write still goes at once when the bucket holds it.
    assert_eq!(std::future::poll_fn(|cx| pacer.poll_allow(cx, 100)).await, 100);
}
