//! `polycorn-proxy`: the cloud half of a Polycorn pair. It serves exactly one
//! train: accepts that train's subflows (mutual TLS; any other train's
//! certificate is refused), multiplexes them into one session, opens the
//! real upstream connections the relay asks for (subject to a destination
//! policy, so it is never an open relay), and schedules downlink traffic
//! with the configured schedulerlet pipeline.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Parser;
use ipnet::IpNet;
use polycorn_core::{Endpoint, EndpointConfig, PathId, Role, DEFAULT_PROXY_BUDGET, MAX_PATHS};
use polycorn_net::config::Scheduler;
use polycorn_net::metrics::{self, counter, gauge, Metric, Source};
use polycorn_net::options::{self, CommonOpts, CommonSettings};
use polycorn_net::session::{RESET_CONNECT_FAILED, RESET_REFUSED_BY_POLICY};
use polycorn_net::subflow::{self, Congestion, Hello, Transport};
use polycorn_net::table::{http::HttpOpts, FileAndApi, TableHub};
use polycorn_net::{merge_options, Session, SessionEvent};
use tokio::net::TcpStream;
use tracing::{debug, info, warn};

mod edge;
mod kafka;
mod policy;
mod preauth;
mod table_topic;

/// The tests against a real broker run in parallel; the ones that stop the
/// broker hold this for writing, the others for reading.
#[cfg(test)]
static BROKER: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Options: from the file given by `--config`, then `POLYCORN_PROXY_*`
/// environment variables, then flags (later wins).
#[derive(Parser, serde::Deserialize, Default, Debug)]
#[serde(rename_all = "kebab-case")]
#[command(name = "polycorn-proxy", version, about = "Polycorn cloud proxy: one per train")]
struct Opts {
    #[command(flatten)]
    #[serde(flatten)]
    common: CommonOpts,
    /// Address to accept subflows on [default: 0.0.0.0:4433].
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// CRL of the CA (PEM, `ca.crl` written by `polycorn-pki revoke` / `crl`):
    /// a train certificate it lists fails the handshake. Checked against the
    /// CA at start (an unusable CRL is an error) and re-read when the file
    /// changes (an unusable new file is refused, the previous CRL kept).
    #[arg(long)]
    crl: Option<PathBuf>,
    /// Most passenger connections of the train at once: beyond it the proxy
    /// refuses an OPEN with a RESET (counted in
    /// polycorn_conns_refused_total); kernel-mptcp-conn: new connections wait
    /// in the listen backlog instead [default: 16384].
    #[arg(long)]
    max_conns: Option<usize>,
    /// Prometheus metrics and health endpoints [default: 127.0.0.1:9464].
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Destinations the proxy refuses to connect to, comma-separated CIDRs;
    /// replaces the default list, which refuses the proxy's own host and the
    /// networks it may run in: unspecified and "this network" (0.0.0.0/8,
    /// ::/128), loopback (127.0.0.0/8, ::1/128), private (10.0.0.0/8,
    /// 172.16.0.0/12, 192.168.0.0/16, fc00::/7, fec0::/10), CGNAT
    /// (100.64.0.0/10), link-local (169.254.0.0/16, fe80::/10), multicast
    /// (224.0.0.0/4, ff00::/8), reserved and broadcast (240.0.0.0/4), IETF,
    /// benchmarking and documentation ranges. IPv6 addresses that carry an IPv4 address
    /// (::ffff:a.b.c.d, ::a.b.c.d, NAT64 64:ff9b::/96 and 64:ff9b:1::/48,
    /// 6to4 2002::/16) are checked as that IPv4 address too. Open a network
    /// with --allow rather than replacing this list.
    #[arg(long, value_delimiter = ',')]
    deny: Option<Vec<IpNet>>,
    /// Destinations allowed although a --deny network contains them,
    /// comma-separated CIDRs, e.g. `10.99.0.0/24` for an origin on a
    /// private network: the most specific entry of either list that contains
    /// the destination decides, and an allow entry wins a tie with a deny
    /// entry of the same prefix length, so `--allow 0.0.0.0/0` re-opens
    /// nothing. Only some networks: `--deny 0.0.0.0/0,::/0 --allow NETS`.
    /// Neither list can open the proxy's own host: its interface addresses
    /// (read again every 5 s), loopback and unspecified are always refused
    /// (but see --allow-own-address).
    #[arg(long, value_delimiter = ',')]
    allow: Option<Vec<IpNet>>,
    /// Addresses of this host that passengers may reach nonetheless,
    /// comma-separated addresses (not networks), which --deny and --allow
    /// must still admit: only for a benchmark whose origin servers share the
    /// proxy's host or listen on loopback (never in
    /// production: every service of the host bound to all interfaces, or
    /// to that loopback address, answers there).
    #[arg(long, value_delimiter = ',')]
    allow_own_address: Option<Vec<std::net::IpAddr>>,
    /// Most subflows in their TLS or QUIC handshake and HELLO at once from
    /// one source (an IPv4 address, an IPv6 /64); beyond it a new connection
    /// is closed at once. 0: no per-source limit, for a proxy that sees
    /// every train through one address (a TCP relay in front of it)
    /// [default: 4].
    #[arg(long)]
    handshakes_per_source: Option<usize>,
    /// Networks of the edge in front of the proxy (Envoy; comma-separated
    /// CIDRs): a TCP connection from one of them must start with a PROXY
    /// protocol v2 header, whose source address is then the connection's
    /// (for --handshakes-per-source and the log); one without a valid
    /// header is closed. Connections from elsewhere are taken as they come.
    /// QUIC is not covered (Envoy's UDP proxy sends no header).
    #[arg(long, value_delimiter = ',')]
    proxy_protocol_from: Option<Vec<IpNet>>,
    /// Upstream connect timeout in seconds [default: 10].
    #[arg(long)]
    connect_timeout_s: Option<f64>,
    /// Memory shared by every passenger connection, bytes: its send buffer
    /// and receive window (buffer capacity, not only bytes held), its
    /// floors and a fixed overhead for its sockets, task and copy buffers
    /// (160 KiB). Windows and send buffers grow past their floors only
    /// below half of it (the other half is kept for new connections'
    /// reservations); windows shrink back above three quarters. The budget is hard: a
    /// new connection reserves its overhead and floors (352 KiB with the
    /// default buffers), and one that does not fit is refused with a RESET
    /// (code 5, overloaded; counted in polycorn_conns_refused_total), so at
    /// most about budget / 352 KiB connections are served at once, whatever
    /// --max-conns says. Size the pod's memory limit at the budget plus the
    /// process's own (docs/operations.md) [default: 268435456 (256 MiB)].
    #[arg(long)]
    mem_budget: Option<u64>,
    /// Follow the trainer's compacted Kafka topic of failure-location
    /// tables (e.g. `polycorn.failure-tables.v1`; needs --kafka-brokers):
    /// read from the beginning at start, then followed; a table is used when
    /// its version is higher than the one in use. The data plane does not
    /// wait for it. With --failure-table too, the file may still replace the
    /// table with any version when it changes.
    #[arg(long)]
    failure_table_topic: Option<String>,
    /// Kafka bootstrap servers for the train's telemetry, e.g.
    /// `kafka-0:9092,kafka-1:9092`. Without it telemetry has no sink: it is
    /// acknowledged on receipt and discarded (counted).
    #[arg(long)]
    kafka_brokers: Option<String>,
    /// Topic for telemetry records [default: polycorn.telemetry.v1].
    #[arg(long)]
    kafka_topic: Option<String>,
    /// Dead-letter topic for malformed records, reason in the
    /// `polycorn-error` header [default: polycorn.telemetry.dlq].
    #[arg(long)]
    kafka_dlq_topic: Option<String>,
    /// How the Kafka clients (telemetry producer, table consumer) reach the
    /// brokers: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL (docs/security.md,
    /// "Kafka") [default: PLAINTEXT].
    #[arg(long)]
    kafka_security_protocol: Option<String>,
    /// SASL mechanism with SASL_SSL or SASL_PLAINTEXT: SCRAM-SHA-512 or
    /// SCRAM-SHA-256 [default: SCRAM-SHA-512].
    #[arg(long)]
    kafka_sasl_mechanism: Option<String>,
    /// SASL user name: the Kafka principal `User:NAME` that the ACLs name.
    #[arg(long)]
    kafka_sasl_username: Option<String>,
    /// File holding the SASL password (its first line): the password itself
    /// is never a flag.
    #[arg(long)]
    kafka_sasl_password_file: Option<PathBuf>,
    /// CA certificate(s) (PEM) that sign the brokers' certificates, with SSL
    /// or SASL_SSL [default: the system's trust store]. The broker's
    /// certificate must name the host dialled.
    #[arg(long)]
    kafka_ssl_ca: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS to Kafka; needs --kafka-ssl-key.
    #[arg(long)]
    kafka_ssl_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM, unencrypted).
    #[arg(long)]
    kafka_ssl_key: Option<PathBuf>,
}

