//! Radio and position sources and what the relay-agent does with them.
//!
//! Sources produce [`RadioEvent`]s into one channel; [`apply`] feeds them
//! to the endpoint (the train's state for handover-failure prediction on
//! the uplink, each path's cell via `PATH_STATUS`) and stores each as a
//! telemetry record in the durable spool, from which
//! [`crate::spool::sender`] sends it to the proxy with top priority on
//! every live path (POLYCORN §4.3). Sources: the testbed's event log ([`replay`]), gpsd
//! ([`gpsd`]) and ModemManager ([`mmcli`]); the live ones go through the
//! handover detector ([`detect`]) on their way to `apply`. See
//! docs/radio-sources.md.

pub mod detect;
pub mod gpsd;
pub mod mmcli;

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use polycorn_core::sched::TrainTracker;
use polycorn_core::wire::LinkState;
use polycorn_core::PathId;
use polycorn_net::Session;
use polycorn_telemetry::events::{parse_events, TripEvent};
use polycorn_telemetry::spool::Class;
use polycorn_telemetry::{testbed_cell_id, v1};
use prost::Message as _;
use tokio::sync::{mpsc, watch};
use tracing::info;

/// Something the train's receivers observed.
#[derive(Clone, Debug, PartialEq)]
pub enum RadioEvent {
    /// A position fix, measured at `time_unix_ms`.
    Gps { time_unix_ms: i64, fix: v1::GpsFix },
    /// Path `path` is now served by `cell_id` (0: no service).
    Cell { time_unix_ms: i64, path: PathId, cell_id: u64 },
    /// A signal sample of path `path`'s interface.
    Signal { time_unix_ms: i64, sample: v1::CellSample },
    /// A finished handover.
    Handover { time_unix_ms: i64, event: v1::HandoverEvent },
}

impl RadioEvent {
    /// The same event `ms` later: every time in it moved (a trip's events
    /// are those of its log from its epoch on, so one list serves trains
    /// that run the trip from different epochs).
    pub fn shifted(&self, ms: i64) -> RadioEvent {
        let mut e = self.clone();
        match &mut e {
            RadioEvent::Gps { time_unix_ms, .. } | RadioEvent::Cell { time_unix_ms, .. } => *time_unix_ms += ms,
            RadioEvent::Signal { time_unix_ms, sample } => {
                *time_unix_ms += ms;
                sample.measured_unix_ms += ms;
            }
            RadioEvent::Handover { time_unix_ms, event } => {
                *time_unix_ms += ms;
                event.start_unix_ms += ms;
            }
        }
        e
    }
}

/// Options of the replay source.
#[derive(Clone, Debug)]
pub struct ReplayOpts {
    pub file: PathBuf,
    /// Unix ms of the trip's time zero (the link emulator's epoch).
    pub epoch_unix_ms: i64,
    /// Path names in `--path` order; carrier k of the log is path k, and
    /// carriers beyond the configured paths are ignored.
    pub path_names: Vec<String>,
    /// Detect handovers from the log's raw cell and link stream with this
    /// configuration instead of replaying its labels
    /// ([`detect::detected_events_of`]).
    pub detect: Option<polycorn_telemetry::handover::DetectorConfig>,
    /// `--replay-gps-only`: fixes and handovers without the log's track
    /// position, as a GPS receiver gives them (the position along the
    /// track then comes from map matching onto the table's routes).
    pub gps_only: bool,
    /// Leave the log's GPS fixes out (the relay reads gpsd: the testbed's
    /// gpsfake plays the same fixes as NMEA); implies `gps_only` for the
    /// handovers, whose position then comes from the receiver's fixes too.
    pub no_gps: bool,
    /// Resume (`--replay-resume`): replay from this Unix ms instead of from
    /// now, sending the events between it and now at once. `Some` of the
    /// epoch on a first start: the whole log is reported, as a modem that
    /// keeps its own history would.
    pub resume_from_unix_ms: Option<i64>,
}

/// The file in the spool directory where `apply` keeps the newest spooled
/// record's time for `--replay-resume`.
pub const REPLAY_POSITION_FILE: &str = "replay-position";

