use super::*;
use polycorn_core::cc::RailwayConfig;
use std::path::PathBuf;

/// A trip directory with one carrier: `per_ms` downlink opportunities every
/// millisecond (12 Mbit/s each), a constant one-way delay, `schedule_extra`
/// lines (blackouts, loss) and `events` as its event log.
fn trip(name: &str, per_ms: usize, delay_ms: u32, schedule_extra: &str, events: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("polycorn-ccsim-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace: String = (1..=1000).flat_map(|ms| std::iter::repeat_n(format!("{ms}\n"), per_ms)).collect();
    std::fs::write(dir.join("c0.down"), &trace).unwrap();
    std::fs::write(dir.join("c0.up"), &trace).unwrap();
    std::fs::write(dir.join("c0.schedule"), format!("delay 0 {delay_ms}\n{schedule_extra}")).unwrap();
    std::fs::write(dir.join("events.jsonl"), events).unwrap();
    dir
}

fn cfg(from: u64, until: u64) -> SimConfig {
    SimConfig { busy_from: Duration::from_secs(from), until: Duration::from_secs(until), ..SimConfig::default() }
}

#[test]
fn a_steady_carrier_is_used_and_its_queue_stays_short() {
    let dir = trip("steady", 1, 40, "", "");
    let mut c = Carrier::load(&dir, 0, 3_000_000).unwrap();
    let mut cc = Railway::new(RailwayConfig::default(), Instant::now());
    let o = run(&mut c, &mut cc, &cfg(5, 40));
    assert_eq!(o.capacity, 35_000 * OPPORTUNITY_BYTES);
    assert!(o.share() >= 0.9, "{o:?}");
    assert!(o.sojourn_p95 <= Duration::from_millis(100), "{o:?}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn capacity_leaves_out_blackouts_and_nothing_is_carried_in_them() {
    let dir = trip("blackout", 1, 40, "blackout 10000 11000 hold\n", "");
    let mut c = Carrier::load(&dir, 0, 3_000_000).unwrap();
    assert_eq!(c.capacity(Duration::from_secs(5), Duration::from_secs(15)), 9_000 * OPPORTUNITY_BYTES);
    let mut cc = Railway::new(RailwayConfig::default(), Instant::now());
    let o = run(&mut c, &mut cc, &cfg(5, 15));
    assert!(o.delivered <= o.capacity, "{o:?}");
    assert!(o.share() >= 0.8, "the carrier is used again after the blackout: {o:?}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn handovers_are_read_for_the_carrier_asked_for() {
    let events = concat!(
        r#"{"event":"handover_start","t_ms":1000,"carrier":1}"#,
        "\n",
        r#"{"event":"handover_start","t_ms":2000,"carrier":0}"#,
        "\n",
        r#"{"event":"rsrp","t_ms":2010,"carrier":0,"rsrp_dbm":-90.0}"#,
        "\n",
        r#"{"event":"handover_end","t_ms":2300,"carrier":0,"outcome":"success"}"#,
        "\n",
        r#"{"event":"handover_end","t_ms":2400,"carrier":1,"outcome":"success"}"#,
        "\n",
    );
    let dir = trip("events", 1, 40, "", events);
    let c = Carrier::load(&dir, 0, 3_000_000).unwrap();
    assert_eq!(c.handovers, vec![(Duration::from_millis(2000), Duration::from_millis(2300))]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(handovers(r#"{"event":"handover_start","carrier":0}"#, 0).is_err(), "an event without t_ms");
}

#[test]
fn a_missing_trip_file_is_named_in_the_error() {
    let dir = trip("missing", 1, 40, "", "");
    std::fs::remove_file(dir.join("c0.up")).unwrap();
    let e = Carrier::load(&dir, 0, 3_000_000).err().expect("no uplink trace").to_string();
    assert!(e.contains("c0.up"), "{e}");
    std::fs::remove_dir_all(dir).unwrap();
}
