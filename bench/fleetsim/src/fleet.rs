//! The simulated trains: per train the relay-agent's own session, subflow
//! loop, telemetry spool and radio replay (polycorn-relay's library), in
//! one runtime for the whole fleet.

use std::hash::BuildHasher;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use polycorn_core::{Endpoint, EndpointConfig, PathId, Role, UserId, DEFAULT_RELAY_BUDGET, PASSENGER_V6_PREFIX};
use polycorn_net::metrics::PathTransports;
use polycorn_net::options::CommonOpts;
use polycorn_net::{Session, SessionEvent};
use polycorn_relay::paths::{keep_path, Dial, KnownProxy, PathSpec};
use polycorn_relay::radio::{self, RadioEvent};
use polycorn_relay::spool;
use rustls::pki_types::ServerName;
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;
use tracing::warn;

use crate::passengers::{Passengers, PaxCounters};
use crate::plan::{Plan, TrainPlan};

/// Error messages kept per train (the count goes on).
const MAX_MESSAGES: usize = 10;

pub fn now_unix_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// One simulated train.
pub struct Train {
    pub index: usize,
    pub plan: TrainPlan,
    /// Set once it started (its session exists; its replay began then).
    pub running: OnceLock<Running>,
    pub started_unix_ms: AtomicI64,
    /// Every path of it has been up at once, at least once.
    pub connected_once: AtomicBool,
    pub pax: Arc<PaxCounters>,
    errors: AtomicU64,
    messages: Mutex<Vec<String>>,
}

/// What a started train runs.
pub struct Running {
    pub session: Session,
    pub dial: Arc<Dial>,
    pub spool: Arc<spool::Shared>,
    /// The spool's next seq when it was opened: records spooled since are
    /// the difference.
    pub seq0: u64,
}

impl Train {
    fn new(index: usize, plan: TrainPlan) -> Train {
        Train {
            index,
            plan,
            running: OnceLock::new(),
            started_unix_ms: AtomicI64::new(0),
            connected_once: AtomicBool::new(false),
            pax: Arc::default(),
            errors: AtomicU64::new(0),
            messages: Mutex::new(Vec::new()),
        }
    }

    /// Count an error of this train, and keep its message if there is room.
    pub fn error(&self, msg: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut m = self.messages.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() < MAX_MESSAGES {
            m.push(msg);
        }
    }

    /// Errors counted by [`Train::error`], and the messages kept.
    pub fn errors(&self) -> (u64, Vec<String>) {
        let m = self.messages.lock().unwrap_or_else(|e| e.into_inner()).clone();
        (self.errors.load(Ordering::Relaxed), m)
    }

    /// Passenger `k` of this train: its own source address, as the
    /// orchestrator's real passengers have (127.64.0.1 onwards).
    pub fn passenger(&self, k: usize) -> UserId {
        let i = self.index;
        let ip = Ipv4Addr::new(127, 64 + (i / 256) as u8, (i % 256) as u8, (k % 254 + 1) as u8);
        UserId::passenger(IpAddr::V4(ip), PASSENGER_V6_PREFIX)
    }
}

/// The fleet: its plan, its trains, what they share.
pub struct Fleet {
    pub plan: Plan,
    pub trains: Vec<Arc<Train>>,
    /// The trip's radio events at epoch 0 (every train plays them shifted to its own epoch).
    events: Option<TripEvents>,
    proxy_name: ServerName<'static>,
    pub stop: watch::Receiver<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// The passengers, once they started.
    pub passengers: OnceLock<Arc<Passengers>>,
    /// A train came up (for the passengers' start).
    connected: Notify,
    pub started: Instant,
}

