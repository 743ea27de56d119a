//! Passenger traffic through the simulated trains' sessions, as
//! `polycorn_benchrun.fleet_traffic` offers it through real relays: per
//! train, downloads back to back (each a fresh connection, paced by the
//! origin) and chat connections that send a 100-byte message after
//! exponential gaps and wait for its echo. Every byte is checked: a
//! download against the origin's keyed stream ([`crate::pattern`]) and its
//! length, a chat answer against its message. The report has
//! `fleet_traffic`'s form, so the orchestrator judges both alike.
//!
//! A connection is opened on the train's session directly
//! (`Session::open`, what the relay's capture does for a passenger's
//! socket): no SOCKS5 listener and no loopback socket per passenger.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use polycorn_core::UserId;
use polycorn_emu::SplitMix64;
use polycorn_net::{ConnStream, Session};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use crate::fleet::{Fleet, Train};
use crate::pattern;
use crate::plan::PassengerPlan;

/// A chat message's length.
const MSG: usize = 100;
/// Error messages kept per train.
const MAX_ERRORS: usize = 10;
/// A download reads in pieces of at most this (the origin writes 16 KiB at most at once).
const READ_BUF: usize = 16 * 1024;

/// One train's passenger counters.
#[derive(Debug, Default)]
pub struct PaxCounters {
    pub bulk_done: AtomicU64,
    pub bulk_bytes: AtomicU64,
    pub bulk_failed: AtomicU64,
    pub bulk_cut_at_end: AtomicU64,
    pub chat_ok: AtomicU64,
    pub chat_failed: AtomicU64,
    pub corrupt: AtomicU64,
    /// Bytes the passengers wrote into the tunnel (headers and chat messages).
    pub bytes_up: AtomicU64,
    errors: Mutex<Vec<String>>,
}

/// A train's passenger counters as `fleet_traffic` reports them.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct PaxReport {
    pub bulk_done: u64,
    pub bulk_bytes: u64,
    pub bulk_failed: u64,
    pub bulk_cut_at_end: u64,
    pub chat_ok: u64,
    pub chat_failed: u64,
    pub corrupt: u64,
    pub errors: Vec<String>,
}

impl PaxCounters {
    fn fail(&self, msg: String) {
        let mut e = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        if e.len() < MAX_ERRORS {
            e.push(msg);
        }
    }

    pub fn report(&self) -> PaxReport {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PaxReport {
            bulk_done: g(&self.bulk_done),
            bulk_bytes: g(&self.bulk_bytes),
            bulk_failed: g(&self.bulk_failed),
            bulk_cut_at_end: g(&self.bulk_cut_at_end),
            chat_ok: g(&self.chat_ok),
            chat_failed: g(&self.chat_failed),
            corrupt: g(&self.corrupt),
            errors: self.errors.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        }
    }
}

/// The whole fleet's passengers: their plan, clock and shared records.
pub struct Passengers {
    pub plan: PassengerPlan,
    pub t0: Instant,
    /// Download keys, fleet-wide (each download its own stream).
    keys: AtomicU64,
    /// Download bytes received in each second since `t0`.
    bytes_per_s: Mutex<Vec<u64>>,
    rtts_ms: Mutex<Vec<f32>>,
    /// How late the runtime woke a 100 ms sleep, while the passengers ran.
    pub loop_lags_ms: Mutex<Vec<f32>>,
    /// Worker tasks still running.
    pub running: AtomicUsize,
    /// True once the passengers' time is up (or the fleet stops).
    pub stop: watch::Receiver<bool>,
}

/// What the passengers report (`fleet_traffic passengers`' form).
#[derive(Debug, Serialize)]
pub struct Report {
    pub seconds: f64,
    pub trains: Vec<PaxReport>,
    pub bulk_bytes_per_s: Vec<u64>,
    pub chat_rtt_ms: Vec<f32>,
    pub loop_lag_ms: Vec<f32>,
}

enum Failure {
    /// The passengers' time ended during the transfer.
    Cut,
    /// The transfer broke (a reset, an error, wrong bytes).
    Broken(String),
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Failure {
        Failure::Broken(format!("{:?}: {e}", e.kind()))
    }
}

