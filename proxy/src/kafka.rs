//! Telemetry from the relay into Kafka (`docs/telemetry.md`).
//!
//! [`Ingest`] is the pure part: for each record (and each duplicate copy)
//! the session delivers, it decides whether to produce it to the telemetry
//! topic, to the dead-letter topic (with the reason), to acknowledge it
//! again, or to ignore it; and after Kafka's delivery report, whether to
//! acknowledge it to the relay. [`KafkaSink`] is the thin rdkafka shell:
//! an idempotent producer (`acks=all`), key = train id, value = the Record
//! bytes exactly as received. The message's form (topic, key, headers) and
//! the producer's settings are [`polycorn_telemetry::kafka`]'s, which the
//! fleet simulator's plane mode produces with too.
//!
//! The relay drops a record from its spool only on our acknowledgement, so
//! a record is acknowledged only after Kafka confirmed it (or, malformed,
//! after the dead-letter topic confirmed it): a Kafka outage costs resends,
//! never records.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

use polycorn_telemetry::kafka as contract;
pub use polycorn_telemetry::kafka::{validate, Target};
use polycorn_telemetry::v1;
use prost::Message as _;
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer as _, ProducerContext};
use rdkafka::ClientContext;
use tokio::sync::oneshot;

/// Default `--kafka-topic`.
pub const DEFAULT_TOPIC: &str = contract::TELEMETRY_TOPIC;
/// Default `--kafka-dlq-topic`.
pub const DEFAULT_DLQ_TOPIC: &str = contract::DLQ_TOPIC;
/// Records produced and not yet confirmed by Kafka, at most; past it new
/// records are ignored (not acknowledged: the relay sends them again).
pub const MAX_IN_FLIGHT: usize = 4096;
/// Seqs confirmed by Kafka remembered, to acknowledge resent copies again
/// without producing them twice.
const CONFIRMED_REMEMBERED: usize = 65536;
/// How long librdkafka keeps trying to deliver one record (retries are
/// idempotent); after that the record counts as failed, stays
/// unacknowledged, and the relay's resend produces it again.
pub const DELIVERY_TIMEOUT: Duration = contract::DELIVERY_TIMEOUT;
/// A producer that has delivered nothing for this long while its
/// deliveries failed is replaced by a new one (see [`StallWatch`]).
pub const REPLACE_AFTER: Duration = Duration::from_secs(60);

/// How the proxy's Kafka clients (the telemetry producer and the table
/// consumer) reach the brokers: `--kafka-security-protocol` and its options
/// (docs/security.md, "Kafka"). The password is read from its file at
/// start-up and never printed (`Debug` shows only the user name).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KafkaSecurity {
    /// librdkafka's `security.protocol`: `plaintext`, `ssl`,
    /// `sasl_plaintext` or `sasl_ssl`.
    protocol: &'static str,
    /// (mechanism, user name, password) with a SASL protocol.
    sasl: Option<(String, String, String)>,
    /// CA certificate(s) of the brokers (PEM), with a TLS protocol.
    ca: Option<PathBuf>,
    /// Client certificate and key (PEM) for mutual TLS.
    cert_key: Option<(PathBuf, PathBuf)>,
}

impl std::fmt::Debug for KafkaSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSecurity")
            .field("protocol", &self.protocol())
            .field("sasl", &self.sasl.as_ref().map(|(m, u, _)| format!("{m} as {u}")))
            .field("ca", &self.ca)
            .field("cert_key", &self.cert_key)
            .finish()
    }
}

/// The SASL mechanisms the proxy offers (librdkafka with OpenSSL).
pub const SASL_MECHANISMS: [&str; 2] = ["SCRAM-SHA-512", "SCRAM-SHA-256"];

/// The flags of [`KafkaSecurity::from_flags`], as given.
#[derive(Debug, Default)]
pub struct KafkaSecurityFlags<'a> {
    pub protocol: Option<&'a str>,
    pub mechanism: Option<&'a str>,
    pub username: Option<&'a str>,
    pub password_file: Option<&'a Path>,
    pub ca: Option<&'a Path>,
    pub cert: Option<&'a Path>,
    pub key: Option<&'a Path>,
}

