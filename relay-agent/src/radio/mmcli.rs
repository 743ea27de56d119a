//! ModemManager as the serving-cell source: every interval, for each
//! configured modem, run `mmcli -m N -J`, `mmcli -m N --location-get -J`
//! and `mmcli -m N --signal-get -J`, parse them (`polycorn_telemetry::mmcli`)
//! and send the path's signal sample and radio-state observation to the
//! detection stage. At start it asks each modem for 3GPP location and
//! signal refresh (`--location-enable-3gpp`, `--signal-setup=SECONDS`),
//! without which those commands print nothing useful.
//!
//! The command is configurable (`--mmcli`) so that tests, and machines
//! whose ModemManager is reached differently, can substitute it. A command
//! that fails, hangs (5 s) or prints garbage is logged with what to check,
//! counted (`polycorn_radio_mmcli_errors_total`), and that poll is skipped:
//! an unusable poll is not evidence that the modem lost service.

use std::sync::Arc;
use std::time::Duration;

use polycorn_core::PathId;
use polycorn_telemetry::mmcli::{cell_sample, observation, parse_location, parse_modem, parse_signal};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use super::detect::{RadioCounters, SourceEvent};
use super::RadioEvent;

/// One modem and the path its interface carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModemSpec {
    pub path: PathId,
    /// The path's name (`--path NAME=...`).
    pub name: String,
    /// mmcli's modem selector: its index, e.g. `0`.
    pub modem: String,
}

/// Parse `--modem PATH_NAME=MODEM_INDEX` against the configured path names.
pub fn parse_modem_spec(s: &str, path_names: &[String]) -> anyhow::Result<ModemSpec> {
    let (name, modem) = s
        .split_once('=')
        .filter(|(n, m)| !n.is_empty() && !m.is_empty())
        .ok_or_else(|| anyhow::anyhow!("--modem {s:?}: expected PATH_NAME=MODEM_INDEX, e.g. carrier-a=0"))?;
    let i = path_names
        .iter()
        .position(|p| p == name)
        .ok_or_else(|| anyhow::anyhow!("--modem {s:?}: no --path named {name:?} (paths: {})", path_names.join(", ")))?;
    Ok(ModemSpec { path: PathId(i as u8), name: name.to_string(), modem: modem.to_string() })
}

/// Options of the mmcli source.
#[derive(Clone, Debug)]
pub struct MmcliOpts {
    /// The mmcli program.
    pub cmd: String,
    pub modems: Vec<ModemSpec>,
    pub interval: Duration,
}

