//! The testbed's event log (`polycorn-tracegen generate` writes
//! `events.jsonl`, one JSON object per line, tagged by `event`, times in ms
//! since the trip's epoch) read back as a radio and position source: the
//! relay-agent replays it in step with the link emulator, as if a GPS
//! receiver and the modems reported it.

use serde::Deserialize;

/// One line of `events.jsonl`. Unknown event kinds are kept as
/// [`TestbedEvent::Other`] so newer logs still replay.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum TestbedEvent {
    Gps {
        t_ms: u64,
        lat: f64,
        lon: f64,
        speed_mps: f64,
        heading_deg: f64,
        accuracy_m: f64,
        track_m: f64,
    },
    /// A modem's signal report, arriving `t_ms - measured_ms` late.
    Rsrp {
        t_ms: u64,
        measured_ms: u64,
        carrier: u32,
        cell: u32,
        rsrp_dbm: f64,
    },
    /// The serving cell of `carrier` is now `cell` (after a handover).
    CellChange {
        t_ms: u64,
        carrier: u32,
        cell: u32,
    },
    HandoverStart {
        t_ms: u64,
        carrier: u32,
        from_cell: u32,
        to_cell: u32,
        track_m: f64,
        rsrp_dbm: f64,
    },
    HandoverEnd {
        t_ms: u64,
        carrier: u32,
        from_cell: u32,
        to_cell: u32,
        outcome: String,
        duration_ms: u64,
    },
    #[serde(other)]
    Other,
}

impl TestbedEvent {
    /// When the event happens, ms since the trip's epoch.
    pub fn t_ms(&self) -> Option<u64> {
        match self {
            TestbedEvent::Gps { t_ms, .. }
            | TestbedEvent::Rsrp { t_ms, .. }
            | TestbedEvent::CellChange { t_ms, .. }
            | TestbedEvent::HandoverStart { t_ms, .. }
            | TestbedEvent::HandoverEnd { t_ms, .. } => Some(*t_ms),
            TestbedEvent::Other => None,
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
/// equal times). Blank lines are skipped; any malformed line is an error
/// naming it.
pub fn parse_events(text: &str) -> Result<Vec<TestbedEvent>, ReplayError> {
    let mut v = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let e: TestbedEvent = serde_json::from_str(line).map_err(|source| ReplayError { line: i + 1, source })?;
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
        assert!(matches!(v[1], TestbedEvent::HandoverEnd { ref outcome, .. } if outcome == "success"));
        assert!(matches!(v[2], TestbedEvent::Gps { track_m, .. } if track_m > 83.0));
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
