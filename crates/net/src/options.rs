//! The options the relay-agent and the proxy share, declared once
//! ([`CommonOpts`], flattened into each binary's own options), and the one
//! way both read them: flags, then `POLYCORN_<BINARY>_<FLAG>` environment
//! variables, then the TOML file of `--config` (earlier wins; [`read`]).
//!
//! Environment variable names follow one rule, so neither binary spells
//! them out: the option's name (its field) in upper case, after the
//! binary's prefix (`--failure-table-url` is `POLYCORN_RELAY_FAILURE_TABLE_URL`
//! and `POLYCORN_PROXY_FAILURE_TABLE_URL`; the relay's repeatable `--path`
//! is the field `paths`, so `POLYCORN_RELAY_PATHS`). An option that names
//! its variable itself keeps it.
//! Config-file keys are the long flag names; a key no flag has is an error,
//! so a typo never passes silently.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::config::{BufferOptions, PipelineToml, Scheduler};
use crate::segtrace::TraceOptions;
use crate::subflow::{Congestion, Transport};
use crate::table::http::HttpOpts;
use crate::table::signature::Verifier;
use crate::Error;

/// Options of both binaries. Help texts name what differs by role in
/// terms of "this endpoint" and "the peer"; a binary may replace a text
/// ([`command`]'s `help`).
#[derive(clap::Args, serde::Deserialize, Default, Debug, Clone)]
#[serde(rename_all = "kebab-case")]
pub struct CommonOpts {
    /// TOML file with any of these options (keys as the long flag names).
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// The train: the relay's own id (its certificate must carry it), the
    /// one train a proxy serves.
    #[arg(long)]
    pub train_id: Option<String>,
    /// CA certificate that signs the peer's certificate (PEM).
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// This endpoint's certificate (PEM).
    #[arg(long)]
    pub cert: Option<PathBuf>,
    /// This endpoint's private key (PEM).
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// Scheduler of what this endpoint sends (the relay: uplink, the proxy:
    /// downlink): a built-in composition (--list-schedulers) or one under
    /// [pipelines] in the config file [default: hrsch+, HRSCH with the
    /// stale filter and the tail rules].
    #[arg(long)]
    pub scheduler: Option<String>,
    /// Print the built-in compositions --scheduler takes, one name a line,
    /// and exit.
    #[arg(long)]
    #[serde(skip)]
    pub list_schedulers: bool,
    /// `tls` (one TLS subflow per train interface), `quic` (one QUIC
    /// subflow per interface, each falling back to TLS on its own when UDP
    /// does not get through; a proxy at `quic` accepts both), `kernel-mptcp` (one
    /// MPTCP connection scheduled by the kernel, carrying every passenger
    /// connection) or `kernel-mptcp-conn` (each passenger connection its own
    /// MPTCP connection with TLS, as OpenMPTCProuter runs it: no session,
    /// scheduler or telemetry) [default: tls].
    #[arg(long)]
    pub transport: Option<String>,
    /// Kernel congestion control of the sockets facing the peer (TLS
    /// subflows, MPTCP connections and their subflows): an algorithm name
    /// (`TCP_CONGESTION`), or `kernel` for the kernel's default. When the
    /// kernel lacks it, a warning and the default [default: bbr].
    #[arg(long)]
    pub subflow_cc: Option<String>,
    /// Congestion control of the QUIC subflows: `railway` (ours, with the
    /// radio's handover hints), `railway-nohints`, either with `-q<ms>`
    /// for another standing queue than its default (more of a fading
    /// carrier used, for more delay), or quinn's `bbr`, `cubic`, `newreno`
    /// [default: railway].
    #[arg(long)]
    pub quic_cc: Option<String>,
    /// Most bytes a passenger connection's receive window grows to:
    /// windows start at --conn-window-initial and double while the window is
    /// what limits the connection (docs/architecture.md, "Flow control and
    /// memory") [default: 8388608].
    #[arg(long)]
    pub conn_window: Option<u64>,
    /// Receive window a passenger connection starts with; equal to
    /// --conn-window, windows are fixed [default: 1048576].
    #[arg(long)]
    pub conn_window_initial: Option<u64>,
    /// Most bytes a passenger connection holds on its send side: read from
    /// the passenger and not yet acknowledged by the peer [default: 8388608].
    #[arg(long)]
    pub conn_send_buffer: Option<u64>,
    /// Failure-location table (JSON, docs/schedulerlets.md "HRSCH") for
    /// handover-failure-aware path rejection of what this endpoint sends;
    /// reloaded when the file changes (a malformed new file is refused, the
    /// old table kept).
    #[arg(long)]
    pub failure_table: Option<PathBuf>,
    /// Poll the LinkDB API for the failure-location table, e.g.
    /// `https://linkdb.example/v1/failure-table` (a URL without a path gets
    /// `/v1/failure-table`), with If-None-Match; a table is used when its
    /// version is higher than the one in use. With --failure-table too, the
    /// file may still replace the table with any version when it changes.
    #[arg(long)]
    pub failure_table_url: Option<String>,
    /// Seconds between polls of --failure-table-url [default: 30].
    #[arg(long)]
    pub failure_table_poll_s: Option<f64>,
    /// File holding the LinkDB API key sent as `X-API-Key` with --failure-table-url.
    #[arg(long)]
    pub failure_table_api_key_file: Option<PathBuf>,
    /// Send the API key over a plain http:// --failure-table-url to a host
    /// that is not loopback (refused at start-up without it): only where
    /// the network to the API is trusted, e.g. a Service inside the cluster.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub failure_table_insecure_http: Option<bool>,
    /// The trainer's table-signing public key(s) (PEM, `polycorn-pki
    /// table-key`; several PUBLIC KEY blocks while a key is rotated): every
    /// table, from the file (signature in FILE.sig), the API or Kafka, must
    /// carry a signature that one of them verifies, or it is refused and
    /// the table in use stays. Without it tables are accepted unsigned
    /// (warned at start).
    #[arg(long)]
    pub failure_table_verify_key: Option<PathBuf>,
    /// Directory (created if missing) where the highest failure-location
    /// table accepted (version and issue time) is kept across restarts:
    /// tables older than it are then refused from the API and Kafka (a
    /// replay). Without it, or on a first start with an empty directory,
    /// the first valid, unexpired table is taken whatever its version.
    #[arg(long)]
    pub failure_table_state_dir: Option<PathBuf>,
    /// Log as JSON lines.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub log_json: Option<bool>,
    /// Write a segment trace to DIR: every DATA frame sent and received
    /// with its path, acknowledgements, timeouts, stale paths and
    /// reinjections, and each path's state every 100 ms, as JSON lines
    /// (docs/benchmarks.md, "Where stalls come from"). Off by default.
    #[arg(long)]
    pub trace_dir: Option<PathBuf>,
    /// Stop the segment trace after this many bytes [default: 1 GiB].
    #[arg(long)]
    pub trace_max_bytes: Option<u64>,
    /// Custom pipelines (config file only).
    #[arg(skip)]
    #[serde(default)]
    pub pipelines: BTreeMap<String, PipelineToml>,
}

