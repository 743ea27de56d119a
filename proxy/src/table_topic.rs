//! `--failure-table-topic`: the trainer's failure-location tables from Kafka
//! (topic `polycorn.failure-tables.v1`: one partition, compacted, key
//! `fleet`, value = the table's canonical JSON, headers `polycorn-version`
//! and `polycorn-etag`; the trainer contract, docs/telemetry.md).
//!
//! Every proxy must see the whole topic, so there is no consumer group at
//! work: partition 0 is assigned at offset Beginning and nothing is ever
//! committed (librdkafka wants a `group.id` all the same: a unique one per
//! process). Each value goes to the [`TableHub`], whose version rule keeps
//! the highest version; a malformed value is refused and counted there.
//! librdkafka reconnects by itself: while Kafka is down the proxy runs on
//! the table it has, and the errors count in
//! `polycorn_failure_table_source_errors{source="kafka"}`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use polycorn_net::table::{Offered, SourceKind, TableHub};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, ConsumerContext, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::watch;
use tracing::{debug, warn};

/// Kafka errors are logged at warn at most this often (librdkafka reports
/// every reconnection attempt while a broker is down); all are counted.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Counts and logs librdkafka's errors (broker down, unknown topic, ...).
pub struct TableContext {
    hub: Arc<TableHub>,
    last_warn: Mutex<Option<Instant>>,
}

impl TableContext {
    fn kafka_error(&self, what: &str) {
        self.hub.source_error(SourceKind::Kafka);
        let mut last = self.last_warn.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
            *last = Some(Instant::now());
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

/// What to do with one message of the topic.
#[derive(Debug, PartialEq, Eq)]
pub enum Delivery<'a> {
    /// A table to judge.
    Table(&'a [u8]),
    /// A tombstone (no value): not a table, ignored.
    Tombstone,
}

/// The pure step: a message's value is a table unless it is a tombstone.
pub fn delivery(payload: Option<&[u8]>) -> Delivery<'_> {
    match payload {
        Some(p) => Delivery::Table(p),
        None => Delivery::Tombstone,
    }
}

/// The consumer of the failure-location table topic.
pub struct TableTopic {
    consumer: StreamConsumer<TableContext>,
    topic: String,
    hub: Arc<TableHub>,
}

impl TableTopic {
    /// A consumer of partition 0 of `topic` from its beginning. Connects in
    /// the background: a broker that is down now is not an error.
    pub fn new(brokers: &str, topic: &str, train_id: &str, hub: Arc<TableHub>) -> anyhow::Result<TableTopic> {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let consumer: StreamConsumer<TableContext> = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("client.id", format!("polycorn-proxy-{train_id}-tables"))
            // Never joined nor committed to (assign, not subscribe).
            .set("group.id", format!("polycorn-proxy-tables-{train_id}-{}-{nanos}", std::process::id()))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false")
            .create_with_context(TableContext { hub: hub.clone(), last_warn: Mutex::new(None) })
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
        let header_version = m.headers().and_then(|hs| {
            hs.iter().find(|h| h.key == "polycorn-version").and_then(|h| h.value).map(String::from_utf8_lossy)
        });
        match delivery(m.payload()) {
            Delivery::Tombstone => {
                debug!(%origin, "failure-location table topic: tombstone ignored");
                None
            }
            Delivery::Table(body) => {
                debug!(%origin, header_version = ?header_version, bytes = body.len(), "failure-location table message");
                Some(self.hub.offer(SourceKind::Kafka, &origin, body))
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

    #[test]
    fn a_tombstone_is_not_a_table() {
        assert_eq!(delivery(None), Delivery::Tombstone);
        assert_eq!(delivery(Some(b"{}")), Delivery::Table(b"{}"));
    }
}
