//! Configuration layering shared by both binaries: a TOML file, then
//! environment variables, then command-line flags (later wins). Each binary
//! declares one options struct that derives both `clap::Parser` (flags and
//! `POLYCORN_*` environment variables) and `serde::Deserialize` (the file),
//! with every field optional, and merges the two with [`merge_options!`].

use std::path::Path;

use serde::de::DeserializeOwned;

use crate::Error;

/// Read a TOML options file; unknown keys are an error (typos must not pass
/// silently).
pub fn load_toml<T: DeserializeOwned + Default>(path: Option<&Path>) -> Result<T, Error> {
    let Some(path) = path else { return Ok(T::default()) };
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        what: "reading config file",
        path: path.into(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| Error::ConfigSyntax { path: path.into(), source })
}

/// Per-connection buffer sizes and the memory budget, as both binaries take
/// them (`--conn-window`, `--conn-window-initial`, `--conn-send-buffer`,
/// `--mem-budget`); `None` keeps the endpoint's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BufferOptions {
    pub conn_window: Option<u64>,
    pub conn_window_initial: Option<u64>,
    pub conn_send_buffer: Option<u64>,
    pub mem_budget: Option<u64>,
}

impl BufferOptions {
    /// Check the sizes and write them into `cfg`; `budget_default` is the
    /// binary's default budget (the relay's and the proxy's differ). The
    /// window must be at least the protocol's initial limit, which a peer
    /// may use before any WINDOW frame arrives; the send buffer must hold a
    /// full segment; the budget must hold at least one connection's floors.
    pub fn apply(&self, cfg: &mut polycorn_core::EndpointConfig, budget_default: u64) -> Result<(), Error> {
        const GIB: u64 = 1 << 30;
        let min = polycorn_core::conn::INITIAL_MAX_DATA;
        let check = |flag: &str, v: u64, lo: u64, hi: u64| {
            if (lo..=hi).contains(&v) {
                Ok(v)
            } else {
                Err(Error::option(format!("--{flag}"), format!("must be between {lo} and {hi} bytes, got {v}")))
            }
        };
        let max = check("conn-window", self.conn_window.unwrap_or(cfg.conn_window_max_bytes), min, GIB)?;
        let initial = match self.conn_window_initial {
            Some(v) => check("conn-window-initial", v, min, max)?,
            None => cfg.conn_window_initial_bytes.min(max),
        };
        let send = check("conn-send-buffer", self.conn_send_buffer.unwrap_or(cfg.conn_send_buffer_bytes), min, GIB)?;
        let floors = cfg.conn_window_min_bytes + cfg.conn_unsent_min_bytes;
        let budget = check("mem-budget", self.mem_budget.unwrap_or(budget_default), floors, 1 << 40)?;
        cfg.conn_window_max_bytes = max;
        cfg.conn_window_initial_bytes = initial;
        cfg.conn_send_buffer_bytes = send;
        cfg.conn_unsent_min_bytes = cfg.conn_unsent_min_bytes.min(send);
        cfg.conn_unsent_initial_bytes = cfg.conn_unsent_initial_bytes.min(send);
        cfg.budget = polycorn_core::MemoryBudget::with_high(budget);
        Ok(())
    }
}

/// `merge_options!(cli, file; a, b, c)` sets each listed field of `cli` to
/// the file's value when the command line and environment left it unset.
#[macro_export]
macro_rules! merge_options {
    ($cli:expr, $file:expr; $($field:ident),* $(,)?) => {
        $( if $cli.$field.is_none() { $cli.$field = $file.$field.take(); } )*
    };
}

/// A pipeline composed in the configuration file:
///
/// ```toml
/// scheduler = "careful"
/// [pipelines.careful]
/// schedulerlets = ["minrtt", "blest"]
/// reinjection = "extended"
/// [pipelines.careful.params.blest]
/// lambda = 1.5
/// [pipelines.careful.params.extended]
/// k = 3
/// ```
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineToml {
    pub schedulerlets: Vec<String>,
    #[serde(default)]
    pub reinjection: Option<String>,
    #[serde(default)]
    pub params: std::collections::BTreeMap<String, std::collections::BTreeMap<String, f64>>,
}

/// The scheduler of what an endpoint sends, as configured and checked:
/// its name and the composition it builds.
#[derive(Clone, Debug, PartialEq)]
pub struct Scheduler {
    pub name: String,
    spec: polycorn_core::sched::PipelineSpec,
}

