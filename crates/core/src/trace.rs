//! An opt-in trace of what an endpoint did and saw, segment by segment:
//! where each packet of passenger data was written and when it arrived,
//! which timers fired, what was reinjected and why.
//!
//! It answers the questions the counters cannot: during a stall of a
//! download, which path held the missing segment, how long until the sender
//! noticed (staleness, a retransmission timeout), and how long the copy
//! sent elsewhere took. The benchmark's stall analysis reads it
//! (`bench/polycorn_bench/stalls.py`).
//!
//! Off by default ([`crate::Endpoint::enable_trace`]). Bounded: at most
//! `capacity` records wait for the shell ([`crate::Endpoint::poll_trace`]);
//! beyond that new records are dropped and counted
//! ([`crate::Endpoint::trace_dropped`]), so a shell that stops draining costs
//! a fixed amount of memory, never more.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::time::Instant;

use crate::ids::{ConnId, PathId, PathMask};
use crate::sched::Reinject;

/// Which copy of a segment a [`TraceEvent::Sent`] was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyKind {
    /// The segment's first placement.
    First,
    /// An extra copy placed at the same time (redundant schedulers,
    /// `idle-inject`).
    Redundant,
    /// Sent again after it was given back to its connection (RTO, stale
    /// path, lost subflow, head-of-line recovery).
    Reinjection,
}

impl CopyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CopyKind::First => "first",
            CopyKind::Redundant => "redundant",
            CopyKind::Reinjection => "reinjection",
        }
    }
}

/// Why a segment went back to its connection's send buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequeueCause {
    /// The path's retransmission timer fired ([`crate::sched::ReinjectionHandler`]).
    Rto,
    /// The path became stale ([`crate::sched::Schedulerlet::on_stale`]).
    Stale,
    /// The subflow was lost ([`crate::Endpoint::path_down`]).
    PathDown,
}

impl RequeueCause {
    pub fn as_str(self) -> &'static str {
        match self {
            RequeueCause::Rto => "rto",
            RequeueCause::Stale => "stale",
            RequeueCause::PathDown => "down",
        }
    }
}

fn reinject_str(r: Reinject) -> &'static str {
    match r {
        Reinject::Nothing => "nothing",
        Reinject::Oldest => "oldest",
        Reinject::AllUnacked => "all",
    }
}

/// One thing the endpoint did or saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceEvent {
    /// A DATA frame was written to `path`'s subflow (handed to the shell).
    Sent {
        path: PathId,
        conn: ConnId,
        offset: u64,
        len: u32,
        copy: CopyKind,
    },
    /// A DATA frame arrived on `path`; `new` of its bytes were not there yet.
    Received {
        path: PathId,
        conn: ConnId,
        offset: u64,
        len: u32,
        new: u32,
    },
    /// The passenger data acknowledged in order on `conn` reached `cumulative`.
    Acked {
        conn: ConnId,
        cumulative: u64,
    },
    /// `path`'s retransmission timer fired for the `count`-th time in a row
    /// with `in_flight` bytes outstanding; the reinjection handler chose `action`.
    Rto {
        path: PathId,
        count: u32,
        in_flight: u64,
        action: Reinject,
    },
    /// `path` became stale (no acknowledgement progress, or the modem
    /// reported no service: `no_service`); the pipeline chose `action`.
    Stale {
        path: PathId,
        in_flight: u64,
        no_service: bool,
        action: Reinject,
    },
    /// An acknowledgement made a stale `path` active again.
    Fresh {
        path: PathId,
    },
    /// `conn` waits only for the peer's window and its head is in flight:
    /// head-of-line recovery reinjected it and/or penalised paths.
    HeadBlocked {
        conn: ConnId,
        offset: u64,
        reinject: bool,
        penalised: PathMask,
    },
    /// `conn`'s tail was in flight and `segments` of its segments, placed
    /// only on paths of `from`, were queued to be sent again elsewhere
    /// ([`crate::sched::Schedulerlet::on_tail_in_flight`]).
    TailReinjected {
        conn: ConnId,
        from: PathMask,
        segments: u32,
    },
    /// A segment placed on `path` went back to `conn`'s send buffer.
    Requeued {
        path: PathId,
        conn: ConnId,
        offset: u64,
        cause: RequeueCause,
    },
    PathUp {
        path: PathId,
    },
    PathDown {
        path: PathId,
    },
    /// `path` had data in flight and heard nothing for `dead_after`.
    PathDead {
        path: PathId,
    },
    /// A head-of-line stall of `conn`'s receive side ended after `stall_us`.
    HolStall {
        conn: ConnId,
        stall_us: u64,
    },
    /// A WINDOW frame raising `conn`'s flow-control limit to `max_data`
    /// went out on `path` (the receiver's side).
    WindowSent {
        path: PathId,
        conn: ConnId,
        max_data: u64,
    },
    /// A WINDOW frame arrived on `path` (the sender's side; copies and
    /// older limits included).
    WindowReceived {
        path: PathId,
        conn: ConnId,
        max_data: u64,
    },
    /// `conn`'s new data started (`limited`) or stopped waiting only for
    /// the peer's flow-control window (the sender's side).
    WindowLimited {
        conn: ConnId,
        limited: bool,
    },
}

