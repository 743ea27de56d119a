//! Telemetry from the relay into Kafka (`docs/telemetry.md`).
//!
//! [`Ingest`] is the pure part: for each record (and each duplicate copy)
//! the session delivers, it decides whether to produce it to the telemetry
//! topic, to the dead-letter topic (with the reason), to acknowledge it
//! again, or to ignore it; and after Kafka's delivery report, whether to
//! acknowledge it to the relay. [`KafkaSink`] is the thin rdkafka shell:
//! an idempotent producer (`acks=all`), key = train id, value = the Record
//! bytes exactly as received.
//!
//! The relay drops a record from its spool only on our acknowledgement, so
//! a record is acknowledged only after Kafka confirmed it (or, malformed,
//! after the dead-letter topic confirmed it): a Kafka outage costs resends,
//! never records.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use polycorn_telemetry::v1;
use prost::Message as _;
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

/// Default `--kafka-topic`.
pub const DEFAULT_TOPIC: &str = "polycorn.telemetry.v1";
/// Default `--kafka-dlq-topic`.
pub const DEFAULT_DLQ_TOPIC: &str = "polycorn.telemetry.dlq";
/// Records produced and not yet confirmed by Kafka, at most; past it new
/// records are ignored (not acknowledged: the relay sends them again).
pub const MAX_IN_FLIGHT: usize = 4096;
/// Seqs confirmed by Kafka remembered, to acknowledge resent copies again
/// without producing them twice.
const CONFIRMED_REMEMBERED: usize = 65536;
/// How long librdkafka keeps trying to deliver one record (retries are
/// idempotent); after that the record counts as failed, stays
/// unacknowledged, and the relay's resend produces it again.
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a record goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// The telemetry topic.
    Telemetry,
    /// The dead-letter topic, with the reason in the `polycorn-error` header.
    DeadLetter(String),
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
        Decision::Produce(validate(&self.train_id, payload))
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

/// Where a record belongs: the telemetry topic, or the dead-letter topic
/// with the reason.
pub fn validate(train_id: &str, payload: &[u8]) -> Target {
    match v1::Record::decode(payload) {
        Err(e) => Target::DeadLetter(format!("not a polycorn.telemetry.v1.Record: {e}")),
        Ok(r) if r.train_id != train_id => {
            Target::DeadLetter(format!("train_id {:?} is not the train of the session ({train_id:?})", r.train_id))
        }
        Ok(r) if r.body.is_none() => Target::DeadLetter("record has no body".into()),
        Ok(_) => Target::Telemetry,
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
}

/// The Kafka producer of one proxy.
pub struct KafkaSink {
    producer: FutureProducer,
    topic: String,
    dlq_topic: String,
    train_id: String,
    pub stats: SinkStats,
}

impl KafkaSink {
    /// An idempotent producer to `brokers` (librdkafka connects in the
    /// background: a broker that is down now is not an error).
    pub fn new(brokers: &str, topic: &str, dlq_topic: &str, train_id: &str) -> anyhow::Result<KafkaSink> {
        Self::with_delivery_timeout(brokers, topic, dlq_topic, train_id, DELIVERY_TIMEOUT)
    }

    pub fn with_delivery_timeout(
        brokers: &str,
        topic: &str,
        dlq_topic: &str,
        train_id: &str,
        delivery_timeout: Duration,
    ) -> anyhow::Result<KafkaSink> {
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("client.id", format!("polycorn-proxy-{train_id}"))
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", delivery_timeout.as_millis().to_string())
            .set("linger.ms", "5")
            .set("compression.type", "lz4")
            .create()
            .map_err(|e| anyhow::anyhow!("creating the Kafka producer for {brokers}: {e}"))?;
        Ok(KafkaSink {
            producer,
            topic: topic.into(),
            dlq_topic: dlq_topic.into(),
            train_id: train_id.into(),
            stats: SinkStats::default(),
        })
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
        let seq_s = seq.to_string();
        let mut headers = OwnedHeaders::new()
            .insert(Header { key: "polycorn-schema", value: Some("telemetry.v1") })
            .insert(Header { key: "polycorn-train", value: Some(self.train_id.as_str()) })
            .insert(Header { key: "polycorn-seq", value: Some(seq_s.as_str()) });
        let topic = match target {
            Target::Telemetry => &self.topic,
            Target::DeadLetter(reason) => {
                headers = headers.insert(Header { key: "polycorn-error", value: Some(reason.as_str()) });
                &self.dlq_topic
            }
        };
        let rec = FutureRecord::to(topic).key(self.train_id.as_str()).payload(payload).headers(headers);
        let queued = self.producer.send_result(rec).map_err(|(e, _)| e);
        let me = self.clone();
        let dlq = matches!(target, Target::DeadLetter(_));
        let topic = topic.clone();
        me.stats.inflight.fetch_add(1, Ordering::Relaxed);
        async move {
            let r = match queued {
                Ok(delivery) => match delivery.await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err((e, _))) => Err(e.to_string()),
                    Err(_) => Err("the producer was dropped".to_string()),
                },
                Err(e) => Err(e.to_string()),
            };
            me.stats.inflight.fetch_sub(1, Ordering::Relaxed);
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
