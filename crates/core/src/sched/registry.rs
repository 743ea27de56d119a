//! Schedulerlets and reinjection handlers registered by name, and pipelines
//! composed by name.
//!
//! Each built-in schedulerlet and reinjection handler declares its name
//! once, as [`FromParams::NAME`]: its `name()` returns it, the registry
//! registers it under it ([`SCHEDULERLETS`], [`REINJECTION_HANDLERS`]) and
//! parameter errors name it. The built-in compositions are one table,
//! [`BUILTIN_PIPELINES`]; `polycorn-relay --list-schedulers` and
//! `polycorn-proxy --list-schedulers` print their names, and
//! docs/schedulerlets.md ("Built-in compositions") says what each is for.

use std::collections::{BTreeMap, HashMap};

use super::hol::{OppReinject, Penalise, StaleFilter, TailReinject};
use super::hrsch::{HofReject, IdleInject, TailFilter, TailReject};
use super::lets::{AllPaths, Blest, Ecf, Extended, MinRtt, NoReinjection, PinPath, PinUser, RoundRobin, RtoOldest};
pub use super::params::{ConfigError, FromParams, ParamReader, Params};
use super::{Pipeline, ReinjectionHandler, Schedulerlet};

/// The composition the relay and the proxy use without `--scheduler`:
/// HRSCH with the stale filter, its tail rule as a candidate filter before
/// `minrtt` and tail reinjection (docs/schedulerlets.md, "`hrsch+`";
/// measured against `hrsch+stale` on 31 held-out trips in docs/results.md,
/// "Tail rules on the railway"). `hrsch` stays the paper's composition, by
/// name, and `hrsch+stale` the previous default.
pub const DEFAULT_PIPELINE: &str = "hrsch+";

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

type LetFactory = Box<dyn Fn(&Params) -> Result<Box<dyn Schedulerlet>, ConfigError> + Send + Sync>;
type ReinjectFactory = Box<dyn Fn(&Params) -> Result<Box<dyn ReinjectionHandler>, ConfigError> + Send + Sync>;

/// A built-in schedulerlet: its name and its constructor.
pub type LetEntry = (&'static str, fn(&Params) -> Result<Box<dyn Schedulerlet>, ConfigError>);
/// A built-in reinjection handler: its name and its constructor.
pub type ReinjectionEntry = (&'static str, fn(&Params) -> Result<Box<dyn ReinjectionHandler>, ConfigError>);

fn from_params<T: FromParams>(p: &Params) -> Result<T, ConfigError> {
    T::from_params(&ParamReader::new(T::NAME, p, T::PARAMS)?)
}

fn boxed_let<T: FromParams + Schedulerlet + 'static>(p: &Params) -> Result<Box<dyn Schedulerlet>, ConfigError> {
    Ok(Box::new(from_params::<T>(p)?))
}

fn boxed_reinjection<T: FromParams + ReinjectionHandler + 'static>(
    p: &Params,
) -> Result<Box<dyn ReinjectionHandler>, ConfigError> {
    Ok(Box::new(from_params::<T>(p)?))
}

const fn schedulerlet<T: FromParams + Schedulerlet + 'static>() -> LetEntry {
    (T::NAME, boxed_let::<T>)
}

const fn reinjection<T: FromParams + ReinjectionHandler + 'static>() -> ReinjectionEntry {
    (T::NAME, boxed_reinjection::<T>)
}

/// The built-in schedulerlets.
pub const SCHEDULERLETS: &[LetEntry] = &[
    schedulerlet::<MinRtt>(),
    schedulerlet::<RoundRobin>(),
    schedulerlet::<AllPaths>(),
    schedulerlet::<PinUser>(),
    schedulerlet::<PinPath>(),
    schedulerlet::<Blest>(),
    schedulerlet::<Ecf>(),
    schedulerlet::<HofReject>(),
    schedulerlet::<TailReject>(),
    schedulerlet::<TailFilter>(),
    schedulerlet::<IdleInject>(),
    schedulerlet::<OppReinject>(),
    schedulerlet::<Penalise>(),
    schedulerlet::<TailReinject>(),
    schedulerlet::<StaleFilter>(),
];

/// The built-in reinjection handlers.
pub const REINJECTION_HANDLERS: &[ReinjectionEntry] =
    &[reinjection::<NoReinjection>(), reinjection::<RtoOldest>(), reinjection::<Extended>()];

