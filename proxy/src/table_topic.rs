//! `--failure-table-topic`: the trainer's failure-location tables from Kafka
//! (topic `polycorn.failure-tables.v1`: one partition, compacted, key
//! `fleet`, value = the table's canonical JSON, headers `polycorn-version`,
//! `polycorn-etag` and `polycorn-signature` (with `--failure-table-verify-key`
//! the value must verify with it); the trainer contract, docs/telemetry.md).
//!
//! Every proxy must see the whole topic, so there is no consumer group at
//! work: partition 0 is assigned at offset Beginning and nothing is ever
//! committed (librdkafka wants a `group.id` all the same: a unique one per
//! process). Each value goes to the [`TableHub`], whose version rule keeps
//! the highest version; a malformed value is refused and counted there.
//! librdkafka reconnects by itself: while Kafka is down the proxy runs on
//! the table it has, and the errors count in
//! `polycorn_failure_table_source_errors{source="kafka"}`.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use polycorn_net::table::{signature, Offered, SourceKind, TableHub};
use polycorn_telemetry::kafka::{table_consumer_settings, HEADER_TABLE_VERSION};
use rdkafka::consumer::{Consumer, ConsumerContext, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::kafka::{client_config, KafkaSecurity};

/// Kafka errors are logged at warn at most this often (librdkafka reports
/// every reconnection attempt while a broker is down); all are counted.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Counts and logs librdkafka's errors (broker down, unknown topic, ...).
pub struct TableContext {
    hub: Arc<TableHub>,
    warn_log: polycorn_net::lograte::Every,
}

impl TableContext {
    fn kafka_error(&self, what: &str) {
        self.hub.source_error(SourceKind::Kafka);
        if self.warn_log.check(Instant::now()).is_some() {
            warn!(error = %what, "failure-location table topic: Kafka error; the table in use stays and the consumer retries");
        } else {
            debug!(error = %what, "failure-location table topic: Kafka error");
        }
    }
}

impl ClientContext for TableContext {
    fn error(&self, error: KafkaError, reason: &str) {
        self.kafka_error(&format!("{error}: {reason}"));
    }
}

impl ConsumerContext for TableContext {}

// The key rule and the consumer's settings are shared with the fleet
// simulator's table consumers (bench/fleetsim, plane mode).
pub use polycorn_telemetry::kafka::{table_delivery as delivery, TableDelivery as Delivery};

/// The consumer of the failure-location table topic.
pub struct TableTopic {
    consumer: StreamConsumer<TableContext>,
    topic: String,
    hub: Arc<TableHub>,
}

impl TableTopic {
    /// A consumer of partition 0 of `topic` from its beginning. Connects in
    /// the background: a broker that is down now is not an error.
    pub fn new(
        brokers: &str,
        security: &KafkaSecurity,
        topic: &str,
        train_id: &str,
        hub: Arc<TableHub>,
    ) -> anyhow::Result<TableTopic> {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let mut config = client_config(brokers, security);
        // Never joined nor committed to (assign, not subscribe).
        let group = format!("polycorn-proxy-tables-{train_id}-{}-{nanos}", std::process::id());
        for (k, v) in table_consumer_settings(&format!("polycorn-proxy-{train_id}-tables"), &group) {
            config.set(k, v);
        }
        let consumer: StreamConsumer<TableContext> = config
            .create_with_context(TableContext {
                hub: hub.clone(),
                warn_log: polycorn_net::lograte::Every::new(WARN_EVERY),
            })
            .map_err(|e| anyhow::anyhow!("creating the Kafka consumer of {topic} at {brokers}: {e}"))?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, 0, Offset::Beginning)
            .map_err(|e| anyhow::anyhow!("assigning {topic} partition 0: {e}"))?;
        consumer.assign(&tpl).map_err(|e| anyhow::anyhow!("assigning {topic} partition 0: {e}"))?;
        Ok(TableTopic { consumer, topic: topic.into(), hub })
    }

    fn on_message(&self, m: &rdkafka::message::BorrowedMessage<'_>) -> Option<Offered> {
        self.hub.source_ok(SourceKind::Kafka);
        let origin = format!("{}:{}@{}", self.topic, m.partition(), m.offset());
        let header = |name: &str| m.headers().and_then(|hs| hs.iter().find(|h| h.key == name).and_then(|h| h.value));
        let header_version = header(HEADER_TABLE_VERSION).map(String::from_utf8_lossy);
        let signature = header(signature::KAFKA_HEADER);
        match delivery(m.key(), m.payload()) {
            Delivery::Tombstone => {
                debug!(%origin, "failure-location table topic: tombstone ignored");
                None
            }
            Delivery::OtherKey => {
                let key = m.key().map(String::from_utf8_lossy);
                self.hub.refuse(SourceKind::Kafka, &origin, &format!("message key {key:?}, not \"fleet\""));
                None
            }
            Delivery::Table(body) => {
                debug!(%origin, header_version = ?header_version, bytes = body.len(), "failure-location table message");
                Some(self.hub.offer(SourceKind::Kafka, &origin, body, signature))
            }
        }
    }

    /// Follow the topic until `stop`.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                m = self.consumer.recv() => match m {
                    Ok(m) => {
                        self.on_message(&m);
                    }
                    Err(e) => {
                        self.consumer.context().kafka_error(&e.to_string());
                        // Errors come back at once while they last: do not spin.
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                            _ = stop.changed() => return,
                        }
                    }
                },
                _ = stop.changed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits (a hang guard, not a timing assertion) until `done` holds.
    async fn until(what: &str, secs: u64, done: impl Fn() -> bool) {
        let give_up = Instant::now() + Duration::from_secs(secs);
        while !done() {
            assert!(Instant::now() < give_up, "{what}: not within {secs} s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The data plane never waits for Kafka: with no broker the consumer
    /// starts at once, runs without a table and counts the errors.
    #[tokio::test(flavor = "multi_thread")]
    async fn without_a_broker_the_proxy_runs_without_a_table_and_counts_errors() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let hub = TableHub::new(|_| {});
        let started = Instant::now();
        let c = TableTopic::new(
            &format!("127.0.0.1:{port}"),
            &KafkaSecurity::default(),
            "polycorn.failure-tables.v1",
            "t",
            hub.clone(),
        )
        .unwrap();
        assert!(started.elapsed() < Duration::from_secs(5), "creating the consumer does not wait for Kafka");
        let (stop_tx, stop) = watch::channel(false);
        let task = tokio::spawn(c.run(stop));
        until("a Kafka error counted", 60, || hub.stats().source(SourceKind::Kafka).errors > 0).await;
        assert_eq!(hub.stats().version, None);
        stop_tx.send(true).unwrap();
        task.await.unwrap();
    }

    /// Tests against a real broker (`POLYCORN_KAFKA_BOOTSTRAP`), run by
    /// `cargo test -- --ignored` from scripts/integration-telemetry.sh.
    mod broker {
        use super::*;
        use polycorn_telemetry::failure_table::{Direction, Entry, FailureTableFile};
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        use rdkafka::config::ClientConfig;
        use rdkafka::message::{Header, OwnedHeaders};
        use rdkafka::producer::{FutureProducer, FutureRecord};

        fn bootstrap() -> String {
            std::env::var("POLYCORN_KAFKA_BOOTSTRAP").expect(
                "POLYCORN_KAFKA_BOOTSTRAP is not set: these tests need a Kafka broker \
                 (run scripts/integration-telemetry.sh, or export POLYCORN_KAFKA_BOOTSTRAP=127.0.0.1:PORT)",
            )
        }

        /// A compacted one-partition topic unique to this run, like the trainer's.
        async fn table_topic(bootstrap: &str, name: &str) -> String {
            let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
            let topic = format!("polycorn.test.{name}.{}.{t}", std::process::id());
            let admin: AdminClient<_> =
                ClientConfig::new().set("bootstrap.servers", bootstrap).create().expect("admin client");
            let new = NewTopic::new(&topic, 1, TopicReplication::Fixed(1)).set("cleanup.policy", "compact");
            for r in admin.create_topics(&[new], &AdminOptions::new()).await.expect("create topic") {
                r.expect("topic created");
            }
            topic
        }

        /// The trainer's message for a table of `version` (the canonical body).
        fn table(version: u64) -> String {
            let mut f = FailureTableFile::new(version, "trainer test");
            f.entries.push(Entry {
                cell: 7,
                direction: Direction::Decreasing,
                position_m: 1234.5,
                failures: Some(3),
                handovers: Some(9),
                route: None,
                lat: None,
                lon: None,
            });
            f.to_json()
        }

        async fn publish(p: &FutureProducer, topic: &str, version: &str, value: &str) {
            let headers = OwnedHeaders::new()
                .insert(Header { key: "polycorn-version", value: Some(version) })
                .insert(Header { key: "polycorn-etag", value: Some("not-checked-by-the-proxy") });
            let rec = FutureRecord::to(topic).key("fleet").payload(value).headers(headers);
            p.send(rec, Duration::from_secs(120)).await.map_err(|(e, _)| e).expect("produced");
        }

        fn producer(bootstrap: &str) -> FutureProducer {
            ClientConfig::new()
                .set("bootstrap.servers", bootstrap)
                .set("message.timeout.ms", "120000")
                .create()
                .expect("producer")
        }

        /// A consumer with its own hub, as a freshly started proxy has:
        /// (hub, versions applied, stop sender).
        fn follow(b: &str, topic: &str) -> (Arc<TableHub>, Arc<std::sync::Mutex<Vec<u64>>>, watch::Sender<bool>) {
            let applied = Arc::new(std::sync::Mutex::new(Vec::new()));
            let a = applied.clone();
            let hub = TableHub::new(move |t| a.lock().unwrap().push(t.version()));
            let c = TableTopic::new(b, &KafkaSecurity::default(), topic, "train-test", hub.clone()).unwrap();
            let (stop_tx, stop) = watch::channel(false);
            tokio::spawn(c.run(stop));
            (hub, applied, stop_tx)
        }

        fn judged(hub: &TableHub) -> u64 {
            let s = hub.stats().source(SourceKind::Kafka);
            s.loads + s.rejected + s.not_newer
        }

        #[tokio::test(flavor = "multi_thread")]
        #[ignore = "needs Kafka: scripts/integration-telemetry.sh"]
        async fn the_highest_version_wins_and_a_new_proxy_reads_it_from_the_beginning() {
            let _broker = crate::BROKER.read().await;
            let b = bootstrap();
            let topic = table_topic(&b, "failure-tables").await;
            let p = producer(&b);
            publish(&p, &topic, "1", &table(1)).await;
            publish(
                &p,
                &topic,
                "2",
                "{\"format\":\"polycorn-failure-table/1\",\"version\":2,\"entries\":[{\"cell\":0}]}",
            )
            .await;
            publish(&p, &topic, "2", &table(2)).await;
            publish(&p, &topic, "1", &table(1)).await;

            let (hub, applied, stop_a) = follow(&b, &topic);
            until("4 messages judged", 120, || judged(&hub) == 4).await;
            let s = hub.stats();
            assert_eq!(s.version, Some(2), "the highest version is in use");
            assert_eq!(s.rejected(), 1, "the malformed value is refused and counted");
            assert_eq!(s.source(SourceKind::Kafka).not_newer, 1, "the older v1 is ignored, not rejected");
            assert_eq!(*applied.lock().unwrap(), vec![1, 2]);
            assert!(s.source(SourceKind::Kafka).last_ok_unix_s.is_some());

            // A proxy started now (fresh state) gets v2 from the beginning of the topic.
            let (hub2, _, stop_b) = follow(&b, &topic);
            until("the new consumer's table", 120, || hub2.stats().version == Some(2) && judged(&hub2) == 4).await;
            assert_eq!(hub2.stats().rejected(), 1);

            // Both follow what comes next.
            publish(&p, &topic, "3", &table(3)).await;
            until("v3 followed", 120, || hub.stats().version == Some(3) && hub2.stats().version == Some(3)).await;
            stop_a.send(true).unwrap();
            stop_b.send(true).unwrap();
        }

        /// With `POLYCORN_KAFKA_STOP_CMD` and `POLYCORN_KAFKA_START_CMD` the
        /// broker is stopped (the table in use stays, errors are counted)
        /// and started again (the consumer follows new tables); without
        /// them only the part before the outage runs.
        #[tokio::test(flavor = "multi_thread")]
        #[ignore = "needs Kafka: scripts/integration-telemetry.sh"]
        async fn the_table_stays_while_kafka_is_down_and_new_ones_follow_after() {
            let _broker = crate::BROKER.write().await;
            let b = bootstrap();
            let topic = table_topic(&b, "failure-tables-outage").await;
            let p = producer(&b);
            publish(&p, &topic, "1", &table(1)).await;
            let (hub, _, stop) = follow(&b, &topic);
            until("v1", 120, || hub.stats().version == Some(1)).await;
            let (Ok(stop_cmd), Ok(start_cmd)) =
                (std::env::var("POLYCORN_KAFKA_STOP_CMD"), std::env::var("POLYCORN_KAFKA_START_CMD"))
            else {
                eprintln!("POLYCORN_KAFKA_STOP_CMD/START_CMD unset: the broker is not stopped");
                return;
            };
            let sh =
                |c: &str| assert!(std::process::Command::new("sh").arg("-c").arg(c).status().unwrap().success(), "{c}");
            let errors = || hub.stats().source(SourceKind::Kafka).errors;
            let before = errors();
            eprintln!("stopping the broker: {stop_cmd}");
            sh(&stop_cmd);
            until("a Kafka error counted", 120, || errors() > before).await;
            assert_eq!(hub.stats().version, Some(1), "the table in use stays");
            eprintln!("starting the broker: {start_cmd}");
            sh(&start_cmd);
            publish(&p, &topic, "2", &table(2)).await;
            until("v2 after the outage", 180, || hub.stats().version == Some(2)).await;
            stop.send(true).unwrap();
        }
    }
}