impl Passengers {
    /// Start every train's passengers now; they stop after the plan's
    /// `seconds` or when the fleet stops.
    pub fn start(fleet: &Arc<Fleet>, plan: PassengerPlan) -> Arc<Passengers> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let pax = Arc::new(Passengers {
            t0: Instant::now(),
            keys: AtomicU64::new(0),
            bytes_per_s: Mutex::default(),
            rtts_ms: Mutex::default(),
            loop_lags_ms: Mutex::default(),
            running: AtomicUsize::new(0),
            stop: stop_rx,
            plan,
        });
        let seconds = Duration::from_secs_f64(pax.plan.seconds);
        let mut fleet_stop = fleet.stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(seconds) => {}
                _ = fleet_stop.wait_for(|s| *s) => {}
            }
            let _ = stop_tx.send(true);
        });
        let mut rng = SplitMix64::stream(pax.plan.seed, 0x7061_7373); // "pass"
        for t in &fleet.trains {
            let Some(r) = t.running.get() else { continue };
            for c in 0..pax.plan.conns {
                let delay = Duration::from_secs_f64(rng.next_f64() * pax.plan.ramp_s);
                let user = t.passenger(c % pax.plan.passengers_per_train);
                let w = Worker { pax: pax.clone(), train: t.clone(), session: r.session.clone(), user };
                pax.running.fetch_add(1, Ordering::Relaxed);
                if c < pax.plan.bulk {
                    tokio::spawn(w.run_bulk(delay));
                } else {
                    let gaps = SplitMix64::new(rng.next_u64());
                    tokio::spawn(w.run_chat(delay, gaps));
                }
            }
        }
        pax
    }

    fn count_bytes(&self, n: usize) {
        let s = self.t0.elapsed().as_secs() as usize;
        let mut b = self.bytes_per_s.lock().unwrap_or_else(|e| e.into_inner());
        if b.len() <= s {
            b.resize(s + 1, 0);
        }
        b[s] += n as u64;
    }

    pub fn stopped(&self) -> bool {
        *self.stop.borrow()
    }

    /// The report so far (final once [`Passengers::running`] is 0).
    pub fn report(&self, fleet: &Fleet) -> Report {
        let lock = |m: &Mutex<Vec<f32>>| m.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Report {
            seconds: self.t0.elapsed().as_secs_f64(),
            trains: fleet.trains.iter().map(|t| t.pax.report()).collect(),
            bulk_bytes_per_s: self.bytes_per_s.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            chat_rtt_ms: lock(&self.rtts_ms),
            loop_lag_ms: lock(&self.loop_lags_ms),
        }
    }
}

/// One passenger connection's worker.
struct Worker {
    pax: Arc<Passengers>,
    train: Arc<Train>,
    session: Session,
    user: UserId,
}

/// The 17-byte header the origin reads first: kind, key, size, rate (network order).
fn header(kind: u8, key: u64, size: u32, rate: u32) -> [u8; 17] {
    let mut h = [0u8; 17];
    h[0] = kind;
    h[1..9].copy_from_slice(&key.to_be_bytes());
    h[9..13].copy_from_slice(&size.to_be_bytes());
    h[13..17].copy_from_slice(&rate.to_be_bytes());
    h
}

/// Chat message `seq` of train `ti`: its train and number, then keyed bytes.
fn chat_message(ti: u32, seq: u64) -> Vec<u8> {
    let mut m = Vec::with_capacity(MSG);
    m.extend_from_slice(&ti.to_be_bytes());
    m.extend_from_slice(&seq.to_be_bytes());
    m.extend_from_slice(&pattern::pattern(seq, u64::from(ti), MSG - 12));
    m
}

impl Worker {
    fn c(&self) -> &PaxCounters {
        &self.train.pax
    }

    fn elapsed(&self) -> String {
        format!("{:.1}s", self.pax.t0.elapsed().as_secs_f64())
    }

    /// Sleep `d`; false if the passengers' time ended first.
    async fn sleep(&self, d: Duration) -> bool {
        let mut stop = self.pax.stop.clone();
        tokio::select! {
            _ = tokio::time::sleep(d) => !self.pax.stopped(),
            _ = stop.wait_for(|s| *s) => false,
        }
    }

    fn open(&self) -> Result<ConnStream, Failure> {
        let origin = self.pax.plan.origin;
        self.session.open(self.user, origin).map_err(|e| Failure::Broken(format!("open: {e}")))
    }

