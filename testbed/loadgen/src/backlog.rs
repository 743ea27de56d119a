//! `backlog`: one always-busy download flow over a window of the trip.
//!
//! From trip time A to B the same file is downloaded again and again, one fresh TCP connection per
//! request, each request starting as soon as the previous one ends (after a 200 ms pause if it
//! failed). The flow thus always has data to send, and the goodput right after every handover
//! failure in the window can be read off its single progress curve. One record for the whole run.
//!
//! With `--users N` (and `--source-base`), N such flows run at once, user u's connections from
//! source address base + u (N distinct passengers to the relay); one record per user, written
//! together at the end in user order (the benchmark's concurrency phase).

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::task::Poll;
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
/// Most `--users` accepted (each holds one connection at a time).
pub const MAX_USERS: u32 = 1000;

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
    /// Local address of every connection (`None`: the system's choice).
    pub source: Option<Ipv4Addr>,
    /// The user this flow belongs to in a multi-user run (`None`: a single-flow run, whose record
    /// has no `user` field and `id` 0, as before multi-user runs existed).
    pub user: Option<u32>,
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
            id: self.user.unwrap_or(0) as usize,
            user: self.user,
            source: self.source.map(|a| a.to_string()),
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
            match fetch(&self.clock, self.origin, self.source, self.host, self.path, self.size, p).await {
                Ok(()) => t.completed += 1,
                Err(e) => {
                    t.fail(self.clock.now_us(), &format!("{e:#}"));
                    tokio::time::sleep(Duration::from_micros(RETRY_PAUSE_US as u64)).await;
                }
            }
        }
    }
}