/// Where a resumed replay starts: the position `apply` left in `dir`, or
/// the trip's epoch when there is none (or it does not parse; a replay
/// from too early only repeats records, which LinkDB ignores).
pub fn resume_point(dir: &std::path::Path, epoch_unix_ms: i64) -> i64 {
    std::fs::read_to_string(dir.join(REPLAY_POSITION_FILE))
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .map_or(epoch_unix_ms, |p| p.max(epoch_unix_ms))
}

/// Keeps the newest spooled record's time in a file, at most once a second
/// (after a crash the replay resumes a little early: records repeat, none
/// is missed). Written by rename, so a reader never sees half a number.
struct PositionKeeper {
    file: PathBuf,
    newest: i64,
    written: i64,
    last_write: Option<std::time::Instant>,
}

impl PositionKeeper {
    fn saw(&mut self, t: i64) {
        self.newest = self.newest.max(t);
        let due = self.last_write.is_none_or(|w| w.elapsed() >= Duration::from_secs(1));
        if self.newest > self.written && due {
            let tmp = self.file.with_extension("tmp");
            let r = std::fs::write(&tmp, self.newest.to_string()).and_then(|()| std::fs::rename(&tmp, &self.file));
            if let Err(e) = r {
                tracing::warn!(error = %e, file = %self.file.display(), "replay position not saved");
            }
            self.written = self.newest;
            self.last_write = Some(std::time::Instant::now());
        }
    }
}

fn now_unix_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// The events of a testbed trip as radio events at their trip times.
/// Events before the replay starts are not reported, except the state they
/// leave (each carrier's serving cell, the last fix), reported at once: a
/// relay started or restarted mid-trip knows where it is.
pub fn events_of(log: &[TripEvent], opts: &ReplayOpts) -> Vec<(i64, RadioEvent)> {
    let n = opts.path_names.len();
    let name = |c: u32| opts.path_names.get(c as usize).cloned().unwrap_or_default();
    let mut out = Vec::new();
    let mut cells: Vec<Option<u64>> = vec![None; n];
    // Per carrier: the handover in progress (its track position, RSRP, and
    // the last fix at its start: a failed handover ends seconds later).
    let mut last_start: Vec<Option<(f64, f64, Option<v1::GpsFix>)>> = vec![None; n];
    let mut last_fix: Option<v1::GpsFix> = None;
    for e in log {
        let t = opts.epoch_unix_ms + e.t_ms().unwrap_or(0) as i64;
        match *e {
            TripEvent::Gps { lat, lon, speed_mps, heading_deg, accuracy_m, track_m, .. } => {
                let fix = v1::GpsFix {
                    lat_deg: lat,
                    lon_deg: lon,
                    speed_mps,
                    heading_deg,
                    accuracy_m,
                    track_m: (!opts.gps_only && !opts.no_gps).then_some(track_m),
                };
                last_fix = Some(fix);
                if !opts.no_gps {
                    out.push((t, RadioEvent::Gps { time_unix_ms: t, fix }));
                }
            }
            TripEvent::Rsrp { measured_ms, carrier, cell, rsrp_dbm, .. } if (carrier as usize) < n => {
                let cell_id = testbed_cell_id(carrier, cell);
                // The first report names the cell the trip starts in.
                if cells[carrier as usize].is_none() {
                    cells[carrier as usize] = Some(cell_id);
                    out.push((t, RadioEvent::Cell { time_unix_ms: t, path: PathId(carrier as u8), cell_id }));
                }
                let sample = v1::CellSample {
                    path: carrier,
                    carrier: name(carrier),
                    cell_id,
                    rsrp_dbm: Some(rsrp_dbm),
                    registration: v1::RegistrationState::Registered as i32,
                    measured_unix_ms: opts.epoch_unix_ms + measured_ms as i64,
                };
                out.push((t, RadioEvent::Signal { time_unix_ms: t, sample }));
            }
            TripEvent::CellChange { carrier, cell, .. } if (carrier as usize) < n => {
                let cell_id = testbed_cell_id(carrier, cell);
                cells[carrier as usize] = Some(cell_id);
                out.push((t, RadioEvent::Cell { time_unix_ms: t, path: PathId(carrier as u8), cell_id }));
            }
            TripEvent::HandoverStart { carrier, track_m, rsrp_dbm, .. } if (carrier as usize) < n => {
                last_start[carrier as usize] = Some((track_m, rsrp_dbm, last_fix));
            }
            TripEvent::HandoverEnd { carrier, from_cell, to_cell, outcome, duration_ms, .. }
                if (carrier as usize) < n =>
            {
                let start = last_start[carrier as usize].take();
                let (track, rsrp) = start.map(|(m, r, _)| (m, r)).unzip();
                // Where the handover began (the last fix before its start),
                // not where it ended.
                let fix = start.map_or(last_fix, |(_, _, f)| f).unwrap_or_default();
                let event = v1::HandoverEvent {
                    path: carrier,
                    carrier: name(carrier),
                    source_cell_id: testbed_cell_id(carrier, from_cell),
                    target_cell_id: testbed_cell_id(carrier, to_cell),
                    start_unix_ms: t - duration_ms as i64,
                    start_lat_deg: fix.lat_deg,
                    start_lon_deg: fix.lon_deg,
                    start_track_m: track.filter(|_| !opts.gps_only && !opts.no_gps),
                    rsrp_dbm: rsrp,
                    outcome: if outcome.failed() { v1::HandoverOutcome::Failure } else { v1::HandoverOutcome::Success }
                        as i32,
                    duration_ms: u32::try_from(duration_ms).unwrap_or(u32::MAX),
                };
                out.push((t, RadioEvent::Handover { time_unix_ms: t, event }));
            }
            _ => {}
        }
    }
    out
}

