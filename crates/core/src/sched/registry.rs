//! Schedulerlets and reinjection handlers registered by name, and pipelines
//! composed by name.
//!
//! Built-in compositions:
//!
//! | name          | schedulerlets             | reinjection  |
//! |---------------|---------------------------|--------------|
//! | `minrtt`      | `minrtt`                  | `rto-oldest` |
//! | `roundrobin`  | `roundrobin`              | `rto-oldest` |
//! | `redundant`   | `all-paths`               | `rto-oldest` |
//! | `blest`       | `minrtt`, `blest`         | `rto-oldest` |
//! | `ecf`         | `minrtt`, `ecf`           | `rto-oldest` |
//! | `single-path` | `pin-user`, `minrtt`      | `rto-oldest` |
//! | `hrsch`       | `hof-reject`, `minrtt`, `tail-reject`, `idle-inject` | `extended` (k = 3) |
//! | `minrtt+hpr`  | `hof-reject`, `minrtt`    | `rto-oldest` |
//! | `minrtt+tpr`  | `minrtt`, `tail-reject`   | `rto-oldest` |
//! | `minrtt+ori`  | `minrtt`, `idle-inject`   | `rto-oldest` |
//! | `minrtt+er`   | `minrtt`                  | `extended` (k = 3) |
//! | `minrtt+opp`  | `minrtt`, `opp-reinject`  | `rto-oldest` |
//! | `minrtt+pen`  | `minrtt`, `penalise`      | `rto-oldest` |
//! | `minrtt+stale`| `stale-filter`, `minrtt`  | `rto-oldest` |
//! | `minrtt+hol`  | `stale-filter`, `minrtt`, `opp-reinject`, `penalise` | `rto-oldest` |
//! | `hrsch+hol`   | `hof-reject`, `stale-filter`, `minrtt`, `tail-reject`, `idle-inject`, `opp-reinject`, `penalise` | `extended` (k = 3) |
//! | `hrsch+stale` | `hof-reject`, `stale-filter`, `minrtt`, `tail-reject`, `idle-inject` | `extended` (k = 3) |
//! | `hrsch+`      | `hof-reject`, `stale-filter`, `tail-filter`, `minrtt`, `idle-inject`, `tail-reinject` | `extended` (k = 3) |
//!
//! The last five are HRSCH (POLYCORN §4) and its ablations, one HRSCH
//! mechanism added to MPTCP's minRTT each ([`super::hrsch`]).

use std::collections::{BTreeMap, HashMap};

use super::hol::{OppReinject, Penalise, StaleFilter, TailReinject};
use super::hrsch::{HofReject, IdleInject, TailFilter, TailReject};
use super::lets::{AllPaths, Blest, Ecf, Extended, MinRtt, NoReinjection, PinPath, PinUser, RoundRobin, RtoOldest};
use super::{Pipeline, ReinjectionHandler, Schedulerlet};
use crate::path::StaleThreshold;

/// The composition the relay and the proxy use without `--scheduler`:
/// HRSCH with the stale filter, its tail rule as a candidate filter before
/// `minrtt` and tail reinjection (docs/schedulerlets.md, "`hrsch+`";
/// measured against `hrsch+stale` on 31 held-out trips in docs/results.md,
/// "Tail rules on the railway"). `hrsch` stays the paper's composition, by
/// name, and `hrsch+stale` the previous default.
pub const DEFAULT_PIPELINE: &str = "hrsch+";

/// Numeric parameters of one schedulerlet, by name.
pub type Params = BTreeMap<String, f64>;

/// A schedulerlet (or reinjection handler) by name with its parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct SchedulerletSpec {
    pub name: String,
    pub params: Params,
}

impl SchedulerletSpec {
    pub fn named(name: &str) -> Self {
        SchedulerletSpec { name: name.to_string(), params: Params::new() }
    }
}

/// A pipeline: schedulerlets in order, then the reinjection handler.
#[derive(Clone, Debug, PartialEq)]
pub struct PipelineSpec {
    pub schedulerlets: Vec<SchedulerletSpec>,
    pub reinjection: SchedulerletSpec,
}

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

type LetFactory = Box<dyn Fn(&Params) -> Result<Box<dyn Schedulerlet>, ConfigError> + Send + Sync>;
type ReinjectFactory = Box<dyn Fn(&Params) -> Result<Box<dyn ReinjectionHandler>, ConfigError> + Send + Sync>;