/// A built-in composition: what `--scheduler NAME` builds without a
/// configuration file.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BuiltinPipeline {
    pub name: &'static str,
    /// Schedulerlets in order, each with its default parameters.
    pub schedulerlets: &'static [&'static str],
    /// The reinjection handler and its parameters.
    pub reinjection: (&'static str, &'static [(&'static str, f64)]),
}

impl BuiltinPipeline {
    pub fn spec(&self) -> PipelineSpec {
        let (name, params) = self.reinjection;
        PipelineSpec {
            schedulerlets: self.schedulerlets.iter().map(|n| SchedulerletSpec::named(n)).collect(),
            reinjection: SchedulerletSpec {
                name: name.into(),
                params: params.iter().map(|&(k, v)| (k.to_string(), v)).collect(),
            },
        }
    }
}

/// MPTCP's reinjection, the baselines'.
const RTO_OLDEST: (&str, &[(&str, f64)]) = (RtoOldest::NAME, &[]);
/// HRSCH's extended reinjection (POLYCORN §4.5), at the third timeout.
const EXTENDED_K3: (&str, &[(&str, f64)]) = (Extended::NAME, &[("k", 3.0)]);

const fn pipeline(
    name: &'static str,
    schedulerlets: &'static [&'static str],
    reinjection: (&'static str, &'static [(&'static str, f64)]),
) -> BuiltinPipeline {
    BuiltinPipeline { name, schedulerlets, reinjection }
}

/// The built-in compositions, in the order `--list-schedulers` prints them.
/// New ones go at the end: the property tests pick a composition by its
/// index here, and their saved regression cases record that index.
pub const BUILTIN_PIPELINES: &[BuiltinPipeline] = &[
    // MPTCP's schedulers and the baselines.
    pipeline("minrtt", &[MinRtt::NAME], RTO_OLDEST),
    pipeline("roundrobin", &[RoundRobin::NAME], RTO_OLDEST),
    pipeline("redundant", &[AllPaths::NAME], RTO_OLDEST),
    pipeline("blest", &[MinRtt::NAME, Blest::NAME], RTO_OLDEST),
    pipeline("ecf", &[MinRtt::NAME, Ecf::NAME], RTO_OLDEST),
    pipeline("single-path", &[PinUser::NAME, MinRtt::NAME], RTO_OLDEST),
    // HRSCH (POLYCORN §4) and its ablations, one HRSCH mechanism added to
    // MPTCP's minRTT each (super::hrsch).
    pipeline("hrsch", &[HofReject::NAME, MinRtt::NAME, TailReject::NAME, IdleInject::NAME], EXTENDED_K3),
    pipeline("minrtt+hpr", &[HofReject::NAME, MinRtt::NAME], RTO_OLDEST),
    pipeline("minrtt+tpr", &[MinRtt::NAME, TailReject::NAME], RTO_OLDEST),
    pipeline("minrtt+ori", &[MinRtt::NAME, IdleInject::NAME], RTO_OLDEST),
    pipeline("minrtt+er", &[MinRtt::NAME], EXTENDED_K3),
    // Head-of-line recovery (super::hol) on top of minrtt, one mechanism
    // each and all three, and inside HRSCH.
    pipeline("minrtt+opp", &[MinRtt::NAME, OppReinject::NAME], RTO_OLDEST),
    pipeline("minrtt+pen", &[MinRtt::NAME, Penalise::NAME], RTO_OLDEST),
    pipeline("minrtt+stale", &[StaleFilter::NAME, MinRtt::NAME], RTO_OLDEST),
    pipeline("minrtt+hol", &[StaleFilter::NAME, MinRtt::NAME, OppReinject::NAME, Penalise::NAME], RTO_OLDEST),
    pipeline(
        "hrsch+hol",
        &[
            HofReject::NAME,
            StaleFilter::NAME,
            MinRtt::NAME,
            TailReject::NAME,
            IdleInject::NAME,
            OppReinject::NAME,
            Penalise::NAME,
        ],
        EXTENDED_K3,
    ),
    pipeline(
        "hrsch+stale",
        &[HofReject::NAME, StaleFilter::NAME, MinRtt::NAME, TailReject::NAME, IdleInject::NAME],
        EXTENDED_K3,
    ),
    // Not in the paper: the tail rule before minrtt, so that a tail packet
    // takes the faster carrier when minrtt would pick a lower-RTT but
    // slower one, and the tail's copies on the quickest carrier once the
    // last packet is placed.
    pipeline(
        "hrsch+",
        &[HofReject::NAME, StaleFilter::NAME, TailFilter::NAME, MinRtt::NAME, IdleInject::NAME, TailReinject::NAME],
        EXTENDED_K3,
    ),
];

/// The names of the built-in compositions, in [`BUILTIN_PIPELINES`]' order.
pub fn builtin_pipeline_names() -> impl Iterator<Item = &'static str> {
    BUILTIN_PIPELINES.iter().map(|p| p.name)
}

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

impl Registry {
    /// An empty registry.
    pub fn empty() -> Self {
        Registry { lets: HashMap::new(), reinjectors: HashMap::new(), pipelines: BTreeMap::new() }
    }

    /// The built-in schedulerlets, reinjection handlers and compositions.
    pub fn with_builtins() -> Self {
        let mut r = Registry::empty();
        for &(name, f) in SCHEDULERLETS {
            r.register_schedulerlet(name, f);
        }
        for &(name, f) in REINJECTION_HANDLERS {
            r.register_reinjection(name, f);
        }
        for p in BUILTIN_PIPELINES {
            r.register_pipeline(p.name, p.spec());
        }
        r
    }

    /// Register `T` under its [`FromParams::NAME`].
    pub fn add_schedulerlet<T: FromParams + Schedulerlet + 'static>(&mut self) {
        self.register_schedulerlet(T::NAME, boxed_let::<T>);
    }

    /// Register `T` under its [`FromParams::NAME`].
    pub fn add_reinjection<T: FromParams + ReinjectionHandler + 'static>(&mut self) {
        self.register_reinjection(T::NAME, boxed_reinjection::<T>);
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

    pub fn reinjection_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.reinjectors.keys().cloned().collect();
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
            ConfigError::UnknownReinjection(spec.reinjection.name.clone(), self.reinjection_names().join(", "))
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
    fn every_builtin_composition_builds_under_its_name() {
        let r = Registry::with_builtins();
        for b in BUILTIN_PIPELINES {
            let p = r.build(b.name).unwrap();
            assert_eq!(p.name(), b.name);
            assert_eq!(p.schedulerlet_names(), b.schedulerlets, "{}", b.name);
        }
        let mut names: Vec<String> = builtin_pipeline_names().map(String::from).collect();
        names.sort();
        assert_eq!(names, r.pipeline_names(), "one entry per name");
        assert!(builtin_pipeline_names().any(|n| n == DEFAULT_PIPELINE));
        assert_eq!(r.build("blest").unwrap().schedulerlet_names(), vec!["minrtt", "blest"]);
    }

    #[test]
    fn every_builtin_answers_to_the_name_it_is_registered_under() {
        for &(name, build) in SCHEDULERLETS {
            assert_eq!(build(&Params::new()).unwrap().name(), name);
        }
        for &(name, build) in REINJECTION_HANDLERS {
            assert_eq!(build(&Params::new()).unwrap().name(), name);
        }
        let r = Registry::with_builtins();
        assert_eq!(r.schedulerlet_names().len(), SCHEDULERLETS.len(), "no name twice");
        assert_eq!(r.reinjection_names().len(), REINJECTION_HANDLERS.len(), "no name twice");
        let e = r.build_spec(
            "x",
            &PipelineSpec {
                reinjection: SchedulerletSpec::named("nope"),
                ..r.pipeline_spec("minrtt").unwrap().clone()
            },
        );
        assert!(e.unwrap_err().to_string().ends_with("known: extended, none, rto-oldest"));
    }

    /// docs/schedulerlets.md has a row for every built-in composition (what
    /// it is for; `--list-schedulers` prints the names).
    #[test]
    fn every_builtin_composition_is_documented() {
        let doc = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/schedulerlets.md");
        let doc = std::fs::read_to_string(doc).unwrap();
        for name in builtin_pipeline_names() {
            assert!(doc.contains(&format!("\n| `{name}` |")), "docs/schedulerlets.md has no row for `{name}`");
        }
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
        impl FromParams for OnlyEven {
            const NAME: &'static str = "only-even";
            fn from_params(_: &ParamReader<'_>) -> Result<Self, ConfigError> {
                Ok(OnlyEven)
            }
        }
        impl Schedulerlet for OnlyEven {
            fn name(&self) -> &'static str {
                Self::NAME
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
        r.add_schedulerlet::<OnlyEven>();
        let spec = PipelineSpec {
            schedulerlets: vec![SchedulerletSpec::named(OnlyEven::NAME), SchedulerletSpec::named(MinRtt::NAME)],
            reinjection: SchedulerletSpec::named(NoReinjection::NAME),
        };
        r.register_pipeline("even-minrtt", spec);
        assert!(!builtin_pipeline_names().any(|n| n == "even-minrtt"), "registered, not built in");
        let mut p = r.build("even-minrtt").unwrap();
        let paths = [super::super::test_support::view(0, 50), super::super::test_support::view(1, 10)];
        let pkt = super::super::test_support::packet();
        let got = p.select(&Context { now: std::time::Instant::now(), paths: &paths, packet: &pkt });
        assert_eq!(got.iter().map(|p| p.0).collect::<Vec<_>>(), vec![0]);
    }
}