/// Read and parse a testbed event log; errors name the file and line.
pub fn load_log(file: &std::path::Path) -> anyhow::Result<Vec<TripEvent>> {
    use anyhow::Context as _;
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    parse_events(&text).with_context(|| format!("{}: not a testbed event log", file.display()))
}

/// Replay a testbed event log in real time into `tx`.
pub async fn replay(
    opts: ReplayOpts,
    log: Vec<TripEvent>,
    tx: mpsc::Sender<RadioEvent>,
    mut stop: watch::Receiver<bool>,
) {
    let events = match opts.detect {
        Some(cfg) => detect::detected_events_of(&log, &opts, cfg),
        None => events_of(&log, &opts),
    };
    let start = opts.resume_from_unix_ms.unwrap_or_else(now_unix_ms);
    let past = events.partition_point(|(t, _)| *t < start);
    info!(file = %opts.file.display(), events = events.len(), skipped = past, detect = opts.detect.is_some(),
        resume_from_unix_ms = opts.resume_from_unix_ms, "replay source started");
    if play(&events, 0, start, opts.path_names.len(), &tx, &mut stop).await {
        info!("replay source: end of the event log");
    }
}

/// Play `events` (times in Unix ms), each `shift_ms` later than its time,
/// into `tx` in real time from `start` (Unix ms) on. Events before `start`
/// are not sent, except the state they leave (each of `paths` paths' serving
/// cell, the last fix), sent at once: a relay started or restarted mid-trip
/// knows where it is. False when `stop` or a closed `tx` ended it early.
pub async fn play(
    events: &[(i64, RadioEvent)],
    shift_ms: i64,
    start: i64,
    paths: usize,
    tx: &mpsc::Sender<RadioEvent>,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    // Catch up: the state past events leave.
    let past = events.partition_point(|(t, _)| *t + shift_ms < start);
    let mut latest_cell: Vec<Option<&RadioEvent>> = vec![None; paths];
    let mut latest_fix = None;
    for (_, e) in &events[..past] {
        match e {
            RadioEvent::Cell { path, .. } => {
                if let Some(slot) = latest_cell.get_mut(path.index()) {
                    *slot = Some(e);
                }
            }
            RadioEvent::Gps { .. } => latest_fix = Some(e),
            _ => {}
        }
    }
    for e in latest_cell.into_iter().flatten().chain(latest_fix) {
        if tx.send(e.shifted(shift_ms)).await.is_err() {
            return false;
        }
    }
    for (t, e) in &events[past..] {
        let wait = Duration::from_millis((t + shift_ms - now_unix_ms()).max(0) as u64);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return false,
        }
        if tx.send(e.shifted(shift_ms)).await.is_err() {
            return false;
        }
    }
    true
}