struct Settings {
    train_id: String,
    listen: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    /// `--crl`, watched for changes; taken by `run`.
    crl: Option<polycorn_pki::CrlWatch>,
    /// `--scheduler`: each session builds its own pipeline.
    scheduler: Scheduler,
    transport: Transport,
    /// `--subflow-cc`.
    congestion: Congestion,
    /// `--quic-cc`, and its controllers' counters.
    quic_cc: polycorn_net::quic::QuicCc,
    cc_stats: Arc<polycorn_net::quic::CcStats>,
    /// kernel-mptcp-conn's connection cap.
    max_conns: usize,
    metrics_listen: SocketAddr,
    /// `--deny` and `--allow`.
    policy: policy::Policy,
    /// `--handshakes-per-source`.
    handshakes_per_source: usize,
    /// `--proxy-protocol-from`.
    edge: edge::Edge,
    connect_timeout: Duration,
    /// Every session's endpoint starts from this; clones share its memory
    /// budget, so a relay that reconnects does not get a second one.
    endpoint: EndpointConfig,
    /// `--failure-table-verify-key`: the keys tables must be signed with.
    table_verifier: Option<polycorn_net::table::signature::Verifier>,
    failure_table: Option<PathBuf>,
    /// `--failure-table-state-dir`: where the highest table accepted is kept.
    failure_table_state_dir: Option<PathBuf>,
    /// `--failure-table-url` and its options.
    table_url: Option<HttpOpts>,
    /// (brokers, topic) of the failure-location tables.
    table_topic: Option<(String, String)>,
    /// (brokers, topic, dead-letter topic), when telemetry goes to Kafka.
    kafka: Option<(String, String, String)>,
    /// How both Kafka clients authenticate.
    kafka_security: kafka::KafkaSecurity,
    /// `--trace-dir` and `--trace-max-bytes`.
    trace: Option<polycorn_net::segtrace::TraceOptions>,
}

/// Help texts of shared options that say more for the proxy.
const PROXY_HELP: &[(&str, &str)] = &[
    ("train_id", "The train this proxy serves; subflows from any other train are refused."),
    ("ca", "CA certificate that signs train certificates (PEM)."),
    ("cert", "This proxy's certificate (PEM)."),
    ("key", "This proxy's private key (PEM)."),
    (
        "transport",
        "`tls` (one TLS subflow per train interface); `quic` (QUIC subflows on UDP and TLS subflows on TCP, the same \
         port: a train's carrier where UDP does not get through falls back to TLS); `kernel-mptcp` (one MPTCP \
         connection scheduled by the \
         kernel, carrying every passenger connection); or `kernel-mptcp-conn` (each passenger connection its own \
         MPTCP connection with TLS, as OpenMPTCProuter runs it; the destination policy and --connect-timeout-s \
         apply, there is no session, scheduler or telemetry) [default: tls].",
    ),
];

