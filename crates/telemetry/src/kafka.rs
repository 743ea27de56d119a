//! What the proxy puts into Kafka and how it reads the table topic, as
//! pure data (docs/telemetry.md, "Topics, keys, values, headers"): the
//! target of a record (telemetry or dead-letter topic, [`validate`]), its
//! envelope (key and headers, [`envelope`]), the telemetry producer's
//! settings ([`producer_settings`]), and the table topic's key rule
//! ([`table_delivery`]) and consumer settings ([`table_consumer_settings`]).
//!
//! No Kafka client here: the proxy's rdkafka shell (proxy/src/kafka.rs,
//! proxy/src/table_topic.rs) and the fleet simulator's plane mode
//! (bench/fleetsim, which produces the records of many trains straight to
//! the topic) both build their clients from these, so that what the
//! simulator sends is what a proxy would.

use std::time::Duration;

use crate::v1;

/// The telemetry topic's default name (`--kafka-topic`).
pub const TELEMETRY_TOPIC: &str = "polycorn.telemetry.v1";
/// The dead-letter topic's default name (`--kafka-dlq-topic`).
pub const DLQ_TOPIC: &str = "polycorn.telemetry.dlq";
/// The failure-location table topic (`--failure-table-topic`).
pub const TABLE_TOPIC: &str = "polycorn.failure-tables.v1";

/// Header naming the value's schema.
pub const HEADER_SCHEMA: &str = "polycorn-schema";
/// The schema of every telemetry value.
pub const SCHEMA_V1: &str = "telemetry.v1";
/// Header naming the train (the session's authenticated train).
pub const HEADER_TRAIN: &str = "polycorn-train";
/// Header carrying the record's spool seq, decimal.
pub const HEADER_SEQ: &str = "polycorn-seq";
/// Header carrying why a record went to the dead-letter topic.
pub const HEADER_ERROR: &str = "polycorn-error";
/// Header carrying a table's version (informational: the proxy judges the value).
pub const HEADER_TABLE_VERSION: &str = "polycorn-version";

/// How long the producer keeps trying to deliver one record (librdkafka's
/// `message.timeout.ms`; its retries are idempotent).
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a record goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// The telemetry topic.
    Telemetry,
    /// The dead-letter topic, with the reason in the `polycorn-error` header.
    DeadLetter(String),
}

/// Where a record of the session of `train_id` belongs: the telemetry
/// topic, or the dead-letter topic with the reason.
pub fn validate(train_id: &str, decoded: &Result<v1::Record, prost::DecodeError>) -> Target {
    match decoded {
        Err(e) => Target::DeadLetter(format!("not a polycorn.telemetry.v1.Record: {e}")),
        Ok(r) if r.train_id != train_id => {
            Target::DeadLetter(format!("train_id {:?} is not the train of the session ({train_id:?})", r.train_id))
        }
        Ok(r) if r.body.is_none() => Target::DeadLetter("record has no body".into()),
        Ok(_) => Target::Telemetry,
    }
}

/// A record's Kafka message apart from its value (the record's bytes
/// exactly as the relay sent them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope<'a> {
    /// The dead-letter topic instead of the telemetry topic.
    pub dead_letter: bool,
    /// The message key: the session's train, so that a train's records all
    /// go to one partition, in the order they were produced.
    pub key: &'a str,
    /// Header names and values, in this order.
    pub headers: Vec<(&'static str, String)>,
}

/// The envelope of record `seq` of the session of `train_id` bound for `target`.
pub fn envelope<'a>(train_id: &'a str, seq: u64, target: &Target) -> Envelope<'a> {
    let mut headers = vec![
        (HEADER_SCHEMA, SCHEMA_V1.to_string()),
        (HEADER_TRAIN, train_id.to_string()),
        (HEADER_SEQ, seq.to_string()),
    ];
    let dead_letter = match target {
        Target::Telemetry => false,
        Target::DeadLetter(reason) => {
            headers.push((HEADER_ERROR, reason.clone()));
            true
        }
    };
    Envelope { dead_letter, key: train_id, headers }
}

/// The telemetry producer's librdkafka settings (besides the brokers and
/// their security): idempotent, `acks=all`, batches of up to 5 ms, lz4.
pub fn producer_settings(client_id: &str, delivery_timeout: Duration) -> Vec<(&'static str, String)> {
    vec![
        ("client.id", client_id.to_string()),
        ("enable.idempotence", "true".into()),
        ("acks", "all".into()),
        ("message.timeout.ms", delivery_timeout.as_millis().to_string()),
        ("linger.ms", "5".into()),
        ("compression.type", "lz4".into()),
    ]
}