/// A path set as a JSON array of path ids.
fn write_paths(out: &mut String, paths: PathMask) -> std::fmt::Result {
    out.push('[');
    for (i, p) in paths.iter().enumerate() {
        write!(out, "{}{}", if i > 0 { "," } else { "" }, p.0)?;
    }
    out.push(']');
    Ok(())
}

impl TraceEvent {
    /// The event's name in the JSON form.
    pub fn kind(&self) -> &'static str {
        match self {
            TraceEvent::Sent { .. } => "sent",
            TraceEvent::Received { .. } => "recv",
            TraceEvent::Acked { .. } => "acked",
            TraceEvent::Rto { .. } => "rto",
            TraceEvent::Stale { .. } => "stale",
            TraceEvent::Fresh { .. } => "fresh",
            TraceEvent::HeadBlocked { .. } => "head",
            TraceEvent::TailReinjected { .. } => "tail_reinject",
            TraceEvent::Requeued { .. } => "requeue",
            TraceEvent::PathUp { .. } => "up",
            TraceEvent::PathDown { .. } => "down",
            TraceEvent::PathDead { .. } => "dead",
            TraceEvent::HolStall { .. } => "hol",
            TraceEvent::WindowSent { .. } => "window_sent",
            TraceEvent::WindowReceived { .. } => "window_recv",
            TraceEvent::WindowLimited { .. } => "window_limited",
        }
    }

    /// Append the event as one JSON object (no newline): `{"t_ms": …,
    /// "ev": "<kind>", …}` with `t_ms` the caller's timestamp in
    /// milliseconds. Every value is a number, a boolean or one of the fixed
    /// names above, so nothing needs escaping.
    pub fn write_json(&self, t_ms: f64, out: &mut String) {
        let _ = write!(out, "{{\"t_ms\":{t_ms:.3},\"ev\":\"{}\"", self.kind());
        let _ = match *self {
            TraceEvent::Sent { path, conn, offset, len, copy } => write!(
                out,
                ",\"path\":{},\"conn\":{},\"off\":{offset},\"len\":{len},\"copy\":\"{}\"",
                path.0,
                conn.0,
                copy.as_str()
            ),
            TraceEvent::Received { path, conn, offset, len, new } => {
                write!(out, ",\"path\":{},\"conn\":{},\"off\":{offset},\"len\":{len},\"new\":{new}", path.0, conn.0)
            }
            TraceEvent::Acked { conn, cumulative } => write!(out, ",\"conn\":{},\"cum\":{cumulative}", conn.0),
            TraceEvent::Rto { path, count, in_flight, action } => write!(
                out,
                ",\"path\":{},\"count\":{count},\"in_flight\":{in_flight},\"action\":\"{}\"",
                path.0,
                reinject_str(action)
            ),
            TraceEvent::Stale { path, in_flight, no_service, action } => write!(
                out,
                ",\"path\":{},\"in_flight\":{in_flight},\"no_service\":{no_service},\"action\":\"{}\"",
                path.0,
                reinject_str(action)
            ),
            TraceEvent::Fresh { path } | TraceEvent::PathUp { path } | TraceEvent::PathDown { path } => {
                write!(out, ",\"path\":{}", path.0)
            }
            TraceEvent::PathDead { path } => write!(out, ",\"path\":{}", path.0),
            TraceEvent::HeadBlocked { conn, offset, reinject, penalised } => {
                let _ = write!(out, ",\"conn\":{},\"off\":{offset},\"reinject\":{reinject},\"penalised\":", conn.0);
                write_paths(out, penalised)
            }
            TraceEvent::TailReinjected { conn, from, segments } => {
                let _ = write!(out, ",\"conn\":{},\"segments\":{segments},\"from\":", conn.0);
                write_paths(out, from)
            }
            TraceEvent::Requeued { path, conn, offset, cause } => write!(
                out,
                ",\"path\":{},\"conn\":{},\"off\":{offset},\"cause\":\"{}\"",
                path.0,
                conn.0,
                cause.as_str()
            ),
            TraceEvent::HolStall { conn, stall_us } => write!(out, ",\"conn\":{},\"stall_us\":{stall_us}", conn.0),
            TraceEvent::WindowSent { path, conn, max_data } | TraceEvent::WindowReceived { path, conn, max_data } => {
                write!(out, ",\"path\":{},\"conn\":{},\"max_data\":{max_data}", path.0, conn.0)
            }
            TraceEvent::WindowLimited { conn, limited } => {
                write!(out, ",\"conn\":{},\"limited\":{limited}", conn.0)
            }
        };
        out.push('}');
    }
}

