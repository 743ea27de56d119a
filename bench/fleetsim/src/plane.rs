//! The plane mode (`--direct-kafka BOOTSTRAP`): the fleet's shared plane
//! (Kafka, ingest, LinkDB, the failure-table topic) under thousands of
//! trains, without a proxy per train.
//!
//! Per train of the plan, the relay's radio replay of the trip from the
//! train's own epoch ([`radio::play`]) and the records it makes of each
//! event ([`radio::record_of`]: the same Protobuf bytes, at the same times,
//! as a relay spools and sends them), produced straight to the telemetry
//! topic the way a proxy produces what its relay sent
//! ([`polycorn_telemetry::kafka`]: checked with the proxy's
//! [`validate`], the proxy's key and headers ([`envelope`]) and its
//! producer's settings: idempotent, `acks=all`, lz4, 5 ms linger). A record
//! Kafka did not confirm is produced again after the relay's resend
//! timeout, as the relay's spool would. No TLS subflows, no session, no
//! spool, no proxy: those are per train, and measured apart.
//!
//! Kafka clients: a real proxy has one producer and one consumer of the
//! failure-table topic. Here one producer serves `trains_per_client`
//! trains, and, with a table topic, one table consumer stands for as many
//! proxies: each follows partition 0 from its beginning with the proxy's
//! settings, and judges what it reads in a [`TableHub`] of its own with
//! the proxies' verify key, as a proxy does, noting when each table
//! version came into use (the propagation delay is the orchestrator's:
//! publication to seen by every consumer).
//!
//! What the orchestrator reads: `/metrics` (the sums) while it runs, the
//! JSON summary (per train its replay's start and counters, per table
//! consumer the versions and when it took them) at the end.

use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use polycorn_net::hof::SharedRoutes;
use polycorn_net::metrics::{Source, Writer};
use polycorn_net::table::signature::{Verifier, KAFKA_HEADER};
use polycorn_net::table::{SourceKind, TableHub};
use polycorn_relay::radio::{self, RadioEvent};
use polycorn_telemetry::kafka::{
    envelope, producer_settings, table_consumer_settings, table_delivery, validate, TableDelivery, DELIVERY_TIMEOUT,
};
use polycorn_telemetry::v1;
use prost::Message as _;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer as _, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::warn;

use crate::fleet::{now_unix_ms, path_name, trip_events, TripEvents};
use crate::plan::{Plan, TrainPlan};
use crate::report;

/// A record Kafka did not confirm is produced again after this long: the
/// relay's spool resends an unacknowledged record after 5 s.
const RESEND_AFTER: Duration = Duration::from_secs(5);
/// Error messages kept per train and per table consumer.
const MAX_MESSAGES: usize = 10;
/// How often the producers' delivery reports are collected.
const POLL_EVERY: Duration = Duration::from_millis(10);
/// Delivery events taken from one producer per round at most.
const POLL_BATCH: usize = 1024;

/// A fault to seed, so that the orchestrator's checks are seen to fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Fault {
    /// The first train's third GPS fix is never produced, though counted
    /// as confirmed (a record lost on the way without anyone noticing).
    DropRecord,
    /// The first table consumer never offers the second table it reads.
    DeafConsumer,
}

/// What the plane mode needs besides the plan.
#[derive(Clone, Debug)]
pub struct Opts {
    pub bootstrap: String,
    pub topic: String,
    pub dlq_topic: String,
    /// The failure-table topic: table consumers follow it.
    pub table_topic: Option<String>,
    /// The tables' verify key (the proxies' `--failure-table-verify-key`).
    pub verify_key: Option<PathBuf>,
    /// Trains per producer and per table consumer.
    pub trains_per_client: usize,
    pub faults: Vec<Fault>,
}

