//! Keeping each carrier's subflow to the train's proxy up: connect (bound
//! to the carrier's interface), TLS or QUIC with the train's certificate,
//! HELLO, run the path in the session; on failure back off and dial again
//! (docs/architecture.md, "Subflows").

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use polycorn_core::PathId;
use polycorn_net::metrics::{self, PathTransports};
use polycorn_net::subflow::{self, Congestion, Hello, Transport};
use polycorn_net::Session;
use tokio::sync::watch;
use tracing::{info, warn};

/// How a train dials its proxy: its identity and TLS material, and the
/// transport of its subflows. Shared by all of its paths.
pub struct Dial {
    pub train_id: String,
    /// Name the proxy's certificate must carry.
    pub proxy_name: rustls::pki_types::ServerName<'static>,
    /// The train's client configuration (its certificate, the proxy's CA).
    pub tls: Arc<rustls::ClientConfig>,
    pub transport: Transport,
    /// `--subflow-cc`.
    pub congestion: Congestion,
    /// `--quic-cc`, and its controllers' counters.
    pub quic_cc: polycorn_net::quic::QuicCc,
    pub cc_stats: Arc<polycorn_net::quic::CcStats>,
    /// `--quic-port`: the proxy's UDP port where it is not each path's port.
    pub quic_port: Option<u16>,
    /// What came of the paths' dials.
    pub counters: PathCounters,
}

/// Counts of the subflows' lives, over every path of a train.
#[derive(Debug, Default)]
pub struct PathCounters {
    /// Subflows that came up (TLS or QUIC handshake and HELLO done).
    pub subflows_up: AtomicU64,
    /// Subflows that went down after being up.
    pub subflows_down: AtomicU64,
    /// Dials that failed or timed out before a subflow came up.
    pub connects_failed: AtomicU64,
}

/// One carrier's subflow: `--path NAME=DEVICE@PROXY_ADDR`.
#[derive(Clone, Debug)]
pub struct PathSpec {
    pub id: PathId,
    pub name: String,
    /// The device the subflow is bound to (SO_BINDTODEVICE), and its link
    /// state: the subflow ends when it goes down. `None`: not bound.
    pub link: Option<polycorn_net::link::LinkWatch>,
    pub proxy: SocketAddr,
}

impl PathSpec {
    /// The interface the subflow is bound to, if any.
    pub fn device(&self) -> Option<&str> {
        self.link.as_ref().map(polycorn_net::link::LinkWatch::device)
    }
}

/// A `--path` value, the `i`-th (its path id).
pub fn parse_path(i: usize, s: &str) -> anyhow::Result<PathSpec> {
    let err = || format!("--path {s:?}: expected NAME=DEVICE@PROXY_ADDR, e.g. carrier-a=wwan0@203.0.113.7:4433");
    let (name, rest) = s.split_once('=').with_context(err)?;
    let (device, addr) = rest.split_once('@').with_context(err)?;
    if name.is_empty() {
        bail!("{}", err());
    }
    let proxy: SocketAddr = addr.parse().with_context(err)?;
    let link = match device {
        "" => None,
        d => Some(polycorn_net::link::LinkWatch::new(d).with_context(|| format!("--path {s:?}"))?),
    };
    Ok(PathSpec { id: PathId(u8::try_from(i).context("too many paths")?), name: name.into(), link, proxy })
}

/// The proxy instance the session's connections live in.
pub type KnownProxy = Arc<std::sync::Mutex<Option<u64>>>;

/// After a carrier's QUIC subflow failed to come up, how long it stays on
/// TLS before QUIC is tried again (at its next reconnect).
pub const QUIC_RETRY: Duration = Duration::from_secs(60);
/// A QUIC handshake gets this long before the carrier falls back to TLS:
/// where UDP is blocked nothing ever answers, and waiting out the whole
/// connect timeout would keep the carrier idle.
pub const QUIC_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// One subflow's byte stream, whichever transport carries it.
enum Subflow {
    Tls(Box<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>, subflow::UnsentProbe),
    Quic(Box<polycorn_net::quic::QuicSubflow>),
}

async fn dial_tls(s: &Dial, spec: &PathSpec, hello: &Hello) -> std::io::Result<(Subflow, u64)> {
    let connector = tokio_rustls::TlsConnector::from(s.tls.clone());
    // A QUIC carrier's fallback is a TLS subflow; kernel MPTCP keeps its
    // MPTCP socket.
    let over = if s.transport == Transport::Quic { Transport::Tls } else { s.transport };
    let tcp = subflow::connect(spec.proxy, spec.device(), over, &s.congestion).await?;
    let probe = subflow::UnsentProbe::new(&tcp)?;
    let mut tls = connector.connect(s.proxy_name.clone(), tcp).await?;
    let instance = subflow::client_hello(&mut tls, hello, Duration::from_secs(10)).await?;
    Ok((Subflow::Tls(Box::new(tls), probe), instance))
}

async fn dial_quic(s: &Dial, session: &Session, spec: &PathSpec, hello: &Hello) -> std::io::Result<(Subflow, u64)> {
    let name = s.proxy_name.to_str();
    let mut sub = tokio::time::timeout(
        QUIC_HANDSHAKE_TIMEOUT,
        polycorn_net::quic::connect(
            SocketAddr::new(spec.proxy.ip(), s.quic_port.unwrap_or(spec.proxy.port())),
            spec.device(),
            &name,
            &s.tls,
            s.quic_cc,
            session.hints().path(spec.id),
            s.cc_stats.clone(),
        ),
    )
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no QUIC handshake (is UDP blocked?)"))??;
    let instance = subflow::client_hello(&mut sub, hello, Duration::from_secs(10)).await?;
    Ok((Subflow::Quic(Box::new(sub)), instance))
}