/// The key of every table message: the trainer publishes one table for the
/// fleet.
pub const TABLE_KEY: &[u8] = b"fleet";

/// What to do with one message of the table topic.
#[derive(Debug, PartialEq, Eq)]
pub enum TableDelivery<'a> {
    /// A table to judge.
    Table(&'a [u8]),
    /// A tombstone (no value): not a table, ignored.
    Tombstone,
    /// Under another key than [`TABLE_KEY`]: not the trainer's, refused.
    OtherKey,
}

/// A message's value under [`TABLE_KEY`] is a table unless it is a tombstone.
pub fn table_delivery<'a>(key: Option<&[u8]>, payload: Option<&'a [u8]>) -> TableDelivery<'a> {
    match (key, payload) {
        (k, _) if k != Some(TABLE_KEY) => TableDelivery::OtherKey,
        (_, Some(p)) => TableDelivery::Table(p),
        (_, None) => TableDelivery::Tombstone,
    }
}

/// The table consumer's librdkafka settings (besides the brokers and their
/// security). Every proxy must see the whole topic, so no consumer group is
/// at work: the caller assigns partition 0 at offset Beginning and nothing
/// is ever committed (librdkafka wants a `group.id` all the same: a unique
/// one per consumer, `group_id`).
pub fn table_consumer_settings(client_id: &str, group_id: &str) -> Vec<(&'static str, String)> {
    vec![
        ("client.id", client_id.to_string()),
        ("group.id", group_id.to_string()),
        ("enable.auto.commit", "false".into()),
        ("enable.auto.offset.store", "false".into()),
        ("auto.offset.reset", "earliest".into()),
        ("enable.partition.eof", "false".into()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    fn record(train: &str) -> Vec<u8> {
        v1::Record {
            train_id: train.into(),
            time_unix_ms: 1,
            body: Some(v1::record::Body::Gps(v1::GpsFix { lat_deg: 31.0, ..Default::default() })),
        }
        .encode_to_vec()
    }

    #[test]
    fn a_record_is_keyed_by_its_train_with_the_schema_train_and_seq_headers() {
        let e = envelope("train-0001", 42, &Target::Telemetry);
        assert!(!e.dead_letter);
        assert_eq!(e.key, "train-0001");
        let h: Vec<(&str, &str)> = e.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(h, [("polycorn-schema", "telemetry.v1"), ("polycorn-train", "train-0001"), ("polycorn-seq", "42")]);
        let d = envelope("train-0001", 7, &Target::DeadLetter("why".into()));
        assert!(d.dead_letter);
        assert_eq!(d.headers.last(), Some(&("polycorn-error", "why".to_string())));
        assert_eq!(d.headers.len(), 4);
    }

    #[test]
    fn malformed_foreign_and_empty_records_are_dead_letters_with_the_reason() {
        let decode = |b: &[u8]| v1::Record::decode(b);
        assert_eq!(validate("t", &decode(&record("t"))), Target::Telemetry);
        let Target::DeadLetter(why) = validate("t", &decode(b"\xff\xff garbage")) else { panic!() };
        assert!(why.contains("not a polycorn.telemetry.v1.Record"), "{why}");
        let Target::DeadLetter(why) = validate("t", &decode(&record("u"))) else { panic!() };
        assert!(why.contains("\"u\"") && why.contains("\"t\""), "{why}");
        let empty = v1::Record { train_id: "t".into(), ..Default::default() }.encode_to_vec();
        assert_eq!(validate("t", &decode(&empty)), Target::DeadLetter("record has no body".into()));
    }

    #[test]
    fn the_producer_is_idempotent_with_acks_all() {
        let s = producer_settings("polycorn-proxy-t", DELIVERY_TIMEOUT);
        let get = |k: &str| s.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("enable.idempotence"), Some("true"));
        assert_eq!(get("acks"), Some("all"));
        assert_eq!(get("message.timeout.ms"), Some("30000"));
        assert_eq!(get("client.id"), Some("polycorn-proxy-t"));
    }

    #[test]
    fn a_tombstone_is_not_a_table_and_only_the_fleet_key_carries_one() {
        assert_eq!(table_delivery(Some(TABLE_KEY), None), TableDelivery::Tombstone);
        assert_eq!(table_delivery(Some(TABLE_KEY), Some(b"{}")), TableDelivery::Table(b"{}"));
        assert_eq!(table_delivery(Some(b"fleet2"), Some(b"{}")), TableDelivery::OtherKey);
        assert_eq!(table_delivery(None, Some(b"{}")), TableDelivery::OtherKey);
        let s = table_consumer_settings("c", "g");
        assert!(s.contains(&("enable.auto.commit", "false".into())) && s.contains(&("group.id", "g".into())));
    }
}