/// What [`CommonOpts`] turn into once checked.
#[derive(Debug)]
pub struct CommonSettings {
    pub train_id: String,
    /// `--scheduler`, checked: it composes.
    pub scheduler: Scheduler,
    /// Its first pipeline, built by the check.
    pub pipeline: polycorn_core::Pipeline,
    pub transport: Transport,
    /// `--subflow-cc`.
    pub congestion: Congestion,
    /// `--quic-cc`.
    pub quic_cc: crate::quic::QuicCc,
    /// `--failure-table-url` and its options.
    pub table_url: Option<HttpOpts>,
    /// `--failure-table-verify-key`: the keys tables must be signed with.
    pub table_verifier: Option<Verifier>,
    /// `--trace-dir` and `--trace-max-bytes`.
    pub trace: Option<TraceOptions>,
}

impl CommonOpts {
    /// Fill what flags and environment left unset from the file's options.
    pub fn merge(&mut self, file: &mut CommonOpts) {
        crate::merge_options!(self, file; train_id, ca, cert, key, scheduler, transport, subflow_cc, quic_cc, conn_window,
            conn_window_initial, conn_send_buffer, failure_table, failure_table_url, failure_table_poll_s,
            failure_table_api_key_file, failure_table_insecure_http, failure_table_verify_key, failure_table_state_dir, log_json, trace_dir,
            trace_max_bytes);
        if self.pipelines.is_empty() {
            self.pipelines = std::mem::take(&mut file.pipelines);
        }
    }

    /// The buffer options, with this binary's `--mem-budget`.
    pub fn buffers(&self, mem_budget: Option<u64>) -> BufferOptions {
        BufferOptions {
            conn_window: self.conn_window,
            conn_window_initial: self.conn_window_initial,
            conn_send_buffer: self.conn_send_buffer,
            mem_budget,
        }
    }

    /// The TLS material's paths (`--ca`, `--cert`, `--key`), each required.
    pub fn tls_files(&self) -> Result<(PathBuf, PathBuf, PathBuf), Error> {
        let need = |p: &Option<PathBuf>, flag: &str| p.clone().ok_or_else(|| Error::option(flag, "is required"));
        Ok((need(&self.ca, "--ca")?, need(&self.cert, "--cert")?, need(&self.key, "--key")?))
    }

