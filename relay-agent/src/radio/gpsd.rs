//! gpsd as a position source: a thin tokio client around the sans-IO
//! parser in `polycorn_telemetry::gpsd`. It connects to gpsd (TCP,
//! `127.0.0.1:2947` by default), asks for JSON reports with `?WATCH`, and
//! sends each fix as `RadioEvent::Gps`. When gpsd goes away (restart,
//! crash, not started yet) it reconnects with backoff (100 ms doubling to
//! 5 s), forever, until the relay stops.

use std::sync::Arc;
use std::time::Duration;

use polycorn_telemetry::gpsd::{parse_line, GpsdStats, LineBuffer, Message, WATCH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use super::detect::{RadioCounters, SourceEvent};
use super::RadioEvent;

/// Default gpsd address.
pub const DEFAULT_ADDR: &str = "127.0.0.1:2947";

/// Read gpsd at `addr` (`host:port`) into `tx` until `stop`.
pub async fn run(
    addr: String,
    tx: mpsc::Sender<SourceEvent>,
    counters: Arc<RadioCounters>,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = polycorn_net::backoff::Backoff::reconnect();
    let mut stats = GpsdStats::default();
    loop {
        let conn = tokio::select! {
            c = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(&addr)) => c,
            _ = stop.changed() => return,
        };
        match conn {
            Ok(Ok(mut sock)) => {
                RadioCounters::add(&counters.gpsd_connects, 1);
                info!(%addr, "gpsd connected");
                backoff.reset();
                let r = tokio::select! {
                    r = session(&mut sock, &tx, &counters, &mut stats) => r,
                    _ = stop.changed() => return,
                };
                match r {
                    Ok(Flow::Closed) => warn!(%addr, ?stats, "gpsd closed the connection; reconnecting"),
                    Ok(Flow::NoReceiver) => return,
                    Err(e) => warn!(%addr, error = %e, "gpsd connection failed; reconnecting"),
                }
            }
            Ok(Err(e)) => {
                warn!(%addr, error = %e, "connecting to gpsd failed (is gpsd running? --gpsd sets the address)")
            }
            Err(_) => warn!(%addr, "connecting to gpsd timed out"),
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff.next_wait()) => {}
            _ = stop.changed() => return,
        }
    }
}

enum Flow {
    Closed,
    NoReceiver,
}

