//! The failure-location table as a file (JSON): what a proxy or relay-agent
//! loads with `--failure-table`, what the testbed's stand-in builder
//! (`polycorn-tracegen failure-table`) writes, and later what the trainer
//! publishes.
//!
//! ```json
//! {"format": "polycorn-failure-table/1", "version": 3,
//!  "source": "free text: where the table came from",
//!  "entries": [{"cell": 4294967301, "direction": "increasing", "position_m": 12345.6,
//!               "failures": 4, "handovers": 6}]}
//! ```
//!
//! `cell` is the data plane's cell ID (non-zero), `direction` the direction
//! of travel along the track (`increasing` or `decreasing`), `position_m`
//! the predicted failure location on the track's linear reference. Other
//! fields are informative. A file that does not parse, has another
//! `format`, or has an entry with cell 0, a non-finite position or an
//! unknown direction is refused as a whole: a shell then keeps the table it
//! had.
//!
//! Optional, for trains whose GPS gives only longitude and latitude (issue
//! 21): an entry's `route` names the route its `position_m` is on (and
//! `lat`/`lon` give the predicted failure point, informative), and
//! `routes` carries those routes' reference lines, so a shell can turn a
//! live fix into a position along the route (map matching):
//!
//! ```json
//!  "routes": [{"id": "bj-sh", "coords": [[116.38, 39.86], [116.39, 39.86]],
//!              "measures": [0.0, 853.2]}]
//! ```
//!
//! `coords` are `[lon, lat]` vertices in the direction of increasing
//! measure and `measures` each vertex's position along the route (metres,
//! geodesic, as LinkDB computed them; non-decreasing). Readers that do not
//! know these fields ignore them.
//!
//! `issued_unix_s` and `expires_unix_s` (Unix seconds) say when the trainer
//! signed the table and until when it may be used. They are part of the
//! signed bytes, so a signature vouches for them: a shell with
//! `--failure-table-verify-key` refuses a signed table without them or past
//! its expiry, and drops a table in use when it expires (crates/net's
//! `table` module). The trainer re-issues the table on every run, an
//! unchanged one under the same version with a later issue time.

use polycorn_core::sched::hrsch::{FailureTable, TrackDirection};
use serde::{Deserialize, Serialize};

/// The only format this version reads and writes.
pub const FORMAT: &str = "polycorn-failure-table/1";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FailureTableFile {
    pub format: String,
    pub version: u64,
    #[serde(default)]
    pub source: String,
    pub entries: Vec<Entry>,
    /// Reference lines of the routes the entries are on (may be empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<RouteLine>,
    /// When the table was issued (signed), Unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issued_unix_s: Option<u64>,
    /// The end of the table's validity, Unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_unix_s: Option<u64>,
}

/// A route's reference line: vertices and their measures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RouteLine {
    pub id: String,
    /// `[lon, lat]`, in the direction of increasing measure.
    pub coords: Vec<[f64; 2]>,
    /// Each vertex's position along the route, metres, non-decreasing.
    pub measures: Vec<f64>,
}

/// The most route vertices a table may carry (all routes together): a
/// 1,300 km line with a vertex every 10 m has 130,000.
pub const MAX_ROUTE_VERTICES: usize = 2_000_000;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub cell: u64,
    pub direction: Direction,
    pub position_m: f64,
    /// Failed handovers out of this cell in this direction behind the entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failures: Option<u64>,
    /// All handovers out of this cell in this direction behind the entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handovers: Option<u64>,
    /// The route `position_m` is on (one of the table's `routes`, or a
    /// route the shell knows otherwise); absent: the track of the trip
    /// replay or of fixes that carry their own track position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// The predicted failure point (informative).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lat: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lon: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Increasing,
    Decreasing,
}

