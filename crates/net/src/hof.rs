//! Handover-failure prediction inputs in the shells (POLYCORN §3, §4.3):
//! train positions from telemetry records. The other input, the
//! failure-location table, comes from its sources in [`crate::table`].
//!
//! A fix's position along the track is its `track_m` when the train sends
//! one (the testbed's trip replay, a train that knows its kilometre post);
//! otherwise, when the table in use carries route lines, the fix's
//! longitude and latitude map-matched onto them ([`Positioner`],
//! `polycorn_telemetry::route_match`), so a train with a plain GPS receiver
//! (gpsd) drives HPR too.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use polycorn_core::sched::{TrainState, TrainTracker};
use polycorn_telemetry::route_match::{Matcher, Routes};
use polycorn_telemetry::v1;

/// The route lines of the table in use, shared by a process's table
/// sources (which set them) and its trains' positioners (which read them).
#[derive(Clone, Debug, Default)]
pub struct SharedRoutes(Arc<RwLock<(u64, Arc<Routes>)>>);

impl SharedRoutes {
    /// New routes (a table was put in use).
    pub fn set(&self, routes: Routes) {
        let mut g = self.0.write().unwrap_or_else(|e| e.into_inner());
        g.0 += 1;
        g.1 = Arc::new(routes);
    }

    /// (generation, routes): the generation grows with every [`Self::set`].
    pub fn get(&self) -> (u64, Arc<Routes>) {
        let g = self.0.read().unwrap_or_else(|e| e.into_inner());
        (g.0, g.1.clone())
    }
}

/// One train's position source: `track_m` when the fix has it, else the
/// map-matched position on the shared routes.
#[derive(Debug, Default)]
pub struct Positioner {
    shared: Option<SharedRoutes>,
    generation: u64,
    matcher: Matcher,
}

impl Positioner {
    pub fn new(shared: Option<SharedRoutes>) -> Self {
        Positioner { shared, generation: 0, matcher: Matcher::default() }
    }

    /// The fix's position along the track, if it has one or matches a route.
    pub fn track_m(&mut self, fix: &v1::GpsFix, time_unix_ms: i64) -> Option<f64> {
        if let Some(t) = fix.track_m {
            return Some(t);
        }
        let shared = self.shared.as_ref()?;
        let (generation, routes) = shared.get();
        if generation != self.generation {
            self.matcher.set_routes((*routes).clone());
            self.generation = generation;
        }
        if self.matcher.routes().is_empty() || (fix.lat_deg == 0.0 && fix.lon_deg == 0.0) {
            return None; // no routes, or no fix (0, 0)
        }
        self.matcher.locate(fix.lat_deg, fix.lon_deg, time_unix_ms).map(|l| l.measure_m)
    }
}

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
/// track position (its own, or map-matched by `positioner`).
pub fn train_state_of(
    record: &v1::Record,
    tracker: &mut TrainTracker,
    positioner: &mut Positioner,
    now: Instant,
    now_unix: SystemTime,
) -> Option<TrainState> {
    let Some(v1::record::Body::Gps(fix)) = &record.body else { return None };
    let track = positioner.track_m(fix, record.time_unix_ms)?;
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
        let mut pos = Positioner::new(None);
        let s = train_state_of(&rec(unix_ms(now_unix) - 300, Some(500.0)), &mut tr, &mut pos, now, now_unix).unwrap();
        assert_eq!(now - s.at, Duration::from_millis(300));
        assert_eq!((s.position_m, s.speed_mps, s.direction), (500.0, 80.0, TrackDirection::Increasing));
        assert!(train_state_of(&rec(0, None), &mut tr, &mut pos, now, now_unix).is_none(), "no track position");
        let far_future = unix_ms(now_unix) + 60_000;
        let s = train_state_of(&rec(far_future, Some(600.0)), &mut tr, &mut pos, now, now_unix).unwrap();
        assert_eq!(s.at, now, "a train clock ahead does not date fixes in the future");
    }

    #[test]
    fn a_fix_without_track_m_is_placed_on_the_shared_routes_once_a_table_brings_them() {
        use polycorn_telemetry::failure_table::RouteLine;
        // A route eastwards along 39° N from 116° E, 10 km, vertex every km.
        let m_per_deg = 6_371_008.8_f64 * 39f64.to_radians().cos() * std::f64::consts::PI / 180.0;
        let line = RouteLine {
            id: "r".into(),
            coords: (0..=10).map(|k| [116.0 + k as f64 * 1000.0 / m_per_deg, 39.0]).collect(),
            measures: (0..=10).map(|k| k as f64 * 1000.0).collect(),
        };
        let shared = SharedRoutes::default();
        let mut pos = Positioner::new(Some(shared.clone()));
        let now = Instant::now();
        let now_unix = SystemTime::now();
        let t0 = unix_ms(now_unix);
        let fix = |t: i64, east_m: f64| v1::Record {
            train_id: "t".into(),
            time_unix_ms: t,
            body: Some(v1::record::Body::Gps(v1::GpsFix {
                lat_deg: 39.0001,
                lon_deg: 116.0 + east_m / m_per_deg,
                speed_mps: 80.0,
                ..Default::default()
            })),
        };
        let mut tr = TrainTracker::new();
        assert!(train_state_of(&fix(t0, 2500.0), &mut tr, &mut pos, now, now_unix).is_none(), "no routes yet");
        shared.set(Routes::new(&[line]));
        let s = train_state_of(&fix(t0, 2500.0), &mut tr, &mut pos, now, now_unix).unwrap();
        assert!((s.position_m - 2500.0).abs() < 1.0, "{}", s.position_m);
        let s = train_state_of(&fix(t0 + 1000, 2580.0), &mut tr, &mut pos, now, now_unix).unwrap();
        assert!((s.position_m - 2580.0).abs() < 1.0 && s.direction == TrackDirection::Increasing);
        let mut off = fix(t0 + 2000, 2660.0);
        if let Some(v1::record::Body::Gps(g)) = &mut off.body {
            g.lat_deg = 39.01; // 1.1 km north: off route
        }
        assert!(train_state_of(&off, &mut tr, &mut pos, now, now_unix).is_none());
    }
}