    async fn run_bulk(self, delay: Duration) {
        if self.sleep(delay).await {
            while !self.pax.stopped() {
                let key = self.pax.keys.fetch_add(1, Ordering::Relaxed) + 1;
                match self.download(key).await {
                    Ok(()) => {
                        self.c().bulk_done.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(Failure::Cut) => {
                        self.c().bulk_cut_at_end.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    Err(Failure::Broken(_)) if self.pax.stopped() => {
                        self.c().bulk_cut_at_end.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    Err(Failure::Broken(e)) => {
                        self.c().bulk_failed.fetch_add(1, Ordering::Relaxed);
                        self.c().fail(format!("{} bulk {key}: {e}", self.elapsed()));
                        if !self.sleep(Duration::from_millis(500)).await {
                            break;
                        }
                    }
                }
            }
        }
        self.pax.running.fetch_sub(1, Ordering::Relaxed);
    }

    async fn download(&self, key: u64) -> Result<(), Failure> {
        let (size, rate) = (self.pax.plan.bulk_size, self.pax.plan.bulk_rate);
        let mut s = self.open()?;
        s.write_all(&header(b'B', key, size, rate)).await?;
        self.c().bytes_up.fetch_add(17, Ordering::Relaxed);
        let mut stop = self.pax.stop.clone();
        let mut buf = vec![0u8; READ_BUF];
        let mut got = 0u64;
        loop {
            let n = tokio::select! {
                r = s.read(&mut buf) => r?,
                _ = stop.wait_for(|s| *s) => return Err(Failure::Cut),
            };
            if n == 0 {
                break;
            }
            if got + n as u64 > u64::from(size) || !pattern::matches(key, got, &buf[..n]) {
                self.c().corrupt.fetch_add(1, Ordering::Relaxed);
                return Err(Failure::Broken(format!("bytes {got}..{} differ from the origin's", got + n as u64)));
            }
            got += n as u64;
            self.c().bulk_bytes.fetch_add(n as u64, Ordering::Relaxed);
            self.pax.count_bytes(n);
        }
        if got != u64::from(size) {
            return Err(Failure::Broken(format!("{got} of {size} bytes, then EOF")));
        }
        // Both directions finished: the connection closes, not resets.
        s.shutdown().await?;
        Ok(())
    }

    async fn run_chat(self, delay: Duration, mut gaps: SplitMix64) {
        if self.sleep(delay).await {
            if let Err(Failure::Broken(e)) = self.chat(&mut gaps).await {
                if !self.pax.stopped() {
                    self.c().chat_failed.fetch_add(1, Ordering::Relaxed);
                    self.c().fail(format!("{} chat {e}", self.elapsed()));
                }
            }
        }
        self.pax.running.fetch_sub(1, Ordering::Relaxed);
    }

    async fn chat(&self, gaps: &mut SplitMix64) -> Result<(), Failure> {
        let mut s = self.open()?;
        s.write_all(&header(b'C', 0, 0, 0)).await?;
        self.c().bytes_up.fetch_add(17, Ordering::Relaxed);
        let ti = self.train.index as u32;
        let mut stop = self.pax.stop.clone();
        let mut back = [0u8; MSG];
        let mut seq = 0u64;
        loop {
            let gap = Duration::from_secs_f64(gaps.exponential(self.pax.plan.chat_gap_s));
            if !self.sleep(gap).await {
                break;
            }
            seq += 1;
            let msg = chat_message(ti, seq);
            let t = Instant::now();
            s.write_all(&msg).await?;
            self.c().bytes_up.fetch_add(MSG as u64, Ordering::Relaxed);
            tokio::select! {
                r = s.read_exact(&mut back) => { r?; }
                _ = stop.wait_for(|s| *s) => break,
            }
            if back[..] != msg[..] {
                self.c().corrupt.fetch_add(1, Ordering::Relaxed);
                return Err(Failure::Broken(format!("{ti}/{seq}: the answer differs")));
            }
            self.pax.rtts_ms.lock().unwrap_or_else(|e| e.into_inner()).push(t.elapsed().as_secs_f32() * 1000.0);
            self.c().chat_ok.fetch_add(1, Ordering::Relaxed);
        }
        // Leave as a passenger does: our FIN, then the origin's.
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            s.shutdown().await?;
            let mut sink = [0u8; MSG];
            while s.read(&mut sink).await? > 0 {}
            Ok::<(), std::io::Error>(())
        })
        .await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_and_messages_are_the_python_passengers() {
        // struct.pack("!cQII", b"B", 7, 65536, 8192)
        let h = header(b'B', 7, 65_536, 8_192);
        assert_eq!(
            h.to_vec(),
            [b"B".as_slice(), &7u64.to_be_bytes(), &65_536u32.to_be_bytes(), &8_192u32.to_be_bytes()].concat()
        );
        // struct.pack("!IQ", ti, seq) + pattern(seq, ti, MSG - 12)
        let m = chat_message(3, 9);
        assert_eq!(m.len(), MSG);
        assert_eq!(m[..12], [[0, 0, 0, 3].as_slice(), &9u64.to_be_bytes()].concat()[..]);
        assert_eq!(m[12..], pattern::pattern(9, 3, MSG - 12)[..]);
    }
}
