//! Live map matching: a GPS fix (longitude, latitude) to a
//! position along a route, for handover-failure prediction on a train
//! whose GPS knows nothing of the track.
//!
//! The routes are the reference lines a failure-location table carries
//! ([`crate::failure_table::RouteLine`]: vertices with LinkDB's geodesic
//! measures), so a position found here is on the same scale as the
//! table's `position_m`. Sans-IO and deterministic: the caller passes each
//! fix's time.
//!
//! The rule, simpler than ingest's hidden Markov model because it runs on
//! one fix at a time and only needs the measure:
//!
//! - the nearest point of each route piece within [`MAX_DIST_M`] of the fix
//!   (great-circle distance to the piece, `geo`'s Haversine closest point);
//!   the measure is interpolated along the piece;
//! - while the train is on a route (a fix matched within
//!   [`CONTINUITY_MS`]), only the pieces of that route within reach of the
//!   last position (at most [`MAX_SPEED_MPS`] since then, plus
//!   [`MAX_DIST_M`]) count, so a parallel line or another pass of a
//!   looping route does not capture the train; when none is near, any
//!   route may match again;
//! - farther than [`MAX_DIST_M`] from every route: off route, no position
//!   (a depot, a GPS jump), never forced onto the line.

use geo::{Closest, Distance, Haversine, HaversineClosestPoint, Line, Point};

use crate::failure_table::RouteLine;

/// A fix farther than this from every route is off route.
pub const MAX_DIST_M: f64 = 150.0;
/// A train is assumed on the route of its last matched fix this long.
pub const CONTINUITY_MS: i64 = 120_000;
/// Faster than any train: bounds how far along the route it can have moved.
pub const MAX_SPEED_MPS: f64 = 150.0;

/// The routes a matcher knows.
#[derive(Debug, Default, Clone)]
pub struct Routes {
    routes: Vec<Route>,
}

#[derive(Debug, Clone)]
struct Route {
    id: String,
    pts: Vec<Point<f64>>,
    measures: Vec<f64>,
}

impl Routes {
    /// From a table's route lines (already checked by the table parser:
    /// at least two vertices, each with a finite, non-decreasing measure).
    pub fn new(lines: &[RouteLine]) -> Self {
        let routes = lines
            .iter()
            .filter(|l| l.coords.len() >= 2 && l.coords.len() == l.measures.len())
            .map(|l| Route {
                id: l.id.clone(),
                pts: l.coords.iter().map(|c| Point::new(c[0], c[1])).collect(),
                measures: l.measures.clone(),
            })
            .collect();
        Routes { routes }
    }

    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    pub fn len(&self) -> usize {
        self.routes.len()
    }
}

/// A matched fix.
#[derive(Debug, Clone, PartialEq)]
pub struct Located {
    /// The route's id.
    pub route: String,
    /// Position along the route, metres (the table's scale).
    pub measure_m: f64,
    /// Distance of the fix from the route, metres.
    pub dist_m: f64,
}

#[derive(Debug, Clone, Copy)]
struct Last {
    route: usize,
    measure_m: f64,
    t_ms: i64,
}

/// One train's matcher: the routes and where the train was last matched.
#[derive(Debug, Default, Clone)]
pub struct Matcher {
    routes: Routes,
    last: Option<Last>,
}

impl Matcher {
    pub fn new(routes: Routes) -> Self {
        Matcher { routes, last: None }
    }

    /// New routes (a new table): the train's last position is forgotten
    /// unless the same route is still there.
    pub fn set_routes(&mut self, routes: Routes) {
        let keep = self.last.and_then(|l| {
            let id = &self.routes.routes.get(l.route)?.id;
            let i = routes.routes.iter().position(|r| &r.id == id)?;
            Some(Last { route: i, ..l })
        });
        self.routes = routes;
        self.last = keep;
    }

    pub fn routes(&self) -> &Routes {
        &self.routes
    }

    /// The position of a fix at `t_ms` (Unix ms), or `None` off route or
    /// without routes. Non-finite or out-of-range coordinates are off route.
    pub fn locate(&mut self, lat: f64, lon: f64, t_ms: i64) -> Option<Located> {
        if !(lat.is_finite() && lon.is_finite() && lat.abs() <= 90.0 && lon.abs() <= 180.0) {
            return None;
        }
        let p = Point::new(lon, lat);
        let recent = self.last.filter(|l| (t_ms - l.t_ms).abs() <= CONTINUITY_MS);
        let mut best = recent.and_then(|l| {
            let reach = MAX_SPEED_MPS * (t_ms - l.t_ms).abs() as f64 / 1000.0 + MAX_DIST_M;
            self.nearest(p, Some((l.route, l.measure_m - reach, l.measure_m + reach)))
        });
        if best.is_none() {
            best = self.nearest(p, None);
        }
        let (route, measure_m, dist_m) = best?;
        self.last = Some(Last { route, measure_m, t_ms });
        Some(Located { route: self.routes.routes[route].id.clone(), measure_m, dist_m })
    }

