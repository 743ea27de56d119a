//! `polycorn-relay`: the on-train half of a Polycorn pair. It captures
//! passengers' TCP (transparently through nftables REDIRECT, or through a
//! SOCKS5 listener), answers their DNS through the tunnel, and carries every
//! connection over one TLS subflow per cellular interface to the train's
//! proxy, scheduling uplink traffic with the configured pipeline (or, for
//! the kernel baselines, over kernel MPTCP: see `--transport`).

use std::hash::BuildHasher;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Parser;
use polycorn_capture::{Dialer, GatewayAllow, InterceptRules, RelayOpts, UdpPolicy};
use polycorn_core::{
    Endpoint, EndpointConfig, PathId, Role, UserId, DEFAULT_RELAY_BUDGET, MAX_PATHS, PASSENGER_V6_PREFIX,
};
use polycorn_net::metrics::{self, PathTransports, Source, Writer};
use polycorn_net::mptcp_conn::{self, ConnDialer};
use polycorn_net::options::{self, CommonOpts, CommonSettings};
use polycorn_net::subflow::Transport;
use polycorn_net::table::{http::HttpOpts, FileAndApi, TableHub};
use polycorn_net::{merge_options, ConnStream, Session, SessionEvent};
use polycorn_relay::paths::{keep_path, parse_path, Dial, KnownProxy, PathSpec};
use polycorn_relay::{radio, spool};
use tokio::sync::watch;
use tracing::{info, warn};

/// Options: from the file given by `--config`, then `POLYCORN_RELAY_*`
/// environment variables, then flags (later wins).
#[derive(Parser, serde::Deserialize, Default, Debug)]
#[serde(rename_all = "kebab-case")]
#[command(name = "polycorn-relay", version, about = "Polycorn relay-agent: one per train gateway")]
struct Opts {
    #[command(flatten)]
    #[serde(flatten)]
    common: CommonOpts,
    /// One subflow per cellular interface: `NAME=DEVICE@PROXY_ADDR`, e.g.
    /// `carrier-a=wwan0@203.0.113.7:4433` (DEVICE may be empty to skip
    /// SO_BINDTODEVICE). Repeat the flag, or comma-separate.
    #[arg(long = "path", value_delimiter = ',')]
    #[serde(rename = "path")]
    paths: Option<Vec<String>>,
    /// Name the proxy's certificate must carry [default: proxy.polycorn].
    #[arg(long)]
    proxy_name: Option<String>,
    /// UDP port of this train's QUIC listener, where it is not the port of
    /// the --path addresses: behind a cloud load balancer that tells trains
    /// apart by TLS server name on one TCP port, each train's QUIC gets a UDP
    /// port of its own (QUIC cannot be routed by server name)
    /// [default: each path's port].
    #[arg(long)]
    quic_port: Option<u16>,
    /// Transparent-capture listener (nftables REDIRECT target), e.g. 0.0.0.0:15001.
    #[arg(long)]
    listen_transparent: Option<SocketAddr>,
    /// SOCKS5 listener for explicit use, e.g. 10.66.0.1:1080.
    #[arg(long)]
    listen_socks: Option<SocketAddr>,
    /// UDP DNS listener for passengers, e.g. 0.0.0.0:5353 (nftables
    /// redirects passengers' port 53 here when --lan-interface is set).
    #[arg(long)]
    listen_dns: Option<SocketAddr>,
    /// Resolver the proxy side reaches, queried over DNS-over-TCP through the
    /// tunnel: by the DNS forwarder (--listen-dns) and for SOCKS5 domain
    /// names (without it, SOCKS5 names are resolved by the train's own
    /// resolver, outside the tunnel; a warning says so).
    #[arg(long)]
    dns_upstream: Option<SocketAddr>,
    /// Passenger-facing interface: when set, the relay installs its
    /// nftables interception rules (table inet polycorn_relay) on it and
    /// removes them on exit. Needs CAP_NET_ADMIN.
    #[arg(long)]
    lan_interface: Option<String>,
    /// Gateway services passengers may reach, as `PROTO:PORT` or
    /// `PROTO:FIRST-LAST` (PROTO `tcp` or `udp`), e.g. `tcp:22,udp:123`.
    /// With --lan-interface the gateway is closed to the passenger LAN: on
    /// any of its addresses passengers reach only the relay (its capture,
    /// SOCKS5 and DNS ports), ICMP, and DHCP/DHCPv6 (UDP 67, 547); every
    /// other TCP connection is reset and other UDP refused, unless listed
    /// here. Repeat the flag, or comma-separate.
    #[arg(long = "gateway-allow", value_delimiter = ',')]
    #[serde(rename = "gateway-allow")]
    gateway_allow: Option<Vec<String>>,
    /// Passenger UDP other than DNS: `reject-quic` (reject UDP 443 so apps
    /// fall back to TCP, drop the rest), `drop-all` or `allow` [default: reject-quic].
    #[arg(long)]
    udp_policy: Option<String>,
    /// Prometheus metrics and health endpoints [default: 127.0.0.1:9465].
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Memory shared by every passenger connection's send buffer and
    /// receive window, bytes: windows grow freely below half of it, only to
    /// a fair share below three quarters, and shrink back above; at the
    /// budget no connection gets more than its floor [default: 67108864 (64 MiB)].
    #[arg(long)]
    mem_budget: Option<u64>,
    /// Most passenger connections at once per listener [default: 4096].
    #[arg(long)]
    max_conns: Option<usize>,
    /// Most connections of one passenger (see --ipv6-passenger-prefix) at
    /// once, so one passenger cannot take every slot; beyond it a connection
    /// is refused (a TCP reset; counted in polycorn_conns_refused_total, and
    /// under kernel-mptcp-conn in polycorn_capture_dial_failed) [default: 1024].
    #[arg(long)]
    max_conns_per_passenger: Option<usize>,
    /// How many leading bits of an IPv6 source address name one passenger
    /// (0-128): a device takes addresses from its LAN's /64 at will, so
    /// the caps count a /64 as one passenger; 128 counts each address
    /// [default: 64].
    #[arg(long)]
    ipv6_passenger_prefix: Option<u8>,
    /// Testbed radio source: replay a polycorn-tracegen event log
    /// (events.jsonl) as GPS fixes, serving cells, signal samples and
    /// handovers; carrier k of the log is the k-th --path.
    #[arg(long)]
    replay_events: Option<PathBuf>,
    /// Unix ms of the replayed trip's time zero (the link emulator's
    /// --epoch-unix-ms) [default: when the relay starts].
    #[arg(long)]
    replay_epoch_unix_ms: Option<i64>,
    /// Replay source: detect handovers from the log's raw cell and link
    /// stream (as the live sources do) instead of replaying its labels.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    replay_detect: Option<bool>,
    /// Replay source: send fixes and handovers with latitude and longitude
    /// only (no position along the track), as a GPS receiver does; HPR then
    /// places them on the failure-location table's route lines.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    replay_gps_only: Option<bool>,
    /// Read position fixes from gpsd at ADDR (host:port) [default when
    /// given without a value: 127.0.0.1:2947].
    #[arg(long, num_args = 0..=1, default_missing_value = radio::gpsd::DEFAULT_ADDR)]
    gpsd: Option<String>,
    /// Poll ModemManager modem MODEM_INDEX for path PATH_NAME's serving
    /// cell, registration and RSRP: `PATH_NAME=MODEM_INDEX`, e.g.
    /// `carrier-a=0`. Repeat the flag, or comma-separate.
    #[arg(long = "modem", value_delimiter = ',')]
    #[serde(rename = "modem")]
    modems: Option<Vec<String>>,
    /// The mmcli program to run [default: mmcli].
    #[arg(long)]
    mmcli: Option<String>,
    /// How often each modem is polled, ms [default: 1000].
    #[arg(long)]
    mmcli_interval_ms: Option<u64>,
    /// A loss of service at least this long is a failed handover, a shorter
    /// one a successful handover's interruption (docs/radio-sources.md)
    /// [default: 1000].
    #[arg(long)]
    handover_failure_threshold_ms: Option<u64>,
    /// Directory of the durable telemetry spool (docs/telemetry.md); one
    /// relay-agent per directory. Opened only when a radio source runs
    /// [default: /var/lib/polycorn/spool].
    #[arg(long)]
    telemetry_spool: Option<PathBuf>,
    /// Upper bound on the spool's size on disk, bytes; past it the oldest
    /// samples are dropped first, handover events last [default: 67108864].
    #[arg(long)]
    telemetry_spool_max_bytes: Option<u64>,
    /// Replay source: after a restart, report the events of the log since
    /// the newest record the spool took before it (and the whole log on a
    /// first start) instead of only those from now on, as a modem that
    /// keeps its own history would. Duplicates are harmless downstream.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    replay_resume: Option<bool>,
}

