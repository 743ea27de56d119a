//! Configuration layering shared by both binaries: a TOML file, then
//! environment variables, then command-line flags (later wins). Each binary
//! declares one options struct that derives both `clap::Parser` (flags and
//! `POLYCORN_*` environment variables) and `serde::Deserialize` (the file),
//! with every field optional, and merges the two with [`merge_options!`].

use std::path::Path;

use serde::de::DeserializeOwned;

/// Read a TOML options file; unknown keys are an error (typos must not pass
/// silently).
pub fn load_toml<T: DeserializeOwned + Default>(path: Option<&Path>) -> Result<T, String> {
    let Some(path) = path else { return Ok(T::default()) };
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading config file {}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("parsing config file {}: {e}", path.display()))
}

/// The receive window must be at least the protocol's initial limit, which a
/// peer may use before any WINDOW frame arrives.
pub fn check_conn_window(bytes: u64) -> Result<u64, String> {
    let min = polycorn_core::conn::INITIAL_MAX_DATA;
    if (min..=1 << 30).contains(&bytes) {
        Ok(bytes)
    } else {
        Err(format!("--conn-window must be between {min} and {} bytes, got {bytes}", 1u64 << 30))
    }
}

/// The per-connection send buffer (bytes the passenger wrote that the peer
/// has not cumulatively acknowledged) must hold at least one full segment.
pub fn check_conn_send_buffer(bytes: u64) -> Result<usize, String> {
    const MIN: u64 = 64 * 1024;
    if (MIN..=1 << 30).contains(&bytes) {
        Ok(bytes as usize)
    } else {
        Err(format!("--conn-send-buffer must be between {MIN} and {} bytes, got {bytes}", 1u64 << 30))
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

/// Build the pipeline called `name`: a custom one from the file, or a
/// built-in composition.
pub fn build_pipeline(
    name: &str,
    custom: &std::collections::BTreeMap<String, PipelineToml>,
) -> Result<polycorn_core::Pipeline, String> {
    use polycorn_core::sched::{PipelineSpec, Registry, SchedulerletSpec};
    let reg = Registry::with_builtins();
    let r = match custom.get(name) {
        Some(p) => {
            let spec_of = |n: &str| SchedulerletSpec {
                name: n.to_string(),
                params: p.params.get(n).cloned().unwrap_or_default(),
            };
            let spec = PipelineSpec {
                schedulerlets: p.schedulerlets.iter().map(|n| spec_of(n)).collect(),
                reinjection: spec_of(p.reinjection.as_deref().unwrap_or("rto-oldest")),
            };
            reg.build_spec(name, &spec)
        }
        None => reg.build(name),
    };
    r.map_err(|e| format!("scheduler {name:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conn_limits_are_checked() {
        let min = polycorn_core::conn::INITIAL_MAX_DATA;
        assert_eq!(check_conn_window(min), Ok(min));
        assert!(check_conn_window(min - 1).unwrap_err().contains("--conn-window"));
        assert!(check_conn_window((1 << 30) + 1).is_err());
        assert_eq!(check_conn_send_buffer(64 * 1024), Ok(64 * 1024));
        assert_eq!(check_conn_send_buffer(4 << 20), Ok(4 << 20));
        assert!(check_conn_send_buffer(10).unwrap_err().contains("--conn-send-buffer"));
        assert!(check_conn_send_buffer((1 << 30) + 1).is_err());
    }
}