/// Keep one subflow up: connect (bound to its interface), TLS or QUIC,
/// HELLO, run; on failure back off (100 ms doubling to 5 s) and retry,
/// forever. Over `--transport quic` a carrier whose QUIC handshake fails
/// falls back to TLS at once, alone, and tries QUIC again after
/// [`QUIC_RETRY`].
pub async fn keep_path(
    s: Arc<Dial>,
    session: Session,
    spec: PathSpec,
    session_id: u64,
    proxy: KnownProxy,
    transports: PathTransports,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = polycorn_net::backoff::Backoff::reconnect();
    let mut quic_failed: Option<Instant> = None;
    let hello =
        Hello { session: session_id, path: spec.id, train_id: s.train_id.clone(), path_name: spec.name.clone() };
    loop {
        // A carrier whose interface is down cannot be dialled: wait for it.
        if let Some(link) = &spec.link {
            if let Some(why) = link.unusable() {
                warn!(path = %spec.id, name = %spec.name, "interface {} is {why}: waiting for it", link.device());
                tokio::select! {
                    _ = link.usable() => {}
                    _ = stop.changed() => return,
                }
                info!(path = %spec.id, name = %spec.name, "interface usable again");
            }
        }
        let try_quic = s.transport == Transport::Quic && quic_failed.is_none_or(|t| t.elapsed() >= QUIC_RETRY);
        let attempt = async {
            if try_quic {
                match dial_quic(&s, &session, &spec, &hello).await {
                    Ok(v) => {
                        quic_failed = None;
                        return Ok(v);
                    }
                    Err(e) => {
                        warn!(path = %spec.id, name = %spec.name, error = %e, "QUIC subflow failed: this carrier falls back to TLS");
                        quic_failed = Some(Instant::now());
                    }
                }
            }
            dial_tls(&s, &spec, &hello).await
        };
        let r = tokio::select! {
            r = tokio::time::timeout(Duration::from_secs(15) + QUIC_HANDSHAKE_TIMEOUT, attempt) => r,
            _ = stop.changed() => return,
        };
        match r {
            Ok(Ok((sub, instance))) => {
                let restarted = {
                    let mut known = proxy.lock().unwrap_or_else(|e| e.into_inner());
                    let restarted = known.is_some_and(|k| k != instance);
                    *known = Some(instance);
                    restarted
                };
                if restarted {
                    // The proxy restarted and lost every connection: reset
                    // them here too, so passengers see it at once.
                    warn!(path = %spec.id, "proxy restarted: resetting passenger connections");
                    session.with(|st, _| st.ep.abort_all(polycorn_net::session::RESET_ABORTED));
                }
                backoff.reset();
                s.counters.subflows_up.fetch_add(1, Ordering::Relaxed);
                // The subflow ends as soon as its interface goes down (a
                // lost modem or SIM), not when the dead-path timer fires:
                // with every carrier gone, /readyz says so at once.
                let lost = async {
                    match &spec.link {
                        Some(link) => link.lost().await,
                        None => std::future::pending().await,
                    }
                };
                let slot = &transports[spec.id.index()];
                let run = async {
                    match sub {
                        Subflow::Tls(tls, probe) => {
                            let cc = subflow::stream_congestion(tls.get_ref().0).unwrap_or_default();
                            info!(path = %spec.id, name = %spec.name, proxy = %spec.proxy, transport = "tls", %cc, "subflow up");
                            slot.store(metrics::ON_TLS, std::sync::atomic::Ordering::Relaxed);
                            session.run_path_until(spec.id, *tls, Some(probe.into()), lost).await
                        }
                        Subflow::Quic(q) => {
                            info!(path = %spec.id, name = %spec.name, proxy = %spec.proxy, transport = "quic", cc = %s.quic_cc, "subflow up");
                            slot.store(metrics::ON_QUIC, std::sync::atomic::Ordering::Relaxed);
                            tokio::spawn(q.log_stats(spec.name.clone(), Duration::from_secs(2)));
                            let probe = polycorn_net::session::SendProbe::Quic(q.send_gauge());
                            session.run_path_until(spec.id, *q, Some(probe), lost).await
                        }
                    }
                };
                let r = tokio::select! {
                    r = run => r,
                    _ = stop.changed() => return,
                };
                slot.store(0, std::sync::atomic::Ordering::Relaxed);
                s.counters.subflows_down.fetch_add(1, Ordering::Relaxed);
                warn!(path = %spec.id, name = %spec.name, error = ?r.err(), "subflow down");
            }
            Ok(Err(e)) => {
                s.counters.connects_failed.fetch_add(1, Ordering::Relaxed);
                warn!(path = %spec.id, name = %spec.name, error = %e, "subflow connect failed");
            }
            Err(_) => {
                s.counters.connects_failed.fetch_add(1, Ordering::Relaxed);
                warn!(path = %spec.id, name = %spec.name, "subflow connect timed out");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff.next_wait()) => {}
            _ = stop.changed() => return,
        }
    }
}