struct Settings {
    /// The train's id and TLS material, the proxy's name, the transport
    /// (`--transport`, `--subflow-cc`, `--quic-cc`, `--quic-port`).
    dial: Arc<Dial>,
    paths: Vec<PathSpec>,
    opts: Opts,
    /// `--scheduler`'s name (its pipeline is built by [`settings`]).
    scheduler: String,
    udp_policy: UdpPolicy,
    /// `--gateway-allow`.
    gateway_allow: Vec<GatewayAllow>,
    modems: Vec<radio::mmcli::ModemSpec>,
    detector: polycorn_telemetry::handover::DetectorConfig,
    /// `--failure-table-url` and its options.
    table_url: Option<HttpOpts>,
    /// `--failure-table-verify-key`: the keys tables must be signed with.
    table_verifier: Option<polycorn_net::table::signature::Verifier>,
    /// `--trace-dir` and `--trace-max-bytes`.
    trace: Option<polycorn_net::segtrace::TraceOptions>,
}

/// Help texts of shared options that say more for the relay.
const RELAY_HELP: &[(&str, &str)] = &[
    ("train_id", "This train's id; must match its certificate."),
    ("ca", "CA certificate that signs the proxy's certificate (PEM)."),
    ("cert", "This train's certificate (PEM)."),
    ("key", "This train's private key (PEM)."),
    (
        "transport",
        "`tls` (one TLS subflow per interface); `quic` (one QUIC subflow per interface, each falling back to TLS \
         on its own when UDP does not get through); `kernel-mptcp` (one MPTCP connection to the first path's proxy \
         address carrying every passenger connection; the kernel adds subflows on its configured endpoints); or \
         `kernel-mptcp-conn` (each passenger connection its own MPTCP connection with TLS to the first path's proxy \
         address, as OpenMPTCProuter runs it: no Polycorn session, so no scheduler and no telemetry upload) \
         [default: tls].",
    ),
];

