//! Handover-failure prediction inputs in the shells (POLYCORN §3, §4.3):
//! train positions from telemetry records. The other input, the
//! failure-location table, comes from its sources in [`crate::table`].

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use polycorn_core::sched::{TrainState, TrainTracker};
use polycorn_telemetry::v1;

/// Current Unix time in ms.
pub fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// The instant (on this host's monotonic clock) a record stamped
/// `time_unix_ms` by the train was measured: now minus its age, the age
/// clamped to [0, 10 s] so a train clock that is off cannot push it far.
pub fn measured_at(time_unix_ms: i64, now: Instant, now_unix: SystemTime) -> Instant {
    let age_ms = (unix_ms(now_unix) - time_unix_ms).clamp(0, 10_000) as u64;
    now.checked_sub(Duration::from_millis(age_ms)).unwrap_or(now)
}

/// The train state a telemetry record implies, if it is a GPS fix with a
/// track position.
pub fn train_state_of(
    record: &v1::Record,
    tracker: &mut TrainTracker,
    now: Instant,
    now_unix: SystemTime,
) -> Option<TrainState> {
    let Some(v1::record::Body::Gps(fix)) = &record.body else { return None };
    let track = fix.track_m?;
    tracker.update(measured_at(record.time_unix_ms, now, now_unix), track, Some(fix.speed_mps))
}

#[cfg(test)]
mod tests {
    use super::*;
    use polycorn_core::sched::TrackDirection;

    #[test]
    fn gps_records_become_train_states_measured_when_the_train_says() {
        let now = Instant::now();
        let now_unix = SystemTime::now();
        let mut tr = TrainTracker::new();
        let rec = |t: i64, track: Option<f64>| v1::Record {
            train_id: "t".into(),
            time_unix_ms: t,
            body: Some(v1::record::Body::Gps(v1::GpsFix { speed_mps: 80.0, track_m: track, ..Default::default() })),
        };
        let s = train_state_of(&rec(unix_ms(now_unix) - 300, Some(500.0)), &mut tr, now, now_unix).unwrap();
        assert_eq!(now - s.at, Duration::from_millis(300));
        assert_eq!((s.position_m, s.speed_mps, s.direction), (500.0, 80.0, TrackDirection::Increasing));
        assert!(train_state_of(&rec(0, None), &mut tr, now, now_unix).is_none(), "no track position");
        let far_future = unix_ms(now_unix) + 60_000;
        let s = train_state_of(&rec(far_future, Some(600.0)), &mut tr, now, now_unix).unwrap();
        assert_eq!(s.at, now, "a train clock ahead does not date fixes in the future");
    }
}
