//! Revoking certificates: the CA's list of revoked serials and the CRL it
//! signs from it.
//!
//! Next to `ca.crt` / `ca.key` a CA directory may hold:
//!
//! | file            | content                                               |
//! |-----------------|-------------------------------------------------------|
//! | `revoked.json`  | the revoked serials and the last CRL number (state)   |
//! | `ca.crl`        | the CRL signed by the CA from that state (PEM, public)|
//!
//! [`revoke`] adds a serial to `revoked.json` and writes a fresh `ca.crl`;
//! [`resign_crl`] writes a fresh `ca.crl` with the same entries. Every CRL
//! gets the next CRL number and a nextUpdate [`DEFAULT_CRL_DAYS`] days (or
//! as asked) ahead; re-sign it well before then. The proxy loads `ca.crl`
//! with `--crl` (see [`crate::server_config_with_crl`]).

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rcgen::{CertificateRevocationListParams, KeyIdMethod, RevocationReason, RevokedCertParams, SerialNumber};
use serde::{Deserialize, Serialize};

use crate::issue::{open_ca, with_ca_dir, GeneratedCa};
use crate::{load_ca, load_certs, x509, PkiError};

/// File name of the revocation state inside a CA directory.
pub const REVOKED_FILE: &str = "revoked.json";
/// File name of the CRL inside a CA directory.
pub const CRL_FILE: &str = "ca.crl";
/// Default time from one CRL to its nextUpdate, in days.
pub const DEFAULT_CRL_DAYS: u32 = 30;

/// Largest accepted CRL validity, in days (1 year).
const MAX_CRL_DAYS: u32 = 366;

/// Why a certificate was revoked (the RFC 5280 reason codes that apply to a
/// train or proxy certificate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum RevokeReason {
    /// No reason given.
    Unspecified,
    /// The private key leaked (or may have).
    KeyCompromise,
    /// The train left the fleet / changed operator.
    AffiliationChanged,
    /// A new certificate replaces it (re-issue).
    Superseded,
    /// The train or proxy is decommissioned.
    CessationOfOperation,
}

impl From<RevokeReason> for RevocationReason {
    fn from(r: RevokeReason) -> Self {
        match r {
            RevokeReason::Unspecified => RevocationReason::Unspecified,
            RevokeReason::KeyCompromise => RevocationReason::KeyCompromise,
            RevokeReason::AffiliationChanged => RevocationReason::AffiliationChanged,
            RevokeReason::Superseded => RevocationReason::Superseded,
            RevokeReason::CessationOfOperation => RevocationReason::CessationOfOperation,
        }
    }
}

/// One revoked certificate in `revoked.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RevokedEntry {
    /// The serial number, lowercase hex without leading zero octets.
    pub serial: String,
    /// When it was revoked, Unix seconds.
    pub revoked_at: i64,
    /// Why.
    pub reason: RevokeReason,
    /// The certificate's subject CN (train id or proxy name), if known; for
    /// the operator only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// The content of `revoked.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RevocationState {
    /// The number of the last CRL signed (0: none yet).
    pub crl_number: u64,
    /// The revoked certificates, oldest first.
    pub revoked: Vec<RevokedEntry>,
}

/// What [`revoke`] or [`resign_crl`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrlReport {
    /// The CRL written (`ca.crl`).
    pub crl: PathBuf,
    /// The state written (`revoked.json`).
    pub state: PathBuf,
    /// The number of the new CRL.
    pub crl_number: u64,
    /// How many certificates it lists.
    pub revoked: usize,
    /// False if the serial given to [`revoke`] was already revoked.
    pub newly_revoked: bool,
    /// The CRL's nextUpdate, Unix seconds: sign a new one before then.
    pub next_update: i64,
}

/// A certificate serial number (positive, minimal octets).
#[derive(Clone, PartialEq, Eq)]
pub struct Serial(Vec<u8>);

impl Serial {
    fn from_octets(octets: &[u8]) -> Serial {
        let first = octets.iter().position(|&b| b != 0).unwrap_or(octets.len().saturating_sub(1));
        Serial(octets[first..].to_vec())
    }