fn settings() -> anyhow::Result<(Settings, bool)> {
    let (mut o, mut f) = options::read::<Opts>("PROXY", PROXY_HELP, |o| o.common.config.as_deref())?;
    o.common.merge(&mut f.common);
    merge_options!(o, f; listen, crl, max_conns, metrics_listen, deny, allow, allow_own_address, handshakes_per_source, proxy_protocol_from, connect_timeout_s, mem_budget,
        kafka_brokers, kafka_topic, kafka_dlq_topic, failure_table_topic, kafka_security_protocol, kafka_sasl_mechanism,
        kafka_sasl_username, kafka_sasl_password_file, kafka_ssl_ca, kafka_ssl_cert, kafka_ssl_key);
    let CommonSettings {
        train_id,
        scheduler,
        // The check's pipeline: each session builds its own.
        pipeline: _,
        transport,
        congestion,
        quic_cc,
        table_url,
        table_verifier,
        trace,
    } = o.common.settings()?;
    let table_topic = match (o.failure_table_topic.take(), &o.kafka_brokers) {
        (Some(topic), Some(b)) => Some((b.clone(), topic)),
        (Some(_), None) => bail!("--failure-table-topic needs --kafka-brokers (the Kafka the trainer publishes to)"),
        (None, _) => None,
    };
    let kafka_security = kafka::KafkaSecurity::from_flags(&kafka::KafkaSecurityFlags {
        protocol: o.kafka_security_protocol.as_deref(),
        mechanism: o.kafka_sasl_mechanism.as_deref(),
        username: o.kafka_sasl_username.as_deref(),
        password_file: o.kafka_sasl_password_file.as_deref(),
        ca: o.kafka_ssl_ca.as_deref(),
        cert: o.kafka_ssl_cert.as_deref(),
        key: o.kafka_ssl_key.as_deref(),
    })
    .map_err(anyhow::Error::msg)?;
    let (ca, cert, key) = o.common.tls_files()?;
    let (tls, crl) =
        polycorn_pki::server_config_with_crl(&ca, &cert, &key, std::slice::from_ref(&train_id), o.crl.as_deref())
            .context("loading the proxy's TLS material")?;
    let policy = policy::Policy::new(o.deny, o.allow).open_own_addresses(o.allow_own_address.unwrap_or_default());
    let mut endpoint = EndpointConfig::new(Role::Proxy);
    o.common.buffers(o.mem_budget).apply(&mut endpoint, DEFAULT_PROXY_BUDGET)?;
    endpoint.hard_budget = true;
    endpoint.conn_overhead_bytes = CONN_OVERHEAD_BYTES;
    let reservation = CONN_OVERHEAD_BYTES + endpoint.conn_window_min_bytes + endpoint.conn_unsent_min_bytes;
    if endpoint.budget.levels().high < reservation {
        bail!("--mem-budget must hold at least one connection's reservation ({reservation} bytes)");
    }
    endpoint.path = transport.path_config(endpoint.path);
    let timeout = o.connect_timeout_s.unwrap_or(10.0);
    if !(timeout > 0.0 && timeout < 3600.0) {
        bail!("--connect-timeout-s must be between 0 and 3600 seconds, got {timeout}");
    }
    let max_conns = o.max_conns.unwrap_or(endpoint.max_conns);
    if max_conns == 0 {
        bail!("--max-conns must be at least 1");
    }
    endpoint.max_conns = max_conns;
    Ok((
        Settings {
            trace,
            train_id,
            listen: o.listen.unwrap_or_else(|| "0.0.0.0:4433".parse().expect("valid")),
            tls,
            crl,
            scheduler,
            transport,
            congestion,
            quic_cc,
            cc_stats: Arc::default(),
            max_conns,
            metrics_listen: o.metrics_listen.unwrap_or_else(|| "127.0.0.1:9464".parse().expect("valid")),
            policy,
            handshakes_per_source: o.handshakes_per_source.unwrap_or(preauth::DEFAULT_PER_SOURCE),
            edge: edge::Edge::new(o.proxy_protocol_from.unwrap_or_default()),
            connect_timeout: Duration::from_secs_f64(timeout),
            endpoint,
            table_verifier,
            failure_table: o.common.failure_table,
            failure_table_state_dir: o.common.failure_table_state_dir,
            table_url,
            table_topic,
            kafka: o.kafka_brokers.map(|b| {
                (
                    b,
                    o.kafka_topic.unwrap_or_else(|| kafka::DEFAULT_TOPIC.into()),
                    o.kafka_dlq_topic.unwrap_or_else(|| kafka::DEFAULT_DLQ_TOPIC.into()),
                )
            }),
            kafka_security,
        },
        o.common.log_json.unwrap_or(false),
    ))
}

/// The session of the relay currently connected, keyed by its session id.
#[derive(Default)]
struct Current {
    session: Option<(u64, Session)>,
    path_names: Vec<(PathId, String)>,
    /// The transport of the subflow that came up last on each path, for
    /// `/readyz` (which reads it only for paths up): a subflow going down
    /// leaves it, since a newer one for the same path may already carry it.
    transports: metrics::PathTransports,
}

struct Proxy {
    s: Settings,
    /// Random per process start; relays detect a restarted proxy by it.
    instance: u64,
    current: Mutex<Current>,
    /// The failure-location table in use, given to every new session.
    table: Mutex<Option<polycorn_core::FailureTable>>,
    /// The table's route lines, for map matching the train's fixes.
    routes: polycorn_net::hof::SharedRoutes,
    /// Telemetry records that did not decode.
    telemetry_malformed: std::sync::atomic::AtomicU64,
    /// Where telemetry goes; None: acknowledged on receipt and discarded.
    sink: Option<Arc<kafka::KafkaSink>>,
    /// Records acknowledged and discarded for want of a sink.
    telemetry_discarded: std::sync::atomic::AtomicU64,
    /// Subflows before authentication (handshake and HELLO): their slots,
    /// per source and in all ([`preauth`]).
    preauth: Arc<preauth::PreAuth>,
    /// Connections refused a slot, logged at warn once a minute at most.
    preauth_log: polycorn_net::lograte::Every,
    /// OPENs refused by the destination policy: all counted, logged at
    /// warn once a minute at most (a passenger's scanner causes one per
    /// address it tries).
    destinations_refused: std::sync::atomic::AtomicU64,
    policy_log: polycorn_net::lograte::Every,
    /// Passenger connections whose upstream connect failed or timed out:
    /// all counted, logged once a minute at most (a passenger scanning
    /// closed ports causes one per port).
    upstream_failed: std::sync::atomic::AtomicU64,
    upstream_log: polycorn_net::lograte::Every,
    /// Subflows refused (a failed TLS handshake, HELLO, another train): all
    /// counted; those that failed before authentication logged at warn
    /// once a minute at most (anyone on the Internet can cause one).
    subflows_refused: std::sync::atomic::AtomicU64,
    refused_log: polycorn_net::lograte::Every,
}