impl Scheduler {
    /// The pipeline called `name`, a custom one from the file or a built-in
    /// composition, built once: that checks it, and the pipeline is the
    /// first one to use.
    pub fn resolve(
        name: &str,
        custom: &std::collections::BTreeMap<String, PipelineToml>,
    ) -> Result<(Scheduler, polycorn_core::Pipeline), Error> {
        use polycorn_core::sched::{PipelineSpec, Registry, SchedulerletSpec};
        let err = |source| Error::Scheduler { name: name.into(), source };
        let reg = Registry::with_builtins();
        let spec = match custom.get(name) {
            Some(p) => {
                let spec_of = |n: &str| SchedulerletSpec {
                    name: n.to_string(),
                    params: p.params.get(n).cloned().unwrap_or_default(),
                };
                PipelineSpec {
                    schedulerlets: p.schedulerlets.iter().map(|n| spec_of(n)).collect(),
                    reinjection: spec_of(p.reinjection.as_deref().unwrap_or("rto-oldest")),
                }
            }
            None => reg.pipeline_spec(name).map_err(err)?.clone(),
        };
        let pipeline = reg.build_spec(name, &spec).map_err(err)?;
        Ok((Scheduler { name: name.into(), spec }, pipeline))
    }

    /// Another pipeline of the same composition, with fresh state (the
    /// proxy: one per session).
    pub fn build(&self) -> Result<polycorn_core::Pipeline, Error> {
        polycorn_core::sched::Registry::with_builtins()
            .build_spec(&self.name, &self.spec)
            .map_err(|source| Error::Scheduler { name: self.name.clone(), source })
    }
}

/// Build the pipeline called `name`: a custom one from the file, or a
/// built-in composition.
pub fn build_pipeline(
    name: &str,
    custom: &std::collections::BTreeMap<String, PipelineToml>,
) -> Result<polycorn_core::Pipeline, Error> {
    Scheduler::resolve(name, custom).map(|(_, p)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pipeline_of_the_testbed_builds() {
        #[derive(serde::Deserialize)]
        struct File {
            pipelines: std::collections::BTreeMap<String, PipelineToml>,
        }
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testbed/pipelines.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let file: File = toml::from_str(&text).unwrap();
        assert!(file.pipelines.len() >= 10, "{:?}", file.pipelines.keys());
        for name in file.pipelines.keys() {
            let p = build_pipeline(name, &file.pipelines).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(p.name(), name);
        }
        let stale = build_pipeline("hrsch+stale-150", &file.pipelines).unwrap();
        assert_eq!(stale.stale_threshold().map(|t| t.min), Some(std::time::Duration::from_millis(150)));
    }

    #[test]
    fn buffer_options_are_checked_and_applied() {
        use polycorn_core::{EndpointConfig, Role};
        let min = polycorn_core::conn::INITIAL_MAX_DATA;
        let mut cfg = EndpointConfig::new(Role::Relay);
        BufferOptions::default().apply(&mut cfg, 64 << 20).unwrap();
        assert_eq!(cfg.budget.levels().high, 64 << 20);
        assert_eq!(cfg.conn_window_max_bytes, 8 << 20);
        let o = BufferOptions { conn_window: Some(min), ..BufferOptions::default() };
        o.apply(&mut cfg, 64 << 20).unwrap();
        assert_eq!(
            (cfg.conn_window_max_bytes, cfg.conn_window_initial_bytes),
            (min, min),
            "initial follows a lower cap"
        );
        let bad = |o: BufferOptions| o.apply(&mut EndpointConfig::new(Role::Relay), 64 << 20).unwrap_err().to_string();
        assert!(bad(BufferOptions { conn_window: Some(min - 1), ..Default::default() }).contains("--conn-window"));
        assert!(bad(BufferOptions { conn_window: Some((1 << 30) + 1), ..Default::default() }).contains("--conn-window"));
        let o = BufferOptions { conn_window: Some(1 << 20), conn_window_initial: Some(2 << 20), ..Default::default() };
        assert!(bad(o).contains("--conn-window-initial"));
        assert!(bad(BufferOptions { conn_send_buffer: Some(10), ..Default::default() }).contains("--conn-send-buffer"));
        assert!(bad(BufferOptions { mem_budget: Some(1000), ..Default::default() }).contains("--mem-budget"));
    }
}