/// Everything that can be composed.
pub struct Registry {
    lets: HashMap<String, LetFactory>,
    reinjectors: HashMap<String, ReinjectFactory>,
    pipelines: BTreeMap<String, PipelineSpec>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("schedulerlets", &self.schedulerlet_names())
            .field("pipelines", &self.pipelines.keys().collect::<Vec<_>>())
            .finish()
    }
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
            return Err(ConfigError::BadParam(self.owner.into(), name.into(), v, what));
        }
        Ok(v)
    }
}

fn no_params(name: &str, p: &Params) -> Result<(), ConfigError> {
    ParamReader::new(name, p, &[]).map(|_| ())
}

/// The tail rule's parameters, shared by `tail-reject` and `tail-filter`
/// (`owner`): `bursts` and `strict`, each 0 or 1.
fn tail_rule(owner: &'static str, p: &Params) -> Result<TailReject, ConfigError> {
    let r = ParamReader::new(owner, p, &["bursts", "strict"])?;
    let flag = |name: &str, what: &'static str| -> Result<bool, ConfigError> {
        let v = r.get(name, 0.0, 0.0..=1.0, what)?;
        if v != 0.0 && v != 1.0 {
            return Err(ConfigError::BadParam(owner.into(), name.into(), v, "0 or 1"));
        }
        Ok(v == 1.0)
    };
    let bursts = flag("bursts", "0 (FIN only, the paper's) or 1 (also burst ends)")?;
    let strict = flag("strict", "0 (T+ relaxed by 1 + rttvar/srtt, the paper's) or 1 (not relaxed)")?;
    Ok(TailReject { bursts, strict, ..TailReject::default() })
}

impl Registry {
    /// An empty registry.
    pub fn empty() -> Self {
        Registry { lets: HashMap::new(), reinjectors: HashMap::new(), pipelines: BTreeMap::new() }
    }