/// Marks a subflow refused before its peer was authenticated (the TLS
/// handshake failed or timed out, other than for a fleet certificate of
/// another train): anyone on the Internet can cause that, so it is logged at
/// warn once a minute at most.
#[derive(Debug)]
struct Unauthenticated(&'static str);

impl std::fmt::Display for Unauthenticated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// `step` of a subflow's setup, unless a newer connection takes its
/// handshake's slot first.
async fn preauth_step<T>(
    handshake: &preauth::Permit,
    step: impl std::future::Future<Output = T>,
    what: &'static str,
) -> anyhow::Result<T> {
    tokio::select! {
        v = step => Ok(v),
        _ = handshake.evicted() => {
            Err(anyhow::anyhow!("its slot went to a newer connection (every slot busy)").context(Unauthenticated(what)))
        }
    }
}

/// A subflow's setup that ran out of [`preauth::PREAUTH_TIMEOUT`].
fn timed_out(what: &'static str) -> anyhow::Error {
    anyhow::anyhow!("no {what} within {} s of the accept", preauth::PREAUTH_TIMEOUT.as_secs())
        .context(Unauthenticated(what))
}

impl Proxy {
    /// A slot for a handshake from `peer`, or None (counted, and logged at
    /// warn once a minute at most).
    fn admit(&self, peer: SocketAddr, proven: bool, transport: &str) -> Option<preauth::Permit> {
        let mut source = preauth::Source::new(peer.ip(), proven);
        if transport == "quic" && self.s.edge.fronts(peer.ip()) {
            // QUIC through the edge's UDP proxy: the source is one of its
            // sessions, which names no client (no PROXY header over UDP).
            source = source.unlimited();
        }
        match self.preauth.admit(source, Instant::now()) {
            Ok(p) => Some(p),
            Err(r) => {
                if let Some(left_out) = self.preauth_log.check(Instant::now()) {
                    warn!(%peer, transport, reason = r.reason(), left_out, "connection refused before its handshake (logged once a minute at most; left_out: since the last line)");
                } else {
                    debug!(%peer, transport, reason = r.reason(), "connection refused before its handshake");
                }
                None
            }
        }
    }

    fn allowed(&self, dst: SocketAddr) -> bool {
        self.s.policy.allows(dst)
    }

    /// The session for `hello`, replacing an older one of a restarted relay,
    /// and where its paths' transports are noted.
    fn session_for(self: &Arc<Self>, hello: &Hello) -> anyhow::Result<(Session, metrics::PathTransports)> {
        let mut cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((id, s)) = cur.session.clone() {
            if id == hello.session {
                if !cur.path_names.iter().any(|(p, _)| *p == hello.path) {
                    cur.path_names.push((hello.path, hello.path_name.clone()));
                }
                return Ok((s, cur.transports.clone()));
            }
            info!(old = id, new = hello.session, "relay restarted: replacing its session");
            s.close();
        }
        let cfg = self.s.endpoint.clone();
        let pipeline = self.s.scheduler.build()?;
        let mut ep = Endpoint::new(cfg, pipeline, Instant::now());
        if let Some(t) = self.table.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            ep.set_failure_table(t);
        }
        let (session, events) = Session::new(ep);
        if let Some(t) = &self.s.trace {
            // One file per relay session: a restarted relay gets a new one.
            match polycorn_net::segtrace::start(&session, t, &format!("proxy-{:016x}", hello.session)) {
                Ok(file) => info!(file = %file.display(), "segment trace on"),
                Err(e) => {
                    warn!(dir = %t.dir.display(), error = %e, "segment trace: cannot create the file; not tracing")
                }
            }
        }
        tokio::spawn(self.clone().events(session.clone(), events));
        cur.session = Some((hello.session, session.clone()));
        cur.path_names = vec![(hello.path, hello.path_name.clone())];
        cur.transports = Default::default();
        Ok((session, cur.transports.clone()))
    }

    async fn events(self: Arc<Self>, session: Session, mut rx: polycorn_net::session::Events) {
        // The train's position, from its GPS telemetry, for the downlink's
        // handover-failure prediction.
        let mut tracker = polycorn_core::TrainTracker::new();
        let mut positioner = polycorn_net::hof::Positioner::new(Some(self.routes.clone()));
        let mut ingest = kafka::Ingest::new(&self.s.train_id, kafka::MAX_IN_FLIGHT);
        // Kafka's delivery reports, (seq, confirmed).
        let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<(u64, bool)>();
        loop {
            let ev = tokio::select! {
                ev = rx.recv() => match ev { Some(ev) => ev, None => break },
                Some((seq, ok)) = done_rx.recv() => {
                    if ingest.on_delivered(seq, ok) {
                        session.with(|st, _| st.ep.ack_telemetry(seq));
                    }
                    continue;
                }
            };
            match ev {
                SessionEvent::ConnOpened { conn, user, dst } => {
                    if !self.allowed(dst) {
                        self.destinations_refused.fetch_add(1, Relaxed);
                        if let Some(left_out) = self.policy_log.check(Instant::now()) {
                            warn!(%conn, %user, %dst, left_out, "destination refused by policy (logged once a minute at most; left_out: since the last line)");
                        } else {
                            debug!(%conn, %user, %dst, "destination refused by policy");
                        }
                        session.reset(conn, RESET_REFUSED_BY_POLICY);
                        continue;
                    }
                    let stream = session.stream(conn);
                    let timeout = self.s.connect_timeout;
                    let me = self.clone();
                    tokio::spawn(async move {
                        let why = match tokio::time::timeout(timeout, TcpStream::connect(dst)).await {
                            Ok(Ok(up)) => {
                                let _ = up.set_nodelay(true);
                                relay(stream, up).await;
                                return;
                            }
                            Ok(Err(e)) => e.to_string(),
                            Err(_) => format!("no answer within {} s", timeout.as_secs_f64()),
                        };
                        me.upstream_failed.fetch_add(1, Relaxed);
                        if let Some(left_out) = me.upstream_log.check(Instant::now()) {
                            info!(%conn, %dst, error = %why, left_out, "upstream connect failed (logged once a minute at most; left_out: since the last line)");
                        } else {
                            debug!(%conn, %dst, error = %why, "upstream connect failed");
                        }
                        stream_reset(stream, RESET_CONNECT_FAILED);
                    });
                }
                SessionEvent::PathStatus { path, state, cell } => {
                    info!(%path, ?state, cell, "radio interface status");
                }
                SessionEvent::Telemetry { seq, payload } => {
                    use prost::Message as _;
                    let decoded = polycorn_telemetry::v1::Record::decode(payload.as_ref());
                    match &decoded {
                        Ok(rec) if rec.train_id == self.s.train_id => session.with(|st, now| {
                            let now_unix = std::time::SystemTime::now();
                            let state =
                                polycorn_net::hof::train_state_of(rec, &mut tracker, &mut positioner, now, now_unix);
                            if let Some(t) = state {
                                st.ep.set_train_state(t);
                            }
                        }),
                        Ok(_) => {}
                        Err(e) => {
                            self.telemetry_malformed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            tracing::debug!(seq, error = %e, "malformed telemetry record");
                        }
                    }
                    self.telemetry(&session, &mut ingest, &done_tx, seq, payload, Some(&decoded));
                }
                SessionEvent::TelemetryDuplicate { seq, payload } => {
                    self.telemetry(&session, &mut ingest, &done_tx, seq, payload, None);
                }
                SessionEvent::TelemetryAcked { .. } => {}
            }
        }
    }

    /// Send a telemetry record (or a copy) on to Kafka; acknowledge it to
    /// the relay once Kafka has it. `decoded`: the first copy, decoded by
    /// the caller; None for a copy (decoded here only if it is produced).
    fn telemetry(
        &self,
        session: &Session,
        ingest: &mut kafka::Ingest,
        done: &tokio::sync::mpsc::UnboundedSender<(u64, bool)>,
        seq: u64,
        payload: bytes::Bytes,
        decoded: Option<&Result<polycorn_telemetry::v1::Record, prost::DecodeError>>,
    ) {
        use std::sync::atomic::Ordering::Relaxed;
        let Some(sink) = &self.sink else {
            // No sink: acknowledge (a copy too, or the relay resends forever).
            if decoded.is_some() {
                self.telemetry_discarded.fetch_add(1, Relaxed);
            }
            session.with(|st, _| st.ep.ack_telemetry(seq));
            return;
        };
        let decision = match decoded {
            Some(d) => ingest.on_decoded(seq, d),
            None => ingest.on_record(seq, &payload),
        };
        match decision {
            kafka::Decision::Produce(target) => {
                if let kafka::Target::DeadLetter(why) = &target {
                    warn!(seq, reason = %why, "malformed telemetry record: to the dead-letter topic");
                }
                let delivered = sink.produce(seq, &payload, &target);
                let done = done.clone();
                tokio::spawn(async move {
                    let _ = done.send((seq, delivered.await));
                });
            }
            kafka::Decision::AckAgain => {
                sink.stats.reacked.fetch_add(1, Relaxed);
                session.with(|st, _| st.ep.ack_telemetry(seq));
            }
            kafka::Decision::InFlight => {}
            kafka::Decision::Full => {
                sink.stats.refused_full.fetch_add(1, Relaxed);
            }
        }
    }

    async fn accept_subflow(
        self: Arc<Self>,
        tcp: TcpStream,
        peer: SocketAddr,
        handshake: preauth::Permit,
    ) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + preauth::PREAUTH_TIMEOUT;
        subflow::tune(&tcp)?;
        let probe = subflow::UnsentProbe::new(&tcp)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(self.s.tls.clone());
        let accept = tokio::time::timeout_at(deadline, acceptor.accept(tcp));
        let tls = match preauth_step(&handshake, accept, "TLS handshake").await? {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) if polycorn_pki::authenticated_refusal(&e).is_some() => {
                return Err(anyhow::Error::new(e).context("TLS handshake"))
            }
            Ok(Err(e)) => return Err(anyhow::Error::new(e).context(Unauthenticated("TLS handshake"))),
            Err(_) => return Err(timed_out("TLS handshake")),
        };
        let cert_train = {
            let (_, conn) = tls.get_ref();
            let certs = conn.peer_certificates().context("no client certificate")?;
            polycorn_pki::train_id_of(&certs[0])?
        };
        let cc = subflow::stream_congestion(tls.get_ref().0).unwrap_or_default();
        self.serve_subflow(tls, cert_train, peer, (handshake, deadline), Some(probe.into()), ("tls", cc), None).await
    }

    /// A QUIC subflow ([`polycorn_net::quic`]): the same HELLO and the same
    /// one-train rule as over TLS.
    async fn accept_quic(
        self: Arc<Self>,
        incoming: quinn::Incoming,
        crypto: polycorn_net::quic::ServerCrypto,
        handshake: preauth::Permit,
    ) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + preauth::PREAUTH_TIMEOUT;
        let peer = incoming.remote_address();
        let accept = polycorn_net::quic::accept(incoming, &crypto, self.s.quic_cc, self.s.cc_stats.clone());
        let (sub, slot) =
            match preauth_step(&handshake, tokio::time::timeout_at(deadline, accept), "QUIC handshake").await? {
                Ok(Ok(v)) => v,
                // A certificate of another train fails inside quinn's
                // handshake, indistinguishable here from any other failure.
                Ok(Err(e)) => return Err(anyhow::Error::new(e).context(Unauthenticated("QUIC handshake"))),
                Err(_) => return Err(timed_out("QUIC handshake")),
            };
        let cert_train = sub.peer_train()?;
        tokio::spawn(sub.log_stats(peer.to_string(), Duration::from_secs(2)));
        let cc = self.s.quic_cc.to_string();
        let probe = polycorn_net::session::SendProbe::Quic(sub.send_gauge());
        self.serve_subflow(sub, cert_train, peer, (handshake, deadline), Some(probe), ("quic", cc), Some(slot)).await
    }

    /// Count and log a refused subflow.
    fn refused(&self, peer: SocketAddr, e: &anyhow::Error) {
        self.subflows_refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if e.downcast_ref::<Unauthenticated>().is_none() {
            // A peer with a fleet certificate: every refusal is worth an
            // operator's look.
            warn!(%peer, error = %format!("{e:#}"), "subflow refused");
        } else if let Some(left_out) = self.refused_log.check(Instant::now()) {
            warn!(
                %peer,
                error = %format!("{e:#}"),
                left_out,
                "subflow refused before authentication (logged once a minute at most; left_out: since the last line)"
            );
        } else {
            debug!(%peer, error = %format!("{e:#}"), "subflow refused before authentication");
        }
    }

    /// After authentication: the HELLO, the train checks, and the subflow's
    /// run in its session.
    #[allow(clippy::too_many_arguments)]
    async fn serve_subflow<S>(
        self: Arc<Self>,
        mut stream: S,
        cert_train: String,
        peer: SocketAddr,
        (handshake, deadline): (preauth::Permit, tokio::time::Instant),
        probe: Option<polycorn_net::session::SendProbe>,
        (transport, cc): (&'static str, String),
        slot: Option<Arc<polycorn_net::quic::HintSlot>>,
    ) -> anyhow::Result<()>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let hello = preauth_step(&handshake, subflow::server_read_hello(&mut stream, left), "HELLO").await??;
        if hello.train_id != cert_train || hello.train_id != self.s.train_id {
            bail!(
                "HELLO names train {:?} but the certificate is for {:?} and this proxy serves {:?}",
                hello.train_id,
                cert_train,
                self.s.train_id
            );
        }
        if hello.path.index() >= MAX_PATHS {
            bail!("path id {} out of range", hello.path);
        }
        let (session, transports) = self.session_for(&hello)?;
        if let Some(slot) = slot {
            slot.bind(session.hints().path(hello.path));
        }
        subflow::server_ack(&mut stream, &hello, self.instance).await?;
        handshake.authenticated(); // no longer counts as a handshake
        let on = if transport == "quic" { metrics::ON_QUIC } else { metrics::ON_TLS };
        transports[hello.path.index()].store(on, std::sync::atomic::Ordering::Relaxed);
        info!(%peer, path = %hello.path, name = %hello.path_name, transport, %cc, "subflow up");
        let r = session.run_path(hello.path, stream, probe).await;
        info!(%peer, path = %hello.path, result = ?r, "subflow down");
        Ok(())
    }
}