    /// Parses a hex serial (`4f3a…`, optionally with `0x` and `:`
    /// separators, as `openssl x509 -serial` or `-text` print it).
    pub fn from_hex(hex: &str) -> Result<Serial, PkiError> {
        let bad = |reason: &'static str| PkiError::InvalidSerial { serial: hex.to_owned(), reason };
        let digits: String =
            hex.trim().trim_start_matches("serial=").trim_start_matches("0x").chars().filter(|c| *c != ':').collect();
        if digits.is_empty() || digits.len() > 42 {
            return Err(bad("give 1 to 20 octets of hex digits"));
        }
        if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("it is not a hex number"));
        }
        let padded = if digits.len() % 2 == 1 { format!("0{digits}") } else { digits };
        let octets = (0..padded.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&padded[i..i + 2], 16))
            .collect::<Result<Vec<u8>, _>>()
            .map_err(|_| bad("it is not a hex number"))?;
        let serial = Serial::from_octets(&octets);
        if serial.0.len() > 20 {
            return Err(bad("serial numbers have at most 20 octets"));
        }
        Ok(serial)
    }

    /// Reads the serial of the first certificate in the PEM file `cert`.
    pub fn of_cert_file(cert: &Path) -> Result<Serial, PkiError> {
        let der = load_certs(cert)?.remove(0);
        let octets = x509::serial_number(&der).map_err(|detail| PkiError::BadCertificate {
            what: format!("the certificate in `{}`", cert.display()),
            detail,
        })?;
        Ok(Serial::from_octets(&octets))
    }

    /// The serial as lowercase hex.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Debug for Serial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Serial({})", self.to_hex())
    }
}

impl fmt::Display for Serial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// Checks that the certificate in `cert` was issued by `ca` (its issuer
/// name is the CA's subject) and returns its serial and CN.
pub fn serial_issued_by(ca: &GeneratedCa, cert: &Path) -> Result<(Serial, Option<String>), PkiError> {
    let loaded = open_ca(ca)?;
    let der = load_certs(cert)?.remove(0);
    let parsed = webpki::EndEntityCert::try_from(&der).map_err(|e| PkiError::BadCertificate {
        what: format!("the certificate in `{}`", cert.display()),
        detail: e.to_string(),
    })?;
    if parsed.issuer() != loaded.subject.as_slice() {
        return Err(PkiError::NotIssuedByCa { path: cert.to_owned() });
    }
    let name = x509::subject_attributes(&der).ok().and_then(|attrs| {
        attrs.iter().find(|a| a.oid == x509::COMMON_NAME).and_then(x509::directory_string).map(str::to_owned)
    });
    Ok((Serial::of_cert_file(cert)?, name))
}

fn now_unix() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX)).unwrap_or(0)
}

/// Reads `dir/revoked.json`; a missing file is an empty state.
pub fn read_revocation_state(dir: &Path) -> Result<RevocationState, PkiError> {
    let path = dir.join(REVOKED_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            serde_json::from_str(&text).map_err(|e| PkiError::BadRevocationState { path, detail: e.to_string() })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(RevocationState::default()),
        Err(cause) => Err(PkiError::Io { op: "read", path, cause }),
    }
}