    /// The built-in schedulerlets and compositions.
    pub fn with_builtins() -> Self {
        let mut r = Registry::empty();
        r.register_schedulerlet("minrtt", |p| no_params("minrtt", p).map(|_| Box::new(MinRtt) as _));
        r.register_schedulerlet("roundrobin", |p| {
            no_params("roundrobin", p).map(|_| Box::new(RoundRobin::default()) as _)
        });
        r.register_schedulerlet("all-paths", |p| no_params("all-paths", p).map(|_| Box::new(AllPaths) as _));
        r.register_schedulerlet("pin-user", |p| no_params("pin-user", p).map(|_| Box::new(PinUser::default()) as _));
        r.register_schedulerlet("pin-path", |p| {
            let r = ParamReader::new("pin-path", p, &["path"])?;
            let path = r.get("path", 0.0, 0.0..=(crate::MAX_PATHS - 1) as f64, "a path id")?;
            Ok(Box::new(PinPath { path: crate::PathId(path as u8) }) as _)
        });
        r.register_schedulerlet("blest", |p| {
            let r = ParamReader::new("blest", p, &["lambda"])?;
            Ok(Box::new(Blest { lambda: r.get("lambda", 1.0, 0.01..=100.0, "0.01..=100")? }) as _)
        });
        r.register_schedulerlet("ecf", |p| {
            let r = ParamReader::new("ecf", p, &["beta"])?;
            Ok(Box::new(Ecf::new(r.get("beta", 0.25, 0.0..=10.0, "0..=10")?)) as _)
        });
        r.register_schedulerlet("hof-reject", |p| {
            let r = ParamReader::new("hof-reject", p, &["gps_error_m", "max_hold_s"])?;
            let e = r.get("gps_error_m", 20.0, 0.0..=10_000.0, "0..=10000")?;
            let hold = r.get("max_hold_s", 10.0, 0.1..=3600.0, "0.1..=3600")?;
            Ok(Box::new(HofReject::new(e, std::time::Duration::from_secs_f64(hold))) as _)
        });
        r.register_schedulerlet("tail-reject", |p| tail_rule("tail-reject", p).map(|t| Box::new(t) as _));
        r.register_schedulerlet("tail-filter", |p| {
            tail_rule("tail-filter", p).map(|rule| Box::new(TailFilter { rule, ..TailFilter::default() }) as _)
        });
        r.register_schedulerlet("idle-inject", |p| {
            let r = ParamReader::new("idle-inject", p, &["alpha", "beta", "tau", "revive_unavailable"])?;
            let alpha = r.get("alpha", 1.0, 0.0..=3600.0, "0..=3600 (seconds)")?;
            let beta = r.get("beta", IdleInject::DEFAULT_BETA_BYTES as f64, 0.0..=1e12, "0..=1e12 (bytes)")?;
            let tau = r.get("tau", 16.0, 0.0..=65_536.0, "0..=65536 (MSS-sized units of 1448 bytes)")?;
            let revive = r.get("revive_unavailable", 0.0, 0.0..=1.0, "0 or 1")?;
            if revive != 0.0 && revive != 1.0 {
                return Err(ConfigError::BadParam("idle-inject".into(), "revive_unavailable".into(), revive, "0 or 1"));
            }
            Ok(Box::new(IdleInject::new(
                std::time::Duration::from_secs_f64(alpha),
                beta as u64,
                tau as u32,
                revive == 1.0,
            )) as _)
        });
        r.register_schedulerlet("opp-reinject", |p| {
            no_params("opp-reinject", p).map(|_| Box::new(OppReinject::default()) as _)
        });
        r.register_schedulerlet("penalise", |p| no_params("penalise", p).map(|_| Box::new(Penalise::default()) as _));
        r.register_schedulerlet("tail-reinject", |p| {
            no_params("tail-reinject", p).map(|_| Box::new(TailReinject::default()) as _)
        });
        r.register_schedulerlet("stale-filter", |p| {
            // Without parameters the endpoint's path configuration decides
            // when a path is stale (2 x SRTT, at least 300 ms); with either,
            // the other takes that default.
            let r = ParamReader::new("stale-filter", p, &["srtt_factor", "min_ms"])?;
            let threshold = if p.is_empty() {
                None
            } else {
                let d = crate::path::PathConfig::default().stale_threshold();
                let factor = r.get("srtt_factor", f64::from(d.srtt_factor), 1.0..=16.0, "an integer from 1 to 16")?;
                if factor.fract() != 0.0 {
                    return Err(ConfigError::BadParam(
                        "stale-filter".into(),
                        "srtt_factor".into(),
                        factor,
                        "an integer from 1 to 16",
                    ));
                }
                let min_ms = r.get("min_ms", d.min.as_secs_f64() * 1e3, 10.0..=60_000.0, "10 to 60000 ms")?;
                Some(StaleThreshold {
                    srtt_factor: factor as u32,
                    min: std::time::Duration::from_secs_f64(min_ms / 1e3),
                })
            };
            Ok(Box::new(StaleFilter { threshold, ..StaleFilter::default() }) as _)
        });
        r.register_reinjection("none", |p| no_params("none", p).map(|_| Box::new(NoReinjection) as _));
        r.register_reinjection("rto-oldest", |p| no_params("rto-oldest", p).map(|_| Box::new(RtoOldest) as _));
        r.register_reinjection("extended", |p| {
            let r = ParamReader::new("extended", p, &["k"])?;
            Ok(Box::new(Extended { k: r.get("k", 3.0, 1.0..=64.0, "1..=64")? as u32 }) as _)
        });
        let comp = |lets: &[&str]| PipelineSpec {
            schedulerlets: lets.iter().map(|n| SchedulerletSpec::named(n)).collect(),
            reinjection: SchedulerletSpec::named("rto-oldest"),
        };
        r.register_pipeline("minrtt", comp(&["minrtt"]));
        r.register_pipeline("roundrobin", comp(&["roundrobin"]));
        r.register_pipeline("redundant", comp(&["all-paths"]));
        r.register_pipeline("blest", comp(&["minrtt", "blest"]));
        r.register_pipeline("ecf", comp(&["minrtt", "ecf"]));
        r.register_pipeline("single-path", comp(&["pin-user", "minrtt"]));
        let extended = |lets: &[&str]| PipelineSpec {
            reinjection: SchedulerletSpec { name: "extended".into(), params: Params::from([("k".into(), 3.0)]) },
            ..comp(lets)
        };
        r.register_pipeline("hrsch", extended(&["hof-reject", "minrtt", "tail-reject", "idle-inject"]));
        r.register_pipeline("minrtt+hpr", comp(&["hof-reject", "minrtt"]));
        r.register_pipeline("minrtt+tpr", comp(&["minrtt", "tail-reject"]));
        r.register_pipeline("minrtt+ori", comp(&["minrtt", "idle-inject"]));
        r.register_pipeline("minrtt+er", extended(&["minrtt"]));
        // Head-of-line recovery (super::hol) on top of minrtt, one mechanism
        // each and all three, and inside HRSCH.
        r.register_pipeline("minrtt+opp", comp(&["minrtt", "opp-reinject"]));
        r.register_pipeline("minrtt+pen", comp(&["minrtt", "penalise"]));
        r.register_pipeline("minrtt+stale", comp(&["stale-filter", "minrtt"]));
        r.register_pipeline("minrtt+hol", comp(&["stale-filter", "minrtt", "opp-reinject", "penalise"]));
        r.register_pipeline(
            "hrsch+stale",
            extended(&["hof-reject", "stale-filter", "minrtt", "tail-reject", "idle-inject"]),
        );
        // Not in the paper: the tail rule before minrtt, so that a
        // tail packet takes the faster carrier when minrtt would pick a
        // lower-RTT but slower one, and the tail's copies on the quickest
        // carrier once the last packet is placed.
        r.register_pipeline(
            "hrsch+",
            extended(&["hof-reject", "stale-filter", "tail-filter", "minrtt", "idle-inject", "tail-reinject"]),
        );
        r.register_pipeline(
            "hrsch+hol",
            extended(&[
                "hof-reject",
                "stale-filter",
                "minrtt",
                "tail-reject",
                "idle-inject",
                "opp-reinject",
                "penalise",
            ]),
        );
        r
    }