/// The proxy's own families: refused handshakes and subflows, and
/// telemetry it could not or need not forward.
const PROXY_METRICS: &[Metric<Proxy>] = &[
    counter(
        "polycorn_proxy_handshakes_evicted",
        "Subflows in their handshake or HELLO closed because a newer connection took their slot (every slot busy).",
        |p| p.preauth.evicted.load(Relaxed) as f64,
    ),
    gauge("polycorn_proxy_handshakes_in_flight", "Subflows in their TLS or QUIC handshake or HELLO.", |p| {
        p.preauth.in_flight() as f64
    }),
    counter(
        "polycorn_proxy_destinations_refused",
        "Passenger connections refused by the destination policy (logged at warn once a minute at most).",
        |p| p.destinations_refused.load(Relaxed) as f64,
    ),
    counter(
        "polycorn_proxy_upstream_connect_failed",
        "Passenger connections reset because the proxy's connect to their destination failed or timed out (logged once a minute at most).",
        |p| p.upstream_failed.load(Relaxed) as f64,
    ),
    counter(
        "polycorn_proxy_subflows_refused",
        "Subflows refused: a failed TLS handshake (logged at warn once a minute at most), a failed HELLO, another train.",
        |p| p.subflows_refused.load(Relaxed) as f64,
    ),
    counter(
        "polycorn_proxy_telemetry_discarded",
        "Telemetry records acknowledged and discarded because no --kafka-brokers is set.",
        |p| p.telemetry_discarded.load(Relaxed) as f64,
    ),
    counter("polycorn_telemetry_malformed", "Telemetry records from the relay that did not decode.", |p| {
        p.telemetry_malformed.load(Relaxed) as f64
    }),
];