/// Runs every flow of a multi-user run at once (or until `stop` resolves, which ends them all at
/// that moment) and writes their records in the order of `runs`.
pub async fn run_users(runs: &[BacklogRun<'_>], sink: &Sink, stop: impl Future<Output = ()>) -> Result<()> {
    for rec in measure_users(runs, stop).await {
        sink.write(&rec)?;
    }
    Ok(())
}

/// The records of [`run_users`], in the order of `runs`.
pub async fn measure_users<'a>(runs: &'a [BacklogRun<'a>], stop: impl Future<Output = ()>) -> Vec<BacklogRecord<'a>> {
    // One signal for every flow: each flow's own stop waits for `true`. The sender lives until
    // every flow has ended (a dropped sender would stop them all at once).
    let (tx, rx) = tokio::sync::watch::channel(false);
    let flows = runs.iter().map(|r| {
        let mut rx = rx.clone();
        r.measure(async move {
            let _ = rx.wait_for(|&stopped| stopped).await;
        })
    });
    let all = join_all(flows.collect());
    tokio::pin!(stop, all);
    tokio::select! {
        recs = &mut all => recs,
        () = &mut stop => {
            tx.send_replace(true);
            all.await
        }
    }
}

/// Polls every future until all are ready; their outputs in order (a tiny `futures::join_all`: a
/// single-threaded runtime, so the flows share one task).
async fn join_all<F: Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut futs: Vec<Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut outs: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, out) in futs.iter_mut().zip(outs.iter_mut()) {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outs.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{IpAddr, TcpListener};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
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
        let (addr, count, _) = origin_with_peers(serve);
        (addr, count)
    }

    /// [`origin`], also keeping every connection's peer address.
    fn origin_with_peers(serve: fn(usize) -> Serve) -> (SocketAddr, Arc<AtomicUsize>, Arc<Mutex<Vec<IpAddr>>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let count = Arc::new(AtomicUsize::new(0));
        let count2 = count.clone();
        let peers = Arc::new(Mutex::new(Vec::new()));
        let peers2 = peers.clone();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { continue };
                if let Ok(peer) = s.peer_addr() {
                    peers2.lock().unwrap().push(peer.ip());
                }
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
        (addr, count, peers)
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
            source: None,
            user: None,
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

    #[tokio::test]
    async fn users_download_at_once_each_from_its_own_address() {
        let (addr, count, peers) = origin_with_peers(|_| Serve::Full);
        let base = Ipv4Addr::new(127, 0, 0, 1);
        let mk = |u: u32| BacklogRun {
            source: Some(Ipv4Addr::from(u32::from(base) + u)),
            user: Some(u),
            ..run_for(addr, now_ms(), (100 * MS, 900 * MS))
        };
        let runs: Vec<BacklogRun<'_>> = (0..3).map(mk).collect();
        let recs = measure_users(&runs, std::future::pending()).await;
        assert_eq!(recs.len(), 3);
        for (u, r) in recs.iter().enumerate() {
            // In user order, each with its user, id and source.
            assert_eq!((r.id, r.user), (u, Some(u as u32)));
            assert_eq!(r.source.as_deref(), Some(format!("127.0.0.{}", u + 1).as_str()));
            assert!(r.completed >= 2, "{r:?}");
            assert_eq!(r.failed, 0, "{r:?}");
            assert!(r.end_ms >= 850.0, "{}", r.end_ms);
            check_progress(r);
        }
        // Every user's connections came from its own address, and all three were served.
        let peers = peers.lock().unwrap().clone();
        assert!(count.load(Ordering::SeqCst) >= 6);
        for u in 1..=3u8 {
            assert!(peers.contains(&IpAddr::from([127, 0, 0, u])), "{peers:?}");
        }
        assert!(peers.iter().all(|p| matches!(p, IpAddr::V4(v) if (1..=3).contains(&v.octets()[3]))), "{peers:?}");
        // A multi-user record carries user and source; a single-flow record neither.
        let v = serde_json::to_value(&recs[2]).unwrap();
        assert_eq!((v["id"].as_u64(), v["user"].as_u64()), (Some(2), Some(2)));
        assert_eq!(v["source"], "127.0.0.3");
        let single_run = run_for(addr, now_ms(), (0, 50 * MS));
        let single = single_run.measure(std::future::pending()).await;
        let v = serde_json::to_value(&single).unwrap();
        assert!(v.get("user").is_none() && v.get("source").is_none(), "{v}");
    }

    #[tokio::test]
    async fn stop_ends_every_user_and_writes_every_record() {
        let (addr, _) = origin(|_| Serve::Stall);
        let mk = |u: u32| BacklogRun { user: Some(u), ..run_for(addr, now_ms(), (0, 60_000 * MS)) };
        let runs: Vec<BacklogRun<'_>> = (0..4).map(mk).collect();
        let out = std::env::temp_dir().join(format!("polycorn-loadgen-users-{}.jsonl", std::process::id()));
        let sink = Sink::create(&out).unwrap();
        run_users(&runs, &sink, tokio::time::sleep(Duration::from_millis(500))).await.unwrap();
        let text = std::fs::read_to_string(&out).unwrap();
        let _ = std::fs::remove_file(&out);
        let recs: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(recs.len(), 4);
        for (u, v) in recs.iter().enumerate() {
            assert_eq!(v["user"].as_u64(), Some(u as u64));
            let end = v["end_ms"].as_f64().unwrap();
            // Stopped long before B, with the stalled request abandoned and its bytes counted.
            assert!((450.0..30_000.0).contains(&end), "{v}");
            assert_eq!((v["requests"].as_u64(), v["bytes"].as_u64()), (Some(1), Some(1000)), "{v}");
        }
    }

    #[tokio::test]
    async fn join_all_keeps_the_order_of_its_futures() {
        let futs: Vec<_> = [30u64, 0, 10]
            .into_iter()
            .map(|ms| async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                ms
            })
            .collect();
        assert_eq!(join_all(futs).await, vec![30, 0, 10]);
        assert!(join_all(Vec::<std::future::Ready<u8>>::new()).await.is_empty());
    }
}