    /// Check every shared option that can be checked before start.
    pub fn settings(&self) -> Result<CommonSettings, Error> {
        let train_id = self.train_id.clone().ok_or_else(|| Error::option("--train-id", "is required"))?;
        let name = self.scheduler.as_deref().unwrap_or(polycorn_core::sched::DEFAULT_PIPELINE);
        let (scheduler, pipeline) = Scheduler::resolve(name, &self.pipelines)?;
        let transport: Transport = self.transport.as_deref().unwrap_or("tls").parse()?;
        let congestion = self.subflow_cc.as_deref().map_or(Ok(Congestion::default()), str::parse)?;
        let quic_cc = self.quic_cc.as_deref().map_or(Ok(crate::quic::QuicCc::DEFAULT), str::parse)?;
        let table_url = HttpOpts::from_flags(
            self.failure_table_url.as_deref(),
            self.failure_table_poll_s,
            self.failure_table_api_key_file.as_deref(),
            self.failure_table_insecure_http.unwrap_or(false),
        )?;
        let table_verifier = Verifier::from_flag(self.failure_table_verify_key.as_deref())?;
        let trace = TraceOptions::from_flags(self.trace_dir.clone(), self.trace_max_bytes)?;
        Ok(CommonSettings {
            train_id,
            scheduler,
            pipeline,
            transport,
            congestion,
            quic_cc,
            table_url,
            table_verifier,
            trace,
        })
    }
}

/// The binary's command with every option that names no environment
/// variable given `POLYCORN_<prefix>_<FLAG>`, and the help texts in
/// `help` (`(flag id, text)`) replacing the shared ones.
pub fn command<T: clap::CommandFactory>(prefix: &str, help: &[(&'static str, &'static str)]) -> clap::Command {
    let mut cmd = T::command().mut_args(|a| {
        if a.get_env().is_some() || a.is_positional() || LISTINGS.contains(&a.get_id().as_str()) {
            return a;
        }
        let var = format!("POLYCORN_{prefix}_{}", a.get_id().as_str().to_ascii_uppercase());
        a.env(var)
    });
    for &(id, text) in help {
        cmd = cmd.mut_arg(id, |a| a.help(text));
    }
    cmd
}

/// Flags (ids) that print something and exit, as `--help` does: only on
/// the command line, never from the environment or the file.
pub const LISTINGS: &[&str] = &["list_schedulers"];

/// `--list-schedulers`: the built-in compositions, one name a line (for
/// scripts: the chart's schema is checked against it).
fn list_schedulers() -> ! {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let written = polycorn_core::sched::builtin_pipeline_names().try_for_each(|n| writeln!(out, "{n}"));
    std::process::exit(if written.and_then(|()| out.flush()).is_ok() { 0 } else { 1 })
}

/// The options of the command line and environment ([`command`]; clap's
/// message and exit on an error or for `--help`, as `Parser::parse` does;
/// the listing and exit for `--list-schedulers`),
/// and those of the file they name with `--config` ([`load_file`]; `config`
/// reads it from the parsed options): the caller merges the two, flags first.
pub fn read<T>(
    prefix: &str,
    help: &[(&'static str, &'static str)],
    config: impl FnOnce(&T) -> Option<&Path>,
) -> Result<(T, T), Error>
where
    T: clap::CommandFactory + clap::FromArgMatches + serde::de::DeserializeOwned + Default,
{
    let mut cmd = command::<T>(prefix, help);
    let matches = cmd.get_matches_mut();
    if matches.get_flag("list_schedulers") {
        list_schedulers();
    }
    let cli = T::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let file = load_file(config(&cli), &cmd)?;
    Ok((cli, file))
}