/// The telemetry record a radio event becomes (a serving-cell change is a
/// cell sample without a signal measure), and its spool class. `path_names`
/// name the carriers by path, as `--path` gives them.
pub fn record_of(train_id: &str, ev: &RadioEvent, path_names: &[String]) -> (v1::Record, Class) {
    let (time_unix_ms, body) = match ev {
        RadioEvent::Gps { time_unix_ms, fix } => (*time_unix_ms, v1::record::Body::Gps(*fix)),
        RadioEvent::Signal { time_unix_ms, sample } => (*time_unix_ms, v1::record::Body::Cell(sample.clone())),
        RadioEvent::Handover { time_unix_ms, event } => (*time_unix_ms, v1::record::Body::Handover(event.clone())),
        RadioEvent::Cell { time_unix_ms, path, cell_id } => {
            let sample = v1::CellSample {
                path: u32::from(path.0),
                carrier: path_names.get(path.index()).cloned().unwrap_or_default(),
                cell_id: *cell_id,
                registration: v1::RegistrationState::Registered as i32,
                measured_unix_ms: *time_unix_ms,
                ..Default::default()
            };
            (*time_unix_ms, v1::record::Body::Cell(sample))
        }
    };
    let class = match body {
        v1::record::Body::Handover(_) => Class::Handover,
        _ => Class::Sample,
    };
    (v1::Record { train_id: train_id.to_string(), time_unix_ms, body: Some(body) }, class)
}

