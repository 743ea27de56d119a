//! The plan: which trains to simulate, where their proxies are, and the
//! load they carry (JSON, written by the orchestrator,
//! `python -m polycorn_benchrun.fleet --sim`, or, for the plane mode
//! without proxies, `python -m polycorn_benchrun.fleet_plane`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use serde::Deserialize;

/// What `--plan` names.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// The CA that signs the proxies' certificates (PEM); not used in the
    /// plane mode (`--direct-kafka`), which has no proxies.
    #[serde(default)]
    pub ca: Option<PathBuf>,
    /// The name the proxies' certificates carry [default: proxy.polycorn].
    #[serde(default = "default_proxy_name")]
    pub proxy_name: String,
    /// Subflows (carriers) per train, named carrier-0, carrier-1, ...; carrier k
    /// of the trip is path k [default: 2].
    #[serde(default = "default_paths")]
    pub paths: usize,
    /// The relay's `--scheduler` [default: the relay's default].
    #[serde(default)]
    pub scheduler: Option<String>,
    /// The relay's `--subflow-cc` [default: the relay's default].
    #[serde(default)]
    pub subflow_cc: Option<String>,
    /// A polycorn-tracegen trip's events.jsonl: every train replays it as its
    /// radio source (GPS fixes, cell samples, handovers), each from its own
    /// `epoch_unix_ms`. Without it, no telemetry.
    #[serde(default)]
    pub events: Option<PathBuf>,
    /// Where each train's durable telemetry spool lives (a directory per
    /// train, created). A tmpfs keeps the simulator's fsyncs off the disk.
    /// Not used in the plane mode (no spool: records go straight to Kafka).
    #[serde(default)]
    pub spool_dir: Option<PathBuf>,
    /// Spool size bound per train, bytes [default: the relay's].
    #[serde(default)]
    pub spool_max_bytes: Option<u64>,
    /// The trains start one after the other over this long, seconds, so that
    /// their handshakes do not all land at once [default: 0].
    #[serde(default)]
    pub start_spread_s: f64,
    pub trains: Vec<TrainPlan>,
    /// Passenger traffic; none without it.
    #[serde(default)]
    pub passengers: Option<PassengerPlan>,
}

/// One train.
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct TrainPlan {
    /// Its train id (its certificate's).
    pub id: String,
    /// Its proxy's subflow address; every path dials it (not in the plane mode).
    #[serde(default)]
    pub proxy: Option<SocketAddr>,
    /// The train's certificate and key (PEM), e.g. `polycorn-pki dev`'s
    /// `<id>.crt`, `<id>.key` (not in the plane mode).
    #[serde(default)]
    pub cert: Option<PathBuf>,
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// Unix ms of its trip's time zero: where on the trip it is.
    #[serde(default)]
    pub epoch_unix_ms: i64,
}

/// The passengers of every train, as `polycorn_benchrun.fleet_traffic` runs
/// them through the real relays.
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct PassengerPlan {
    /// The origin (`fleet_traffic origin`), reached through each train's proxy.
    pub origin: SocketAddr,
    /// Connections per train.
    pub conns: usize,
    /// Of them, downloads (back to back, each a fresh connection); the rest chat.
    pub bulk: usize,
    /// Bytes per second of one download (the origin paces it).
    pub bulk_rate: u32,
    /// Bytes of one download.
    pub bulk_size: u32,
    /// Mean gap between a chat connection's messages, seconds (exponential).
    pub chat_gap_s: f64,
    /// Each connection starts at a uniform random time within this long, seconds.
    pub ramp_s: f64,
    /// The passengers stop this long after they started, seconds.
    pub seconds: f64,
    /// Passengers (source identities) per train, the connections spread over them.
    #[serde(default = "default_passengers_per_train")]
    pub passengers_per_train: usize,
    /// The passengers start once every train has had all its subflows up,
    /// or this long after the start at the latest, seconds [default: 120].
    #[serde(default = "default_start_within_s")]
    pub start_within_s: f64,
    /// Start the passengers at SIGUSR1 instead (an orchestrator that starts
    /// its measurement clock with them) [default: false].
    #[serde(default)]
    pub start_on_sigusr1: bool,
    /// Seed of the ramp and the chat gaps.
    #[serde(default)]
    pub seed: u64,
}

fn default_proxy_name() -> String {
    "proxy.polycorn".into()
}

fn default_paths() -> usize {
    2
}

fn default_passengers_per_train() -> usize {
    10
}

fn default_start_within_s() -> f64 {
    120.0
}

impl Plan {
    /// Read and check a plan file: for trains with proxies, or with `plane`
    /// for the plane mode (no proxies, no certificates, no spool, no
    /// passengers).
    pub fn load(file: &Path, plane: bool) -> anyhow::Result<Plan> {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let plan: Plan =
            serde_json::from_str(&text).with_context(|| format!("{}: not a fleetsim plan", file.display()))?;
        plan.check(plane).with_context(|| format!("plan {}", file.display()))?;
        Ok(plan)
    }