async fn mmcli(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = tokio::process::Command::new(cmd).args(args).kill_on_drop(true).output();
    match tokio::time::timeout(Duration::from_secs(5), out).await {
        Err(_) => Err(format!("`{cmd} {}` timed out after 5 s", args.join(" "))),
        Ok(Err(e)) => Err(format!("running `{cmd}` failed: {e} (is ModemManager's mmcli installed? --mmcli sets it)")),
        Ok(Ok(o)) if !o.status.success() => Err(format!(
            "`{cmd} {}` exited with {}: {}",
            args.join(" "),
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Ok(Ok(o)) => Ok(String::from_utf8_lossy(&o.stdout).into_owned()),
    }
}

/// One poll of one modem: the events to send, or what went wrong.
async fn poll(cmd: &str, m: &ModemSpec) -> Result<Vec<SourceEvent>, String> {
    let t = super::now_unix_ms();
    let id = m.modem.as_str();
    let status = parse_modem(&mmcli(cmd, &["-m", id, "-J"]).await?).map_err(|e| e.to_string())?;
    let cell = parse_location(&mmcli(cmd, &["-m", id, "--location-get", "-J"]).await?).map_err(|e| e.to_string())?;
    // No signal is no RSRP, not a failed poll: older modems lack it.
    let signal = match mmcli(cmd, &["-m", id, "--signal-get", "-J"])
        .await
        .and_then(|s| parse_signal(&s).map_err(|e| e.to_string()))
    {
        Ok(s) => s,
        Err(e) => {
            debug!(modem = id, error = %e, "no signal from mmcli");
            Default::default()
        }
    };
    let obs = observation(t, &status, &cell, signal);
    let sample = cell_sample(u32::from(m.path.0), &m.name, &obs);
    Ok(vec![
        SourceEvent::Radio(RadioEvent::Signal { time_unix_ms: t, sample }),
        SourceEvent::Observed { path: m.path, obs },
    ])
}

/// Poll every modem every `opts.interval` into `tx` until `stop`.
pub async fn run(
    opts: MmcliOpts,
    tx: mpsc::Sender<SourceEvent>,
    counters: Arc<RadioCounters>,
    mut stop: watch::Receiver<bool>,
) {
    let refresh_s = opts.interval.as_secs().max(1).to_string();
    for m in &opts.modems {
        for args in [
            vec!["-m", &m.modem, "--location-enable-3gpp"],
            vec!["-m", &m.modem, &format!("--signal-setup={refresh_s}")],
        ] {
            if let Err(e) = mmcli(&opts.cmd, &args).await {
                warn!(modem = %m.modem, path = %m.name, error = %e, "mmcli setup step failed; cell or signal may stay unknown");
            }
        }
    }
    info!(modems = opts.modems.len(), interval_ms = opts.interval.as_millis() as u64, cmd = %opts.cmd, "mmcli source started");
    let mut failing = vec![0u64; opts.modems.len()];
    let mut tick = tokio::time::interval(opts.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        for (i, m) in opts.modems.iter().enumerate() {
            match poll(&opts.cmd, m).await {
                Ok(events) => {
                    RadioCounters::add(&counters.mmcli_polls, 1);
                    if failing[i] > 0 {
                        info!(modem = %m.modem, path = %m.name, after = failing[i], "mmcli polls work again");
                        failing[i] = 0;
                    }
                    for e in events {
                        if tx.send(e).await.is_err() {
                            return;
                        }
                    }
                }
                Err(e) => {
                    RadioCounters::add(&counters.mmcli_errors, 1);
                    failing[i] += 1;
                    // Log the first failures, then sparsely.
                    if failing[i] <= 3 || failing[i].is_power_of_two() {
                        warn!(modem = %m.modem, path = %m.name, consecutive = failing[i], error = %e, "mmcli poll failed; skipped");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use polycorn_telemetry::v1;
    use std::sync::atomic::Ordering;

    #[test]
    fn modem_specs_name_a_configured_path() {
        let names = vec!["carrier-a".to_string(), "carrier-b".to_string()];
        let m = parse_modem_spec("carrier-b=3", &names).unwrap();
        assert_eq!((m.path, m.name.as_str(), m.modem.as_str()), (PathId(1), "carrier-b", "3"));
        for bad in ["carrier-b", "=1", "carrier-b=", "carrier-c=1"] {
            let e = parse_modem_spec(bad, &names).unwrap_err().to_string();
            assert!(e.contains("--modem"), "{bad}: {e}");
        }
    }

    /// A stand-in for mmcli that steps through a handover scenario, one
    /// step per poll, printing the real-format fixtures: cell ...1D, cell
    /// ...1E (a handover), searching with no cell, cell ...1F (a failed
    /// handover), then garbage forever.
    fn fake_mmcli(dir: &std::path::Path) -> std::path::PathBuf {
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/telemetry/tests/data/mmcli");
        let script = format!(
            r#"#!/bin/sh
F="{f}"
D="{d}"
echo "$*" >> "$D/calls"
case "$*" in *--location-enable-3gpp*|*--signal-setup*) exit 0;; esac
n=$(cat "$D/step" 2>/dev/null || echo 0)
case "$n" in 0) cid=0A3B5C1D;; 1) cid=0A3B5C1E;; 3) cid=0A3B5C1F;; esac
case "$*" in
  *--location-get*)
    if [ "$n" = 2 ]; then cat "$F/location-none.json"; else sed "s/0A3B5C1D/$cid/" "$F/location.json"; fi ;;
  *--signal-get*)
    echo $((n + 1)) > "$D/step"
    cat "$F/signal.json" ;;
  *)
    if [ "$n" -ge 4 ]; then echo "error: couldn't find modem" >&2; exit 1; fi
    if [ "$n" = 2 ]; then cat "$F/modem-searching.json"; else cat "$F/modem-connected.json"; fi ;;
esac
"#,
            f = fixtures.display(),
            d = dir.display()
        );
        let p = dir.join("mmcli");
        std::fs::write(&p, script).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[tokio::test]
    async fn a_fake_mmcli_scenario_yields_a_success_then_a_failure_and_counts_garbage() {
        let dir = std::env::temp_dir().join(format!("polycorn-mmcli-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let cmd = fake_mmcli(&dir).display().to_string();
        let modems = vec![ModemSpec { path: PathId(1), name: "carrier-b".into(), modem: "0".into() }];
        let opts = MmcliOpts { cmd, modems, interval: Duration::from_millis(5) };
        let counters = Arc::new(RadioCounters::default());
        let (src_tx, src_rx) = mpsc::channel(64);
        let (tx, mut rx) = mpsc::channel(64);
        let (stop_tx, stop) = watch::channel(false);
        let names = vec!["carrier-a".to_string(), "carrier-b".to_string()];
        let stage = super::super::detect::DetectStage::new(Default::default(), names, counters.clone());
        tokio::spawn(super::super::detect::run(stage, src_rx, tx));
        let source = tokio::spawn(run(opts, src_tx, counters.clone(), stop));

        let mut cells = Vec::new();
        let mut handovers = Vec::new();
        let mut samples = 0;
        while handovers.len() < 2 {
            match tokio::time::timeout(Duration::from_secs(30), rx.recv()).await.expect("events").expect("open") {
                RadioEvent::Cell { path, cell_id, .. } => cells.push((path, cell_id)),
                RadioEvent::Handover { event, .. } => handovers.push(event),
                RadioEvent::Signal { sample, .. } => {
                    assert_eq!((sample.path, sample.carrier.as_str()), (1, "carrier-b"));
                    samples += 1;
                }
                RadioEvent::Gps { .. } => unreachable!(),
            }
        }
        assert_eq!(
            cells,
            vec![(PathId(1), 0x0A3B_5C1D), (PathId(1), 0x0A3B_5C1E), (PathId(1), 0), (PathId(1), 0x0A3B_5C1F)]
        );
        assert_eq!(samples, 4);
        let o = |e: &v1::HandoverEvent| (e.outcome, e.source_cell_id, e.target_cell_id, e.rsrp_dbm, e.carrier.clone());
        assert_eq!(
            o(&handovers[0]),
            (v1::HandoverOutcome::Success as i32, 0x0A3B_5C1D, 0x0A3B_5C1E, Some(-98.0), "carrier-b".into())
        );
        assert_eq!(
            o(&handovers[1]),
            (v1::HandoverOutcome::Failure as i32, 0x0A3B_5C1E, 0x0A3B_5C1F, Some(-98.0), "carrier-b".into())
        );
        // Then mmcli fails: counted, logged, and nothing crashes.
        while counters.mmcli_errors.load(Ordering::Relaxed) < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(counters.mmcli_polls.load(Ordering::Relaxed), 4);
        stop_tx.send(true).unwrap();
        source.await.unwrap();
        let calls = std::fs::read_to_string(dir.join("calls")).unwrap();
        assert!(calls.starts_with("-m 0 --location-enable-3gpp\n-m 0 --signal-setup=1\n-m 0 -J\n"), "{calls}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