/// The checked options, and the uplink's pipeline (built by the check).
fn settings() -> anyhow::Result<(Settings, polycorn_core::Pipeline)> {
    let (mut o, mut f) = options::read::<Opts>("RELAY", RELAY_HELP, |o| o.common.config.as_deref())?;
    o.common.merge(&mut f.common);
    merge_options!(o, f; paths, proxy_name, quic_port, listen_transparent, listen_socks, listen_dns, dns_upstream, lan_interface,
        gateway_allow, udp_policy, metrics_listen, mem_budget, max_conns, max_conns_per_passenger, ipv6_passenger_prefix, replay_events, replay_epoch_unix_ms,
        replay_detect, replay_gps_only, gpsd, modems, mmcli, mmcli_interval_ms, handover_failure_threshold_ms,
        telemetry_spool, telemetry_spool_max_bytes, replay_resume);
    let CommonSettings {
        train_id,
        scheduler,
        pipeline,
        transport,
        congestion,
        quic_cc,
        table_url,
        table_verifier,
        trace,
    } = o.common.settings()?;
    let specs = o.paths.clone().unwrap_or_default();
    if specs.is_empty() {
        bail!("at least one --path NAME=DEVICE@PROXY_ADDR is required");
    }
    if specs.len() > MAX_PATHS {
        bail!("at most {MAX_PATHS} paths are supported, got {}", specs.len());
    }
    let paths = specs.iter().enumerate().map(|(i, s)| parse_path(i, s)).collect::<anyhow::Result<Vec<_>>>()?;
    let (ca, cert, key) = o.common.tls_files()?;
    let tls = polycorn_pki::client_config(&ca, &cert, &key).context("loading the train's TLS material")?;
    let name = o.proxy_name.clone().unwrap_or_else(|| "proxy.polycorn".into());
    let proxy_name = rustls::pki_types::ServerName::try_from(name.clone())
        .with_context(|| format!("--proxy-name {name:?} is not a valid DNS name or IP address"))?;
    let udp_policy = match o.udp_policy.as_deref().unwrap_or("reject-quic") {
        "reject-quic" => UdpPolicy::RejectQuic,
        "drop-all" => UdpPolicy::DropAll,
        "allow" => UdpPolicy::Allow,
        other => bail!("unknown --udp-policy {other:?}: use reject-quic, drop-all or allow"),
    };
    let gateway_allow = o
        .gateway_allow
        .iter()
        .flatten()
        .map(|a| a.parse::<GatewayAllow>().map_err(|e| anyhow::anyhow!("--gateway-allow {e}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if !gateway_allow.is_empty() && o.lan_interface.is_none() {
        bail!("--gateway-allow needs --lan-interface (it opens holes in the rules installed there)");
    }
    o.common.buffers(o.mem_budget).apply(&mut EndpointConfig::new(Role::Relay), DEFAULT_RELAY_BUDGET)?;
    if o.max_conns_per_passenger == Some(0) {
        bail!("--max-conns-per-passenger must be at least 1");
    }
    if o.ipv6_passenger_prefix.is_some_and(|p| p > 128) {
        bail!("--ipv6-passenger-prefix must be 0 to 128");
    }
    if o.telemetry_spool_max_bytes.is_some_and(|b| b < spool::MIN_MAX_BYTES) {
        bail!("--telemetry-spool-max-bytes must be at least {}", spool::MIN_MAX_BYTES);
    }
    if o.listen_dns.is_some() && o.dns_upstream.is_none() {
        bail!("--listen-dns needs --dns-upstream (where the queries go, through the tunnel)");
    }
    if o.lan_interface.is_some() && o.listen_transparent.is_none() {
        bail!("--lan-interface needs --listen-transparent (where intercepted connections go)");
    }
    let names: Vec<String> = paths.iter().map(|p| p.name.clone()).collect();
    let modems = o
        .modems
        .iter()
        .flatten()
        .map(|m| radio::mmcli::parse_modem_spec(m, &names))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if o.mmcli_interval_ms == Some(0) {
        bail!("--mmcli-interval-ms must be at least 1");
    }
    let detector = polycorn_telemetry::handover::DetectorConfig {
        failure_threshold_ms: o
            .handover_failure_threshold_ms
            .unwrap_or(polycorn_telemetry::handover::DEFAULT_FAILURE_THRESHOLD_MS),
    };
    let dial = Dial {
        train_id,
        proxy_name,
        tls,
        transport,
        congestion,
        quic_cc,
        cc_stats: Arc::default(),
        quic_port: o.quic_port,
        counters: Default::default(),
    };
    let settings = Settings {
        trace,
        dial: Arc::new(dial),
        paths,
        opts: o,
        scheduler: scheduler.name,
        udp_policy,
        gateway_allow,
        modems,
        detector,
        table_url,
        table_verifier,
    };
    Ok((settings, pipeline))
}

/// Whether any radio source runs (and so the telemetry spool is opened).
/// Every radio source's flag belongs here.
fn radio_sources_configured(o: &Opts) -> bool {
    o.replay_events.is_some() || o.gpsd.is_some() || o.modems.as_ref().is_some_and(|m| !m.is_empty())
}

fn default_metrics_listen() -> SocketAddr {
    "127.0.0.1:9465".parse().expect("valid")
}

/// Opens passenger connections through the session, each under its
/// passenger (an IPv6 source by its prefix of `.1` bits).
#[derive(Clone)]
struct TunnelDialer(Session, u8);

impl Dialer for TunnelDialer {
    type Stream = ConnStream;
    fn dial(
        &self,
        user: IpAddr,
        dst: SocketAddr,
    ) -> impl std::future::Future<Output = std::io::Result<ConnStream>> + Send {
        let r = self.0.open(UserId::passenger(user, self.1), dst).map_err(|e| std::io::Error::other(e.to_string()));
        std::future::ready(r)
    }

    /// Passenger bytes enter the endpoint with their burst-end mark, so
    /// `tail-reject` with `bursts = 1` sees requests and chat messages that
    /// end without a FIN on the uplink too.
    fn poll_write_burst(
        stream: &mut ConnStream,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
        end: bool,
    ) -> std::task::Poll<std::io::Result<usize>> {
        stream.poll_write_burst(cx, buf, end)
    }
}

/// `kernel-mptcp-conn`: each passenger connection its own MPTCP connection.
#[derive(Clone, Debug)]
struct MptcpConnDialer(ConnDialer);

impl Dialer for MptcpConnDialer {
    type Stream = mptcp_conn::ClientStream;
    fn dial(
        &self,
        user: IpAddr,
        dst: SocketAddr,
    ) -> impl std::future::Future<Output = std::io::Result<mptcp_conn::ClientStream>> + Send {
        let d = self.0.clone();
        async move { d.dial(user, dst).await }
    }
}

/// The passenger-facing servers, bound, with their options.
#[derive(Default)]
struct Listeners {
    transparent: Option<(tokio::net::TcpListener, RelayOpts)>,
    /// With the resolver for SOCKS5 names (`--dns-upstream`) if any.
    socks: Option<(tokio::net::TcpListener, RelayOpts, Option<SocketAddr>)>,
    dns: Option<(tokio::net::UdpSocket, SocketAddr, RelayOpts)>,
}

/// Serve every listener through `dialer` until `stop` says so.
fn spawn_capture<D: Dialer>(
    tasks: &mut tokio::task::JoinSet<()>,
    dialer: D,
    l: Listeners,
    stop_rx: &watch::Receiver<bool>,
) {
    let stop = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.changed().await;
    };
    if let Some((l, o)) = l.transparent {
        tasks.spawn(polycorn_capture::serve_transparent(l, dialer.clone(), o, stop(stop_rx.clone())));
    }
    match l.socks {
        Some((l, o, Some(upstream))) => {
            let resolver = polycorn_capture::TunnelResolver::new(dialer.clone(), upstream);
            tasks.spawn(polycorn_capture::serve_socks5_with_resolver(
                l,
                dialer.clone(),
                resolver,
                o,
                stop(stop_rx.clone()),
            ));
        }
        Some((l, o, None)) => {
            tasks.spawn(polycorn_capture::serve_socks5(l, dialer.clone(), o, stop(stop_rx.clone())));
        }
        None => {}
    }
    if let Some((sock, upstream, o)) = l.dns {
        tasks.spawn(polycorn_capture::serve_dns(sock, upstream, dialer, o, stop(stop_rx.clone())));
    }
}

fn capture_metrics(w: &mut Writer, kind: &'static str, st: &polycorn_capture::CaptureStats) {
    let s = st.snapshot();
    let l = || vec![("listener".to_string(), kind.to_string())];
    w.counter("polycorn_capture_accepted", "Passenger connections accepted.", l(), s.accepted as f64);
    w.counter("polycorn_capture_refused", "Passenger connections refused.", l(), s.refused as f64);
    w.counter("polycorn_capture_dial_failed", "Tunnel dials that failed.", l(), s.dial_failed as f64);
    w.counter(
        "polycorn_capture_handshake_failed",
        "SOCKS5 clients that sent garbage, closed early or timed out in their handshake.",
        l(),
        s.handshake_failed as f64,
    );
    w.counter(
        "polycorn_capture_relay_errors",
        "Passenger connections whose relaying ended with an I/O error rather than two clean FINs.",
        l(),
        s.relay_errors as f64,
    );
    w.gauge("polycorn_capture_active", "Passenger connections being relayed.", l(), s.active as f64);
    w.counter("polycorn_capture_up_bytes", "Bytes from passengers into the tunnel.", l(), s.bytes_up as f64);
    w.counter("polycorn_capture_down_bytes", "Bytes from the tunnel to passengers.", l(), s.bytes_down as f64);
    w.counter("polycorn_capture_dns_queries", "DNS queries from passengers.", l(), s.dns_queries as f64);
    w.counter("polycorn_capture_dns_failed", "DNS queries that failed.", l(), s.dns_failed as f64);
    w.counter(
        "polycorn_capture_dns_limited",
        "DNS queries dropped because the answers to their source (an IPv4 address, an IPv6 /64) were over its byte budget.",
        l(),
        s.dns_limited as f64,
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    polycorn_net::panics::finish("polycorn-relay", run().await)
}

/// The radio sources (the trip replay, gpsd, the modems): the replay feeds
/// `radio::apply` directly; gpsd and the modems go through the handover
/// detector first. All end in one channel. Nothing when none is configured.
fn start_radio(
    s: &Arc<Settings>,
    tasks: &mut tokio::task::JoinSet<()>,
    session: &Session,
    spool: Option<Arc<spool::Shared>>,
    tables: Option<&TableHub>,
    sources_pre: &mut Vec<Source>,
    stop_rx: &watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let live = s.opts.gpsd.is_some() || !s.modems.is_empty();
    if s.opts.replay_events.is_some() || live {
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        let spool = spool.expect("opened when a radio source runs");
        let resume = s.opts.replay_events.is_some() && s.opts.replay_resume.unwrap_or(false);
        let spool_dir = spool.dir();
        let position = resume.then(|| spool_dir.join(radio::REPLAY_POSITION_FILE));
        let names: Vec<String> = s.paths.iter().map(|p| p.name.clone()).collect();
        let routes = tables.map(TableHub::routes);
        tasks.spawn(radio::apply(session.clone(), s.dial.train_id.clone(), spool, rx, names.clone(), position, routes));
        if let Some(file) = s.opts.replay_events.clone() {
            let epoch_unix_ms =
                s.opts.replay_epoch_unix_ms.unwrap_or_else(|| polycorn_net::hof::unix_ms(std::time::SystemTime::now()));
            let opts = radio::ReplayOpts {
                file,
                epoch_unix_ms,
                path_names: names.clone(),
                detect: s.opts.replay_detect.unwrap_or(false).then_some(s.detector),
                gps_only: s.opts.replay_gps_only.unwrap_or(false),
                // gpsd is the receiver: the log's fixes come from it (the
                // testbed's gpsfake plays them), not from the replay.
                no_gps: s.opts.gpsd.is_some(),
                resume_from_unix_ms: resume.then(|| radio::resume_point(&spool_dir, epoch_unix_ms)),
            };
            let log = radio::load_log(&opts.file)?;
            tasks.spawn(radio::replay(opts, log, tx.clone(), stop_rx.clone()));
        }
        if live {
            let counters = Arc::new(radio::detect::RadioCounters::default());
            let c = counters.clone();
            sources_pre.push(Arc::new(move |w: &mut Writer| c.write(w)));
            let (src_tx, src_rx) = tokio::sync::mpsc::channel(1024);
            let stage = radio::detect::DetectStage::new(s.detector, names, counters.clone());
            tasks.spawn(radio::detect::run(stage, src_rx, tx));
            if let Some(addr) = s.opts.gpsd.clone() {
                tasks.spawn(radio::gpsd::run(addr, src_tx.clone(), counters.clone(), stop_rx.clone()));
            }
            if !s.modems.is_empty() {
                let opts = radio::mmcli::MmcliOpts {
                    cmd: s.opts.mmcli.clone().unwrap_or_else(|| "mmcli".into()),
                    modems: s.modems.clone(),
                    interval: Duration::from_millis(s.opts.mmcli_interval_ms.unwrap_or(1000)),
                };
                tasks.spawn(radio::mmcli::run(opts, src_tx, counters, stop_rx.clone()));
            }
        }
    }
    Ok(())
}

/// The passenger-facing listeners (`--listen-transparent`, `--listen-socks`,
/// `--listen-dns`), bound; each server gets its own counters, exported with a
/// `listener` label (pushed to `sources`), whose stats are returned too.
async fn open_listeners(
    s: &Settings,
    max_conns: usize,
    sources: &mut Vec<Source>,
) -> anyhow::Result<(Listeners, Vec<Arc<polycorn_capture::CaptureStats>>)> {
    let mut passengers = Vec::new();
    let mut opts_for = |kind: &'static str| {
        let o = RelayOpts { max_conns, ..Default::default() };
        passengers.push(o.stats.clone());
        let st = o.stats.clone();
        sources.push(Arc::new(move |w| capture_metrics(w, kind, &st)));
        o
    };
    let bind = |addr: SocketAddr| async move {
        tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))
    };
    let mut listeners = Listeners::default();
    if let Some(addr) = s.opts.listen_transparent {
        listeners.transparent = Some((bind(addr).await?, opts_for("transparent")));
        info!(%addr, "transparent capture listening");
    }
    if let Some(addr) = s.opts.listen_socks {
        listeners.socks = Some((bind(addr).await?, opts_for("socks5"), s.opts.dns_upstream));
        match s.opts.dns_upstream {
            Some(upstream) => info!(%addr, %upstream, "SOCKS5 listening; names resolved through the tunnel"),
            None => warn!(
                %addr,
                "SOCKS5 listening; without --dns-upstream its names are resolved by the train's own resolver, outside the tunnel"
            ),
        }
    }
    if let (Some(addr), Some(upstream)) = (s.opts.listen_dns, s.opts.dns_upstream) {
        let sock = tokio::net::UdpSocket::bind(addr).await.with_context(|| format!("binding {addr}"))?;
        listeners.dns = Some((sock, upstream, opts_for("dns")));
        info!(%addr, %upstream, "DNS listening");
    }
    Ok((listeners, passengers))
}