impl KafkaSecurity {
    /// From the flags; an inconsistent combination (a user name without a
    /// SASL protocol, a CA without TLS, a certificate without its key, ...)
    /// is an error rather than silently ignored.
    pub fn from_flags(f: &KafkaSecurityFlags<'_>) -> Result<KafkaSecurity, String> {
        let protocol = match f.protocol.unwrap_or("PLAINTEXT").to_ascii_uppercase().as_str() {
            "PLAINTEXT" => "plaintext",
            "SSL" => "ssl",
            "SASL_PLAINTEXT" => "sasl_plaintext",
            "SASL_SSL" => "sasl_ssl",
            other => {
                return Err(format!(
                    "--kafka-security-protocol must be PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL, got {other:?}"
                ))
            }
        };
        let (sasl, tls) = (protocol.starts_with("sasl"), protocol.ends_with("ssl"));
        let sasl = if sasl {
            let mechanism = f.mechanism.unwrap_or(SASL_MECHANISMS[0]).to_ascii_uppercase();
            if !SASL_MECHANISMS.contains(&mechanism.as_str()) {
                return Err(format!("--kafka-sasl-mechanism must be one of {SASL_MECHANISMS:?}, got {mechanism:?}"));
            }
            let user = f.username.filter(|u| !u.is_empty()).ok_or_else(|| {
                format!("--kafka-security-protocol {} needs --kafka-sasl-username", protocol.to_ascii_uppercase())
            })?;
            let file = f.password_file.ok_or_else(|| {
                format!("--kafka-security-protocol {} needs --kafka-sasl-password-file", protocol.to_ascii_uppercase())
            })?;
            Some((mechanism, user.to_string(), read_password(file)?))
        } else {
            for (given, flag) in [
                (f.mechanism.is_some(), "--kafka-sasl-mechanism"),
                (f.username.is_some(), "--kafka-sasl-username"),
                (f.password_file.is_some(), "--kafka-sasl-password-file"),
            ] {
                if given {
                    return Err(format!("{flag} needs --kafka-security-protocol SASL_SSL (or SASL_PLAINTEXT)"));
                }
            }
            None
        };
        if !tls {
            for (given, flag) in [
                (f.ca.is_some(), "--kafka-ssl-ca"),
                (f.cert.is_some(), "--kafka-ssl-cert"),
                (f.key.is_some(), "--kafka-ssl-key"),
            ] {
                if given {
                    return Err(format!("{flag} needs --kafka-security-protocol SSL or SASL_SSL"));
                }
            }
        }
        let cert_key = match (f.cert, f.key) {
            (Some(c), Some(k)) => Some((c.to_path_buf(), k.to_path_buf())),
            (None, None) => None,
            _ => return Err("--kafka-ssl-cert and --kafka-ssl-key go together (mutual TLS)".into()),
        };
        Ok(KafkaSecurity { protocol, sasl, ca: f.ca.map(Path::to_path_buf), cert_key })
    }

    /// The protocol, as in the flag (`PLAINTEXT`, `SASL_SSL`, ...).
    pub fn protocol(&self) -> String {
        if self.protocol.is_empty() {
            "PLAINTEXT".into()
        } else {
            self.protocol.to_ascii_uppercase()
        }
    }

    /// The user name with SASL.
    pub fn username(&self) -> Option<&str> {
        self.sasl.as_ref().map(|(_, u, _)| u.as_str())
    }

    /// Set these options on a librdkafka client configuration.
    pub fn apply(&self, c: &mut ClientConfig) {
        if self.protocol.is_empty() {
            return;
        }
        c.set("security.protocol", self.protocol);
        if let Some((mechanism, user, password)) = &self.sasl {
            c.set("sasl.mechanism", mechanism).set("sasl.username", user).set("sasl.password", password);
        }
        if let Some(ca) = &self.ca {
            c.set("ssl.ca.location", ca.to_string_lossy());
        }
        if let Some((cert, key)) = &self.cert_key {
            c.set("ssl.certificate.location", cert.to_string_lossy()).set("ssl.key.location", key.to_string_lossy());
        }
        if self.protocol.ends_with("ssl") {
            // librdkafka's default, stated: the broker's certificate must
            // name the host dialled.
            c.set("ssl.endpoint.identification.algorithm", "https");
        }
    }
}

/// A password file: its first line (a trailing newline is not part of it).
fn read_password(file: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("reading --kafka-sasl-password-file {}: {e}", file.display()))?;
    let password = text.lines().next().unwrap_or_default();
    if password.is_empty() {
        return Err(format!("--kafka-sasl-password-file {} is empty", file.display()));
    }
    Ok(password.to_string())
}

/// A librdkafka configuration for `brokers` with `security` applied.
pub fn client_config(brokers: &str, security: &KafkaSecurity) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers);
    security.apply(&mut c);
    c
}

/// What to do with a record the relay sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Produce it; acknowledge it when Kafka confirms.
    Produce(Target),
    /// Kafka has it already (our acknowledgement was lost): acknowledge again.
    AckAgain,
    /// Being produced: the acknowledgement follows Kafka's confirmation.
    InFlight,
    /// Too many records in flight: not taken; the relay sends it again.
    Full,
}

/// The pure telemetry ingest state of one session.
#[derive(Debug)]
pub struct Ingest {
    train_id: String,
    max_in_flight: usize,
    in_flight: HashSet<u64>,
    /// Confirmed seqs; the oldest are forgotten past a bound (a copy of a
    /// forgotten one is produced again: consumers dedup by (train, seq)).
    confirmed: BTreeSet<u64>,
}