    /// The nearest point within MAX_DIST_M: (route index, measure, distance);
    /// `within`: only route r's pieces overlapping measures [lo, hi].
    fn nearest(&self, p: Point<f64>, within: Option<(usize, f64, f64)>) -> Option<(usize, f64, f64)> {
        let mut best: Option<(usize, f64, f64)> = None;
        for (ri, r) in self.routes.routes.iter().enumerate() {
            if within.is_some_and(|(w, _, _)| w != ri) {
                continue;
            }
            for k in 0..r.pts.len() - 1 {
                let (m0, m1) = (r.measures[k], r.measures[k + 1]);
                if let Some((_, lo, hi)) = within {
                    if m1 < lo || m0 > hi {
                        continue;
                    }
                }
                let (a, b) = (r.pts[k], r.pts[k + 1]);
                let c = match Line::new(a, b).haversine_closest_point(&p) {
                    Closest::SinglePoint(c) | Closest::Intersection(c) => c,
                    Closest::Indeterminate => a,
                };
                let d = Haversine.distance(p, c);
                if d > MAX_DIST_M || best.is_some_and(|(_, _, bd)| bd <= d) {
                    continue;
                }
                let len = Haversine.distance(a, b);
                let f = if len > 0.0 { (Haversine.distance(a, c) / len).clamp(0.0, 1.0) } else { 0.0 };
                best = Some((ri, m0 + f * (m1 - m0), d));
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: f64 = 6_371_008.8;

    /// A point `east` and `north` metres from (lon0, lat0).
    fn at(lon0: f64, lat0: f64, east: f64, north: f64) -> [f64; 2] {
        [lon0 + (east / (R * lat0.to_radians().cos())).to_degrees(), lat0 + (north / R).to_degrees()]
    }

    /// A route eastwards from (116, 39): 20 km, a vertex every 100 m, its
    /// measure the distance along it; and "b", 60 m north of it.
    fn lines() -> Vec<RouteLine> {
        let mk = |id: &str, north: f64| RouteLine {
            id: id.into(),
            coords: (0..=200).map(|k| at(116.0, 39.0, k as f64 * 100.0, north)).collect(),
            measures: (0..=200).map(|k| k as f64 * 100.0).collect(),
        };
        vec![mk("a", 0.0), mk("b", 60.0)]
    }

    #[test]
    fn a_fix_near_the_line_gets_its_measure_and_a_far_one_none() {
        let mut m = Matcher::new(Routes::new(&lines()));
        let [lon, lat] = at(116.0, 39.0, 1234.0, -20.0);
        let got = m.locate(lat, lon, 0).unwrap();
        assert_eq!(got.route, "a");
        assert!((got.measure_m - 1234.0).abs() < 1.0, "{got:?}");
        assert!((got.dist_m - 20.0).abs() < 0.5, "{got:?}");
        let [lon, lat] = at(116.0, 39.0, 5000.0, -400.0);
        assert_eq!(m.locate(lat, lon, 1000), None, "a depot 400 m away is off route");
        assert_eq!(m.locate(f64::NAN, lon, 2000), None);
        assert_eq!(m.locate(91.0, lon, 3000), None);
        assert_eq!(Matcher::default().locate(lat, lon, 0), None, "no routes");
    }

    #[test]
    fn continuity_keeps_the_train_on_its_line_beside_another() {
        // A train on "a" whose fixes lean 40 m north (20 m from "b"): it
        // stays on "a" while it was matched there recently.
        let mut m = Matcher::new(Routes::new(&lines()));
        let [lon, lat] = at(116.0, 39.0, 1000.0, 0.0);
        assert_eq!(m.locate(lat, lon, 0).unwrap().route, "a");
        for s in 1..10 {
            let [lon, lat] = at(116.0, 39.0, 1000.0 + 80.0 * s as f64, 40.0);
            let got = m.locate(lat, lon, s * 1000).unwrap();
            assert_eq!(got.route, "a", "second {s}");
            assert!((got.measure_m - (1000.0 + 80.0 * s as f64)).abs() < 1.0);
        }
        // Without that history the same fix is "b"'s.
        let mut fresh = Matcher::new(Routes::new(&lines()));
        let [lon, lat] = at(116.0, 39.0, 1800.0, 40.0);
        assert_eq!(fresh.locate(lat, lon, 0).unwrap().route, "b");
        // After the continuity window the train may be anywhere again.
        let got = m.locate(lat, lon, 10_000 + CONTINUITY_MS + 1).unwrap();
        assert_eq!(got.route, "b");
    }

    #[test]
    fn new_routes_keep_the_train_on_a_route_they_still_have() {
        let mut m = Matcher::new(Routes::new(&lines()));
        let [lon, lat] = at(116.0, 39.0, 1000.0, 0.0);
        m.locate(lat, lon, 0).unwrap();
        let mut swapped = lines();
        swapped.reverse(); // "b" first now
        m.set_routes(Routes::new(&swapped));
        let [lon, lat] = at(116.0, 39.0, 1080.0, 40.0);
        assert_eq!(m.locate(lat, lon, 1000).unwrap().route, "a");
        m.set_routes(Routes::new(&swapped[..1])); // only "b"
        assert_eq!(m.locate(lat, lon, 2000).unwrap().route, "b");
    }
}
