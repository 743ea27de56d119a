//! The shell around the durable telemetry spool
//! ([`polycorn_telemetry::spool`]): [`radio::apply`](crate::radio::apply)
//! appends records, [`sender`] sends them from the spool with top priority on
//! every live path (again after a timeout, and at once when a path comes
//! up), acknowledgements from the proxy remove them, and [`write_metrics`]
//! exports the counters.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use polycorn_net::metrics::Writer;
use polycorn_net::Session;
use polycorn_telemetry::spool::{Class, Spool, SpoolConfig};
use tokio::sync::{watch, Notify};
use tracing::warn;

/// Default `--telemetry-spool`.
pub const DEFAULT_DIR: &str = "/var/lib/polycorn/spool";
/// Default `--telemetry-spool-max-bytes` (64 MiB: days of samples at 1 Hz).
pub const DEFAULT_MAX_BYTES: u64 = 64 << 20;
/// Smallest `--telemetry-spool-max-bytes` accepted.
pub const MIN_MAX_BYTES: u64 = 64 << 10;
/// Samples are fsynced at least this often; handover events at once.
const SYNC_EVERY: Duration = Duration::from_secs(1);
/// Records handed to the endpoint per round.
const BATCH: usize = 64;

/// The spool shared by the radio task, the sender and the event loop.
pub struct Shared {
    spool: Mutex<Spool>,
    /// Something became sendable (an append, an ack freeing window room).
    wake: Notify,
    /// A handover event waits for its fsync.
    urgent_sync: AtomicBool,
    /// Appends and syncs that failed (disk full, IO errors).
    errors: AtomicU64,
}

impl Shared {
    /// Open the spool in `dir` (see `docs/telemetry.md`).
    pub fn open(dir: &Path, max_bytes: u64) -> anyhow::Result<Arc<Shared>> {
        let spool = Spool::open(dir, SpoolConfig::with_max_bytes(max_bytes))?;
        if let Some(w) = spool.open_warning() {
            warn!(dir = %dir.display(), error = %w, "telemetry spool: acks.log not compacted (the spool works without it)");
        }
        let st = spool.stats();
        tracing::info!(dir = %dir.display(), records = st.records, bytes = st.bytes, next_seq = st.next_seq,
            truncated_bytes = st.truncated_bytes, "telemetry spool opened");
        Ok(Arc::new(Shared {
            spool: Mutex::new(spool),
            wake: Notify::new(),
            urgent_sync: AtomicBool::new(false),
            errors: AtomicU64::new(0),
        }))
    }

    /// Its sizes and counters.
    pub fn stats(&self) -> polycorn_telemetry::spool::SpoolStats {
        self.lock().stats()
    }

    /// When the record in flight that has waited longest for its
    /// confirmation was first sent (see [`Spool::oldest_in_flight_since`]).
    pub fn oldest_in_flight_since(&self) -> Option<Instant> {
        self.lock().oldest_in_flight_since()
    }

    /// Appends, reads, acknowledgements and fsyncs that failed.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// The spool's directory.
    pub fn dir(&self) -> std::path::PathBuf {
        self.lock().dir().to_path_buf()
    }

    fn lock(&self) -> MutexGuard<'_, Spool> {
        self.spool.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Store a record for sending; returns its seq (None: dropped by the
    /// size bound, or the disk refused it, which is logged and counted).
    pub fn append(&self, payload: &[u8], class: Class) -> Option<u64> {
        let r = self.lock().append(payload, class);
        match r {
            Ok(seq) => {
                if class == Class::Handover {
                    self.urgent_sync.store(true, Ordering::Relaxed);
                }
                self.wake.notify_one();
                seq
            }
            Err(e) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                warn!(error = %e, "telemetry record not spooled");
                None
            }
        }
    }

    /// The proxy confirmed `seq` (Kafka has it).
    pub fn ack(&self, seq: u64) {
        let r = self.lock().ack(seq);
        match r {
            Ok(_) => self.wake.notify_one(),
            Err(e) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                warn!(seq, error = %e, "telemetry acknowledgement not recorded");
            }
        }
    }

    async fn sync(self: &Arc<Self>) {
        // Take the work under the lock, fsync without it: appends go on.
        let work = self.lock().sync_work();
        let r = match work {
            Ok(w) => tokio::task::spawn_blocking(move || w.run()).await.unwrap_or(Ok(())),
            Err(e) => Err(e),
        };
        if let Err(e) = r {
            self.errors.fetch_add(1, Ordering::Relaxed);
            warn!(error = %e, "telemetry spool fsync failed");
        }
    }
}