impl Ingest {
    pub fn new(train_id: &str, max_in_flight: usize) -> Ingest {
        Ingest { train_id: train_id.into(), max_in_flight, in_flight: HashSet::new(), confirmed: BTreeSet::new() }
    }

    /// A record (first copy or a duplicate) arrived.
    pub fn on_record(&mut self, seq: u64, payload: &[u8]) -> Decision {
        self.decide(seq, |train| validate(train, &v1::Record::decode(payload)))
    }

    /// The same, for a record the caller has decoded already.
    pub fn on_decoded(&mut self, seq: u64, decoded: &Result<v1::Record, prost::DecodeError>) -> Decision {
        self.decide(seq, |train| validate(train, decoded))
    }

    /// The record is validated (`target`) only when it is to be produced.
    fn decide(&mut self, seq: u64, target: impl FnOnce(&str) -> Target) -> Decision {
        if self.confirmed.contains(&seq) {
            return Decision::AckAgain;
        }
        if self.in_flight.contains(&seq) {
            return Decision::InFlight;
        }
        if self.in_flight.len() >= self.max_in_flight {
            return Decision::Full;
        }
        self.in_flight.insert(seq);
        Decision::Produce(target(&self.train_id))
    }

    /// Kafka's delivery report for `seq`; returns whether to acknowledge it.
    pub fn on_delivered(&mut self, seq: u64, ok: bool) -> bool {
        self.in_flight.remove(&seq);
        if ok {
            self.confirmed.insert(seq);
            while self.confirmed.len() > CONFIRMED_REMEMBERED {
                self.confirmed.pop_first();
            }
        }
        ok
    }

    #[cfg(test)]
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }
}

/// When to replace the producer. The fault campaign once saw librdkafka's
/// idempotent producer stop delivering for good after a broker stall moved
/// partition leadership ("new leader not found in cache"; every record
/// `MessageTimedOut` for 11 minutes, while a new producer delivered to the
/// same partition at once; docs/testing.md, fault campaign finding 2). A
/// producer is replaced when its deliveries failed and none succeeded for
/// `replace_after` since it was created or last delivered. During a real
/// outage that is once per `replace_after`, which costs nothing: its
/// records are unacknowledged either way and the relay resends them.
#[derive(Debug)]
pub struct StallWatch {
    replace_after: Duration,
    since: Instant,
    failures: u64,
}

impl StallWatch {
    pub fn new(replace_after: Duration, now: Instant) -> StallWatch {
        StallWatch { replace_after, since: now, failures: 0 }
    }

    /// A delivery report; returns whether to replace the producer now (the
    /// watch then starts again, as for a new producer).
    pub fn on_delivery(&mut self, ok: bool, now: Instant) -> bool {
        if ok {
            self.since = now;
            self.failures = 0;
            return false;
        }
        self.failures += 1;
        if now.saturating_duration_since(self.since) < self.replace_after {
            return false;
        }
        self.since = now;
        self.failures = 0;
        true
    }
}

/// Producer counters, for metrics.
#[derive(Debug, Default)]
pub struct SinkStats {
    pub produced: AtomicU64,
    pub produce_errors: AtomicU64,
    pub dlq: AtomicU64,
    pub reacked: AtomicU64,
    pub refused_full: AtomicU64,
    pub inflight: AtomicU64,
    /// Producers replaced because they stopped delivering ([`StallWatch`]).
    pub replaced: AtomicU64,
}

/// While records are in flight, how often [`poll_deliveries`] collects
/// their delivery reports (it adds at most this much to an acknowledgement).
const POLL_BUSY: Duration = Duration::from_millis(5);
/// With nothing in flight, how often it looks for the client's other
/// events (errors); a record produced wakes it at once.
const POLL_IDLE: Duration = Duration::from_millis(200);
/// Events handled per round at most, so a backlog of reports cannot keep
/// the thread from looking at the current producer.
const POLL_BATCH: usize = 1024;

/// Hands each delivery report to the task waiting for it, and counts the
/// reports handled so [`poll_deliveries`] knows when the queue is empty.
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

type Producer = BaseProducer<Deliveries>;

/// The producer in use (replaced by [`KafkaSink::on_delivery`]) and what the
/// polling thread needs to follow it.
struct Current {
    producer: RwLock<Arc<Producer>>,
    stop: AtomicBool,
}

/// The proxy's one thread for delivery reports. rdkafka's `FutureProducer`
/// polls on a thread of its own with a 100 ms deadline that it turns into
/// whole milliseconds, rounded down, so the last millisecond of every poll
/// is a zero-timeout poll again and again: an idle proxy spent most of its
/// CPU there. Here a round handles the reports that are ready
/// (`poll(0)` takes one event at a time) and then sleeps: [`POLL_BUSY`]
/// while records are in flight, else until a record is produced or
/// [`POLL_IDLE`] passes.
fn poll_deliveries(current: &Current, inflight: &AtomicU64) {
    while !current.stop.load(Ordering::Relaxed) {
        let p = current.producer.read().unwrap_or_else(|e| e.into_inner()).clone();
        for _ in 0..POLL_BATCH {
            let before = p.context().handled.load(Ordering::Relaxed);
            p.poll(Duration::ZERO);
            if p.context().handled.load(Ordering::Relaxed) == before {
                break;
            }
        }
        drop(p);
        if inflight.load(Ordering::Relaxed) > 0 {
            std::thread::sleep(POLL_BUSY);
        } else {
            std::thread::park_timeout(POLL_IDLE);
        }
    }
}