/// An event and when it happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceRecord {
    pub at: Instant,
    pub event: TraceEvent,
}

/// The bounded queue of records waiting for the shell.
#[derive(Debug)]
pub(crate) struct Tracer {
    records: VecDeque<TraceRecord>,
    capacity: usize,
    dropped: u64,
}

impl Tracer {
    pub(crate) fn new(capacity: usize) -> Self {
        Tracer { records: VecDeque::new(), capacity: capacity.max(1), dropped: 0 }
    }

    pub(crate) fn push(&mut self, at: Instant, event: TraceEvent) {
        if self.records.len() >= self.capacity {
            self.dropped += 1;
        } else {
            self.records.push_back(TraceRecord { at, event });
        }
    }

    pub(crate) fn pop(&mut self) -> Option<TraceRecord> {
        self.records.pop_front()
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }
}

/// Record `event` if tracing is on (a free function, so callers can hold
/// borrows of other endpoint fields).
pub(crate) fn record(tracer: &mut Option<Tracer>, at: Instant, event: TraceEvent) {
    if let Some(t) = tracer.as_mut() {
        t.push(at, event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_json_objects_with_fixed_names() {
        let mut s = String::new();
        TraceEvent::Sent { path: PathId(1), conn: ConnId(7), offset: 16, len: 100, copy: CopyKind::Reinjection }
            .write_json(12.5, &mut s);
        assert_eq!(s, r#"{"t_ms":12.500,"ev":"sent","path":1,"conn":7,"off":16,"len":100,"copy":"reinjection"}"#);
        s.clear();
        let mut pen = PathMask::EMPTY;
        pen.insert(PathId(0));
        pen.insert(PathId(2));
        TraceEvent::HeadBlocked { conn: ConnId(3), offset: 0, reinject: true, penalised: pen }.write_json(0.0, &mut s);
        assert_eq!(s, r#"{"t_ms":0.000,"ev":"head","conn":3,"off":0,"reinject":true,"penalised":[0,2]}"#);
    }

    #[test]
    fn a_full_tracer_drops_and_counts_instead_of_growing() {
        let now = Instant::now();
        let mut t = Tracer::new(2);
        for c in 0..5 {
            t.push(now, TraceEvent::Acked { conn: ConnId(c), cumulative: 0 });
        }
        assert_eq!(t.dropped(), 3);
        assert_eq!(t.pop().map(|r| r.event), Some(TraceEvent::Acked { conn: ConnId(0), cumulative: 0 }));
        assert_eq!(t.pop().map(|r| r.event), Some(TraceEvent::Acked { conn: ConnId(1), cumulative: 0 }));
        assert_eq!(t.pop(), None);
    }
}
