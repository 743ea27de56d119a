//! ModemManager's `mmcli --output-json` (`-J`) outputs, sans-IO: the text
//! of three commands per modem becomes one [`handover::Observation`] and a
//! [`v1::CellSample`].
//!
//! | command | keys read |
//! |---|---|
//! | `mmcli -m N -J` | `modem.generic.state`, `modem.generic.access-technologies`, `modem.3gpp.registration-state`, `modem.3gpp.operator-code`, `modem.3gpp.operator-name` |
//! | `mmcli -m N --location-get -J` | `modem.location.3gpp.cid` (hex), `.tac` (hex), `.lac`, `.mcc`, `.mnc` |
//! | `mmcli -m N --signal-get -J` | `modem.signal.lte.rsrp` (dBm), else `modem.signal.5g.rsrp` |
//!
//! mmcli prints every value as a string and `--` for a value it does not
//! have (ModemManager's `cli/mmcli-output.c` turns "unknown" and "none" into
//! `--`); the fixtures under `tests/data/mmcli/` have the real shapes. The
//! location needs `--location-enable-3gpp` and the signal needs
//! `--signal-setup=SECONDS` once per modem; the relay's source does both.
//!
//! Registration (3GPP registration state, or the modem state when that is
//! `--`) maps to [`v1::RegistrationState`]: `home`, `roaming` and their
//! `-sms-only` / `-csfb-not-preferred` variants are registered; `searching`
//! is searching; `denied`, `emergency-only` and `attached-rlos` (no
//! ordinary service) are denied; `idle` is idle. The data-plane link is up
//! when the modem state is `connected` (its bearer is up).

use serde_json::Value;

use crate::handover::Observation;
use crate::v1;

/// Why an mmcli output was refused.
#[derive(Debug, thiserror::Error)]
pub enum MmcliError {
    #[error("mmcli output is not JSON: {0}")]
    NotJson(#[from] serde_json::Error),
    #[error("mmcli output lacks {0} (is it the output of the right mmcli command, with -J?)")]
    Missing(&'static str),
    #[error("mmcli output has an unusable {field}: {value:?}")]
    Invalid { field: &'static str, value: String },
}

/// `mmcli -m N -J`, the parts that matter here.
#[derive(Clone, Debug, PartialEq)]
pub struct ModemStatus {
    /// `modem.generic.state`, e.g. `connected`.
    pub state: String,
    pub registration: v1::RegistrationState,
    /// e.g. `["lte"]`.
    pub access_technologies: Vec<String>,
    pub operator_code: Option<String>,
    pub operator_name: Option<String>,
    /// The modem's data bearer is connected.
    pub link_up: bool,
}

/// `mmcli -m N --location-get -J`: the serving cell.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CellLocation {
    /// E-UTRAN cell identity (or the UMTS/GSM cell id); 0 when `--`.
    pub cell_id: u64,
    pub tac: Option<u32>,
    pub lac: Option<u32>,
    pub mcc: Option<String>,
    pub mnc: Option<String>,
}

/// `mmcli -m N --signal-get -J`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Signal {
    pub rsrp_dbm: Option<f64>,
}

fn root(text: &str) -> Result<Value, MmcliError> {
    let v: Value = serde_json::from_str(text.trim())?;
    if v.get("modem").is_none_or(|m| !m.is_object()) {
        return Err(MmcliError::Missing("modem"));
    }
    Ok(v)
}

/// A string value; `None` for mmcli's `--`, an empty string or absence.
fn string(v: &Value, pointer: &str) -> Option<String> {
    v.pointer(pointer).and_then(Value::as_str).map(str::trim).filter(|s| !s.is_empty() && *s != "--").map(String::from)
}

fn hex(v: &Value, pointer: &str, field: &'static str) -> Result<Option<u64>, MmcliError> {
    string(v, pointer)
        .map(|s| u64::from_str_radix(&s, 16).map_err(|_| MmcliError::Invalid { field, value: s }))
        .transpose()
}

fn number(v: &Value, pointer: &str, field: &'static str) -> Result<Option<f64>, MmcliError> {
    string(v, pointer)
        .map(|s| match s.trim_end_matches("dBm").trim().parse::<f64>() {
            Ok(x) if x.is_finite() => Ok(x),
            _ => Err(MmcliError::Invalid { field, value: s }),
        })
        .transpose()
}

/// Map a 3GPP registration state (or, failing that, a modem state).
pub fn registration_of(registration: Option<&str>, state: &str) -> v1::RegistrationState {
    use v1::RegistrationState as R;
    match registration {
        Some(
            "home"
            | "roaming"
            | "home-sms-only"
            | "roaming-sms-only"
            | "home-csfb-not-preferred"
            | "roaming-csfb-not-preferred",
        ) => R::Registered,
        Some("searching") => R::Searching,
        Some("denied" | "emergency-only" | "attached-rlos") => R::Denied,
        Some("idle") => R::Idle,
        _ => match state {
            "registered" | "connecting" | "connected" | "disconnecting" => R::Registered,
            "searching" => R::Searching,
            "enabled" => R::Idle,
            "locked" | "failed" => R::Denied,
            _ => R::Unspecified,
        },
    }
}

/// Parse `mmcli -m N -J`.
pub fn parse_modem(text: &str) -> Result<ModemStatus, MmcliError> {
    let v = root(text)?;
    let state = string(&v, "/modem/generic/state").ok_or(MmcliError::Missing("modem.generic.state"))?;
    let registration = registration_of(string(&v, "/modem/3gpp/registration-state").as_deref(), &state);
    let access_technologies = v
        .pointer("/modem/generic/access-technologies")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).filter(|s| *s != "--").map(String::from).collect())
        .unwrap_or_default();
    Ok(ModemStatus {
        link_up: state == "connected",
        state,
        registration,
        access_technologies,
        operator_code: string(&v, "/modem/3gpp/operator-code"),
        operator_name: string(&v, "/modem/3gpp/operator-name"),
    })
}