/// The Kafka producer of one proxy.
pub struct KafkaSink {
    /// Replaced when it stops delivering ([`StallWatch`]); `produce` takes
    /// a clone of the `Arc`, so a record is never held up by a swap.
    current: Arc<Current>,
    /// The thread of [`poll_deliveries`], woken when a record is produced.
    poller: Thread,
    config: ClientConfig,
    watch: Mutex<StallWatch>,
    topic: String,
    dlq_topic: String,
    train_id: String,
    pub stats: Arc<SinkStats>,
}

impl KafkaSink {
    /// An idempotent producer to `brokers` (librdkafka connects in the
    /// background: a broker that is down now is not an error).
    pub fn new(
        brokers: &str,
        security: &KafkaSecurity,
        topic: &str,
        dlq_topic: &str,
        train_id: &str,
    ) -> anyhow::Result<KafkaSink> {
        Self::with_timeouts(brokers, security, topic, dlq_topic, train_id, DELIVERY_TIMEOUT, REPLACE_AFTER)
    }

    /// With the delivery timeout and [`StallWatch`]'s `replace_after` given.
    pub fn with_timeouts(
        brokers: &str,
        security: &KafkaSecurity,
        topic: &str,
        dlq_topic: &str,
        train_id: &str,
        delivery_timeout: Duration,
        replace_after: Duration,
    ) -> anyhow::Result<KafkaSink> {
        let mut config = client_config(brokers, security);
        for (k, v) in contract::producer_settings(&format!("polycorn-proxy-{train_id}"), delivery_timeout) {
            config.set(k, v);
        }
        let producer: Producer = config
            .create_with_context(Deliveries::default())
            .map_err(|e| anyhow::anyhow!("creating the Kafka producer for {brokers}: {e}"))?;
        let current = Arc::new(Current { producer: RwLock::new(Arc::new(producer)), stop: AtomicBool::new(false) });
        let stats = Arc::new(SinkStats::default());
        let poller = {
            let (current, stats) = (current.clone(), stats.clone());
            std::thread::Builder::new()
                .name("kafka-deliveries".into())
                .spawn(move || poll_deliveries(&current, &stats.inflight))
                .map_err(|e| anyhow::anyhow!("starting the Kafka delivery thread: {e}"))?
                .thread()
                .clone()
        };
        Ok(KafkaSink {
            current,
            poller,
            config,
            watch: Mutex::new(StallWatch::new(replace_after, Instant::now())),
            topic: topic.into(),
            dlq_topic: dlq_topic.into(),
            train_id: train_id.into(),
            stats,
        })
    }

    fn producer(&self) -> Arc<Producer> {
        self.current.producer.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Feeds a delivery report to the [`StallWatch`]; replaces the producer
    /// when it says so. The old one is dropped on a thread of its own: its
    /// drop purges what it still holds (those records fail, stay
    /// unacknowledged and are resent) and waits for librdkafka.
    fn on_delivery(&self, ok: bool) {
        let replace = self.watch.lock().unwrap_or_else(|e| e.into_inner()).on_delivery(ok, Instant::now());
        if !replace {
            return;
        }
        let new: Producer = match self.config.create_with_context(Deliveries::default()) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "could not create a new Kafka producer (the current one stays)");
                return;
            }
        };
        let old =
            std::mem::replace(&mut *self.current.producer.write().unwrap_or_else(|e| e.into_inner()), Arc::new(new));
        self.stats.replaced.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            "the Kafka producer delivered no telemetry record for a while and its deliveries failed: \
             replaced by a new one (the relay resends what was not confirmed)"
        );
        let _ = std::thread::Builder::new().name("kafka-producer-drop".into()).spawn(move || drop(old));
    }

    /// Wait up to `timeout` for queued records to be delivered (at
    /// shutdown: fewer records for the relay to resend to the next proxy).
    pub fn flush(&self, timeout: Duration) {
        if let Err(e) = self.producer().flush(timeout) {
            tracing::warn!(error = %e, "telemetry not all delivered to Kafka at shutdown (the relay resends it)");
        }
    }

    /// Produce one record: it is queued in librdkafka now (so records are
    /// produced in the order they arrive); the future resolves to whether
    /// Kafka confirmed it.
    pub fn produce(
        self: &Arc<Self>,
        seq: u64,
        payload: &[u8],
        target: &Target,
    ) -> impl std::future::Future<Output = bool> + Send + 'static {
        let env = contract::envelope(&self.train_id, seq, target);
        let headers = kafka_headers(&env.headers);
        let topic = if env.dead_letter { &self.dlq_topic } else { &self.topic };
        let (tx, rx) = oneshot::channel();
        let rec = BaseRecord::with_opaque_to(topic, Box::new(tx)).key(env.key).payload(payload).headers(headers);
        let queued = self.producer().send(rec).map_err(|(e, _)| e.to_string());
        let me = self.clone();
        let dlq = matches!(target, Target::DeadLetter(_));
        let topic = topic.clone();
        if me.stats.inflight.fetch_add(1, Ordering::Relaxed) == 0 {
            me.poller.unpark();
        }
        async move {
            let r = match queued {
                Ok(()) => rx.await.unwrap_or_else(|_| Err("the producer was dropped".to_string())),
                Err(e) => Err(e),
            };
            me.stats.inflight.fetch_sub(1, Ordering::Relaxed);
            me.on_delivery(r.is_ok());
            match r {
                Ok(()) => {
                    let c = if dlq { &me.stats.dlq } else { &me.stats.produced };
                    c.fetch_add(1, Ordering::Relaxed);
                    true
                }
                Err(e) => {
                    me.stats.produce_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(seq, topic = %topic, error = %e, "telemetry record not delivered to Kafka (the relay sends it again)");
                    false
                }
            }
        }
    }
}

