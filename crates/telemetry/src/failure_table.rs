//! The failure-location table as a file (JSON): what a proxy or relay-agent
//! loads with `--failure-table`, what the testbed's stand-in builder
//! (`polycorn-tracegen failure-table`) writes, and later what the trainer
//! publishes (issue 6).
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
}

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
}

impl FailureTableFile {
    pub fn new(version: u64, source: impl Into<String>) -> Self {
        FailureTableFile { format: FORMAT.into(), version, source: source.into(), entries: Vec::new() }
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

    #[test]
    fn a_table_round_trips_and_becomes_the_core_table() {
        let mut f = FailureTableFile::new(7, "test");
        f.entries.push(Entry {
            cell: 5,
            direction: Direction::Increasing,
            position_m: 1000.0,
            failures: Some(2),
            handovers: Some(3),
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
        ];
        for (text, want) in cases {
            let e = FailureTableFile::parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}