    fn check(&self, plane: bool) -> anyhow::Result<()> {
        if plane {
            if self.passengers.is_some() {
                bail!("the plane mode has no passengers (no proxies to carry them)");
            }
        } else {
            if self.ca.is_none() || self.spool_dir.is_none() {
                bail!("ca and spool_dir are needed (only the plane mode, --direct-kafka, goes without)");
            }
            if let Some(t) = self.trains.iter().find(|t| t.proxy.is_none() || t.cert.is_none() || t.key.is_none()) {
                bail!("train {} needs its proxy, cert and key (only the plane mode goes without)", t.id);
            }
        }
        if self.paths == 0 || self.paths > polycorn_core::MAX_PATHS {
            bail!("paths must be 1 to {}", polycorn_core::MAX_PATHS);
        }
        if self.trains.is_empty() {
            bail!("no trains");
        }
        let mut ids: Vec<&str> = self.trains.iter().map(|t| t.id.as_str()).collect();
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            bail!("train {} is listed twice", w[0]);
        }
        if let Some(t) = self.trains.iter().find(|t| t.id.is_empty() || t.id.contains(['/', '\0']) || t.id == "..") {
            bail!("train id {:?} cannot name a spool directory", t.id);
        }
        if !(self.start_spread_s.is_finite() && self.start_spread_s >= 0.0) {
            bail!("start_spread_s must be a number of seconds, 0 or more");
        }
        if let Some(p) = &self.passengers {
            if p.bulk > p.conns {
                bail!("passengers: bulk ({}) is more than conns ({})", p.bulk, p.conns);
            }
            if p.passengers_per_train == 0 {
                bail!("passengers: passengers_per_train must be at least 1");
            }
            for (name, v) in [("chat_gap_s", p.chat_gap_s), ("ramp_s", p.ramp_s), ("seconds", p.seconds)] {
                if !(v.is_finite() && v >= 0.0) {
                    bail!("passengers: {name} must be a number of seconds, 0 or more");
                }
            }
            if p.bulk > 0 && (p.bulk_rate == 0 || p.bulk_size == 0) {
                bail!("passengers: downloads need a bulk_rate and a bulk_size above 0");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(extra: &str) -> anyhow::Result<Plan> {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("plan.json");
        std::fs::write(
            &f,
            format!(
                r#"{{"ca": "ca.crt", "spool_dir": "/tmp/s", "trains": [
                  {{"id": "train-a", "proxy": "127.0.0.1:4433", "cert": "a.crt", "key": "a.key", "epoch_unix_ms": 5}},
                  {{"id": "train-b", "proxy": "127.0.0.1:4434", "cert": "b.crt", "key": "b.key"}}]{extra}}}"#
            ),
        )
        .unwrap();
        Plan::load(&f, false)
    }

    #[test]
    fn a_plan_reads_with_its_defaults() {
        let p = plan("").unwrap();
        assert_eq!((p.paths, p.proxy_name.as_str(), p.trains.len()), (2, "proxy.polycorn", 2));
        assert_eq!(p.trains[0].epoch_unix_ms, 5);
        assert!(p.passengers.is_none() && p.events.is_none());
        let p = plan(
            r#", "passengers": {"origin": "127.0.0.2:9", "conns": 5, "bulk": 1, "bulk_rate": 8192,
                "bulk_size": 65536, "chat_gap_s": 5, "ramp_s": 1, "seconds": 10}"#,
        )
        .unwrap();
        let pax = p.passengers.unwrap();
        assert_eq!((pax.conns, pax.passengers_per_train, pax.start_within_s), (5, 10, 120.0));
    }

    #[test]
    fn the_plane_mode_needs_no_proxy_certificate_or_spool_and_takes_no_passengers() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("plan.json");
        std::fs::write(&f, r#"{"trains": [{"id": "train-a", "epoch_unix_ms": 5}]}"#).unwrap();
        assert!(Plan::load(&f, true).is_ok());
        let e = format!("{:#}", Plan::load(&f, false).unwrap_err());
        assert!(e.contains("only the plane mode"), "{e}");
        std::fs::write(
            &f,
            r#"{"trains": [{"id": "train-a"}], "passengers": {"origin": "127.0.0.2:9", "conns": 1, "bulk": 0,
                "bulk_rate": 1, "bulk_size": 1, "chat_gap_s": 1, "ramp_s": 1, "seconds": 1}}"#,
        )
        .unwrap();
        assert!(format!("{:#}", Plan::load(&f, true).unwrap_err()).contains("no passengers"));
    }

    #[test]
    fn a_wrong_plan_is_refused_with_its_reason() {
        let e = |extra: &str| format!("{:#}", plan(extra).unwrap_err());
        assert!(e(r#", "paths": 0"#).contains("paths must be"));
        assert!(e(r#", "pahts": 2"#).contains("unknown field"));
        assert!(e(r#", "passengers": {"origin": "127.0.0.2:9", "conns": 1, "bulk": 2, "bulk_rate": 1, "bulk_size": 1, "chat_gap_s": 1, "ramp_s": 1, "seconds": 1}"#)
            .contains("more than conns"));
    }
}