impl Drop for KafkaSink {
    fn drop(&mut self) {
        self.current.stop.store(true, Ordering::Relaxed);
        self.poller.unpark();
    }
}

/// An envelope's headers as librdkafka's.
pub fn kafka_headers(headers: &[(&str, String)]) -> OwnedHeaders {
    headers
        .iter()
        .fold(OwnedHeaders::new_with_capacity(headers.len()), |h, (k, v)| h.insert(Header { key: k, value: Some(v) }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn record(train: &str) -> Vec<u8> {
        v1::Record {
            train_id: train.into(),
            time_unix_ms: 1,
            body: Some(v1::record::Body::Gps(v1::GpsFix { lat_deg: 31.0, lon_deg: 121.0, ..Default::default() })),
        }
        .encode_to_vec()
    }

    #[test]
    fn a_record_is_acknowledged_only_after_kafka_confirmed_it() {
        let mut i = Ingest::new("train-0001", 10);
        assert_eq!(i.on_record(1, &record("train-0001")), Decision::Produce(Target::Telemetry));
        assert_eq!(i.on_record(1, &record("train-0001")), Decision::InFlight, "a copy from another path");
        assert!(!i.on_delivered(1, false), "Kafka failed: no ack");
        assert_eq!(
            i.on_record(1, &record("train-0001")),
            Decision::Produce(Target::Telemetry),
            "the relay's resend is produced again"
        );
        assert!(i.on_delivered(1, true));
        assert_eq!(i.on_record(1, &record("train-0001")), Decision::AckAgain, "our ack was lost");
        assert_eq!(i.in_flight(), 0);
    }

    #[test]
    fn malformed_and_foreign_records_go_to_the_dead_letter_topic_with_the_reason() {
        let mut i = Ingest::new("train-0001", 10);
        let Decision::Produce(Target::DeadLetter(why)) = i.on_record(1, b"\xff\xff garbage") else { panic!() };
        assert!(why.contains("not a polycorn.telemetry.v1.Record"), "{why}");
        let Decision::Produce(Target::DeadLetter(why)) = i.on_record(2, &record("train-0099")) else { panic!() };
        assert!(why.contains("train-0099") && why.contains("train-0001"), "{why}");
        let empty = v1::Record { train_id: "train-0001".into(), ..Default::default() }.encode_to_vec();
        assert_eq!(i.on_record(3, &empty), Decision::Produce(Target::DeadLetter("record has no body".into())));
    }

    fn flags(protocol: &str) -> KafkaSecurityFlags<'_> {
        KafkaSecurityFlags { protocol: Some(protocol), ..Default::default() }
    }

    fn config(s: &KafkaSecurity) -> BTreeMap<String, String> {
        let c = client_config("b:9093", s);
        c.config_map().into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn sasl_ssl_takes_the_password_from_its_file_and_sets_every_option() {
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("password");
        std::fs::write(&pw, "s3cret\n").unwrap();
        let ca = dir.path().join("ca.crt");
        let s = KafkaSecurity::from_flags(&KafkaSecurityFlags {
            username: Some("proxy"),
            password_file: Some(&pw),
            ca: Some(&ca),
            ..flags("sasl_ssl")
        })
        .unwrap();
        let c = config(&s);
        assert_eq!(c["security.protocol"], "sasl_ssl");
        assert_eq!(c["sasl.mechanism"], "SCRAM-SHA-512");
        assert_eq!(c["sasl.username"], "proxy");
        // config_map() hides the password; the client gets it as it is.
        assert_eq!(c["sasl.password"], "[sanitized for safety]");
        let raw = client_config("b:9093", &s);
        assert_eq!(raw.get("sasl.password"), Some("s3cret"), "the first line, without its newline");
        assert_eq!(c["ssl.ca.location"], ca.to_string_lossy());
        assert_eq!(c["ssl.endpoint.identification.algorithm"], "https");
        assert_eq!(s.protocol(), "SASL_SSL");
        assert!(!format!("{s:?}").contains("s3cret"), "Debug never shows the password: {s:?}");
        // The default is what it always was: no security option at all.
        assert_eq!(config(&KafkaSecurity::default()).keys().collect::<Vec<_>>(), ["bootstrap.servers"]);
        let plain = KafkaSecurity::from_flags(&KafkaSecurityFlags::default()).unwrap();
        assert_eq!(config(&plain)["security.protocol"], "plaintext");
    }

    #[test]
    fn inconsistent_security_flags_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("password");
        std::fs::write(&pw, "x").unwrap();
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let p = Path::new("/nonexistent/x.pem");
        let cases: Vec<(KafkaSecurityFlags<'_>, &str)> = vec![
            (flags("tls"), "must be PLAINTEXT, SSL"),
            (flags("SASL_SSL"), "needs --kafka-sasl-username"),
            (KafkaSecurityFlags { username: Some("proxy"), ..flags("SASL_SSL") }, "needs --kafka-sasl-password-file"),
            (
                KafkaSecurityFlags { username: Some("proxy"), password_file: Some(&empty), ..flags("SASL_SSL") },
                "is empty",
            ),
            (
                KafkaSecurityFlags { username: Some("proxy"), password_file: Some(p), ..flags("SASL_SSL") },
                "reading --kafka-sasl-password-file",
            ),
            (
                KafkaSecurityFlags {
                    username: Some("proxy"),
                    password_file: Some(&pw),
                    mechanism: Some("PLAIN"),
                    ..flags("SASL_SSL")
                },
                "--kafka-sasl-mechanism must be one of",
            ),
            (KafkaSecurityFlags { username: Some("proxy"), ..flags("SSL") }, "--kafka-sasl-username needs"),
            (KafkaSecurityFlags { password_file: Some(&pw), ..Default::default() }, "--kafka-sasl-password-file needs"),
            (
                KafkaSecurityFlags {
                    username: Some("proxy"),
                    password_file: Some(&pw),
                    ca: Some(p),
                    ..flags("SASL_PLAINTEXT")
                },
                "--kafka-ssl-ca needs",
            ),
            (KafkaSecurityFlags { cert: Some(p), ..flags("SSL") }, "go together"),
        ];
        for (f, want) in cases {
            let e = KafkaSecurity::from_flags(&f).expect_err(want);
            assert!(e.contains(want), "{f:?}: {e}");
        }
        // mTLS alone (SSL with a client certificate) is fine.
        let s = KafkaSecurity::from_flags(&KafkaSecurityFlags { cert: Some(p), key: Some(p), ..flags("ssl") }).unwrap();
        assert_eq!(config(&s)["ssl.certificate.location"], "/nonexistent/x.pem");
        assert_eq!(s.username(), None);
    }

    #[test]
    fn a_producer_is_replaced_after_failing_without_a_delivery_for_replace_after() {
        let t0 = Instant::now();
        let s = |x: u64| t0 + Duration::from_secs(x);
        let mut w = StallWatch::new(Duration::from_secs(60), t0);
        assert!(!w.on_delivery(false, s(30)), "failing, but not for 60 s yet");
        assert!(!w.on_delivery(true, s(40)), "a delivery");
        assert!(!w.on_delivery(false, s(70)), "60 s from the last delivery, not from the start");
        assert!(!w.on_delivery(false, s(99)));
        assert!(w.on_delivery(false, s(100)), "no delivery for 60 s, and failures: replace");
        assert!(!w.on_delivery(false, s(101)), "the new producer gets its 60 s");
        assert!(!w.on_delivery(false, s(159)));
        assert!(w.on_delivery(false, s(160)), "still nothing: once per 60 s");
        // Never a replacement while records are delivered, however many fail.
        let mut w = StallWatch::new(Duration::from_secs(60), t0);
        for i in 1..1000 {
            assert!(!w.on_delivery(i % 10 == 0, s(i)), "at {i} s");
        }
    }

    #[test]
    fn the_in_flight_window_is_bounded() {
        let mut i = Ingest::new("t", 2);
        let r = record("t");
        assert!(matches!(i.on_record(1, &r), Decision::Produce(_)));
        assert!(matches!(i.on_record(2, &r), Decision::Produce(_)));
        assert_eq!(i.on_record(3, &r), Decision::Full);
        i.on_delivered(1, true);
        assert!(matches!(i.on_record(3, &r), Decision::Produce(_)));
    }

    /// Tests against a real broker (`POLYCORN_KAFKA_BOOTSTRAP`), run by
    /// `cargo test -- --ignored` from the integration script.
    mod broker {
        use super::*;
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        use rdkafka::consumer::{BaseConsumer, Consumer};
        use rdkafka::message::Headers;
        use rdkafka::{Message, Offset, TopicPartitionList};
        use std::collections::BTreeMap;

        const TRAIN: &str = "train-0001";

        fn bootstrap() -> String {
            std::env::var("POLYCORN_KAFKA_BOOTSTRAP").expect(
                "POLYCORN_KAFKA_BOOTSTRAP is not set: these tests need a Kafka broker \
                 (run scripts/integration-telemetry.sh, or export POLYCORN_KAFKA_BOOTSTRAP=127.0.0.1:PORT)",
            )
        }

        fn unique(name: &str) -> String {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
            format!("polycorn.test.{name}.{}.{t}", std::process::id())
        }

        async fn create_topics(bootstrap: &str, names: &[&str]) {
            let admin: AdminClient<_> =
                ClientConfig::new().set("bootstrap.servers", bootstrap).create().expect("admin client");
            let topics: Vec<NewTopic> = names.iter().map(|n| NewTopic::new(n, 1, TopicReplication::Fixed(1))).collect();
            for r in admin.create_topics(&topics, &AdminOptions::new()).await.expect("create topics") {
                r.expect("topic created");
            }
        }

        /// Every message of `topic` (one partition) until `want` arrived:
        /// (key, headers, payload).
        fn read_back(bootstrap: &str, topic: &str, want: usize) -> Vec<(String, BTreeMap<String, String>, Vec<u8>)> {
            let c: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", bootstrap)
                .set("group.id", unique("reader"))
                .set("enable.auto.commit", "false")
                .create()
                .expect("consumer");
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(topic, 0, Offset::Beginning).unwrap();
            c.assign(&tpl).unwrap();
            let mut out = Vec::new();
            // Generous: a hang guard, not a timing assertion.
            let give_up = std::time::Instant::now() + Duration::from_secs(120);
            while out.len() < want && std::time::Instant::now() < give_up {
                let Some(m) = c.poll(Duration::from_millis(200)) else { continue };
                let m = m.expect("consume");
                let mut h = BTreeMap::new();
                if let Some(hs) = m.headers() {
                    for x in hs.iter() {
                        h.insert(x.key.to_string(), String::from_utf8_lossy(x.value.unwrap_or_default()).into_owned());
                    }
                }
                let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
                out.push((key, h, m.payload().unwrap_or_default().to_vec()));
            }
            out
        }

        fn gps(seq: u64) -> Vec<u8> {
            v1::Record {
                train_id: TRAIN.into(),
                time_unix_ms: seq as i64,
                body: Some(v1::record::Body::Gps(v1::GpsFix { lat_deg: 31.0, ..Default::default() })),
            }
            .encode_to_vec()
        }

        /// Offer `seqs` to the ingest (as the relay's sends or resends) and
        /// produce what it says; returns the seqs it acknowledged.
        async fn offer(
            sink: &Arc<KafkaSink>,
            ingest: &mut Ingest,
            seqs: &[u64],
            body: impl Fn(u64) -> Vec<u8>,
        ) -> Vec<u64> {
            let mut pending = Vec::new();
            for &seq in seqs {
                let payload = body(seq);
                match ingest.on_record(seq, &payload) {
                    Decision::Produce(t) => pending.push((seq, tokio::spawn(sink.produce(seq, &payload, &t)))),
                    d => panic!("seq {seq}: unexpected {d:?}"),
                }
            }
            let mut acked = Vec::new();
            for (seq, h) in pending {
                if ingest.on_delivered(seq, h.await.unwrap()) {
                    acked.push(seq);
                }
            }
            acked
        }

        #[tokio::test(flavor = "multi_thread")]
        #[ignore = "needs Kafka: scripts/integration-telemetry.sh"]
        async fn records_reach_kafka_keyed_by_train_and_are_acked_after_delivery() {
            let _broker = crate::BROKER.read().await;
            let b = bootstrap();
            let (topic, dlq) = (unique("telemetry"), unique("dlq"));
            create_topics(&b, &[&topic, &dlq]).await;
            let sink = Arc::new(KafkaSink::new(&b, &KafkaSecurity::default(), &topic, &dlq, TRAIN).unwrap());
            let mut ingest = Ingest::new(TRAIN, 100);
            let seqs: Vec<u64> = (1..=20).collect();
            assert_eq!(
                offer(&sink, &mut ingest, &seqs, gps).await,
                seqs,
                "every record acked after Kafka confirmed it"
            );
            // A resend after a lost ack is acknowledged, not produced again.
            assert_eq!(ingest.on_record(7, &gps(7)), Decision::AckAgain);
            // Malformed and foreign records: dead-letter topic, then acked.
            let bad = |seq: u64| {
                if seq == 21 {
                    b"\x08\xff\xff".to_vec()
                } else {
                    v1::Record {
                        train_id: "train-0099".into(),
                        time_unix_ms: 1,
                        body: Some(v1::record::Body::Gps(Default::default())),
                    }
                    .encode_to_vec()
                }
            };
            assert_eq!(offer(&sink, &mut ingest, &[21, 22], bad).await, vec![21, 22]);
            assert_eq!(sink.stats.produced.load(Ordering::Relaxed), 20);
            assert_eq!(sink.stats.dlq.load(Ordering::Relaxed), 2);

            let got = read_back(&b, &topic, 20);
            assert_eq!(got.len(), 20);
            for (i, (key, h, payload)) in got.iter().enumerate() {
                let seq = i as u64 + 1;
                assert_eq!(key, TRAIN);
                assert_eq!(payload, &gps(seq), "the value is the record as received");
                assert_eq!(h["polycorn-seq"], seq.to_string());
                assert_eq!(h["polycorn-schema"], "telemetry.v1");
                assert_eq!(h["polycorn-train"], TRAIN);
            }
            let dead = read_back(&b, &dlq, 2);
            assert_eq!(dead.len(), 2);
            assert!(dead[0].1["polycorn-error"].contains("not a polycorn.telemetry.v1.Record"), "{:?}", dead[0].1);
            assert!(dead[1].1["polycorn-error"].contains("train-0099"), "{:?}", dead[1].1);
            assert_eq!(dead[1].0, TRAIN, "keyed by the session's train, not the record's claim");
        }

        /// With `POLYCORN_KAFKA_STOP_CMD` and `POLYCORN_KAFKA_START_CMD`
        /// (shell commands), the broker itself is stopped and restarted;
        /// without them the outage is a producer whose broker address
        /// answers nothing, and recovery a producer to the real broker.
        #[tokio::test(flavor = "multi_thread")]
        #[ignore = "needs Kafka: scripts/integration-telemetry.sh"]
        async fn nothing_is_acked_while_kafka_is_down_and_everything_arrives_after() {
            let _broker = crate::BROKER.write().await;
            let b = bootstrap();
            let (topic, dlq) = (unique("outage"), unique("outage-dlq"));
            create_topics(&b, &[&topic, &dlq]).await;
            let cmds = (std::env::var("POLYCORN_KAFKA_STOP_CMD").ok(), std::env::var("POLYCORN_KAFKA_START_CMD").ok());
            let sh =
                |c: &str| assert!(std::process::Command::new("sh").arg("-c").arg(c).status().unwrap().success(), "{c}");
            let mut ingest = Ingest::new(TRAIN, 100);
            let seqs: Vec<u64> = (1..=10).collect();
            let plain = KafkaSecurity::default();
            // replace_after below the delivery timeout: the first failed
            // delivery (after 3 s) replaces the producer, and the records
            // then all arrive through the replacement.
            let (delivery, replace) = (Duration::from_secs(3), Duration::from_secs(2));
            let live = Arc::new(KafkaSink::with_timeouts(&b, &plain, &topic, &dlq, TRAIN, delivery, replace).unwrap());
            let down = match &cmds {
                (Some(stop), Some(_)) => {
                    eprintln!("stopping the broker: {stop}");
                    sh(stop);
                    live.clone()
                }
                _ => {
                    eprintln!(
                        "POLYCORN_KAFKA_STOP_CMD/START_CMD unset: simulating the outage with a dead broker address"
                    );
                    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
                    let dead = format!("127.0.0.1:{port}");
                    Arc::new(KafkaSink::with_timeouts(&dead, &plain, &topic, &dlq, TRAIN, delivery, replace).unwrap())
                }
            };
            assert!(offer(&down, &mut ingest, &seqs, gps).await.is_empty(), "nothing acked while Kafka is down");
            assert_eq!(down.stats.produce_errors.load(Ordering::Relaxed), 10);
            assert!(down.stats.replaced.load(Ordering::Relaxed) >= 1, "the failing producer was replaced");
            if let (Some(_), Some(start)) = &cmds {
                eprintln!("starting the broker: {start}");
                sh(start);
            }
            // The relay resends everything unacknowledged; retry until the
            // broker is back (each round waits at most the delivery timeout).
            let mut acked = BTreeSet::new();
            for _ in 0..40 {
                let rest: Vec<u64> = seqs.iter().copied().filter(|s| !acked.contains(s)).collect();
                if rest.is_empty() {
                    break;
                }
                acked.extend(offer(&live, &mut ingest, &rest, gps).await);
            }
            assert_eq!(acked.len(), 10, "every record acked once Kafka is back");
            let got = read_back(&b, &topic, 10);
            let seen: BTreeSet<String> = got.iter().map(|(_, h, _)| h["polycorn-seq"].clone()).collect();
            assert_eq!(seen.len(), 10, "every seq is in Kafka (a duplicate would be allowed: consumers dedup by seq)");
        }
    }
}