/// Parse `mmcli -m N --location-get -J`.
pub fn parse_location(text: &str) -> Result<CellLocation, MmcliError> {
    let v = root(text)?;
    if v.pointer("/modem/location/3gpp").is_none() {
        return Err(MmcliError::Missing("modem.location.3gpp"));
    }
    let small = |x: Option<u64>, field| {
        x.map(|x| u32::try_from(x).map_err(|_| MmcliError::Invalid { field, value: format!("{x:X}") })).transpose()
    };
    Ok(CellLocation {
        cell_id: hex(&v, "/modem/location/3gpp/cid", "modem.location.3gpp.cid")?.unwrap_or(0),
        tac: small(hex(&v, "/modem/location/3gpp/tac", "modem.location.3gpp.tac")?, "modem.location.3gpp.tac")?,
        // An LTE modem reports lac 0000; that is "none", not area 0.
        lac: small(hex(&v, "/modem/location/3gpp/lac", "modem.location.3gpp.lac")?, "modem.location.3gpp.lac")?
            .filter(|&l| l != 0),
        mcc: string(&v, "/modem/location/3gpp/mcc"),
        mnc: string(&v, "/modem/location/3gpp/mnc"),
    })
}

/// Parse `mmcli -m N --signal-get -J`.
pub fn parse_signal(text: &str) -> Result<Signal, MmcliError> {
    let v = root(text)?;
    if v.pointer("/modem/signal").is_none() {
        return Err(MmcliError::Missing("modem.signal"));
    }
    let lte = number(&v, "/modem/signal/lte/rsrp", "modem.signal.lte.rsrp")?;
    let nr = number(&v, "/modem/signal/5g/rsrp", "modem.signal.5g.rsrp")?;
    Ok(Signal { rsrp_dbm: lte.or(nr) })
}

/// One poll of a modem as the detector's observation (its RSRP included).
pub fn observation(time_unix_ms: i64, modem: &ModemStatus, cell: &CellLocation, signal: Signal) -> Observation {
    Observation {
        time_unix_ms,
        cell_id: cell.cell_id,
        registration: modem.registration,
        rsrp_dbm: signal.rsrp_dbm,
        link_up: modem.link_up,
    }
}

