//! The testbed's trip event log, `events.jsonl`: one JSON object per line,
//! tagged by `event`, times in ms since the trip's epoch. One type,
//! [`TripEvent`], for the writer (`polycorn-tracegen generate`) and every
//! reader: the relay-agent replays the log in step with the link emulator
//! as if a GPS receiver and the modems reported it, the trace generator
//! validates trips, builds failure tables and NMEA logs from it.

use serde::{Deserialize, Serialize};

/// How a handover ended (M19's types; hsr-model.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Type I, successful: queue held.
    Success,
    /// Type II, radio-link failure: queue held.
    Rlf,
    /// Type III, NAS recovery: queue flushed.
    Nas,
}

impl Outcome {
    /// M19's type number.
    pub fn ho_type(self) -> u8 {
        match self {
            Outcome::Success => 1,
            Outcome::Rlf => 2,
            Outcome::Nas => 3,
        }
    }

    /// Whether the handover failed (type II or III).
    pub fn failed(self) -> bool {
        self != Outcome::Success
    }
}

/// One line of `events.jsonl`. Unknown event kinds read as
/// [`TripEvent::Other`], so a newer log still replays; the writer never
/// writes one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum TripEvent {
    /// 1 Hz GPS fix with bounded error.
    Gps {
        /// Time, ms.
        t_ms: u64,
        /// Latitude, degrees.
        lat: f64,
        /// Longitude, degrees.
        lon: f64,
        /// Speed, m/s (exact).
        speed_mps: f64,
        /// Heading, degrees clockwise from north.
        heading_deg: f64,
        /// Error bound, metres.
        accuracy_m: f64,
        /// True position along the track, metres (ground truth, not a GPS output).
        track_m: f64,
    },
    /// A modem's signal report, logged at its report time (`t_ms - measured_ms` late).
    Rsrp {
        /// Report time, ms.
        t_ms: u64,
        /// Measurement time, ms.
        measured_ms: u64,
        /// Carrier index.
        carrier: u32,
        /// Serving cell.
        cell: u32,
        /// RSRP, dBm.
        rsrp_dbm: f64,
    },
    /// A handover starts: the carrier's link goes dark.
    HandoverStart {
        /// Time, ms.
        t_ms: u64,
        /// Carrier index.
        carrier: u32,
        /// Source cell.
        from_cell: u32,
        /// Target cell.
        to_cell: u32,
        /// Position along the track where the blackout starts (the UE leaves the source cell),
        /// metres.
        track_m: f64,
        /// Trigger jitter δ past the cell boundary, metres.
        delta_m: f64,
        /// True RSRP at the blackout start (v1: at the trigger, the same place), dBm.
        rsrp_dbm: f64,
        /// Failure model v2: where the handover was triggered, metres (a too-late failure's
        /// blackout starts later, at the coverage edge). Absent for v1.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        trigger_track_m: Option<f64>,
        /// Failure model v2, failures only: too late (true) or a random radio-link failure.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        too_late: Option<bool>,
    },
    /// A handover ends: the link is back on the target cell.
    HandoverEnd {
        /// Time, ms.
        t_ms: u64,
        /// Carrier index.
        carrier: u32,
        /// Source cell.
        from_cell: u32,
        /// Target cell.
        to_cell: u32,
        /// Outcome.
        outcome: Outcome,
        /// M19 type (1, 2, 3).
        ho_type: u8,
        /// Blackout length, ms.
        duration_ms: u64,
        /// `hold` or `flush`.
        blackout: String,
        /// Position along the track at the start, metres.
        track_m: f64,
    },
    /// The carrier's serving cell changed (at the end of each handover).
    CellChange {
        /// Time, ms.
        t_ms: u64,
        /// Carrier index.
        carrier: u32,
        /// New serving cell.
        cell: u32,
    },
    /// An event kind this build does not know.
    #[serde(other)]
    Other,
}