/// Read the options file (`None`: no file, every option unset). Its keys
/// are the long flag names of `cmd`, plus `pipelines`; any other key is an
/// error naming it.
pub fn load_file<T: serde::de::DeserializeOwned + Default>(
    path: Option<&Path>,
    cmd: &clap::Command,
) -> Result<T, Error> {
    let Some(path) = path else { return Ok(T::default()) };
    let table: toml::Table = crate::config::load_toml(Some(path))?;
    let known = |k: &str| {
        k == "pipelines"
            || (k != "config"
                && cmd.get_arguments().any(|a| a.get_long() == Some(k) && !LISTINGS.contains(&a.get_id().as_str())))
    };
    if let Some(k) = table.keys().find(|k| !known(k)) {
        return Err(Error::option(
            format!("config file {}", path.display()),
            format!("unknown key {k:?} (keys are the long flag names, e.g. train-id)"),
        ));
    }
    toml::Value::Table(table).try_into().map_err(|source| Error::ConfigSyntax { path: path.into(), source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// A binary's options as the relay and the proxy declare theirs.
    #[derive(Parser, serde::Deserialize, Default, Debug)]
    #[serde(rename_all = "kebab-case")]
    struct Opts {
        #[command(flatten)]
        #[serde(flatten)]
        common: CommonOpts,
        /// Own option.
        #[arg(long)]
        listen: Option<String>,
        /// Own option with its own variable name.
        #[arg(long = "path", env = "POLYCORN_TEST_PATHS", value_delimiter = ',')]
        #[serde(rename = "path")]
        paths: Option<Vec<String>>,
    }

    #[test]
    fn every_option_reads_its_variable_by_one_rule() {
        let cmd = command::<Opts>("TEST", &[("ca", "The trains' CA.")]);
        let env = |id: &str| {
            cmd.get_arguments()
                .find(|a| a.get_id() == id)
                .and_then(|a| a.get_env())
                .map(|e| e.to_str().unwrap().to_owned())
        };
        assert_eq!(env("failure_table_url").as_deref(), Some("POLYCORN_TEST_FAILURE_TABLE_URL"));
        assert_eq!(env("train_id").as_deref(), Some("POLYCORN_TEST_TRAIN_ID"));
        assert_eq!(env("config").as_deref(), Some("POLYCORN_TEST_CONFIG"));
        assert_eq!(env("listen").as_deref(), Some("POLYCORN_TEST_LISTEN"));
        assert_eq!(env("paths").as_deref(), Some("POLYCORN_TEST_PATHS"), "an explicit name is kept");
        assert_eq!(env("list_schedulers"), None, "a listing is asked for on the command line only");
        let ca = cmd.get_arguments().find(|a| a.get_id() == "ca").unwrap();
        assert_eq!(ca.get_help().map(ToString::to_string).as_deref(), Some("The trains' CA."));
        let m = cmd.try_get_matches_from(["x", "--subflow-cc", "cubic", "--listen", "a", "--path", "p,q"]).unwrap();
        let o = <Opts as clap::FromArgMatches>::from_arg_matches(&m).unwrap();
        assert_eq!(o.common.subflow_cc.as_deref(), Some("cubic"));
        assert_eq!(o.paths.map(|p| p.len()), Some(2));
    }

    #[test]
    fn the_file_takes_flag_names_and_refuses_others() {
        let dir = tempfile::tempdir().unwrap();
        let cmd = command::<Opts>("TEST", &[]);
        let file = |text: &str| {
            let p = dir.path().join("c.toml");
            std::fs::write(&p, text).unwrap();
            load_file::<Opts>(Some(&p), &cmd)
        };
        let o = file("train-id = \"t\"\nlisten = \"l\"\npath = [\"a\"]\nconn-window = 65536\n[pipelines.p]\nschedulerlets = [\"minrtt\"]\n").unwrap();
        assert_eq!(o.common.train_id.as_deref(), Some("t"));
        assert_eq!(o.common.conn_window, Some(65536));
        assert_eq!(o.listen.as_deref(), Some("l"));
        assert_eq!(o.common.pipelines.len(), 1);
        let e = file("trian-id = \"x\"\n").unwrap_err().to_string();
        assert!(e.contains("unknown key \"trian-id\""), "{e}");
        assert!(file("config = \"x\"\n").is_err(), "the file cannot name another file");
        assert!(file("list-schedulers = true\n").is_err(), "nor ask for a listing");
        let e = file("conn-window = \"big\"\n").unwrap_err();
        assert!(matches!(e, Error::ConfigSyntax { .. }), "{e:?}");
        assert!(load_file::<Opts>(None, &cmd).unwrap().common.train_id.is_none());
    }

    #[test]
    fn file_values_fill_only_what_flags_left_unset() {
        let mut cli = CommonOpts { train_id: Some("flag".into()), ..Default::default() };
        let mut file = CommonOpts {
            train_id: Some("file".into()),
            scheduler: Some("minrtt".into()),
            pipelines: [("p".to_string(), PipelineToml::default())].into(),
            ..Default::default()
        };
        cli.merge(&mut file);
        assert_eq!((cli.train_id.as_deref(), cli.scheduler.as_deref()), (Some("flag"), Some("minrtt")));
        assert_eq!(cli.pipelines.len(), 1);
        let s = CommonOpts { train_id: Some("t".into()), scheduler: Some("minrtt".into()), ..Default::default() };
        let s = s.settings().unwrap();
        assert_eq!((s.scheduler.name.as_str(), s.transport), ("minrtt", Transport::Tls));
        assert_eq!(s.pipeline.name(), "minrtt");
        let e = CommonOpts { train_id: Some("t".into()), scheduler: Some("nope".into()), ..Default::default() }
            .settings()
            .unwrap_err();
        assert!(matches!(e, Error::Scheduler { .. }), "{e:?}");
        assert!(CommonOpts::default().settings().unwrap_err().to_string().contains("--train-id"));
    }
}