/// Send spooled records to the proxy until `stop`.
pub async fn sender(shared: Arc<Shared>, session: Session, mut stop: watch::Receiver<bool>) {
    let mut prev_paths_up = 0u64;
    let mut last_sync = Instant::now();
    loop {
        let (up, paths_up) = session.with(|st, _| (st.ep.up_paths(), st.ep.stats().paths_up));
        if paths_up != prev_paths_up {
            // A path came (back) up: whatever was in flight may have died
            // with the paths that carried it.
            shared.lock().resend_now();
        }
        let mut more = false;
        if !up.is_empty() {
            let r = shared.lock().next_to_send(Instant::now(), BATCH);
            match r {
                Ok(out) => {
                    more = out.len() == BATCH;
                    if !out.is_empty() {
                        let refused: Vec<(u64, usize)> = session.with(|st, _| {
                            out.into_iter()
                                .filter_map(|o| {
                                    let len = o.payload.len();
                                    st.ep.send_telemetry(o.seq, o.payload.into()).err().map(|_| (o.seq, len))
                                })
                                .collect()
                        });
                        // Only a spool written by an older version holds a
                        // record too large for a frame: it can never be
                        // sent, so it is dropped, loudly.
                        for (seq, len) in refused {
                            shared.errors.fetch_add(1, Ordering::Relaxed);
                            warn!(seq, bytes = len, "dropping a spooled telemetry record too large to send");
                            if let Err(e) = shared.lock().ack(seq) {
                                warn!(error = %e, "dropping a telemetry record from the spool");
                            }
                        }
                    }
                }
                Err(e) => {
                    shared.errors.fetch_add(1, Ordering::Relaxed);
                    warn!(error = %e, "reading the telemetry spool");
                }
            }
        }
        prev_paths_up = paths_up;
        if shared.urgent_sync.swap(false, Ordering::Relaxed) || last_sync.elapsed() >= SYNC_EVERY {
            shared.sync().await;
            last_sync = Instant::now();
        }
        if more {
            tokio::task::yield_now().await;
            continue;
        }
        // Wake for: a new record or an ack, the next resend deadline, and a
        // periodic look at the paths and the fsync interval.
        let mut wait = Duration::from_millis(200);
        if let Some(d) = shared.lock().poll_timeout() {
            wait = wait.min(d.saturating_duration_since(Instant::now()));
        }
        tokio::select! {
            _ = shared.wake.notified() => {}
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => {
                shared.sync().await;
                return;
            }
        }
    }
}

/// Spool sizes and counters, `polycorn_telemetry_spool_*`.
pub fn write_metrics(w: &mut Writer, shared: &Shared) {
    let s = shared.stats();
    let oldest = shared.oldest_in_flight_since();
    w.gauge(
        "polycorn_telemetry_spool_records",
        "Telemetry records spooled and not yet confirmed.",
        vec![],
        s.records as f64,
    );
    w.gauge("polycorn_telemetry_spool_bytes", "Telemetry spool segment bytes on disk.", vec![], s.bytes as f64);
    w.gauge(
        "polycorn_telemetry_spool_in_flight",
        "Telemetry records sent and awaiting confirmation.",
        vec![],
        s.in_flight as f64,
    );
    w.gauge(
        "polycorn_telemetry_spool_oldest_in_flight_seconds",
        "How long the record in flight that has waited longest has awaited its confirmation since first sent (0: none in flight); past the resend timeout (5 s), confirmations are being lost.",
        vec![],
        oldest.map_or(0.0, |t| t.elapsed().as_secs_f64()),
    );
    for c in Class::ALL {
        w.counter(
            "polycorn_telemetry_spool_dropped",
            "Telemetry records dropped unconfirmed by the spool's size bound (oldest samples first, handover events last).",
            vec![("class".into(), c.name().into())],
            s.dropped[c as usize] as f64,
        );
    }
    w.counter(
        "polycorn_telemetry_spool_acked",
        "Telemetry records the proxy confirmed (Kafka has them).",
        vec![],
        s.acked as f64,
    );
    w.counter(
        "polycorn_telemetry_spool_resent",
        "Telemetry records sent again (timeout or a path coming up).",
        vec![],
        s.resent as f64,
    );
    w.counter(
        "polycorn_telemetry_spool_errors",
        "Telemetry spool appends, reads and fsyncs that failed.",
        vec![],
        shared.errors.load(Ordering::Relaxed) as f64,
    );
}