impl TripEvent {
    /// When the event happens, ms since the trip's epoch; `None` for [`TripEvent::Other`].
    pub fn t_ms(&self) -> Option<u64> {
        match self {
            TripEvent::Gps { t_ms, .. }
            | TripEvent::Rsrp { t_ms, .. }
            | TripEvent::CellChange { t_ms, .. }
            | TripEvent::HandoverStart { t_ms, .. }
            | TripEvent::HandoverEnd { t_ms, .. } => Some(*t_ms),
            TripEvent::Other => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("line {line}: {source}")]
pub struct ReplayError {
    pub line: usize,
    #[source]
    pub source: serde_json::Error,
}

/// Parse a whole event log; events come back in time order (stable for
/// equal times), unknown kinds left out. Blank lines are skipped; any
/// malformed line is an error naming it.
pub fn parse_events(text: &str) -> Result<Vec<TripEvent>, ReplayError> {
    let mut v = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let e: TripEvent = serde_json::from_str(line).map_err(|source| ReplayError { line: i + 1, source })?;
        if e.t_ms().is_some() {
            v.push(e);
        }
    }
    v.sort_by_key(|e| e.t_ms().unwrap_or(0));
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_log_parses_in_time_order_and_unknown_kinds_are_skipped() {
        let text = r#"{"event":"gps","t_ms":1000,"lat":39.8,"lon":116.3,"speed_mps":83.3,"heading_deg":160.0,"accuracy_m":20.0,"track_m":83.3}
{"event":"cell_change","t_ms":900,"carrier":1,"cell":2}

{"event":"something_new","t_ms":5}
{"event":"handover_end","t_ms":950,"carrier":1,"from_cell":1,"to_cell":2,"outcome":"success","ho_type":1,"duration_ms":49,"blackout":"hold","track_m":811.6}
"#;
        let v = parse_events(text).unwrap();
        assert_eq!(v.len(), 3);
        assert_eq!(v[0].t_ms(), Some(900));
        assert!(matches!(v[1], TripEvent::HandoverEnd { outcome: Outcome::Success, .. }));
        assert!(matches!(v[2], TripEvent::Gps { track_m, .. } if track_m > 83.0));
    }

    #[test]
    fn what_the_writer_writes_reads_back() {
        let events = [
            TripEvent::Gps {
                t_ms: 0,
                lat: 1.5,
                lon: 2.5,
                speed_mps: 80.0,
                heading_deg: 160.0,
                accuracy_m: 5.0,
                track_m: 0.0,
            },
            TripEvent::HandoverStart {
                t_ms: 10,
                carrier: 1,
                from_cell: 3,
                to_cell: 4,
                track_m: 800.0,
                delta_m: 12.5,
                rsrp_dbm: -101.5,
                trigger_track_m: Some(790.0),
                too_late: Some(true),
            },
            TripEvent::HandoverEnd {
                t_ms: 900,
                carrier: 1,
                from_cell: 3,
                to_cell: 4,
                outcome: Outcome::Nas,
                ho_type: 3,
                duration_ms: 890,
                blackout: "flush".into(),
                track_m: 800.0,
            },
        ];
        let text: String = events.iter().map(|e| serde_json::to_string(e).unwrap() + "\n").collect();
        assert!(text.contains("\"outcome\":\"nas\"") && text.contains("\"event\":\"handover_start\""));
        assert_eq!(parse_events(&text).unwrap(), events);
        assert!(Outcome::Rlf.failed() && !Outcome::Success.failed() && Outcome::Nas.ho_type() == 3);
    }

    #[test]
    fn a_malformed_line_is_named() {
        let e = parse_events("{\"event\":\"gps\",\"t_ms\":0}\n").unwrap_err();
        assert_eq!(e.line, 1);
        let e =
            parse_events("\n{\"event\":\"cell_change\",\"t_ms\":1,\"carrier\":0,\"cell\":1}\nnot json\n").unwrap_err();
        assert_eq!(e.line, 3);
    }
}