impl From<Direction> for TrackDirection {
    fn from(d: Direction) -> Self {
        match d {
            Direction::Increasing => TrackDirection::Increasing,
            Direction::Decreasing => TrackDirection::Decreasing,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("not a failure-location table: {0}")]
    Parse(#[from] serde_json::Error),
    #[error("format {0:?} is not {FORMAT:?}")]
    Format(String),
    #[error("entry {0}: {1}")]
    Entry(usize, &'static str),
    #[error("route {0}: {1}")]
    Route(usize, &'static str),
    #[error("expires_unix_s {expires} is before issued_unix_s {issued}")]
    Validity { issued: u64, expires: u64 },
}

impl FailureTableFile {
    pub fn new(version: u64, source: impl Into<String>) -> Self {
        FailureTableFile {
            format: FORMAT.into(),
            version,
            source: source.into(),
            entries: Vec::new(),
            routes: Vec::new(),
            issued_unix_s: None,
            expires_unix_s: None,
        }
    }

    /// Parse and check a table file.
    pub fn parse(text: &str) -> Result<Self, TableError> {
        let f: FailureTableFile = serde_json::from_str(text)?;
        if f.format != FORMAT {
            return Err(TableError::Format(f.format));
        }
        for (i, e) in f.entries.iter().enumerate() {
            if e.cell == 0 {
                return Err(TableError::Entry(i, "cell 0 means unknown and cannot have a failure location"));
            }
            if !e.position_m.is_finite() {
                return Err(TableError::Entry(i, "position_m must be a finite number"));
            }
            if e.route.as_ref().is_some_and(|r| r.is_empty() || r.len() > 128) {
                return Err(TableError::Entry(i, "route must be 1 to 128 bytes"));
            }
        }
        if let (Some(issued), Some(expires)) = (f.issued_unix_s, f.expires_unix_s) {
            if expires < issued {
                return Err(TableError::Validity { issued, expires });
            }
        }
        let mut vertices = 0usize;
        let mut ids = std::collections::HashSet::new();
        for (i, r) in f.routes.iter().enumerate() {
            if r.id.is_empty() || r.id.len() > 128 || !ids.insert(r.id.as_str()) {
                return Err(TableError::Route(i, "id must be 1 to 128 bytes and unique"));
            }
            if r.coords.len() < 2 || r.coords.len() != r.measures.len() {
                return Err(TableError::Route(i, "needs at least 2 vertices, each with a measure"));
            }
            vertices = vertices.saturating_add(r.coords.len());
            if vertices > MAX_ROUTE_VERTICES {
                return Err(TableError::Route(i, "too many route vertices in one table"));
            }
            let in_range =
                |c: &[f64; 2]| c[0].is_finite() && c[1].is_finite() && c[0].abs() <= 180.0 && c[1].abs() <= 90.0;
            if !r.coords.iter().all(in_range) {
                return Err(TableError::Route(i, "a vertex is not a finite [lon, lat] in WGS 84"));
            }
            if !r.measures.iter().all(|m| m.is_finite()) || r.measures.windows(2).any(|w| w[1] < w[0]) {
                return Err(TableError::Route(i, "measures must be finite and non-decreasing"));
            }
        }
        Ok(f)
    }

    /// The table the endpoint uses.
    pub fn to_table(&self) -> FailureTable {
        let mut t = FailureTable::new(self.version);
        for e in &self.entries {
            t.insert(e.cell, e.direction.into(), e.position_m);
        }
        t
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a table serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by fuzz/ (failure_table): serde_json's default float parser put
    /// this vertex of a trainer's table 1 ULP off when reading it back.
    #[test]
    fn coordinates_read_back_exactly_as_written() {
        let text = r#"{"format":"polycorn-failure-table/1","version":1,"entries":[],
            "routes":[{"id":"r7","coords":[[116.39501136913448,39.83123454470766],[116.4,39.8]],"measures":[0,1]}]}"#;
        let f = FailureTableFile::parse(text).unwrap();
        assert_eq!(f.routes[0].coords[0][0], 116.39501136913448_f64);
        assert_eq!(FailureTableFile::parse(&f.to_json()).unwrap(), f);
    }

    #[test]
    fn a_table_round_trips_and_becomes_the_core_table() {
        let mut f = FailureTableFile::new(7, "test");
        f.entries.push(Entry {
            cell: 5,
            direction: Direction::Increasing,
            position_m: 1000.0,
            failures: Some(2),
            handovers: Some(3),
            route: Some("r1".into()),
            lat: Some(39.9),
            lon: Some(116.4),
        });
        f.routes.push(RouteLine {
            id: "r1".into(),
            coords: vec![[116.4, 39.9], [116.41, 39.9]],
            measures: vec![0.0, 853.0],
        });
        let g = FailureTableFile::parse(&f.to_json()).unwrap();
        assert_eq!(f, g);
        let t = g.to_table();
        assert_eq!(t.version(), 7);
        assert_eq!(t.distance_to_failure(5, TrackDirection::Increasing, 900.0), Some(100.0));
        assert_eq!(t.distance_to_failure(5, TrackDirection::Decreasing, 900.0), None);
    }

    #[test]
    fn bad_tables_are_refused_with_the_reason() {
        let ok = r#"{"format":"polycorn-failure-table/1","version":1,"entries":[]}"#;
        assert!(FailureTableFile::parse(ok).is_ok());
        let cases = [
            ("{", "not a failure-location table"),
            (r#"{"format":"x","version":1,"entries":[]}"#, "format"),
            (
                r#"{"format":"polycorn-failure-table/1","version":1,"entries":[{"cell":0,"direction":"increasing","position_m":1}]}"#,
                "cell 0",
            ),
            (
                r#"{"format":"polycorn-failure-table/1","version":1,"entries":[{"cell":1,"direction":"up","position_m":1}]}"#,
                "not a failure-location table",
            ),
            (r#"{"format":"polycorn-failure-table/1","version":-1,"entries":[]}"#, "not a failure-location table"),
            (
                r#"{"format":"polycorn-failure-table/1","version":1,"entries":[{"cell":1,"direction":"increasing","position_m":1,"route":""}]}"#,
                "route must be",
            ),
            (
                r#"{"format":"polycorn-failure-table/1","version":1,"entries":[],"routes":[{"id":"a","coords":[[1,2]],"measures":[0]}]}"#,
                "at least 2 vertices",
            ),
            (
                r#"{"format":"polycorn-failure-table/1","version":1,"entries":[],"routes":[{"id":"a","coords":[[1,2],[1,3]],"measures":[0]}]}"#,
                "each with a measure",
            ),
            (
                r#"{"format":"polycorn-failure-table/1","version":1,"entries":[],"routes":[{"id":"a","coords":[[1,2],[1,3]],"measures":[5,4]}]}"#,
                "non-decreasing",
            ),
            (
                r#"{"format":"polycorn-failure-table/1","version":1,"entries":[],"routes":[{"id":"a","coords":[[1,2],[181,3]],"measures":[0,1]}]}"#,
                "WGS 84",
            ),
            (
                r#"{"format":"polycorn-failure-table/1","version":1,"entries":[],"routes":[{"id":"a","coords":[[1,2],[1,3]],"measures":[0,1]},{"id":"a","coords":[[1,2],[1,3]],"measures":[0,1]}]}"#,
                "unique",
            ),
        ];
        for (text, want) in cases {
            let e = FailureTableFile::parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}
