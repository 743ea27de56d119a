//! `backlog`: one always-busy download flow over a window of the trip.
//!
//! From trip time A to B the same file is downloaded again and again, one fresh TCP connection per
//! request, each request starting as soon as the previous one ends (after a 200 ms pause if it
//! failed). The flow thus always has data to send, and the goodput right after every handover
//! failure in the window can be read off its single progress curve. One record for the whole run.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Result};

use crate::bulk::{fetch, Progress};
use crate::clock::TripClock;
use crate::plan::us_to_ms;
use crate::record::{BacklogRecord, Sink};

/// Pause after a failed request before the next one (no busy loop while the network is down).
pub const RETRY_PAUSE_US: i64 = 200_000;
/// Errors kept in the record (the count of failures is always complete).
pub const MAX_ERRORS: usize = 20;
/// Largest `--size` accepted (as for bulk sizes).
pub const MAX_SIZE: u64 = 1 << 40;

/// Checks `--path`: absolute, printable ASCII without spaces.
pub fn check_path(path: &str) -> Result<()> {
    if !path.starts_with('/') {
        bail!("path {path:?} must start with '/'");
    }
    if !path.chars().all(|c| c.is_ascii_graphic()) {
        bail!("path {path:?} must be printable ASCII without spaces");
    }
    Ok(())
}

/// Checks `--size`: between 1 byte and 1 TiB (an empty body would make the loop spin).
pub fn check_size(size: u64) -> Result<()> {
    if !(1..=MAX_SIZE).contains(&size) {
        bail!("size {size} must be between 1 and {MAX_SIZE} bytes");
    }
    Ok(())
}

/// Request counts and the first errors.
#[derive(Debug, Default)]
struct Tally {
    requests: u64,
    completed: u64,
    failed: u64,
    errors: Vec<String>,
}

impl Tally {
    /// A request failed at `now_us` with `error`.
    fn fail(&mut self, now_us: i64, error: &str) {
        self.failed += 1;
        if self.errors.len() < MAX_ERRORS {
            self.errors.push(format!("{:.3}: {error}", us_to_ms(now_us)));
        }
    }
}

pub struct BacklogRun<'a> {
    pub clock: TripClock,
    pub origin: SocketAddr,
    /// `Host` header value (the `--origin` argument as given).
    pub host: &'a str,
    pub path: &'a str,
    /// Expected body size of each request.
    pub size: u64,
    /// [A, B] in trip µs.
    pub window: (i64, i64),
}