/// One simulated train's counters.
#[derive(Debug, Default)]
struct TrainState {
    started_unix_ms: AtomicI64,
    /// Records its replay made.
    made: AtomicU64,
    /// ... that Kafka confirmed, on the telemetry or the dead-letter topic.
    confirmed: AtomicU64,
    dead_letters: AtomicU64,
    /// Deliveries Kafka failed (each record is produced again).
    failed: AtomicU64,
    resent: AtomicU64,
    /// Produced and not yet confirmed or given up (at the stop).
    in_flight: AtomicU64,
    messages: Mutex<Vec<String>>,
}

impl TrainState {
    fn error(&self, msg: String) {
        let mut m = self.messages.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() < MAX_MESSAGES {
            m.push(msg);
        }
    }
}

/// One table consumer: it stands for `trains` proxies.
struct Follower {
    index: usize,
    trains: usize,
    hub: Arc<TableHub>,
    /// (version, Unix ms) of every table it put in use.
    seen: Arc<Mutex<Vec<(u64, i64)>>>,
    /// Table messages read (offered or not).
    messages: AtomicU64,
    errors: AtomicU64,
    error_messages: Mutex<Vec<String>>,
}

impl Follower {
    fn highest(&self) -> u64 {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|&(v, _)| v).max().unwrap_or(0)
    }
}

/// The plane-mode fleet.
pub struct Plane {
    plan: Plan,
    opts: Opts,
    trains: Vec<Arc<TrainState>>,
    /// One per group of trains, created as its first train starts.
    producers: Vec<OnceLock<Producer>>,
    /// Set once the delivery reports need no more collecting.
    poller_done: std::sync::atomic::AtomicBool,
    /// Trains whose replay may still make records.
    trains_running: AtomicUsize,
    /// One per group of trains with a table topic.
    followers: Vec<Arc<Follower>>,
    events: Option<TripEvents>,
    stop: watch::Receiver<bool>,
}