/// Apply radio events to the session and spool each as telemetry
/// ([`record_of`]).
pub async fn apply(
    session: Session,
    train_id: String,
    spool: std::sync::Arc<crate::spool::Shared>,
    mut rx: mpsc::Receiver<RadioEvent>,
    path_names: Vec<String>,
    position_file: Option<PathBuf>,
    routes: Option<polycorn_net::hof::SharedRoutes>,
) {
    let mut positioner = polycorn_net::hof::Positioner::new(routes);
    let mut position =
        position_file.map(|file| PositionKeeper { file, newest: i64::MIN, written: i64::MIN, last_write: None });
    let mut tracker = TrainTracker::new();
    let mut cells: Vec<u64> = Vec::new();
    let mut reported_up: Vec<PathId> = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let ev = tokio::select! {
            ev = rx.recv() => match ev { Some(e) => e, None => return },
            _ = tick.tick() => {
                // A path that came up after its cell was reported must learn
                // it (and so must the proxy's view of it).
                session.with(|st, _| {
                    let up = st.ep.up_paths();
                    if up != reported_up {
                        for (i, &c) in cells.iter().enumerate() {
                            if c != 0 {
                                st.ep.report_link(PathId(i as u8), LinkState::Connected, c);
                            }
                        }
                        reported_up = up;
                    }
                });
                continue;
            }
        };
        if let RadioEvent::Cell { path, cell_id, .. } = &ev {
            let (p, c) = (*path, *cell_id);
            if cells.len() <= p.index() {
                cells.resize(p.index() + 1, 0);
            }
            cells[p.index()] = c;
            let state = if c == 0 { LinkState::NoService } else { LinkState::Connected };
            session.report_link(p, state, c);
        }
        let (record, class) = record_of(&train_id, &ev, &path_names);
        if spool.append(&record.encode_to_vec(), class).is_some() {
            if let Some(p) = position.as_mut() {
                p.saw(record.time_unix_ms);
            }
        }
        session.with(|st, now| {
            if let Some(s) =
                polycorn_net::hof::train_state_of(&record, &mut tracker, &mut positioner, now, SystemTime::now())
            {
                st.ep.set_train_state(s);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replay options for `n` paths named carrier-0.., epoch 1,000,000 ms
    /// (shared with the detection stage's tests).
    pub(crate) fn opts(n: usize) -> ReplayOpts {
        ReplayOpts {
            file: PathBuf::new(),
            epoch_unix_ms: 1_000_000,
            path_names: (0..n).map(|i| format!("carrier-{i}")).collect(),
            detect: None,
            gps_only: false,
            no_gps: false,
            resume_from_unix_ms: None,
        }
    }

    #[test]
    fn a_trip_log_becomes_radio_events_with_data_plane_cell_ids() {
        let log = parse_events(
            r#"{"event":"gps","t_ms":0,"lat":1,"lon":2,"speed_mps":80,"heading_deg":0,"accuracy_m":20,"track_m":0}
{"event":"rsrp","t_ms":60,"measured_ms":0,"carrier":0,"cell":0,"rsrp_dbm":-100}
{"event":"rsrp","t_ms":70,"measured_ms":0,"carrier":2,"cell":0,"rsrp_dbm":-100}
{"event":"handover_start","t_ms":900,"carrier":0,"from_cell":0,"to_cell":1,"track_m":75,"delta_m":0,"rsrp_dbm":-110}
{"event":"gps","t_ms":1000,"lat":1.001,"lon":2,"speed_mps":80,"heading_deg":0,"accuracy_m":20,"track_m":80}
{"event":"gps","t_ms":2000,"lat":1.002,"lon":2,"speed_mps":80,"heading_deg":0,"accuracy_m":20,"track_m":160}
{"event":"handover_end","t_ms":2900,"carrier":0,"from_cell":0,"to_cell":1,"outcome":"nas","ho_type":3,"duration_ms":2000,"blackout":"flush","track_m":75}
{"event":"cell_change","t_ms":2900,"carrier":0,"cell":1}
"#,
        )
        .unwrap();
        let ev = events_of(&log, &opts(2));
        let cells: Vec<_> = ev
            .iter()
            .filter_map(|(t, e)| match e {
                RadioEvent::Cell { path, cell_id, .. } => Some((*t, path.0, *cell_id)),
                _ => None,
            })
            .collect();
        assert_eq!(
            cells,
            vec![(1_000_060, 0, testbed_cell_id(0, 0)), (1_002_900, 0, testbed_cell_id(0, 1))],
            "the first report names the starting cell; carrier 2 has no path"
        );
        let ho = ev.iter().find_map(|(_, e)| match e {
            RadioEvent::Handover { event, .. } => Some(event.clone()),
            _ => None,
        });
        let ho = ho.unwrap();
        assert_eq!(ho.outcome, v1::HandoverOutcome::Failure as i32);
        assert_eq!((ho.start_unix_ms, ho.start_track_m, ho.duration_ms), (1_000_900, Some(75.0), 2000));
        // Its position is the last fix before it began (t 0), not the one
        // before it ended (t 2000, 160 m on): GPS-only positions come from it.
        assert_eq!((ho.start_lat_deg, ho.start_lon_deg), (1.0, 2.0));

        // --replay-gps-only: the same events without any track position.
        let gps_only = events_of(&log, &ReplayOpts { gps_only: true, ..opts(2) });
        assert_eq!(gps_only.len(), ev.len());
        for (_, e) in &gps_only {
            match e {
                RadioEvent::Gps { fix, .. } => assert!(fix.track_m.is_none() && fix.lat_deg >= 1.0),
                RadioEvent::Handover { event, .. } => assert!(event.start_track_m.is_none()),
                _ => {}
            }
        }

        // With gpsd as the receiver (no_gps): the same radio events, no
        // fixes, and handovers without track positions.
        let no_gps = events_of(&log, &ReplayOpts { no_gps: true, ..opts(2) });
        let fixes = ev.iter().filter(|(_, e)| matches!(e, RadioEvent::Gps { .. })).count();
        assert!(fixes > 0);
        assert_eq!(no_gps.len(), ev.len() - fixes);
        for (_, e) in &no_gps {
            match e {
                RadioEvent::Gps { .. } => panic!("a replayed fix with gpsd as the receiver"),
                RadioEvent::Handover { event, .. } => assert!(event.start_track_m.is_none()),
                _ => {}
            }
        }
    }

    /// A trip's events from one epoch, shifted, are its events from
    /// another: one list serves every train of a simulated fleet.
    #[test]
    fn shifted_events_are_the_events_of_a_later_epoch() {
        let log = parse_events(
            r#"{"event":"gps","t_ms":0,"lat":1,"lon":2,"speed_mps":80,"heading_deg":0,"accuracy_m":20,"track_m":0}
{"event":"rsrp","t_ms":60,"measured_ms":10,"carrier":0,"cell":0,"rsrp_dbm":-100}
{"event":"handover_start","t_ms":900,"carrier":0,"from_cell":0,"to_cell":1,"track_m":75,"delta_m":0,"rsrp_dbm":-110}
{"event":"handover_end","t_ms":2900,"carrier":0,"from_cell":0,"to_cell":1,"outcome":"nas","ho_type":3,"duration_ms":2000,"blackout":"flush","track_m":75}
{"event":"cell_change","t_ms":2900,"carrier":0,"cell":1}
"#,
        )
        .unwrap();
        let base = events_of(&log, &opts(1));
        let later = events_of(&log, &ReplayOpts { epoch_unix_ms: 1_000_000 + 123_456, ..opts(1) });
        assert_eq!(base.len(), later.len());
        assert!(base.iter().any(|(_, e)| matches!(e, RadioEvent::Handover { .. })));
        for ((t0, e0), (t1, e1)) in base.iter().zip(&later) {
            assert_eq!((t0 + 123_456, e0.shifted(123_456)), (*t1, e1.clone()));
        }
    }

    /// Played from a start mid-trip: the state before it at once (the
    /// serving cell, the last fix), shifted, then only what follows.
    #[tokio::test]
    async fn play_catches_up_then_sends_what_follows_shifted() {
        let cell = |t: i64, c: u64| (t, RadioEvent::Cell { time_unix_ms: t, path: PathId(0), cell_id: c });
        let fix = |t: i64| (t, RadioEvent::Gps { time_unix_ms: t, fix: v1::GpsFix::default() });
        let now = now_unix_ms();
        // Times relative to an epoch 0; the train's trip began 10 s ago.
        let shift = now - 10_000;
        let events = vec![cell(0, 1), fix(1_000), cell(5_000, 2), fix(9_000), fix(10_050), cell(10_100, 3)];
        let (tx, mut rx) = mpsc::channel(16);
        let (_stop_tx, mut stop) = watch::channel(false);
        assert!(play(&events, shift, now, 1, &tx, &mut stop).await);
        drop(tx);
        let mut got = Vec::new();
        while let Some(e) = rx.recv().await {
            got.push(e);
        }
        let want: Vec<RadioEvent> =
            [cell(5_000, 2), fix(9_000), fix(10_050), cell(10_100, 3)].iter().map(|(_, e)| e.shifted(shift)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_resumed_replay_starts_where_the_spool_left_off_never_before_the_epoch() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(resume_point(dir.path(), 5_000), 5_000, "no position yet: the whole log");
        let mut k = PositionKeeper {
            file: dir.path().join(REPLAY_POSITION_FILE),
            newest: i64::MIN,
            written: i64::MIN,
            last_write: None,
        };
        k.saw(9_000);
        k.saw(8_000); // older records do not move it back
        assert_eq!(resume_point(dir.path(), 5_000), 9_000);
        assert_eq!(resume_point(dir.path(), 10_000), 10_000, "a position before the epoch is the epoch");
        std::fs::write(dir.path().join(REPLAY_POSITION_FILE), "garbage").unwrap();
        assert_eq!(resume_point(dir.path(), 5_000), 5_000, "an unreadable position replays from the start");
    }
}