impl BacklogRun<'_> {
    /// Runs the flow (or stops early when `stop` resolves) and writes its record.
    pub async fn run(&self, sink: &Sink, stop: impl Future<Output = ()>) -> Result<()> {
        let rec = self.measure(stop).await;
        sink.write(&rec)
    }

    /// Sleeps until A, keeps a download in flight until B or until `stop` resolves, then abandons
    /// the download in flight and returns the record.
    pub async fn measure(&self, stop: impl Future<Output = ()>) -> BacklogRecord<'_> {
        let (a, b) = self.window;
        tokio::pin!(stop);
        // None: stopped before A.
        let late = tokio::select! {
            biased;
            () = &mut stop => None,
            late = self.clock.sleep_until(a) => Some(late),
        };
        let start_us = self.clock.now_us();
        let mut progress = Progress::new(start_us);
        let mut tally = Tally::default();
        // Stopped before A: the run starts and ends at the signal.
        let end_us = if late.is_some() {
            tokio::select! {
                biased;
                () = &mut stop => {}
                () = tokio::time::sleep_until(self.clock.instant_at(b)) => {}
                () = self.keep_busy(&mut progress, &mut tally) => {}
            }
            self.clock.now_us().max(start_us)
        } else {
            start_us
        };
        progress.finish(end_us);
        BacklogRecord {
            kind: "backlog",
            id: 0,
            label: "backlog",
            path: self.path,
            size: self.size,
            planned_ms: us_to_ms(a),
            start_ms: us_to_ms(start_us),
            end_ms: us_to_ms(end_us),
            bytes: progress.body_bytes(),
            requests: tally.requests,
            completed: tally.completed,
            failed: tally.failed,
            errors: tally.errors,
            late: late.unwrap_or(false),
            progress: progress.samples().iter().map(|&(t, n)| (us_to_ms(t), n)).collect(),
        }
    }

    /// Back-to-back requests, forever (the caller abandons it).
    async fn keep_busy(&self, p: &mut Progress, t: &mut Tally) {
        loop {
            p.begin_request();
            t.requests += 1;
            match fetch(&self.clock, self.origin, self.host, self.path, self.size, p).await {
                Ok(()) => t.completed += 1,
                Err(e) => {
                    t.fail(self.clock.now_us(), &format!("{e:#}"));
                    tokio::time::sleep(Duration::from_micros(RETRY_PAUSE_US as u64)).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::{SystemTime, UNIX_EPOCH};

    use super::*;
    use crate::bulk::PROGRESS_STEP_US;

    const MS: i64 = 1000;

    #[test]
    fn progress_accumulates_across_requests() {
        let mut p = Progress::new(0);
        // Request 1 completes with 3000 bytes.
        p.begin_request();
        p.add(30 * MS, 1000);
        p.add(80 * MS, 2000);
        assert_eq!(p.request_bytes(), 3000);
        // Request 2 fails after 500 bytes; they still count.
        p.begin_request();
        assert_eq!(p.request_bytes(), 0);
        p.add(120 * MS, 500);
        assert_eq!((p.request_bytes(), p.body_bytes()), (500, 3500));
        // 200 ms pause, then request 3 stalls until 620 ms; the grid points of the pause and the
        // stall are written late, flat at the bytes from before.
        p.begin_request();
        p.add(620 * MS, 4000);
        p.add(650 * MS, 1000);
        assert_eq!((p.request_bytes(), p.body_bytes()), (5000, 8500));
        // Abandoned at the end of the window.
        p.finish(730 * MS);
        let want: Vec<(i64, u64)> = [
            (0, 0),
            (100, 3000),
            (200, 3500),
            (300, 3500),
            (400, 3500),
            (500, 3500),
            (600, 3500),
            (700, 8500),
            (730, 8500),
        ]
        .into_iter()
        .map(|(t, b)| (t * MS, b))
        .collect();
        assert_eq!(p.samples(), &want[..]);
        assert_eq!(p.body_bytes(), 8500);
    }

    #[test]
    fn argument_checks() {
        assert!(check_path("/files/100MiB.bin").is_ok());
        assert!(check_path("files/100MiB.bin").is_err());
        assert!(check_path("/a b").is_err());
        assert!(check_path("/é").is_err());
        assert!(check_path("").is_err());
        assert!(check_size(1).is_ok());
        assert!(check_size(104_857_600).is_ok());
        assert!(check_size(MAX_SIZE).is_ok());
        assert!(check_size(0).is_err());
        assert!(check_size(MAX_SIZE + 1).is_err());
    }

    #[test]
    fn errors_are_capped_and_stamped() {
        let mut t = Tally::default();
        for k in 0..25 {
            t.fail(1_234_567 + k, "boom");
        }
        assert_eq!(t.failed, 25);
        assert_eq!(t.errors.len(), MAX_ERRORS);
        assert_eq!(t.errors[0], "1234.567: boom");
    }

    // ---- loopback runs -------------------------------------------------------------------------

    const SIZE: usize = 60_000;

    #[derive(Clone, Copy)]
    enum Serve {
        /// The whole body, in 4 pieces 5 ms apart.
        Full,
        /// Content-Length SIZE but only half the body, then close.
        Short,
        /// The header and 1000 body bytes, then nothing for 5 s.
        Stall,
    }

    /// A tiny HTTP/1.1 origin on 127.0.0.1; connection k (from 0) is served as `serve(k)`.
    fn origin(serve: fn(usize) -> Serve) -> (SocketAddr, Arc<AtomicUsize>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let count = Arc::new(AtomicUsize::new(0));
        let count2 = count.clone();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { continue };
                let how = serve(count2.fetch_add(1, Ordering::SeqCst));
                std::thread::spawn(move || {
                    let mut head = Vec::new();
                    let mut b = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        if s.read(&mut b).unwrap_or(0) == 0 {
                            return;
                        }
                        head.push(b[0]);
                    }
                    let hdr = format!("HTTP/1.1 200 OK\r\nContent-Length: {SIZE}\r\nConnection: close\r\n\r\n");
                    if s.write_all(hdr.as_bytes()).is_err() {
                        return;
                    }
                    let body = vec![0x5au8; SIZE];
                    let _ = match how {
                        Serve::Full => body.chunks(SIZE / 4).enumerate().try_for_each(|(i, piece)| {
                            if i > 0 {
                                std::thread::sleep(Duration::from_millis(5));
                            }
                            s.write_all(piece)
                        }),
                        Serve::Short => s.write_all(&body[..SIZE / 2]),
                        Serve::Stall => {
                            let r = s.write_all(&body[..1000]);
                            std::thread::sleep(Duration::from_secs(5));
                            r
                        }
                    };
                });
            }
        });
        (addr, count)
    }

    fn now_ms() -> i64 {
        SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
    }

    fn run_for(origin: SocketAddr, epoch: i64, window: (i64, i64)) -> BacklogRun<'static> {
        BacklogRun {
            clock: TripClock::new(epoch).unwrap(),
            origin,
            host: "origin.test:80",
            path: "/files/x.bin",
            size: SIZE as u64,
            window,
        }
    }

    fn us(ms: f64) -> i64 {
        (ms * 1000.0).round() as i64
    }

    /// Checks the progress curve against the other fields: (start, 0), every grid time before the
    /// end, (end, bytes); times increase, bytes never decrease.
    fn check_progress(r: &BacklogRecord<'_>) {
        let pts = &r.progress;
        assert_eq!(pts[0], (r.start_ms, 0));
        assert_eq!(*pts.last().unwrap(), (r.end_ms, r.bytes));
        let (start, end) = (us(r.start_ms), us(r.end_ms));
        let grid: Vec<i64> = (1..).map(|k| start + k * PROGRESS_STEP_US).take_while(|&g| g < end).collect();
        let mut want_times = vec![start];
        want_times.extend(&grid);
        if end > start {
            want_times.push(end);
        }
        assert_eq!(pts.iter().map(|p| us(p.0)).collect::<Vec<_>>(), want_times);
        assert!(pts.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1), "{pts:?}");
    }

    #[tokio::test]
    async fn backlog_keeps_downloading_over_the_window() {
        // Every third connection is cut short.
        let (addr, _) = origin(|k| if k % 3 == 1 { Serve::Short } else { Serve::Full });
        let run = run_for(addr, now_ms(), (300 * MS, 1_500 * MS));
        let r = run.measure(std::future::pending()).await;
        assert_eq!((r.kind, r.id, r.label, r.path, r.size), ("backlog", 0, "backlog", "/files/x.bin", SIZE as u64));
        assert_eq!(r.planned_ms, 300.0);
        assert!(!r.late);
        assert!(r.start_ms >= 300.0);
        assert!(r.end_ms >= 1_450.0, "{}", r.end_ms);
        assert!(r.requests >= 3, "{r:?}");
        assert!(r.completed >= 2, "{r:?}");
        assert!(r.failed >= 1, "{r:?}");
        // At most the download in flight at B is neither completed nor failed.
        let in_flight = r.requests - r.completed - r.failed;
        assert!(in_flight <= 1, "{r:?}");
        // bytes = the completed bodies + the halves of the short ones + what the abandoned one got.
        let size = SIZE as i64;
        let rest = r.bytes as i64 - r.completed as i64 * size - r.failed as i64 * (size / 2);
        assert!((0..size).contains(&rest), "{r:?}");
        if in_flight == 0 {
            assert_eq!(rest, 0);
        }
        assert_eq!(r.errors.len() as u64, r.failed.min(MAX_ERRORS as u64));
        for e in &r.errors {
            let (t, msg) = e.split_once(": ").unwrap();
            let t: f64 = t.parse().unwrap();
            assert!(t >= r.start_ms && t <= r.end_ms, "{e}");
            assert_eq!(msg, format!("connection closed after {} of {SIZE} body bytes", SIZE / 2));
        }
        check_progress(&r);
        // The record serialises to the documented fields.
        let v = serde_json::to_value(&r).unwrap();
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        let mut want = [
            "kind",
            "id",
            "label",
            "path",
            "size",
            "planned_ms",
            "start_ms",
            "end_ms",
            "bytes",
            "requests",
            "completed",
            "failed",
            "errors",
            "late",
            "progress",
        ];
        want.sort_unstable();
        assert_eq!(keys, want);
    }

    #[tokio::test]
    async fn late_start_and_abandon_at_the_end() {
        let (addr, count) = origin(|_| Serve::Stall);
        // Trip time is ≈ 200 ms already: A = 100 ms has passed.
        let run = run_for(addr, now_ms() - 200, (100 * MS, 700 * MS));
        let r = run.measure(std::future::pending()).await;
        assert!(r.late);
        assert!(r.start_ms >= 200.0);
        assert!(r.end_ms >= 650.0, "{}", r.end_ms);
        assert_eq!((r.requests, r.completed, r.failed, r.bytes), (1, 0, 0, 1000), "{r:?}");
        assert!(r.errors.is_empty());
        assert_eq!(count.load(Ordering::SeqCst), 1);
        check_progress(&r);
        assert!(r.progress.len() >= 5);
    }

    #[tokio::test]
    async fn refused_connections_pause_and_stop_ends_the_run() {
        let addr = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let run = run_for(addr, now_ms(), (0, 60_000 * MS));
        let stop = tokio::time::sleep(Duration::from_millis(700));
        let r = run.measure(stop).await;
        // Stopped long before B.
        assert!(r.end_ms >= 650.0 && r.end_ms < 30_000.0, "{}", r.end_ms);
        assert!(r.failed >= 2, "{r:?}");
        assert!(r.requests - r.failed <= 1);
        // 200 ms between attempts: about 4 in 700 ms, never a busy loop.
        assert!(r.requests <= 10, "{r:?}");
        assert_eq!((r.completed, r.bytes), (0, 0));
        assert!(r.errors.iter().all(|e| e.contains(": connect: ")), "{:?}", r.errors);
        check_progress(&r);
    }

    #[tokio::test]
    async fn stop_before_the_window_writes_an_empty_record() {
        let (addr, count) = origin(|_| Serve::Full);
        let run = run_for(addr, now_ms(), (5_000 * MS, 10_000 * MS));
        let out = std::env::temp_dir().join(format!("polycorn-loadgen-backlog-{}.jsonl", std::process::id()));
        let sink = Sink::create(&out).unwrap();
        run.run(&sink, tokio::time::sleep(Duration::from_millis(100))).await.unwrap();
        let text = std::fs::read_to_string(&out).unwrap();
        let _ = std::fs::remove_file(&out);
        assert_eq!(text.lines().count(), 1);
        let v: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
        assert_eq!(v["kind"], "backlog");
        assert_eq!(v["requests"], 0);
        assert_eq!(v["bytes"], 0);
        assert_eq!(v["late"], false);
        assert_eq!(v["planned_ms"], 5000.0);
        assert_eq!(v["start_ms"], v["end_ms"]);
        assert!(v["end_ms"].as_f64().unwrap() < 5000.0);
        assert_eq!(v["progress"].as_array().unwrap().len(), 1);
        assert_eq!(count.load(Ordering::SeqCst), 0);
    }
}
