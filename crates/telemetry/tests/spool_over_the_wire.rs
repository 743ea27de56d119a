//! The spool driving a real relay endpoint against a real proxy endpoint
//! (sans-IO, virtual time): lost acknowledgements, the spool's resend after
//! its timeout, and the proxy acknowledging copies it already stored.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use polycorn_core::{Endpoint, EndpointConfig, Event, PathId, Registry, Role};
use polycorn_telemetry::spool::{Class, Spool, SpoolConfig};

fn pair(now: Instant) -> (Endpoint, Endpoint) {
    let r = Registry::with_builtins();
    let mut relay = Endpoint::new(EndpointConfig::new(Role::Relay), r.build("minrtt").unwrap(), now);
    let mut proxy = Endpoint::new(EndpointConfig::new(Role::Proxy), r.build("minrtt").unwrap(), now);
    for p in [PathId(0), PathId(1)] {
        relay.path_up(p, now);
        proxy.path_up(p, now);
    }
    (relay, proxy)
}

/// Move bytes both ways until quiet; `lose_acks` drops everything the
/// proxy sends (its TELEMETRY_ACKs among it).
fn pump(relay: &mut Endpoint, proxy: &mut Endpoint, now: Instant, lose_acks: bool) {
    for _ in 0..100 {
        let mut moved = false;
        for p in relay.up_paths() {
            let mut out = Vec::new();
            if relay.poll_transmit(p, now, &mut out, 1 << 20) > 0 {
                proxy.handle_input(p, &out, now).unwrap();
                moved = true;
            }
        }
        for p in proxy.up_paths() {
            let mut out = Vec::new();
            if proxy.poll_transmit(p, now, &mut out, 1 << 20) > 0 {
                if !lose_acks {
                    relay.handle_input(p, &out, now).unwrap();
                }
                moved = true;
            }
        }
        if !moved {
            return;
        }
    }
    panic!("never quiet");
}

/// The proxy's shell, reduced to its rule: store (in "Kafka"), then ack;
/// a copy of a stored record is acknowledged again.
fn proxy_shell(proxy: &mut Endpoint, kafka: &mut BTreeMap<u64, Vec<Bytes>>) {
    while let Some(ev) = proxy.poll_event() {
        match ev {
            Event::Telemetry { seq, payload } => {
                kafka.entry(seq).or_default().push(payload);
                proxy.ack_telemetry(seq);
            }
            Event::TelemetryDuplicate { seq, .. } => {
                assert!(kafka.contains_key(&seq), "a copy of something stored");
                proxy.ack_telemetry(seq);
            }
            _ => {}
        }
    }
}

fn relay_shell(relay: &mut Endpoint, spool: &mut Spool) {
    while let Some(ev) = relay.poll_event() {
        if let Event::TelemetryAcked { seq } = ev {
            spool.ack(seq).unwrap();
        }
    }
}

fn send(relay: &mut Endpoint, spool: &mut Spool, now: Instant) {
    for o in spool.next_to_send(now, 64).unwrap() {
        relay.send_telemetry(o.seq, Bytes::from(o.payload)).unwrap();
    }
}

#[test]
fn lost_acks_end_with_every_record_stored_once_and_the_spool_empty() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = SpoolConfig::with_max_bytes(1 << 20);
    let t0 = Instant::now();
    let (mut relay, mut proxy) = pair(t0);
    let mut kafka = BTreeMap::new();
    let mut spool = Spool::open(dir.path(), cfg.clone()).unwrap();
    for i in 0..10u8 {
        let class = if i % 4 == 0 { Class::Handover } else { Class::Sample };
        spool.append(&[i; 30], class).unwrap();
    }
    // Every acknowledgement is lost.
    send(&mut relay, &mut spool, t0);
    pump(&mut relay, &mut proxy, t0, false);
    proxy_shell(&mut proxy, &mut kafka);
    pump(&mut relay, &mut proxy, t0, true);
    relay_shell(&mut relay, &mut spool);
    assert_eq!(kafka.len(), 10);
    assert_eq!(spool.stats().records, 10, "nothing acknowledged reached the relay");

    // Five seconds on, the spool sends them again; those acks are lost too.
    let t = t0 + Duration::from_secs(5);
    send(&mut relay, &mut spool, t);
    pump(&mut relay, &mut proxy, t, false);
    proxy_shell(&mut proxy, &mut kafka);
    pump(&mut relay, &mut proxy, t, true);
    relay_shell(&mut relay, &mut spool);
    assert_eq!(spool.stats().resent, 10);
    assert_eq!(spool.stats().records, 10);
    // The spool's crash recovery in between: reopened, it holds them all.
    drop(spool);
    let mut spool = Spool::open(dir.path(), cfg).unwrap();
    spool.append(b"after reopening", Class::Sample).unwrap();
    spool.append(b"handover after reopening", Class::Handover).unwrap();
    let t1 = t0 + Duration::from_secs(6);
    send(&mut relay, &mut spool, t1);
    pump(&mut relay, &mut proxy, t1, false);
    proxy_shell(&mut proxy, &mut kafka);
    pump(&mut relay, &mut proxy, t1, false);
    relay_shell(&mut relay, &mut spool);
    assert_eq!(spool.stats().records, 0, "copies of stored records are acknowledged again");
    assert_eq!(kafka.len(), 12);
    assert!(kafka.values().all(|v| v.len() == 1), "each record stored once");
    // Nothing more goes out, however long we wait.
    let later = t1 + Duration::from_secs(60);
    assert!(spool.next_to_send(later, 64).unwrap().is_empty());
}