fn client(bootstrap: &str, settings: Vec<(&'static str, String)>) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap);
    for (k, v) in settings {
        c.set(k, v);
    }
    c
}

/// An envelope's headers as librdkafka's.
fn kafka_headers(headers: &[(&str, String)]) -> OwnedHeaders {
    headers
        .iter()
        .fold(OwnedHeaders::new_with_capacity(headers.len()), |h, (k, v)| h.insert(Header { key: k, value: Some(v) }))
}

impl Plane {
    /// The trains and their table hubs; the Kafka clients are created as
    /// their first train starts ([`Plane::start_all`]).
    pub fn new(plan: Plan, opts: Opts, stop: watch::Receiver<bool>) -> anyhow::Result<Plane> {
        anyhow::ensure!(opts.trains_per_client >= 1, "--trains-per-client must be at least 1");
        let events = trip_events(&plan)?;
        let n = plan.trains.len();
        let groups = n.div_ceil(opts.trains_per_client);
        let verifier =
            opts.verify_key.as_deref().map(Verifier::load).transpose().context("reading the tables' verify key")?;
        let mut followers = Vec::new();
        if opts.table_topic.is_some() {
            for g in 0..groups {
                let seen = Arc::new(Mutex::new(Vec::new()));
                let s = seen.clone();
                let hub = TableHub::build(SharedRoutes::default(), verifier.clone(), move |t| {
                    s.lock().unwrap_or_else(|e| e.into_inner()).push((t.version(), now_unix_ms()));
                });
                followers.push(Arc::new(Follower {
                    index: g,
                    trains: opts.trains_per_client.min(n - g * opts.trains_per_client),
                    hub,
                    seen,
                    messages: AtomicU64::new(0),
                    errors: AtomicU64::new(0),
                    error_messages: Mutex::new(Vec::new()),
                }));
            }
        }
        let trains = (0..n).map(|_| Arc::new(TrainState::default())).collect();
        let producers = (0..groups).map(|_| OnceLock::new()).collect();
        Ok(Plane {
            plan,
            opts,
            trains,
            producers,
            poller_done: false.into(),
            trains_running: AtomicUsize::new(0),
            followers,
            events,
            stop,
        })
    }

    /// Start the trains one after the other over the plan's spread, each
    /// group's Kafka clients with its first train (a fleet's proxies do not
    /// all connect in the same instant either).
    pub async fn start_all(self: Arc<Self>) {
        let me = self.clone();
        if let Err(e) = std::thread::Builder::new().name("kafka-poller".into()).spawn(move || me.poll_deliveries()) {
            warn!(error = %e, "the delivery reports' poller did not start");
        }
        let n = self.trains.len();
        let spread = Duration::from_secs_f64(self.plan.start_spread_s);
        let t0 = tokio::time::Instant::now();
        let mut stop = self.stop.clone();
        for i in 0..n {
            tokio::select! {
                _ = tokio::time::sleep_until(t0 + spread.mul_f64(i as f64 / n as f64)) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            if i % self.opts.trains_per_client == 0 {
                if let Err(e) = self.start_clients(i / self.opts.trains_per_client) {
                    warn!(error = format!("{e:#}"), "Kafka clients not started");
                    self.trains[i].error(format!("{e:#}"));
                }
            }
            self.trains_running.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(self.clone().run_train(i));
        }
    }

    /// Collect every producer's delivery reports, every [`POLL_EVERY`], until
    /// [`Plane::finish`]. One thread for all of them, as the proxy has one
    /// for its producer (proxy/src/kafka.rs says why not rdkafka's
    /// `FutureProducer`). `poll(0)` takes one event at a time, so each
    /// producer is polled until a poll hands over no report (at most
    /// [`POLL_BATCH`] times a round).
    fn poll_deliveries(&self) {
        while !self.poller_done.load(Ordering::Relaxed) {
            for p in self.producers.iter().filter_map(OnceLock::get) {
                for _ in 0..POLL_BATCH {
                    let before = p.context().handled.load(Ordering::Relaxed);
                    p.poll(Duration::ZERO);
                    if p.context().handled.load(Ordering::Relaxed) == before {
                        break;
                    }
                }
            }
            std::thread::sleep(POLL_EVERY);
        }
    }

    /// Stop collecting delivery reports (after [`Plane::settle`]).
    pub fn finish(&self) {
        self.poller_done.store(true, Ordering::Relaxed);
    }

    /// Group `g`'s producer and, with a table topic, its table consumer
    /// (partition 0 from its beginning, no group, as a proxy's).
    fn start_clients(self: &Arc<Self>, g: usize) -> anyhow::Result<()> {
        let o = &self.opts;
        let p = client(&o.bootstrap, producer_settings(&format!("polycorn-fleetsim-plane-{g}"), DELIVERY_TIMEOUT))
            .create_with_context(Deliveries::default())
            .map_err(|e| anyhow::anyhow!("creating Kafka producer {g}: {e}"))?;
        let _ = self.producers[g].set(p);
        let (Some(topic), Some(f)) = (&o.table_topic, self.followers.get(g)) else { return Ok(()) };
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let group = format!("polycorn-fleetsim-tables-{g}-{}-{nanos}", std::process::id());
        let c: StreamConsumer =
            client(&o.bootstrap, table_consumer_settings(&format!("polycorn-fleetsim-plane-{g}-tables"), &group))
                .create()
                .map_err(|e| anyhow::anyhow!("creating table consumer {g}: {e}"))?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, 0, Offset::Beginning)
            .map_err(|e| anyhow::anyhow!("assigning {topic} partition 0: {e}"))?;
        c.assign(&tpl).map_err(|e| anyhow::anyhow!("assigning {topic} partition 0: {e}"))?;
        tokio::spawn(self.clone().follow(f.clone(), c));
        Ok(())
    }

    /// Train `i`: its replay, each record produced as its proxy would.
    async fn run_train(self: Arc<Self>, i: usize) {
        let _running = Running(&self.trains_running);
        let (t, plan) = (self.trains[i].clone(), &self.plan.trains[i]);
        let start = now_unix_ms();
        t.started_unix_ms.store(start, Ordering::Relaxed);
        let Some(evs) = self.events.clone() else { return };
        let (tx, mut rx) = mpsc::channel(1024);
        let (epoch, paths, mut stop) = (plan.epoch_unix_ms, self.plan.paths, self.stop.clone());
        tokio::spawn(async move {
            radio::play(&evs, epoch, start, paths, &tx, &mut stop).await;
        });
        let names: Vec<String> = (0..paths).map(path_name).collect();
        if self.producers[i / self.opts.trains_per_client].get().is_none() {
            t.error("its group's Kafka producer was not created".into());
            return;
        }
        let (mut seq, mut fixes) = (0u64, 0u64);
        while let Some(ev) = rx.recv().await {
            if *self.stop.borrow() {
                // Stopped: what the replay had queued is never made (a
                // record made now would miss the summary's counts).
                break;
            }
            let (record, _class) = radio::record_of(&plan.id, &ev, &names);
            seq += 1;
            t.made.fetch_add(1, Ordering::Relaxed);
            if matches!(ev, RadioEvent::Gps { .. }) {
                fixes += 1;
                if self.opts.faults.contains(&Fault::DropRecord) && i == 0 && fixes == 3 {
                    t.confirmed.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
            t.in_flight.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(deliver(self.clone(), i, seq, record.encode_to_vec()));
        }
    }

    /// Follow the table topic as a proxy does (proxy/src/table_topic.rs).
    async fn follow(self: Arc<Self>, f: Arc<Follower>, consumer: StreamConsumer) {
        let mut stop = self.stop.clone();
        let topic = self.opts.table_topic.clone().unwrap_or_default();
        loop {
            let m = tokio::select! {
                m = consumer.recv() => m,
                _ = stop.changed() => return,
            };
            let m = match m {
                Ok(m) => m,
                Err(e) => {
                    f.errors.fetch_add(1, Ordering::Relaxed);
                    f.hub.source_error(SourceKind::Kafka);
                    {
                        let mut msgs = f.error_messages.lock().unwrap_or_else(|e| e.into_inner());
                        if msgs.len() < MAX_MESSAGES {
                            msgs.push(e.to_string());
                        }
                    }
                    // Errors come back at once while they last: do not spin.
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            f.hub.source_ok(SourceKind::Kafka);
            match table_delivery(m.key(), m.payload()) {
                TableDelivery::Table(body) => {
                    let k = f.messages.fetch_add(1, Ordering::Relaxed) + 1;
                    if self.opts.faults.contains(&Fault::DeafConsumer) && f.index == 0 && k == 2 {
                        continue;
                    }
                    let signature =
                        m.headers().and_then(|hs| hs.iter().find(|h| h.key == KAFKA_HEADER).and_then(|h| h.value));
                    let origin = format!("{topic}:{}@{}", m.partition(), m.offset());
                    f.hub.offer(SourceKind::Kafka, &origin, body, signature);
                }
                TableDelivery::OtherKey => {
                    f.messages.fetch_add(1, Ordering::Relaxed);
                    f.hub.refuse(SourceKind::Kafka, &topic, "message key is not \"fleet\"");
                }
                TableDelivery::Tombstone => {}
            }
        }
    }

    /// Until every train's replay has ended and nothing is in flight, or
    /// `within` (after the stop).
    pub async fn settle(&self, within: Duration) {
        let end = Instant::now() + within;
        while (self.trains_running.load(Ordering::Relaxed) > 0 || self.totals().in_flight > 0) && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn train_counters(&self, i: usize) -> Counters {
        let t = &self.trains[i];
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Counters {
            records_made: l(&t.made),
            records_confirmed: l(&t.confirmed),
            records_dead_letters: l(&t.dead_letters),
            records_failed: l(&t.failed),
            records_resent: l(&t.resent),
            in_flight: l(&t.in_flight),
        }
    }

    fn totals(&self) -> Counters {
        let mut s = Counters::default();
        for i in 0..self.trains.len() {
            s.add(&self.train_counters(i));
        }
        s
    }

    /// Whether every train has started and Kafka confirmed a record of each.
    pub fn all_connected(&self) -> bool {
        self.trains.iter().all(|t| t.confirmed.load(Ordering::Relaxed) > 0)
    }

    /// Trains started, and those of them Kafka confirmed a record of.
    fn started_and_connected(&self) -> (usize, usize) {
        let started = self.trains.iter().filter(|t| t.started_unix_ms.load(Ordering::Relaxed) > 0).count();
        let connected = self.trains.iter().filter(|t| t.confirmed.load(Ordering::Relaxed) > 0).count();
        (started, connected)
    }

    /// The metrics of `/metrics`: the fleet's sums.
    pub fn metrics_source(self: &Arc<Self>) -> Source {
        let me = self.clone();
        Arc::new(move |w: &mut Writer| {
            let s = me.totals();
            let (started, connected) = me.started_and_connected();
            let l = Vec::new;
            w.gauge("polycorn_fleetsim_trains", "Trains in the plan.", l(), me.trains.len() as f64);
            w.gauge("polycorn_fleetsim_trains_started", "Trains started.", l(), started as f64);
            w.gauge(
                "polycorn_fleetsim_trains_connected_once",
                "Trains Kafka confirmed a record of (plane mode).",
                l(),
                connected as f64,
            );
            w.gauge(
                "polycorn_fleetsim_plane_producers",
                "Kafka producers.",
                l(),
                me.producers.iter().filter(|p| p.get().is_some()).count() as f64,
            );
            w.gauge("polycorn_fleetsim_plane_table_consumers", "Table consumers.", l(), me.followers.len() as f64);
            w.counter("polycorn_fleetsim_plane_records_made", "Records the replays made.", l(), s.records_made as f64);
            w.counter(
                "polycorn_fleetsim_plane_records_confirmed",
                "Records Kafka confirmed (telemetry and dead-letter topics).",
                l(),
                s.records_confirmed as f64,
            );
            w.counter(
                "polycorn_fleetsim_plane_records_dead_letters",
                "Records produced to the dead-letter topic.",
                l(),
                s.records_dead_letters as f64,
            );
            w.counter(
                "polycorn_fleetsim_plane_records_failed",
                "Deliveries Kafka failed (produced again after 5 s).",
                l(),
                s.records_failed as f64,
            );
            w.counter(
                "polycorn_fleetsim_plane_records_resent",
                "Records produced again.",
                l(),
                s.records_resent as f64,
            );
            w.gauge(
                "polycorn_fleetsim_plane_in_flight",
                "Records awaiting Kafka's confirmation.",
                l(),
                s.in_flight as f64,
            );
            let versions: Vec<u64> = me.followers.iter().map(|f| f.highest()).collect();
            w.gauge(
                "polycorn_fleetsim_plane_table_version_min",
                "The lowest table version in use over the table consumers (0: none).",
                l(),
                versions.iter().copied().min().unwrap_or(0) as f64,
            );
            w.gauge(
                "polycorn_fleetsim_plane_table_version_max",
                "The highest table version in use over the table consumers (0: none).",
                l(),
                versions.iter().copied().max().unwrap_or(0) as f64,
            );
            let errors: u64 = me.followers.iter().map(|f| f.errors.load(Ordering::Relaxed)).sum();
            w.counter("polycorn_fleetsim_plane_table_errors", "Table consumers' Kafka errors.", l(), errors as f64);
        })
    }

    /// The JSON summary.
    pub fn summary(&self, started_unix_ms: i64, seconds: f64, threads: usize, lags: &[f32]) -> Summary {
        let trains = self
            .plan
            .trains
            .iter()
            .enumerate()
            .map(|(i, p): (usize, &TrainPlan)| {
                let t = &self.trains[i];
                let counters = self.train_counters(i);
                TrainSummary {
                    id: p.id.clone(),
                    started_unix_ms: t.started_unix_ms.load(Ordering::Relaxed),
                    epoch_unix_ms: p.epoch_unix_ms,
                    connected: counters.records_confirmed > 0,
                    counters,
                    error_messages: t.messages.lock().unwrap_or_else(|e| e.into_inner()).clone(),
                }
            })
            .collect();
        let tables = self
            .followers
            .iter()
            .map(|f| {
                let st = f.hub.stats();
                TableConsumerSummary {
                    index: f.index,
                    trains: f.trains,
                    seen: f
                        .seen
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .iter()
                        .map(|&(version, unix_ms)| Seen { version, unix_ms })
                        .collect(),
                    messages: f.messages.load(Ordering::Relaxed),
                    refused: st.rejected(),
                    errors: f.errors.load(Ordering::Relaxed),
                    error_messages: f.error_messages.lock().unwrap_or_else(|e| e.into_inner()).clone(),
                }
            })
            .collect();
        let (trains_started, trains_connected) = self.started_and_connected();
        let (cpu_s, max_rss_kib) = report::self_usage();
        Summary {
            mode: "plane",
            trains_planned: self.trains.len(),
            trains_started,
            trains_connected,
            trains_per_client: self.opts.trains_per_client,
            producers: self.producers.iter().filter(|p| p.get().is_some()).count(),
            table_consumers: self.followers.len(),
            started_unix_ms,
            seconds,
            cpu_s,
            max_rss_kib,
            threads,
            loop_lag_ms_p50: report::quantile(lags, 0.5),
            loop_lag_ms_p99: report::quantile(lags, 0.99),
            loop_lag_ms_max: f64::from(lags.iter().copied().fold(0.0f32, f32::max)),
            totals: self.totals(),
            trains,
            tables,
        }
    }
}

/// Counts a train's replay as running while it lives.
struct Running<'a>(&'a AtomicUsize);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Hands each delivery report to the record's waiting task, and counts the
/// reports handed over.
#[derive(Default)]
struct Deliveries {
    handled: AtomicU64,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = Box<oneshot::Sender<Result<(), String>>>;

    fn delivery(&self, r: &DeliveryResult<'_>, tx: Self::DeliveryOpaque) {
        self.handled.fetch_add(1, Ordering::Relaxed);
        let _ = tx.send(r.as_ref().map(|_| ()).map_err(|(e, _)| e.to_string()));
    }
}

/// A producer of the plane mode (its reports collected by [`Plane::poll_deliveries`]).
type Producer = BaseProducer<Deliveries>;

/// Produce record `seq` of train `i` as its proxy would, again after
/// [`RESEND_AFTER`] while Kafka fails it (until the stop).
async fn deliver(plane: Arc<Plane>, i: usize, seq: u64, payload: Vec<u8>) {
    let Some(producer) = plane.producers[i / plane.opts.trains_per_client].get() else { return };
    let (t, plan) = (&plane.trains[i], &plane.plan.trains[i]);
    let target = validate(&plan.id, &v1::Record::decode(payload.as_slice()));
    let env = envelope(&plan.id, seq, &target);
    let topic = if env.dead_letter { &plane.opts.dlq_topic } else { &plane.opts.topic };
    loop {
        let (tx, rx) = oneshot::channel();
        let rec = BaseRecord::with_opaque_to(topic, Box::new(tx))
            .key(env.key)
            .payload(&payload)
            .headers(kafka_headers(&env.headers));
        let r = match producer.send(rec) {
            Ok(()) => rx.await.unwrap_or_else(|_| Err("the producer was dropped".to_string())),
            Err((e, _)) => Err(e.to_string()),
        };
        match r {
            Ok(()) => {
                t.confirmed.fetch_add(1, Ordering::Relaxed);
                if env.dead_letter {
                    t.dead_letters.fetch_add(1, Ordering::Relaxed);
                }
                break;
            }
            Err(e) => {
                t.failed.fetch_add(1, Ordering::Relaxed);
                warn!(train = %plan.id, seq, error = %e, "record not delivered to Kafka (produced again)");
                t.error(format!("seq {seq}: {e}"));
            }
        }
        let mut stop = plane.stop.clone();
        tokio::select! {
            _ = tokio::time::sleep(RESEND_AFTER) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        t.resent.fetch_add(1, Ordering::Relaxed);
    }
    t.in_flight.fetch_sub(1, Ordering::Relaxed);
}

/// A train's counters (and the sums over the fleet).
#[derive(Debug, Default, Serialize, Clone)]
pub struct Counters {
    pub records_made: u64,
    pub records_confirmed: u64,
    pub records_dead_letters: u64,
    pub records_failed: u64,
    pub records_resent: u64,
    pub in_flight: u64,
}

impl Counters {
    fn add(&mut self, o: &Counters) {
        self.records_made += o.records_made;
        self.records_confirmed += o.records_confirmed;
        self.records_dead_letters += o.records_dead_letters;
        self.records_failed += o.records_failed;
        self.records_resent += o.records_resent;
        self.in_flight += o.in_flight;
    }
}

#[derive(Debug, Serialize)]
pub struct TrainSummary {
    pub id: String,
    pub started_unix_ms: i64,
    pub epoch_unix_ms: i64,
    pub connected: bool,
    #[serde(flatten)]
    pub counters: Counters,
    pub error_messages: Vec<String>,
}

/// A table version a consumer put in use, and when (Unix ms).
#[derive(Debug, Serialize)]
pub struct Seen {
    pub version: u64,
    pub unix_ms: i64,
}

#[derive(Debug, Serialize)]
pub struct TableConsumerSummary {
    pub index: usize,
    /// The proxies it stands for.
    pub trains: usize,
    pub seen: Vec<Seen>,
    pub messages: u64,
    /// Tables its hub refused (malformed, unsigned, expired, another key).
    pub refused: u64,
    pub errors: u64,
    pub error_messages: Vec<String>,
}

/// The JSON written at the end.
#[derive(Debug, Serialize)]
pub struct Summary {
    pub mode: &'static str,
    pub trains_planned: usize,
    pub trains_started: usize,
    /// Trains Kafka confirmed a record of.
    pub trains_connected: usize,
    pub trains_per_client: usize,
    pub producers: usize,
    pub table_consumers: usize,
    pub started_unix_ms: i64,
    pub seconds: f64,
    /// The process's CPU time (user + system), seconds, and its peak RSS, KiB.
    pub cpu_s: f64,
    pub max_rss_kib: u64,
    pub threads: usize,
    pub loop_lag_ms_p50: f64,
    pub loop_lag_ms_p99: f64,
    pub loop_lag_ms_max: f64,
    pub totals: Counters,
    pub trains: Vec<TrainSummary>,
    pub tables: Vec<TableConsumerSummary>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_headers_are_the_envelopes_in_order() {
        let env = envelope("train-x", 9, &polycorn_telemetry::kafka::Target::Telemetry);
        let h = kafka_headers(&env.headers);
        let got: Vec<(String, String)> = h
            .iter()
            .map(|x| (x.key.to_string(), String::from_utf8_lossy(x.value.unwrap_or_default()).into_owned()))
            .collect();
        let want: Vec<(String, String)> = env.headers.iter().map(|(k, v)| ((*k).to_string(), v.clone())).collect();
        assert_eq!(got, want);
    }
}