async fn session(
    sock: &mut TcpStream,
    tx: &mpsc::Sender<SourceEvent>,
    counters: &RadioCounters,
    stats: &mut GpsdStats,
) -> std::io::Result<Flow> {
    sock.write_all(WATCH.as_bytes()).await?;
    let mut lines = LineBuffer::default();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = sock.read(&mut buf).await?;
        if n == 0 {
            return Ok(Flow::Closed);
        }
        for line in lines.push(&buf[..n]) {
            let r = line.and_then(|l| parse_line(&l));
            stats.count(&r);
            match r {
                Ok(Message::Fix(f)) => {
                    RadioCounters::add(&counters.gpsd_fixes, 1);
                    let ev = SourceEvent::Radio(RadioEvent::Gps { time_unix_ms: f.time_unix_ms, fix: f.fix });
                    if tx.send(ev).await.is_err() {
                        return Ok(Flow::NoReceiver);
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    RadioCounters::add(&counters.gpsd_malformed, 1);
                    // Logged while rare; a peer that only speaks garbage
                    // shows in the counter instead of flooding the log.
                    if stats.malformed <= 10 || stats.malformed.is_power_of_two() {
                        warn!(error = %e, malformed = stats.malformed, "gpsd line refused");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use tokio::net::TcpListener;

    /// Origin, heading and speed of the fixture trip (the testbed's
    /// synthetic track, `polycorn-tracegen`): 300 km/h due 160°.
    const ORIGIN: (f64, f64) = (39.865, 116.379);
    const HEADING_DEG: f64 = 160.0;
    const SPEED_MPS: f64 = 300.0 / 3.6;
    const EPOCHS: u32 = 150;
    /// 2024-05-01T08:00:00Z
    const START_UNIX_MS: i64 = 1_714_550_400_000;

    fn position(k: u32) -> (f64, f64) {
        position_at(SPEED_MPS * f64::from(k))
    }

    /// (lat, lon) `x` metres along the fixture's track.
    fn position_at(x: f64) -> (f64, f64) {
        let h = HEADING_DEG.to_radians();
        let m_per_deg_lat = 111_320.0;
        let m_per_deg_lon = m_per_deg_lat * ORIGIN.0.to_radians().cos();
        (ORIGIN.0 + x * h.cos() / m_per_deg_lat, ORIGIN.1 + x * h.sin() / m_per_deg_lon)
    }

    fn nmea(body: &str) -> String {
        let sum = body.bytes().fold(0u8, |a, b| a ^ b);
        format!("${body}*{sum:02X}\r\n")
    }

    fn degrees_minutes(x: f64, width: usize) -> String {
        let d = x.abs().trunc();
        format!("{:0width$}{:07.4}", d as u32, (x.abs() - d) * 60.0)
    }

    /// The fixture `tests/data/trip.nmea`: one GPRMC and one GPGGA per
    /// second, 150 s along a straight line at 300 km/h, on 2024-05-01.
    fn trip_nmea() -> String {
        trip_nmea_on("010524")
    }

    /// The same trip on another day (`ddmmyy`).
    fn trip_nmea_on(date: &str) -> String {
        let mut out = String::new();
        for k in 0..EPOCHS {
            let (lat, lon) = position(k);
            let t = format!("08{:02}{:02}.00", k / 60, k % 60);
            let (la, lo) = (degrees_minutes(lat, 2), degrees_minutes(lon, 3));
            let knots = SPEED_MPS * 3600.0 / 1852.0;
            out += &nmea(&format!("GPRMC,{t},A,{la},N,{lo},E,{knots:.3},{HEADING_DEG:.1},{date},,,A"));
            out += &nmea(&format!("GPGGA,{t},{la},N,{lo},E,1,10,0.9,45.0,M,-9.0,M,,"));
        }
        out
    }

    fn fixture_path() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/trip.nmea")
    }

    #[test]
    fn the_nmea_fixture_is_what_the_generator_writes() {
        // Regenerate with: POLYCORN_REGEN_FIXTURES=1 cargo test -p polycorn-relay nmea_fixture
        if std::env::var_os("POLYCORN_REGEN_FIXTURES").is_some() {
            std::fs::write(fixture_path(), trip_nmea()).unwrap();
        }
        let committed = std::fs::read_to_string(fixture_path()).unwrap();
        assert!(committed == trip_nmea(), "tests/data/trip.nmea is stale: regenerate it (see this test)");
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    async fn next_fix(rx: &mut mpsc::Receiver<SourceEvent>) -> (i64, polycorn_telemetry::v1::GpsFix) {
        match tokio::time::timeout(Duration::from_secs(60), rx.recv()).await {
            Ok(Some(SourceEvent::Radio(RadioEvent::Gps { time_unix_ms, fix }))) => (time_unix_ms, fix),
            other => panic!("expected a fix, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn fixes_come_through_garbage_and_reconnects() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let (tx, mut rx) = mpsc::channel(16);
        let counters = Arc::new(RadioCounters::default());
        let (_stop_tx, stop) = watch::channel(false);
        tokio::spawn(run(addr, tx, counters.clone(), stop));
        for round in 0..2 {
            let (mut s, _) = l.accept().await.unwrap();
            let mut cmd = vec![0u8; WATCH.len()];
            s.read_exact(&mut cmd).await.unwrap();
            assert_eq!(cmd, WATCH.as_bytes());
            let tpv = format!(
                r#"{{"class":"TPV","mode":3,"time":"2024-05-01T08:00:00Z","lat":{round}.5,"lon":2.0,"speed":1.5,"track":90.0}}"#
            );
            let lines = format!(
                "{{\"class\":\"VERSION\"}}\nnot json at all\n{{\"class\":\"TPV\",\"mode\":3,\"lat\":12\n{tpv}\n"
            );
            s.write_all(lines.as_bytes()).await.unwrap();
            let (_, fix) = next_fix(&mut rx).await;
            assert_eq!((fix.lat_deg, fix.speed_mps, fix.heading_deg), (f64::from(round) + 0.5, 1.5, 90.0));
            drop(s); // gpsd "restarts"
        }
        assert_eq!(counters.gpsd_connects.load(Ordering::Relaxed), 2);
        assert_eq!(counters.gpsd_malformed.load(Ordering::Relaxed), 4);
    }

    /// A gpsfake process (its own gpsd on `port`), killed with its group.
    struct GpsFake(std::process::Child);

    impl GpsFake {
        fn start(port: u16, log: &std::path::Path) -> GpsFake {
            use std::os::unix::process::CommandExt as _;
            let found = std::process::Command::new("gpsfake").arg("--help").output().is_ok();
            assert!(
                found,
                "\n\n*** gpsfake is not installed: this test needs gpsd's own gpsfake (Debian: gpsd gpsd-clients). \
                 Run `make setup` (scripts/setup.sh) to install it. ***\n"
            );
            // -1: play the log once; -q: quiet; -c: 20 ms between sentences
            // (the fix times come from the log, so the pace does not matter).
            let child = std::process::Command::new("gpsfake")
                .args(["-1", "-q", "-c", "0.02", "-P", &port.to_string()])
                .arg(log)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .process_group(0)
                .spawn()
                .expect("spawning gpsfake");
            GpsFake(child)
        }
    }

    impl Drop for GpsFake {
        fn drop(&mut self) {
            // gpsfake runs gpsd as a child: end the whole group (gpsfake
            // takes seconds to act on SIGTERM, so SIGKILL), then remove the
            // control socket it leaves in /tmp.
            let pid = self.0.id();
            let _ = std::process::Command::new("kill").args(["-KILL", "--", &format!("-{pid}")]).status();
            let _ = self.0.wait();
            let _ = std::fs::remove_file(format!("/tmp/gpsfake-{pid}.sock"));
        }
    }

    /// The real gpsd, fed our NMEA log by gpsfake: the client gets the
    /// fixes gpsd computes, with the log's positions, speed and course, and
    /// reconnects to a restarted gpsd.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn gpsfake_fixes_have_the_logs_positions_and_survive_a_gpsd_restart() {
        let port = free_port();
        let fake = GpsFake::start(port, &fixture_path());
        let (tx, mut rx) = mpsc::channel(1024);
        let counters = Arc::new(RadioCounters::default());
        let (stop_tx, stop) = watch::channel(false);
        let client = tokio::spawn(run(format!("127.0.0.1:{port}"), tx, counters.clone(), stop));
        // (day, epoch) of a fix, after checking it lies on the fixture's track.
        let check = |(t, fix): (i64, polycorn_telemetry::v1::GpsFix)| {
            let (day, ms) = ((t - START_UNIX_MS).div_euclid(86_400_000), (t - START_UNIX_MS).rem_euclid(86_400_000));
            let k = ms / 1000;
            assert!((0..=1).contains(&day) && k < i64::from(EPOCHS) && ms % 1000 == 0, "fix time {t}");
            let (lat, lon) = position(k as u32);
            assert!(
                (fix.lat_deg - lat).abs() < 1e-5 && (fix.lon_deg - lon).abs() < 1e-5,
                "k={k}: {fix:?} vs {lat},{lon}"
            );
            assert!((fix.speed_mps - SPEED_MPS).abs() < 0.01, "{fix:?}");
            assert!((fix.heading_deg - HEADING_DEG).abs() < 0.01, "{fix:?}");
            assert!(fix.track_m.is_none());
            (day, k)
        };
        let mut seen = Vec::new();
        while seen.len() < 20 {
            seen.push(check(next_fix(&mut rx).await));
        }
        assert!(seen.windows(2).all(|w| w[0] <= w[1]), "fixes in time order: {seen:?}");
        assert!(seen.iter().all(|&(day, _)| day == 0));

        // gpsd restarts, replaying the trip a day later: the client
        // reconnects and reads the new gpsd's fixes.
        drop(fake);
        let next_day = std::env::temp_dir().join(format!("polycorn-gpsfake-{}.nmea", std::process::id()));
        std::fs::write(&next_day, trip_nmea_on("020524")).unwrap();
        let _fake = GpsFake::start(port, &next_day);
        while check(next_fix(&mut rx).await).0 == 0 {}
        assert_eq!(counters.gpsd_connects.load(Ordering::Relaxed), 2);
        assert_eq!(counters.gpsd_malformed.load(Ordering::Relaxed), 0);
        stop_tx.send(true).unwrap();
        client.await.unwrap();
        let _ = std::fs::remove_file(next_day);
    }

    /// The gpsd path gives HPR the positions the trip replay
    /// gives. The fixture's fixes, read from the real gpsd (gpsfake) and
    /// map-matched onto a route line drawn through the trip (as a table's
    /// `routes` carries it: a vertex every 500 m with its measure), against
    /// the replay's own track positions (speed × time): every position within
    /// one second of travel, and the fix at which HPR starts holding a
    /// carrier before a failure location 6 km on (t_HOF under 1.3 s) the same
    /// within one second.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn gpsfake_fixes_place_the_train_where_the_replay_does() {
        use polycorn_telemetry::failure_table::RouteLine;
        use polycorn_telemetry::route_match::Routes;
        let port = free_port();
        let _fake = GpsFake::start(port, &fixture_path());
        let (tx, mut rx) = mpsc::channel(1024);
        let (stop_tx, stop) = watch::channel(false);
        let client = tokio::spawn(run(format!("127.0.0.1:{port}"), tx, Arc::new(RadioCounters::default()), stop));
        let n = (SPEED_MPS * f64::from(EPOCHS) / 500.0) as usize + 2;
        let line = RouteLine {
            id: "fixture".into(),
            coords: (0..=n)
                .map(|i| {
                    let (lat, lon) = position_at(i as f64 * 500.0);
                    [lon, lat]
                })
                .collect(),
            measures: (0..=n).map(|i| i as f64 * 500.0).collect(),
        };
        let shared = polycorn_net::hof::SharedRoutes::default();
        shared.set(Routes::new(&[line]));
        let mut positioner = polycorn_net::hof::Positioner::new(Some(shared));
        const FAILURE_M: f64 = 6000.0;
        let holds = |pos: f64| (FAILURE_M - pos) / SPEED_MPS < 1.3;
        let (mut first_hold_gps, mut first_hold_replay) = (None, None);
        let mut seen = 0;
        while seen < 100 {
            let (t, fix) = next_fix(&mut rx).await;
            let k = (t - START_UNIX_MS) / 1000;
            let replay = SPEED_MPS * k as f64;
            let gps = positioner.track_m(&fix, t).expect("a fix on the line is placed");
            assert!((gps - replay).abs() < SPEED_MPS, "k={k}: {gps} vs {replay}");
            if first_hold_gps.is_none() && holds(gps) {
                first_hold_gps = Some(k);
            }
            if first_hold_replay.is_none() && holds(replay) {
                first_hold_replay = Some(k);
            }
            seen += 1;
        }
        let (g, r) = (first_hold_gps.unwrap(), first_hold_replay.unwrap());
        assert!((g - r).abs() <= 1, "HPR holds from fix {g} on gpsd, {r} on the replay");
        stop_tx.send(true).unwrap();
        client.await.unwrap();
    }
}
