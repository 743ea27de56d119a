//! A schedulerlet's parameters: what a configuration gives it, how it reads
//! them, and the errors a bad one gets. Schedulerlets build themselves from
//! these; the registry, which names every schedulerlet, builds on them too.

use std::collections::BTreeMap;

/// Numeric parameters of one schedulerlet, by name.
pub type Params = BTreeMap<String, f64>;

/// Configuration that names something unknown or gives a bad parameter.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("unknown scheduler {0:?}; known: {1}")]
    UnknownPipeline(String, String),
    #[error("unknown schedulerlet {0:?}; known: {1}")]
    UnknownSchedulerlet(String, String),
    #[error("unknown reinjection handler {0:?}; known: {1}")]
    UnknownReinjection(String, String),
    #[error("schedulerlet {0}: unknown parameter {1:?}; accepted: {2}")]
    UnknownParam(String, String, String),
    #[error("schedulerlet {0}: parameter {1} = {2} is out of range ({3})")]
    BadParam(String, String, f64, &'static str),
    #[error("a pipeline needs at least one schedulerlet")]
    EmptyPipeline,
}

/// A schedulerlet or reinjection handler that is built from parameters,
/// under the one name it declares.
pub trait FromParams: Sized {
    /// The name: what `name()` returns, what configuration and pipelines
    /// call it, and what its parameter errors say.
    const NAME: &'static str;
    /// The parameters it accepts; any other is refused, naming these.
    const PARAMS: &'static [&'static str] = &[];
    /// Build one from its parameters (each read with a default).
    fn from_params(p: &ParamReader<'_>) -> Result<Self, ConfigError>;
}

/// Read parameters, rejecting names a schedulerlet does not accept.
pub struct ParamReader<'a> {
    owner: &'a str,
    params: &'a Params,
    accepted: &'static [&'static str],
}

impl<'a> ParamReader<'a> {
    pub fn new(owner: &'a str, params: &'a Params, accepted: &'static [&'static str]) -> Result<Self, ConfigError> {
        if let Some(k) = params.keys().find(|k| !accepted.contains(&k.as_str())) {
            return Err(ConfigError::UnknownParam(owner.into(), k.clone(), accepted.join(", ")));
        }
        Ok(ParamReader { owner, params, accepted })
    }

    /// No parameter was given: every one takes its default.
    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// A parameter with a default, checked against `range`.
    pub fn get(
        &self,
        name: &str,
        default: f64,
        range: std::ops::RangeInclusive<f64>,
        what: &'static str,
    ) -> Result<f64, ConfigError> {
        debug_assert!(self.accepted.contains(&name));
        let v = self.params.get(name).copied().unwrap_or(default);
        if !v.is_finite() || !range.contains(&v) {
            return Err(self.bad(name, v, what));
        }
        Ok(v)
    }

    /// A switch: 0 (off, the default) or 1; `what` says what each means.
    pub fn flag(&self, name: &str, what: &'static str) -> Result<bool, ConfigError> {
        let v = self.get(name, 0.0, 0.0..=1.0, what)?;
        if v != 0.0 && v != 1.0 {
            return Err(self.bad(name, v, "0 or 1"));
        }
        Ok(v == 1.0)
    }

    /// The error for parameter `name` = `value`, which is not `what`.
    pub fn bad(&self, name: &str, value: f64, what: &'static str) -> ConfigError {
        ConfigError::BadParam(self.owner.into(), name.into(), value, what)
    }
}