/// The Kafka sink's families (with --kafka-brokers only).
const KAFKA_METRICS: &[Metric<kafka::SinkStats>] = &[
    counter("polycorn_proxy_telemetry_produced", "Telemetry records Kafka confirmed.", |k| {
        k.produced.load(Relaxed) as f64
    }),
    counter(
        "polycorn_proxy_telemetry_produce_errors",
        "Telemetry records Kafka did not confirm (not acknowledged; the relay resends).",
        |k| k.produce_errors.load(Relaxed) as f64,
    ),
    counter("polycorn_proxy_telemetry_dlq", "Malformed telemetry records the dead-letter topic confirmed.", |k| {
        k.dlq.load(Relaxed) as f64
    }),
    counter(
        "polycorn_proxy_telemetry_reacked",
        "Resent telemetry records Kafka already had, acknowledged again.",
        |k| k.reacked.load(Relaxed) as f64,
    ),
    counter(
        "polycorn_proxy_telemetry_refused",
        "Telemetry records not taken because too many were in flight to Kafka.",
        |k| k.refused_full.load(Relaxed) as f64,
    ),
    counter(
        "polycorn_proxy_telemetry_producer_replaced",
        "Kafka producers replaced because their deliveries failed and none succeeded for a minute.",
        |k| k.replaced.load(Relaxed) as f64,
    ),
    gauge("polycorn_proxy_telemetry_inflight", "Telemetry records sent to Kafka and awaiting confirmation.", |k| {
        k.inflight.load(Relaxed) as f64
    }),
];

fn write_proxy_metrics(w: &mut metrics::Writer, p: &Proxy) {
    for (reason, n) in [("per_source", &p.preauth.refused_per_source), ("busy", &p.preauth.refused_busy)] {
        w.counter(
            "polycorn_proxy_handshakes_refused",
            "Connections closed at once, before their handshake: their source had --handshakes-per-source in flight \
             (per_source), or every slot they may take was busy (busy).",
            vec![("reason".into(), reason.into())],
            n.load(Relaxed) as f64,
        );
    }
    w.table(PROXY_METRICS, Vec::new, p);
    if let Some(k) = &p.sink {
        w.table(KAFKA_METRICS, Vec::new, &k.stats);
    }
}

/// Start the failure-location table's sources (file, LinkDB API, Kafka
/// topic), all feeding one hub that puts each table to use in the current
/// session and every later one. None when no source is configured.
fn table_sources(
    proxy: &Arc<Proxy>,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Option<Arc<TableHub>>> {
    let s = &proxy.s;
    if s.failure_table.is_none() && s.table_url.is_none() && s.table_topic.is_none() {
        return Ok(None);
    }
    let p = proxy.clone();
    let apply = move |t: polycorn_core::FailureTable| {
        *p.table.lock().unwrap_or_else(|e| e.into_inner()) = Some(t.clone());
        let cur = p.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, s)) = &cur.session {
            s.with(|st, _| st.ep.set_failure_table(t));
        }
    };
    let hub =
        TableHub::open(proxy.routes.clone(), s.table_verifier.clone(), s.failure_table_state_dir.as_deref(), apply)?;
    for t in FileAndApi::open(&hub, s.failure_table.as_deref(), s.table_url.as_ref())?.tasks(stop) {
        tokio::spawn(t);
    }
    if let Some((brokers, topic)) = &s.table_topic {
        let c = table_topic::TableTopic::new(brokers, &s.kafka_security, topic, &s.train_id, hub.clone())?;
        info!(%brokers, %topic, "failure-location table: following the Kafka topic from its beginning (the data plane does not wait for it)");
        tokio::spawn(c.run(stop.clone()));
    }
    Ok(Some(hub))
}

/// `--crl`: re-read the CRL file when it changes (every
/// `polycorn_net::table::file::CHECK_EVERY`, like the failure-location
/// table file); warn hourly while its nextUpdate has passed.
async fn watch_crl(mut crl: polycorn_pki::CrlWatch, mut stop: tokio::sync::watch::Receiver<bool>) {
    let every = polycorn_net::table::file::CHECK_EVERY;
    let expiry_every = (3600.0 / every.as_secs_f64()).max(1.0) as u64;
    let mut n = 0u64;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
        }
        n += 1;
        match crl.check() {
            Some(Ok(st)) if st.expired => {
                warn!(crl = %crl.path().display(), "new CRL in use, but its next update has passed: re-sign it (polycorn-pki crl)")
            }
            Some(Ok(st)) => info!(crl = %crl.path().display(), crls = st.crls, "new CRL in use"),
            Some(Err(e)) => {
                warn!(crl = %crl.path().display(), error = %e, "new CRL refused; the previous one stays in use")
            }
            None if n % expiry_every == 0 && crl.expired_now() => {
                warn!(crl = %crl.path().display(), "the CRL's next update has passed: re-sign it (polycorn-pki crl) and copy it here")
            }
            None => {}
        }
    }
}

fn stream_reset(stream: polycorn_net::ConnStream, code: u32) {
    stream.reset(code);
}

/// Each direction's copy buffer between a passenger's stream and its
/// upstream socket.
const COPY_BUFFER_BYTES: usize = 64 * 1024;

/// What a passenger connection holds outside the endpoint's buffers, charged
/// to the memory budget for its life: both copy buffers, and an allowance
/// for the upstream socket, the task and the connection's state in the
/// endpoint and session (a few KiB measured; the rest is headroom for
/// allocator rounding).
const CONN_OVERHEAD_BYTES: u64 = 2 * COPY_BUFFER_BYTES as u64 + 32 * 1024;