/// `--lan-interface`: the nftables interception rules, installed (removed
/// again at shutdown).
fn install_rules(s: &Settings) -> anyhow::Result<Option<InterceptRules>> {
    Ok(match (&s.opts.lan_interface, s.opts.listen_transparent) {
        (Some(lan), Some(t)) => {
            // The rest of the gateway (the relay's metrics too, which the
            // image serves on every address for Prometheus) is closed to
            // the passengers.
            let r = InterceptRules {
                lan_if: lan.clone(),
                tcp_redirect_port: t.port(),
                dns_port: s.opts.listen_dns.map_or(0, |d| d.port()),
                udp_policy: s.udp_policy,
                passenger_tcp_ports: s.opts.listen_socks.map(|a| a.port()).into_iter().collect(),
                gateway_allow: s.gateway_allow.clone(),
            };
            r.install().with_context(|| format!("installing interception rules on {lan}"))?;
            let allowed: Vec<String> = s.gateway_allow.iter().map(ToString::to_string).collect();
            info!(%lan, gateway_allow = ?allowed, "interception rules installed; the gateway is closed to passengers");
            Some(r)
        }
        _ => None,
    })
}

async fn run() -> anyhow::Result<()> {
    let (s, pipeline) = match settings() {
        Ok((s, pipeline)) => (Arc::new(s), pipeline),
        Err(e) => {
            eprintln!("polycorn-relay: {e:#}");
            std::process::exit(2);
        }
    };
    polycorn_net::logging::init("info", s.opts.common.log_json.unwrap_or(false));
    polycorn_net::panics::install("relay");
    let session_id = std::collections::hash_map::RandomState::new().hash_one((Instant::now(), std::process::id()));
    let mut cfg = EndpointConfig::new(Role::Relay);
    s.opts.common.buffers(s.opts.mem_budget).apply(&mut cfg, DEFAULT_RELAY_BUDGET)?;
    cfg.path = s.dial.transport.path_config(cfg.path);
    cfg.max_conns_per_user = s.opts.max_conns_per_passenger.unwrap_or(cfg.max_conns_per_user);
    let per_passenger = cfg.max_conns_per_user;
    let v6_prefix = s.opts.ipv6_passenger_prefix.unwrap_or(PASSENGER_V6_PREFIX);
    let ep = Endpoint::new(cfg, pipeline, Instant::now());
    let (session, mut events) = Session::new(ep);
    if let Some(t) = &s.trace {
        let file = polycorn_net::segtrace::start(&session, t, &format!("relay-{session_id:016x}"))
            .with_context(|| format!("--trace-dir {}", t.dir.display()))?;
        info!(file = %file.display(), "segment trace on");
    }
    // The failure-location table's sources, before any path is up.
    let tables = if s.opts.common.failure_table.is_some() || s.table_url.is_some() {
        let ts = session.clone();
        let state_dir = s.opts.common.failure_table_state_dir.as_deref();
        Some(TableHub::open(Default::default(), s.table_verifier.clone(), state_dir, move |t| {
            ts.with(|st, _| st.ep.set_failure_table(t))
        })?)
    } else {
        None
    };
    let table_sources = match &tables {
        Some(hub) => Some(FileAndApi::open(hub, s.opts.common.failure_table.as_deref(), s.table_url.as_ref())?),
        None => None,
    };
    info!(train = %s.dial.train_id, scheduler = %s.scheduler, transport = ?s.dial.transport, subflow_cc = %s.dial.congestion, paths = s.paths.len(), session = session_id, "relay started");

    let (stop_tx, stop_rx) = watch::channel(false);
    let stop = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.changed().await;
    };
    let mut tasks = tokio::task::JoinSet::new();
    let paths: Vec<PathSpec> = match s.dial.transport {
        Transport::Tls | Transport::Quic => s.paths.clone(),
        // One MPTCP connection; the kernel spreads it over its endpoints.
        // Not bound to a device: the binding would pin every subflow the
        // kernel adds to the first interface (and without a device, the
        // first interface going down does not end the whole connection).
        Transport::KernelMptcp => s.paths.iter().take(1).map(|p| PathSpec { link: None, ..p.clone() }).collect(),
        // No session paths: each passenger connection dials the first
        // path's proxy address itself (unbound, for the same reason).
        Transport::KernelMptcpConn => Vec::new(),
    };
    let conn_dialer = (s.dial.transport == Transport::KernelMptcpConn).then(|| {
        let proxy = s.paths[0].proxy;
        info!(%proxy, "kernel-mptcp-conn: one MPTCP connection per passenger connection");
        ConnDialer::new(proxy, s.dial.proxy_name.clone(), &s.dial.tls, Arc::default())
            .with_congestion(s.dial.congestion.clone())
            .with_passengers(v6_prefix, per_passenger)
    });
    let known_proxy = KnownProxy::default();
    let transports = PathTransports::default();
    let mut sources_pre: Vec<Source> = Vec::new();
    for p in &paths {
        tasks.spawn(keep_path(
            s.dial.clone(),
            session.clone(),
            p.clone(),
            session_id,
            known_proxy.clone(),
            transports.clone(),
            stop_rx.clone(),
        ));
    }
    if s.dial.transport == Transport::Quic {
        let names: Vec<(PathId, String)> = paths.iter().map(|p| (p.id, p.name.clone())).collect();
        let (t, cc) = (transports.clone(), s.dial.cc_stats.clone());
        sources_pre.push(Arc::new(move |w: &mut Writer| metrics::write_subflow_transports(w, &names, &t[..], &cc)));
    }
    // The telemetry spool, when a radio source feeds it.
    let spool = if radio_sources_configured(&s.opts) {
        if conn_dialer.is_some() {
            warn!("kernel-mptcp-conn has no session to the proxy: telemetry stays in the spool, within its bound");
        }
        let dir = s.opts.telemetry_spool.clone().unwrap_or_else(|| spool::DEFAULT_DIR.into());
        let max = s.opts.telemetry_spool_max_bytes.unwrap_or(spool::DEFAULT_MAX_BYTES);
        let sh = spool::Shared::open(&dir, max).context("opening the telemetry spool (--telemetry-spool)")?;
        tasks.spawn(spool::sender(sh.clone(), session.clone(), stop_rx.clone()));
        let m = sh.clone();
        sources_pre.push(Arc::new(move |w: &mut Writer| spool::write_metrics(w, &m)));
        Some(sh)
    } else {
        None
    };
    let acks = spool.clone();
    tokio::spawn(async move {
        while let Some(ev) = events.recv().await {
            if let (SessionEvent::TelemetryAcked { seq }, Some(sp)) = (ev, &acks) {
                sp.ack(seq);
            }
        }
    });

    if let Some(hub) = &tables {
        sources_pre.push(hub.metrics());
    }
    for t in table_sources.map(|t| t.tasks(&stop_rx)).unwrap_or_default() {
        tasks.spawn(t);
    }
    start_radio(&s, &mut tasks, &session, spool.clone(), tables.as_deref(), &mut sources_pre, &stop_rx)?;

    let max_conns = s.opts.max_conns.unwrap_or(4096);
    let mut sources: Vec<Source> = std::mem::take(&mut sources_pre);
    let names: Vec<(PathId, String)> = paths.iter().map(|p| (p.id, p.name.clone())).collect();
    let ready_names = names.clone();
    let ms = session.clone();
    sources.push(Arc::new(move |w| ms.with(|st, now| metrics::write_session(w, st, &names, now))));
    if let Some(d) = &conn_dialer {
        let st = d.stats().clone();
        sources.push(Arc::new(move |w| st.write_relay(w)));
    }

    let (listeners, passengers) = open_listeners(&s, max_conns, &mut sources).await?;
    match &conn_dialer {
        None => spawn_capture(&mut tasks, TunnelDialer(session.clone(), v6_prefix), listeners, &stop_rx),
        Some(d) => spawn_capture(&mut tasks, MptcpConnDialer(d.clone()), listeners, &stop_rx),
    }
    let rules = install_rules(&s)?;

    let rs = session.clone();
    let conn_stats = conn_dialer.as_ref().map(|d| d.stats().clone());
    // kernel-mptcp-conn has no standing connection to watch: ready unless
    // the latest dial to the proxy failed.
    let transport = s.dial.transport;
    let ready = Arc::new(move || match &conn_stats {
        Some(st) => st.last_ok.load(std::sync::atomic::Ordering::Relaxed).into(),
        None => metrics::path_readiness(&ready_names, &rs.with(|st, _| st.ep.up_paths()), &transports[..], transport),
    });
    let metrics_addr = s.opts.metrics_listen.unwrap_or_else(default_metrics_listen);
    tasks.spawn(async move {
        if let Err(e) = metrics::serve(metrics_addr, sources, ready, stop(stop_rx)).await {
            warn!(error = %e, "metrics endpoint failed");
        }
    });

    polycorn_net::shutdown_signal().await;
    info!("shutting down");
    let _ = stop_tx.send(true);
    // The passengers' connections end first (reset through the tunnel and
    // closed towards the passengers) while the interception rules still
    // translate them: removing the rules drops their conntrack entries, and
    // a close sent after that never reaches the passenger, who would wait
    // on a dead connection (found by the fault campaign, `make chaos`).
    session.close();
    let give_up = Instant::now() + Duration::from_secs(2);
    while passengers.iter().any(|st| st.active.load(std::sync::atomic::Ordering::Relaxed) > 0)
        && Instant::now() < give_up
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if let Some(r) = rules {
        if let Err(e) = r.remove() {
            warn!(error = %e, "removing interception rules");
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(3), async { while tasks.join_next().await.is_some() {} }).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Passenger bytes relayed through the tunnel dialer reach the endpoint
    /// with their burst-end mark (a short read ends a burst, full reads do
    /// not), so `tail-reject` with `bursts = 1` works on the uplink.
    #[tokio::test]
    async fn the_tunnel_dialer_marks_the_passengers_bursts() {
        use tokio::io::AsyncWriteExt;
        // No path is up: what the relay writes stays in the endpoint.
        let pipeline = polycorn_core::sched::Registry::with_builtins().build("minrtt").unwrap();
        let (session, _events) =
            Session::new(Endpoint::new(EndpointConfig::new(Role::Relay), pipeline, Instant::now()));
        let dialer = TunnelDialer(session.clone(), PASSENGER_V6_PREFIX);
        let mut conn = dialer.dial("10.66.0.2".parse().unwrap(), "10.99.0.10:80".parse().unwrap()).await.unwrap();
        let id = conn.id();
        let (mut passenger, mut socket) = tokio::io::duplex(1 << 16);
        let opts = RelayOpts { buf_size: 1024, ..Default::default() };
        let task = tokio::spawn(async move {
            polycorn_capture::relay(&mut socket, &mut conn, &opts, TunnelDialer::poll_write_burst).await
        });
        let held = |bytes: u64| {
            let session = session.clone();
            async move {
                for _ in 0..500 {
                    match session.peek(|st, _| st.ep.send_state(id)) {
                        Some((b, end)) if b >= bytes => return end,
                        _ => tokio::time::sleep(Duration::from_millis(10)).await,
                    }
                }
                panic!("the endpoint never held {bytes} bytes");
            }
        };
        passenger.write_all(&[1; 2048]).await.unwrap();
        assert!(!held(2048).await, "full reads mark nothing");
        passenger.write_all(b"GET / HTTP/1.1").await.unwrap();
        assert!(held(2062).await, "a short read ends the passenger's burst");
        task.abort();
    }

    #[test]
    fn a_path_spec_names_interface_and_proxy() {
        let p = parse_path(1, "carrier-b=wwan1@203.0.113.7:4433").unwrap();
        assert_eq!(p.id, PathId(1));
        assert_eq!(p.name, "carrier-b");
        assert_eq!(p.device(), Some("wwan1"));
        assert_eq!(p.proxy, "203.0.113.7:4433".parse().unwrap());
        let p = parse_path(0, "lab=@[::1]:4433").unwrap();
        assert_eq!(p.device(), None, "an empty device means no SO_BINDTODEVICE");
    }

    #[test]
    fn malformed_path_specs_are_refused_with_the_expected_form() {
        for bad in ["carrier", "=wwan0@1.2.3.4:1", "a=wwan0", "a=wwan0@nowhere", "a=wwan0@1.2.3.4"] {
            let e = parse_path(0, bad).unwrap_err().to_string();
            assert!(e.contains("NAME=DEVICE@PROXY_ADDR"), "{bad}: {e}");
        }
        let e = format!("{:#}", parse_path(0, "a=../x@1.2.3.4:1").unwrap_err());
        assert!(e.contains("not a network interface name"), "{e}");
    }

    /// The options of a config file with `text`, read as the relay reads it.
    fn file_opts(text: &str) -> Result<Opts, polycorn_net::Error> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("relay.toml");
        std::fs::write(&path, text).unwrap();
        options::load_file(Some(&path), &options::command::<Opts>("RELAY", &[]))
    }

    #[test]
    fn the_config_file_uses_the_flag_names() {
        let o = file_opts("train-id = \"train-0001\"\npath = [\"a=car0@10.77.0.2:4433\"]\nscheduler = \"blest\"\n")
            .unwrap();
        assert_eq!(o.paths.unwrap().len(), 1);
        assert_eq!(o.common.scheduler.as_deref(), Some("blest"));
        assert!(file_opts("trian-id = \"x\"\n").is_err(), "typos are errors");
        let o = file_opts(
            "gpsd = \"127.0.0.1:2947\"\nmodem = [\"a=0\", \"b=1\"]\nmmcli = \"/usr/bin/mmcli\"\nmmcli-interval-ms = 500\nreplay-detect = true\n",
        )
        .unwrap();
        assert_eq!(o.modems.map(|m| m.len()), Some(2));
        assert_eq!((o.mmcli_interval_ms, o.replay_detect), (Some(500), Some(true)));
    }

    #[test]
    fn every_option_has_its_relay_variable() {
        let cmd = options::command::<Opts>("RELAY", RELAY_HELP);
        for a in cmd.get_arguments() {
            let want = format!("POLYCORN_RELAY_{}", a.get_id().as_str().to_ascii_uppercase());
            let want = (!options::LISTINGS.contains(&a.get_id().as_str())).then_some(want.as_str());
            assert_eq!(a.get_env().and_then(|e| e.to_str()), want, "--{:?}", a.get_long());
        }
        let names = |id: &str| {
            cmd.get_arguments()
                .find(|a| a.get_id() == id)
                .and_then(|a| a.get_env())
                .map(|e| e.to_string_lossy().into_owned())
        };
        // The documented names (docs/operations.md) of options that moved into the shared struct.
        assert_eq!(names("paths").unwrap(), "POLYCORN_RELAY_PATHS");
        assert_eq!(names("modems").unwrap(), "POLYCORN_RELAY_MODEMS");
        assert_eq!(names("failure_table_verify_key").unwrap(), "POLYCORN_RELAY_FAILURE_TABLE_VERIFY_KEY");
    }

    #[test]
    fn every_transport_is_a_flag_and_a_config_key() {
        for t in Transport::ALL.map(Transport::name) {
            let o = Opts::try_parse_from(["polycorn-relay", "--transport", t]).unwrap();
            let parsed = o.common.transport.as_deref().map(|s| s.parse::<Transport>().ok());
            assert_eq!(parsed, Some(Some(t.parse().unwrap())));
            let f = file_opts(&format!("transport = \"{t}\"\n")).unwrap();
            assert_eq!(f.common.transport.as_deref(), Some(t));
        }
        assert!("kernel-mptcp-connection".parse::<Transport>().is_err());
    }

    #[test]
    fn the_gateway_allow_list_is_a_flag_and_a_config_key() {
        let o = Opts::try_parse_from([
            "polycorn-relay",
            "--gateway-allow",
            "tcp:22,udp:123",
            "--gateway-allow",
            "tcp:8000-8010",
        ])
        .unwrap();
        let entries: Vec<GatewayAllow> = o.gateway_allow.unwrap().iter().map(|a| a.parse().unwrap()).collect();
        let shown: Vec<String> = entries.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["tcp:22", "udp:123", "tcp:8000-8010"]);
        let f = file_opts("gateway-allow = [\"tcp:2947\"]\n").unwrap();
        assert_eq!(f.gateway_allow.unwrap(), ["tcp:2947"]);
    }

    #[test]
    fn radio_flags_parse() {
        let o =
            Opts::try_parse_from(["polycorn-relay", "--gpsd", "--modem", "a=0", "--modem", "b=1", "--replay-detect"])
                .unwrap();
        assert_eq!(o.gpsd.as_deref(), Some(radio::gpsd::DEFAULT_ADDR));
        assert_eq!(o.modems.unwrap(), vec!["a=0".to_string(), "b=1".to_string()]);
        assert_eq!(o.replay_detect, Some(true));
    }
}