impl Fleet {
    pub fn new(plan: Plan, stop: watch::Receiver<bool>) -> anyhow::Result<Fleet> {
        let proxy_name = ServerName::try_from(plan.proxy_name.clone())
            .with_context(|| format!("proxy_name {:?} is not a valid DNS name or IP address", plan.proxy_name))?;
        let events = trip_events(&plan)?;
        let spool_dir = plan.spool_dir.as_ref().context("the plan has no spool_dir")?;
        std::fs::create_dir_all(spool_dir)
            .with_context(|| format!("creating the spool directory {}", spool_dir.display()))?;
        let trains = plan.trains.iter().enumerate().map(|(i, t)| Arc::new(Train::new(i, t.clone()))).collect();
        Ok(Fleet {
            plan,
            trains,
            events,
            proxy_name,
            stop,
            tasks: Mutex::new(Vec::new()),
            passengers: OnceLock::new(),
            connected: Notify::new(),
            started: Instant::now(),
        })
    }

    pub fn spawn<F: std::future::Future<Output = ()> + Send + 'static>(&self, f: F) {
        let h = tokio::spawn(f);
        self.tasks.lock().unwrap_or_else(|e| e.into_inner()).push(h);
    }

    /// Every task spawned, to wait for at the end.
    pub fn take_tasks(&self) -> Vec<JoinHandle<()>> {
        std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Start the trains, one after the other over the plan's spread.
    pub async fn start_all(self: Arc<Self>) {
        let n = self.trains.len();
        let spread = Duration::from_secs_f64(self.plan.start_spread_s);
        let t0 = tokio::time::Instant::now();
        let mut stop = self.stop.clone();
        for (i, t) in self.trains.iter().enumerate() {
            let at = t0 + spread.mul_f64(i as f64 / n as f64);
            tokio::select! {
                _ = tokio::time::sleep_until(at) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            if let Err(e) = self.start(t) {
                warn!(train = %t.plan.id, error = format!("{e:#}"), "train not started");
                t.error(format!("not started: {e:#}"));
            }
        }
    }

    /// A train's session, spool and TLS material, as the relay-agent sets
    /// them up, then its tasks: a subflow loop per path, the spool's sender,
    /// the acknowledgements, the radio replay and what applies it.
    fn start(&self, t: &Arc<Train>) -> anyhow::Result<()> {
        let p = &self.plan;
        let common = CommonOpts {
            train_id: Some(t.plan.id.clone()),
            scheduler: p.scheduler.clone(),
            subflow_cc: p.subflow_cc.clone(),
            ..Default::default()
        };
        let cs = common.settings()?;
        let (Some(ca), Some(spool_dir), Some(proxy), Some(cert), Some(key)) =
            (&p.ca, &p.spool_dir, t.plan.proxy, &t.plan.cert, &t.plan.key)
        else {
            anyhow::bail!("the plan has no CA, spool directory, proxy, certificate or key for {}", t.plan.id);
        };
        let tls = polycorn_pki::client_config(ca, cert, key)
            .with_context(|| format!("loading {}'s TLS material", t.plan.id))?;
        let mut cfg = EndpointConfig::new(Role::Relay);
        common.buffers(None).apply(&mut cfg, DEFAULT_RELAY_BUDGET)?;
        cfg.path = cs.transport.path_config(cfg.path);
        let dir = spool_dir.join(&t.plan.id);
        let sp = spool::Shared::open(&dir, p.spool_max_bytes.unwrap_or(spool::DEFAULT_MAX_BYTES))
            .with_context(|| format!("opening the spool {}", dir.display()))?;
        let (session, mut events) = Session::new(Endpoint::new(cfg, cs.pipeline, Instant::now()));
        let dial = Arc::new(Dial {
            train_id: t.plan.id.clone(),
            proxy_name: self.proxy_name.clone(),
            tls,
            transport: cs.transport,
            congestion: cs.congestion,
            quic_cc: cs.quic_cc,
            cc_stats: Arc::default(),
            quic_port: None,
            counters: Default::default(),
        });
        let running =
            Running { session: session.clone(), dial: dial.clone(), spool: sp.clone(), seq0: sp.stats().next_seq };
        if t.running.set(running).is_err() {
            anyhow::bail!("started twice");
        }
        let session_id =
            std::collections::hash_map::RandomState::new().hash_one((Instant::now(), std::process::id(), t.index));
        let (known, transports) = (KnownProxy::default(), PathTransports::default());
        for k in 0..p.paths {
            let spec = PathSpec { id: PathId(k as u8), name: path_name(k), link: None, proxy };
            self.spawn(keep_path(
                dial.clone(),
                session.clone(),
                spec,
                session_id,
                known.clone(),
                transports.clone(),
                self.stop.clone(),
            ));
        }
        self.spawn(spool::sender(sp.clone(), session.clone(), self.stop.clone()));
        let acks = sp.clone();
        self.spawn(async move {
            while let Some(ev) = events.recv().await {
                if let SessionEvent::TelemetryAcked { seq } = ev {
                    acks.ack(seq);
                }
            }
        });
        let start = now_unix_ms();
        t.started_unix_ms.store(start, Ordering::Relaxed);
        if let Some(evs) = self.events.clone() {
            let (tx, rx) = mpsc::channel(1024);
            let names = (0..p.paths).map(path_name).collect();
            self.spawn(radio::apply(session.clone(), t.plan.id.clone(), sp, rx, names, None, None));
            let (epoch, paths, mut stop) = (t.plan.epoch_unix_ms, p.paths, self.stop.clone());
            self.spawn(async move {
                radio::play(&evs, epoch, start, paths, &tx, &mut stop).await;
            });
        }
        Ok(())
    }

    /// Until `stop`: note every train whose paths are all up, at least once.
    pub async fn watch_connections(self: Arc<Self>) {
        let mut stop = self.stop.clone();
        let paths = self.plan.paths;
        loop {
            for t in &self.trains {
                if t.connected_once.load(Ordering::Relaxed) {
                    continue;
                }
                if let Some(r) = t.running.get() {
                    if r.session.peek(|st, _| st.ep.up_paths().len()) >= paths {
                        t.connected_once.store(true, Ordering::Relaxed);
                        self.connected.notify_waiters();
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// Trains started, and those of them that have had every path up.
    pub fn started_and_connected(&self) -> (usize, usize) {
        let started = self.trains.iter().filter(|t| t.running.get().is_some()).count();
        let connected = self.trains.iter().filter(|t| t.connected_once.load(Ordering::Relaxed)).count();
        (started, connected)
    }

    /// Whether every train of the plan has started and had every path up.
    pub fn all_connected(&self) -> bool {
        self.trains.iter().all(|t| t.connected_once.load(Ordering::Relaxed))
    }

    /// Until every train has had all its paths up, or `within`; false when stopped first.
    pub async fn wait_connected(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        let mut stop = self.stop.clone();
        loop {
            if *stop.borrow() {
                return false;
            }
            if self.all_connected() || tokio::time::Instant::now() >= deadline {
                return true;
            }
            tokio::select! {
                _ = self.connected.notified() => {}
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = stop.wait_for(|s| *s) => return false,
            }
        }
    }

    /// End every session: passenger connections reset, subflows closed.
    pub fn close(&self) {
        for t in &self.trains {
            if let Some(r) = t.running.get() {
                r.session.close();
            }
        }
    }
}

/// A trip's radio events at epoch 0, with their times (Unix ms).
pub type TripEvents = Arc<[(i64, RadioEvent)]>;

/// The plan's trip as the relay's replay makes radio events of it, at
/// epoch 0 (every train plays them shifted to its own epoch); None without
/// a trip.
pub fn trip_events(plan: &Plan) -> anyhow::Result<Option<TripEvents>> {
    let Some(file) = &plan.events else { return Ok(None) };
    let log = radio::load_log(file)?;
    let opts = radio::ReplayOpts {
        file: file.clone(),
        epoch_unix_ms: 0,
        path_names: (0..plan.paths).map(path_name).collect(),
        detect: None,
        gps_only: false,
        no_gps: false,
        resume_from_unix_ms: None,
    };
    Ok(Some(Arc::from(radio::events_of(&log, &opts))))
}

/// The name of path `k` (carrier `k` of the trip).
pub fn path_name(k: usize) -> String {
    format!("carrier-{k}")
}