/// One poll of a modem as a telemetry cell sample.
pub fn cell_sample(path: u32, carrier: &str, obs: &Observation) -> v1::CellSample {
    v1::CellSample {
        path,
        carrier: carrier.to_string(),
        cell_id: obs.cell_id,
        rsrp_dbm: obs.rsrp_dbm,
        registration: obs.registration as i32,
        measured_unix_ms: obs.time_unix_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use v1::RegistrationState as R;

    fn fixture(name: &str) -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/mmcli").join(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn a_connected_lte_modem_is_registered_with_its_link_up() {
        let m = parse_modem(&fixture("modem-connected.json")).unwrap();
        assert_eq!((m.state.as_str(), m.registration, m.link_up), ("connected", R::Registered, true));
        assert_eq!(m.access_technologies, vec!["lte".to_string()]);
        assert_eq!((m.operator_code.as_deref(), m.operator_name.as_deref()), (Some("46000"), Some("CHINA MOBILE")));
    }

    #[test]
    fn a_searching_modem_has_lost_registration_and_link() {
        let m = parse_modem(&fixture("modem-searching.json")).unwrap();
        assert_eq!((m.registration, m.link_up, m.operator_name), (R::Searching, false, None));
        assert!(m.access_technologies.is_empty());
    }

    #[test]
    fn the_location_gives_the_cell_id_and_tac_from_hex() {
        let c = parse_location(&fixture("location.json")).unwrap();
        assert_eq!(c.cell_id, 0x0A3B_5C1D);
        assert_eq!((c.tac, c.lac), (Some(0x5A2F), None));
        assert_eq!((c.mcc.as_deref(), c.mnc.as_deref()), (Some("460"), Some("00")));
        let none = parse_location(&fixture("location-none.json")).unwrap();
        assert_eq!(none.cell_id, 0, "no cell while searching");
    }

    #[test]
    fn the_signal_gives_lte_rsrp_or_5g_or_none() {
        assert_eq!(parse_signal(&fixture("signal.json")).unwrap().rsrp_dbm, Some(-98.0));
        let nr = r#"{"modem":{"signal":{"5g":{"rsrp":"-88.50"},"lte":{"rsrp":"--"}}}}"#;
        assert_eq!(parse_signal(nr).unwrap().rsrp_dbm, Some(-88.5));
        assert_eq!(parse_signal(r#"{"modem":{"signal":{"lte":{"rsrp":"--"}}}}"#).unwrap().rsrp_dbm, None);
    }

    #[test]
    fn registration_states_map_to_the_schema() {
        let cases = [
            (Some("home"), "connected", R::Registered),
            (Some("roaming-sms-only"), "registered", R::Registered),
            (Some("searching"), "searching", R::Searching),
            (Some("denied"), "enabled", R::Denied),
            (Some("emergency-only"), "enabled", R::Denied),
            (Some("idle"), "enabled", R::Idle),
            (None, "connected", R::Registered),
            (None, "searching", R::Searching),
            (None, "enabled", R::Idle),
            (None, "disabled", R::Unspecified),
            (Some("something-new"), "initializing", R::Unspecified),
        ];
        for (reg, state, want) in cases {
            assert_eq!(registration_of(reg, state), want, "{reg:?} {state}");
        }
    }

    #[test]
    fn garbage_is_an_error_naming_what_is_wrong() {
        let bad = [
            ("", "not JSON"),
            ("error: couldn't find modem", "not JSON"),
            ("[]", "lacks modem"),
            (r#"{"modem":{"generic":{}}}"#, "modem.generic.state"),
            (r#"{"modem":{"generic":{"state":"--"}}}"#, "modem.generic.state"),
        ];
        for (text, want) in bad {
            let e = parse_modem(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        let e = parse_location(r#"{"modem":{"location":{"3gpp":{"cid":"XYZ"}}}}"#).unwrap_err().to_string();
        assert!(e.contains("cid") && e.contains("XYZ"), "{e}");
        assert!(parse_location(r#"{"modem":{"location":{}}}"#).is_err());
        assert!(parse_signal(r#"{"modem":{"signal":{"lte":{"rsrp":"strong"}}}}"#).is_err());
        assert!(parse_signal(&fixture("modem-connected.json")).is_err(), "the wrong command's output");
    }

    #[test]
    fn a_poll_becomes_an_observation_and_a_sample() {
        let m = parse_modem(&fixture("modem-connected.json")).unwrap();
        let c = parse_location(&fixture("location.json")).unwrap();
        let s = parse_signal(&fixture("signal.json")).unwrap();
        let o = observation(42, &m, &c, s);
        assert_eq!((o.cell_id, o.registration, o.link_up, o.rsrp_dbm), (0x0A3B_5C1D, R::Registered, true, Some(-98.0)));
        let cs = cell_sample(1, "carrier-b", &o);
        assert_eq!((cs.path, cs.carrier.as_str(), cs.measured_unix_ms), (1, "carrier-b", 42));
    }
}