/// Copy both ways until both directions finished, telling the endpoint
/// where the server's bursts end (`polycorn_net::relay`).
async fn relay(mut a: polycorn_net::ConnStream, mut b: TcpStream) {
    if let Err(e) = polycorn_net::relay::relay_bursts(&mut a, &mut b, COPY_BUFFER_BYTES).await {
        tracing::debug!(conn = %a.id(), error = %e, "connection ended with an error");
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    polycorn_net::panics::finish("polycorn-proxy", run().await)
}

async fn run() -> anyhow::Result<()> {
    let (mut s, json) = match settings() {
        Ok(v) => v,
        Err(e) => {
            eprintln!("polycorn-proxy: {e:#}");
            std::process::exit(2);
        }
    };
    polycorn_net::logging::init("info", json);
    polycorn_net::panics::install("proxy");
    let listener = subflow::listen(s.listen, s.transport, &s.congestion)?;
    let crl = s.crl.take();
    if let Some(c) = &crl {
        let st = c.status();
        if st.expired {
            warn!(crl = %c.path().display(), "the CRL's next update has passed: re-sign it (polycorn-pki crl); it still applies");
        } else {
            info!(crl = %c.path().display(), crls = st.crls, "revoked train certificates are refused (CRL)");
        }
    }
    if !s.policy.opened_own_addresses().is_empty() {
        warn!(addresses = ?s.policy.opened_own_addresses(), "--allow-own-address: passengers may reach these addresses of this host");
    }
    info!(listen = %s.listen, train = %s.train_id, scheduler = %s.scheduler.name, transport = ?s.transport, subflow_cc = %s.congestion, "proxy started");
    let metrics_addr = s.metrics_listen;
    let instance = std::hash::BuildHasher::hash_one(
        &std::collections::hash_map::RandomState::new(),
        (Instant::now(), std::process::id()),
    );
    let sink = match &s.kafka {
        Some((brokers, topic, dlq)) => {
            info!(%brokers, %topic, dlq_topic = %dlq, security = %s.kafka_security.protocol(), user = ?s.kafka_security.username(), "telemetry goes to Kafka");
            Some(Arc::new(kafka::KafkaSink::new(brokers, &s.kafka_security, topic, dlq, &s.train_id)?))
        }
        None => {
            warn!("no --kafka-brokers: telemetry has no sink; records are acknowledged and discarded");
            None
        }
    };
    let per_source = s.handshakes_per_source;
    let proxy = Arc::new(Proxy {
        s,
        sink,
        telemetry_discarded: Default::default(),
        instance,
        current: Mutex::new(Current::default()),
        table: Mutex::new(None),
        routes: polycorn_net::hof::SharedRoutes::default(),
        telemetry_malformed: Default::default(),
        preauth: preauth::PreAuth::new(per_source),
        preauth_log: polycorn_net::lograte::Every::new(Duration::from_secs(60)),
        destinations_refused: Default::default(),
        policy_log: polycorn_net::lograte::Every::new(Duration::from_secs(60)),
        upstream_failed: Default::default(),
        upstream_log: polycorn_net::lograte::Every::new(Duration::from_secs(60)),
        subflows_refused: Default::default(),
        refused_log: polycorn_net::lograte::Every::new(Duration::from_secs(60)),
    });

    let p = proxy.clone();
    let source: Source = Arc::new(move |w| {
        let cur = p.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, s)) = &cur.session {
            let names = cur.path_names.clone();
            s.with(|st, now| metrics::write_session(w, st, &names, now));
        } else {
            // No train connected: the budget every session will share.
            metrics::write_budget(w, &p.s.endpoint.budget);
        }
        write_proxy_metrics(w, &p);
    });
    let mut sources = vec![source];
    if proxy.s.transport == Transport::Quic {
        let cc = proxy.s.cc_stats.clone();
        sources.push(Arc::new(move |w| metrics::write_subflow_transports(w, &[], &[], &cc)));
    }
    let conn_mode = proxy.s.transport == Transport::KernelMptcpConn;
    let conn_stats = Arc::new(polycorn_net::mptcp_conn::ConnStats::default());
    if conn_mode {
        let st = conn_stats.clone();
        sources.push(Arc::new(move |w| st.write_proxy(w)));
    }
    let p = proxy.clone();
    let ready = Arc::new(move || {
        // kernel-mptcp-conn: listening is all there is to be ready for.
        if conn_mode {
            return true.into();
        }
        let cur = p.current.lock().unwrap_or_else(|e| e.into_inner());
        match &cur.session {
            Some((_, s)) => {
                let up = s.with(|st, _| st.ep.up_paths());
                metrics::path_readiness(&cur.path_names, &up, &cur.transports[..], p.s.transport)
            }
            None => false.into(),
        }
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut m_stop = stop_rx.clone();
    if let Some(c) = crl {
        tokio::spawn(watch_crl(c, stop_rx.clone()));
    }
    if let Some(hub) = table_sources(&proxy, &stop_rx)? {
        sources.push(hub.metrics());
    }
    let metrics_task = tokio::spawn(metrics::serve(metrics_addr, sources, ready, async move {
        let _ = m_stop.changed().await;
    }));

    if conn_mode {
        let p = proxy.clone();
        let opts = polycorn_net::mptcp_conn::ServeOpts {
            train_id: proxy.s.train_id.clone(),
            max_conns: proxy.s.max_conns,
            connect_timeout: proxy.s.connect_timeout,
            handshake_timeout: polycorn_net::mptcp_conn::HANDSHAKE_TIMEOUT,
            allowed: Arc::new(move |dst| p.allowed(dst)),
            stats: conn_stats,
        };
        info!(max_conns = opts.max_conns, "kernel-mptcp-conn: one MPTCP connection per passenger connection");
        polycorn_net::mptcp_conn::serve(listener, &proxy.s.tls, opts, async {
            polycorn_net::shutdown_signal().await;
            info!("shutting down");
        })
        .await;
        let _ = stop_tx.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(2), metrics_task).await;
        if let Some(k) = proxy.sink.clone() {
            let _ = tokio::task::spawn_blocking(move || k.flush(Duration::from_secs(5))).await;
        }
        return Ok(());
    }
    // Over QUIC the proxy also takes TLS subflows on the same port (TCP):
    // a carrier where UDP does not get through falls back to them.
    let quic = match proxy.s.transport {
        Transport::Quic => {
            let (endpoint, crypto) = polycorn_net::quic::listen(proxy.s.listen, &proxy.s.tls)
                .with_context(|| format!("QUIC listener on UDP {}", proxy.s.listen))?;
            info!(listen = %proxy.s.listen, cc = %proxy.s.quic_cc, "QUIC subflows on UDP, TLS subflows on TCP");
            Some((endpoint, crypto))
        }
        _ => None,
    };
    let accept_quic = async {
        let Some((endpoint, crypto)) = &quic else { return std::future::pending().await };
        while let Some(incoming) = endpoint.accept().await {
            // An unvalidated source may be spoofed: it is counted apart,
            // and refused a slot it is asked to prove itself (a stateless
            // retry), after which it is counted as itself.
            let proven = incoming.remote_address_validated();
            let Some(handshake) = proxy.admit(incoming.remote_address(), proven, "quic") else {
                if !proven && incoming.may_retry() {
                    if let Err(e) = incoming.retry() {
                        e.into_incoming().refuse();
                    }
                } else {
                    incoming.refuse();
                }
                continue;
            };
            let p = proxy.clone();
            let crypto = crypto.clone();
            tokio::spawn(async move {
                let peer = incoming.remote_address();
                if let Err(e) = p.clone().accept_quic(incoming, crypto, handshake).await {
                    p.refused(peer, &e);
                }
            });
        }
    };
    let accept = async {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(v) => v,
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            if !proxy.s.edge.fronts(peer.ip()) {
                let Some(handshake) = proxy.admit(peer, true, "tls") else { continue };
                let p = proxy.clone();
                tokio::spawn(async move {
                    if let Err(e) = p.clone().accept_subflow(tcp, peer, handshake).await {
                        p.refused(peer, &e);
                    }
                });
                continue;
            }
            // From the edge: the client is in the connection's first bytes,
            // which the edge sends at once.
            let p = proxy.clone();
            tokio::spawn(async move {
                let mut tcp = tcp;
                let header = tokio::time::timeout(preauth::PREAUTH_TIMEOUT, p.s.edge.client(&mut tcp, peer));
                let client = match header.await {
                    Ok(Ok(client)) => client,
                    Ok(Err(e)) => return p.refused(peer, &e.context(Unauthenticated("PROXY protocol header"))),
                    Err(_) => return p.refused(peer, &timed_out("PROXY protocol header")),
                };
                let Some(handshake) = p.admit(client, true, "tls") else { return };
                if let Err(e) = p.clone().accept_subflow(tcp, client, handshake).await {
                    p.refused(client, &e);
                }
            });
        }
    };
    tokio::select! {
        _ = accept => {}
        _ = accept_quic => {}
        _ = polycorn_net::shutdown_signal() => info!("shutting down"),
    }
    let _ = stop_tx.send(true);
    if let Some((_, s)) = proxy.current.lock().unwrap_or_else(|e| e.into_inner()).session.take() {
        s.close();
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), metrics_task).await;
    if let Some(k) = proxy.sink.clone() {
        let _ = tokio::task::spawn_blocking(move || k.flush(Duration::from_secs(5))).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The policy the flags make, asked about `host:port` destinations.
    fn policy(args: &[&str]) -> impl Fn(&str) -> bool {
        let o = Opts::try_parse_from([&["polycorn-proxy"], args].concat()).expect("flags");
        let p = policy::Policy::new(o.deny, o.allow);
        move |dst: &str| p.allows(dst.parse().expect("socket address"))
    }

    #[test]
    fn the_default_policy_refuses_the_proxys_host_and_private_networks() {
        let ok = policy(&[]);
        for dst in [
            "[::]:7777",
            "0.0.0.0:7777",
            "127.0.0.1:80",
            "[::1]:80",
            "[::ffff:127.0.0.1]:80",
            "[64:ff9b::7f00:1]:80",
            "[64:ff9b::a00:1]:80",
            "10.0.0.1:9092",
            "172.20.0.5:5432",
            "192.168.0.7:9090",
        ] {
            assert!(!ok(dst), "{dst} must be refused by default");
        }
        assert!(ok("93.184.216.34:443"));
        assert!(ok("[2606:4700:4700::1111]:443"));
    }

    #[test]
    fn allow_reopens_a_private_network_without_restating_the_deny_list() {
        let ok = policy(&["--allow", "10.99.0.0/24"]);
        assert!(ok("10.99.0.10:80"));
        assert!(ok("[::ffff:10.99.0.10]:80"));
        assert!(!ok("10.98.0.10:80"));
        assert!(!ok("127.0.0.1:80"));
        assert!(!ok("[::]:80"));
        assert!(ok("93.184.216.34:443"));
    }

    #[test]
    fn deny_everything_allow_some_admits_only_those() {
        let ok = policy(&["--deny", "0.0.0.0/0,::/0", "--allow", "10.99.0.0/24"]);
        assert!(ok("10.99.0.10:80"));
        assert!(!ok("10.98.0.10:80"));
        assert!(!ok("93.184.216.34:443"));
    }

    /// The options of a config file with `text`, read as the proxy reads it.
    fn file_opts(text: &str) -> Result<Opts, polycorn_net::Error> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("proxy.toml");
        std::fs::write(&path, text).unwrap();
        options::load_file(Some(&path), &options::command::<Opts>("PROXY", &[]))
    }

    #[test]
    fn every_transport_parses() {
        for t in Transport::ALL.map(Transport::name) {
            assert_eq!(t.parse::<Transport>().unwrap().name(), t);
        }
        let e = "mptcp".parse::<Transport>().unwrap_err().to_string();
        assert!(e.contains("kernel-mptcp-conn"), "{e}");
        let o = file_opts("transport = \"kernel-mptcp-conn\"\nmax-conns = 10\n").unwrap();
        assert_eq!((o.common.transport.as_deref(), o.max_conns), (Some("kernel-mptcp-conn"), Some(10)));
    }

    #[test]
    fn the_config_file_uses_the_flag_names() {
        let o = file_opts("train-id = \"t\"\ndeny = [\"10.0.0.0/8\"]\n").unwrap();
        assert_eq!(o.deny.unwrap().len(), 1);
        assert!(file_opts("listen = 5\n").is_err());
        assert!(file_opts("kafka-brokerz = \"k:9092\"\n").is_err(), "typos are errors");
        // A relay-only option is not a proxy key.
        assert!(file_opts("path = [\"a=car0@10.0.0.1:4433\"]\n").is_err());
    }

    #[test]
    fn every_option_has_its_proxy_variable() {
        let cmd = options::command::<Opts>("PROXY", PROXY_HELP);
        for a in cmd.get_arguments() {
            let want = format!("POLYCORN_PROXY_{}", a.get_id().as_str().to_ascii_uppercase());
            let want = (!options::LISTINGS.contains(&a.get_id().as_str())).then_some(want.as_str());
            assert_eq!(a.get_env().and_then(|e| e.to_str()), want, "--{:?}", a.get_long());
        }
    }
}