    pub fn register_schedulerlet(
        &mut self,
        name: &str,
        f: impl Fn(&Params) -> Result<Box<dyn Schedulerlet>, ConfigError> + Send + Sync + 'static,
    ) {
        self.lets.insert(name.to_string(), Box::new(f));
    }

    pub fn register_reinjection(
        &mut self,
        name: &str,
        f: impl Fn(&Params) -> Result<Box<dyn ReinjectionHandler>, ConfigError> + Send + Sync + 'static,
    ) {
        self.reinjectors.insert(name.to_string(), Box::new(f));
    }

    pub fn register_pipeline(&mut self, name: &str, spec: PipelineSpec) {
        self.pipelines.insert(name.to_string(), spec);
    }

    pub fn schedulerlet_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.lets.keys().cloned().collect();
        v.sort();
        v
    }

    pub fn pipeline_names(&self) -> Vec<String> {
        self.pipelines.keys().cloned().collect()
    }

    pub fn pipeline_spec(&self, name: &str) -> Result<&PipelineSpec, ConfigError> {
        self.pipelines
            .get(name)
            .ok_or_else(|| ConfigError::UnknownPipeline(name.into(), self.pipeline_names().join(", ")))
    }

    /// Build a registered composition.
    pub fn build(&self, name: &str) -> Result<Pipeline, ConfigError> {
        let spec = self.pipeline_spec(name)?.clone();
        self.build_spec(name, &spec)
    }

    /// Build any composition.
    pub fn build_spec(&self, name: &str, spec: &PipelineSpec) -> Result<Pipeline, ConfigError> {
        if spec.schedulerlets.is_empty() {
            return Err(ConfigError::EmptyPipeline);
        }
        let mut lets = Vec::new();
        for s in &spec.schedulerlets {
            let f = self.lets.get(&s.name).ok_or_else(|| {
                ConfigError::UnknownSchedulerlet(s.name.clone(), self.schedulerlet_names().join(", "))
            })?;
            lets.push(f(&s.params)?);
        }
        let rf = self.reinjectors.get(&spec.reinjection.name).ok_or_else(|| {
            let mut known: Vec<_> = self.reinjectors.keys().cloned().collect();
            known.sort();
            ConfigError::UnknownReinjection(spec.reinjection.name.clone(), known.join(", "))
        })?;
        Ok(Pipeline::new(name, lets, rf(&spec.reinjection.params)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_pipeline_is_hrsch_with_the_stale_filter_and_the_tail_rules() {
        let r = Registry::with_builtins();
        let default = r.build(DEFAULT_PIPELINE).unwrap().schedulerlet_names();
        let hrsch = r.build("hrsch").unwrap().schedulerlet_names();
        assert_eq!(hrsch, ["hof-reject", "minrtt", "tail-reject", "idle-inject"], "the paper's composition");
        // The stale filter first, the tail rule moved before minrtt, and tail
        // reinjection after the selection.
        let expected = ["hof-reject", "stale-filter", "tail-filter", "minrtt", "idle-inject", "tail-reinject"];
        assert_eq!(default, expected);
        assert_eq!(
            r.pipeline_spec(DEFAULT_PIPELINE).unwrap().reinjection,
            r.pipeline_spec("hrsch").unwrap().reinjection
        );
    }

    #[test]
    fn every_builtin_composition_builds() {
        let r = Registry::with_builtins();
        for name in [
            "minrtt",
            "roundrobin",
            "redundant",
            "blest",
            "ecf",
            "single-path",
            "hrsch",
            "minrtt+hpr",
            "minrtt+tpr",
            "minrtt+ori",
            "minrtt+er",
            "hrsch+stale",
            "hrsch+hol",
            "hrsch+",
        ] {
            let p = r.build(name).unwrap();
            assert_eq!(p.name(), name);
        }
        assert_eq!(r.build("blest").unwrap().schedulerlet_names(), vec!["minrtt", "blest"]);
    }

    #[test]
    fn the_stale_filter_takes_its_threshold_as_parameters() {
        let r = Registry::with_builtins();
        let with = |params: &[(&str, f64)]| {
            let spec = PipelineSpec {
                schedulerlets: vec![
                    SchedulerletSpec {
                        name: "stale-filter".into(),
                        params: params.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
                    },
                    SchedulerletSpec::named("minrtt"),
                ],
                reinjection: SchedulerletSpec::named("rto-oldest"),
            };
            r.build_spec("t", &spec).map(|p| p.stale_threshold())
        };
        assert_eq!(with(&[]).unwrap(), None, "no parameters: the endpoint's path configuration decides");
        let t = with(&[("min_ms", 150.0)]).unwrap().unwrap();
        assert_eq!((t.srtt_factor, t.min), (2, std::time::Duration::from_millis(150)));
        let t = with(&[("srtt_factor", 3.0), ("min_ms", 600.0)]).unwrap().unwrap();
        assert_eq!((t.srtt_factor, t.min), (3, std::time::Duration::from_millis(600)));
        for bad in [("srtt_factor", 1.5), ("srtt_factor", 0.0), ("min_ms", 5.0), ("min_ms", f64::NAN)] {
            let e = with(&[bad]).unwrap_err().to_string();
            assert!(e.contains("stale-filter") && e.contains(bad.0), "{bad:?}: {e}");
        }
        assert!(with(&[("after_ms", 1.0)]).unwrap_err().to_string().contains("accepted: srtt_factor, min_ms"));
        assert_eq!(r.build("minrtt").unwrap().stale_threshold(), None);
    }

    #[test]
    fn unknown_names_and_bad_params_are_clear_errors() {
        let r = Registry::with_builtins();
        let e = r.build("hrsch-typo").unwrap_err().to_string();
        assert!(e.contains("hrsch-typo") && e.contains("minrtt"), "{e}");
        let mut spec = r.pipeline_spec("blest").unwrap().clone();
        spec.schedulerlets[1].params.insert("lamda".into(), 1.0);
        assert!(matches!(r.build_spec("x", &spec), Err(ConfigError::UnknownParam(..))));
        spec.schedulerlets[1].params.clear();
        spec.schedulerlets[1].params.insert("lambda".into(), -1.0);
        assert!(matches!(r.build_spec("x", &spec), Err(ConfigError::BadParam(..))));
    }

    #[test]
    fn a_user_schedulerlet_composes_with_builtins() {
        use super::super::{Context, Kind, PathSets};
        struct OnlyEven;
        impl Schedulerlet for OnlyEven {
            fn name(&self) -> &'static str {
                "only-even"
            }
            fn kind(&self) -> Kind {
                Kind::CandidateFilter
            }
            fn apply(&mut self, _: &Context<'_>, sets: &mut PathSets) {
                for p in sets.candidates.iter() {
                    if p.0 % 2 == 1 {
                        sets.reject(p);
                    }
                }
            }
        }
        let mut r = Registry::with_builtins();
        r.register_schedulerlet("only-even", |_| Ok(Box::new(OnlyEven) as _));
        let spec = PipelineSpec {
            schedulerlets: vec![SchedulerletSpec::named("only-even"), SchedulerletSpec::named("minrtt")],
            reinjection: SchedulerletSpec::named("none"),
        };
        r.register_pipeline("even-minrtt", spec);
        let mut p = r.build("even-minrtt").unwrap();
        let paths = [super::super::test_support::view(0, 50), super::super::test_support::view(1, 10)];
        let pkt = super::super::test_support::packet();
        let got = p.select(&Context { now: std::time::Instant::now(), paths: &paths, packet: &pkt });
        assert_eq!(got.iter().map(|p| p.0).collect::<Vec<_>>(), vec![0]);
    }
}