/// Signs the CRL of `state` with `ca`, valid for `days`; returns the PEM
/// text and the nextUpdate (Unix seconds).
pub fn sign_crl(ca: &GeneratedCa, state: &RevocationState, days: u32) -> Result<(String, i64), PkiError> {
    if days == 0 || days > MAX_CRL_DAYS {
        return Err(PkiError::InvalidValidity { what: "a CRL", days });
    }
    let loaded = open_ca(ca)?;
    let to_time = |secs: i64| {
        time::OffsetDateTime::from_unix_timestamp(secs).map_err(|_| PkiError::InvalidValidity { what: "a CRL", days })
    };
    let now = now_unix();
    let next_update = now + i64::from(days) * 86_400;
    let revoked_certs = state
        .revoked
        .iter()
        .map(|r| {
            Ok(RevokedCertParams {
                serial_number: SerialNumber::from(Serial::from_hex(&r.serial)?.0),
                revocation_time: to_time(r.revoked_at)?,
                reason_code: Some(r.reason.into()),
                invalidity_date: None,
            })
        })
        .collect::<Result<Vec<_>, PkiError>>()?;
    let params = CertificateRevocationListParams {
        // Back-dated a little, like the certificates, for clock skew.
        this_update: to_time(now - 300)?,
        next_update: to_time(next_update)?,
        crl_number: SerialNumber::from(state.crl_number),
        issuing_distribution_point: None,
        revoked_certs,
        key_identifier_method: match &loaded.key_id {
            Some(id) => KeyIdMethod::PreSpecified(id.clone()),
            None => KeyIdMethod::Sha256,
        },
    };
    let generate = |cause| PkiError::Generate { what: "the CRL".into(), cause };
    let crl = params.signed_by(&loaded.issuer).map_err(generate)?;
    Ok((crl.pem().map_err(generate)?, next_update))
}

fn write_state_and_crl(
    dir: &Path,
    ca: &GeneratedCa,
    mut state: RevocationState,
    days: u32,
    newly_revoked: bool,
) -> Result<CrlReport, PkiError> {
    state.crl_number += 1;
    let (pem, next_update) = sign_crl(ca, &state, days).map_err(|e| with_ca_dir(e, dir))?;
    let state_path = dir.join(REVOKED_FILE);
    let crl_path = dir.join(CRL_FILE);
    let mut json = serde_json::to_string_pretty(&state).expect("the revocation state serialises");
    json.push('\n');
    // State first: a crash in between leaves a CRL older than the state,
    // and the next `crl` or `revoke` writes a newer one.
    crate::files::write_file(&state_path, &json, false)?;
    crate::files::write_file(&crl_path, &pem, false)?;
    Ok(CrlReport {
        crl: crl_path,
        state: state_path,
        crl_number: state.crl_number,
        revoked: state.revoked.len(),
        newly_revoked,
        next_update,
    })
}

/// Revokes `serial` (CN `name`, if known) in the CA directory `dir`: adds
/// it to `revoked.json` and writes a freshly signed `ca.crl` valid for
/// `days`. Revoking a serial twice keeps the first entry (and still
/// re-signs).
pub fn revoke(
    dir: &Path,
    serial: &Serial,
    name: Option<String>,
    reason: RevokeReason,
    days: u32,
) -> Result<CrlReport, PkiError> {
    let ca = load_ca(dir)?;
    let mut state = read_revocation_state(dir)?;
    let hex = serial.to_hex();
    let newly_revoked = !state.revoked.iter().any(|r| r.serial == hex);
    if newly_revoked {
        state.revoked.push(RevokedEntry { serial: hex, revoked_at: now_unix(), reason, name });
    }
    write_state_and_crl(dir, &ca, state, days, newly_revoked)
}

/// Writes a freshly signed `ca.crl` (next CRL number, nextUpdate `days`
/// ahead) for the CA directory `dir`, listing the serials of
/// `revoked.json` (none if it does not exist).
pub fn resign_crl(dir: &Path, days: u32) -> Result<CrlReport, PkiError> {
    let ca = load_ca(dir)?;
    let state = read_revocation_state(dir)?;
    write_state_and_crl(dir, &ca, state, days, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_serials_are_normalised() {
        assert_eq!(Serial::from_hex("00:C3:01").unwrap().to_hex(), "c301");
        assert_eq!(Serial::from_hex("0x0abc").unwrap().to_hex(), "0abc");
        assert_eq!(Serial::from_hex("serial=7F").unwrap().to_hex(), "7f");
        assert_eq!(Serial::from_hex("0").unwrap().to_hex(), "00");
        assert!(Serial::from_hex("xyz").is_err());
        assert!(Serial::from_hex("").is_err());
        assert!(Serial::from_hex(&"ab".repeat(21)).is_err());
    }
}
