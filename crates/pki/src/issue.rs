//! Generating the development CA and issuing train and proxy certificates.
//!
//! Everything here works on PEM text in memory; [`crate::files`] puts it on
//! disk. All keys are ECDSA P-256, all signatures ECDSA with SHA-256.

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, DnValue, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyIdMethod, KeyPair, KeyUsagePurpose, PublicKeyData, SanType, SerialNumber, PKCS_ECDSA_P256_SHA256,
};
use rustls::client::danger::ServerCertVerifier;
use rustls::client::WebPkiServerVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::x509;
use crate::PkiError;

/// Default common name of the development CA.
pub const DEFAULT_CA_NAME: &str = "Polycorn Development CA";
/// Default validity of the CA certificate, in days (10 years).
pub const DEFAULT_CA_DAYS: u32 = 3650;
/// Default validity of train and proxy certificates, in days (1 year).
pub const DEFAULT_LEAF_DAYS: u32 = 365;
/// The DNS zone under which train identities live: train `train-0042` has the
/// DNS SAN `train-0042.trains.polycorn`.
pub const TRAIN_DOMAIN: &str = "trains.polycorn";
/// Organization (O=) put in every subject this crate issues.
pub const ORGANIZATION: &str = "Polycorn";
/// The SANs of the development proxy certificate written by
/// [`crate::write_dev_bundle`].
pub const DEV_PROXY_SANS: [&str; 4] = ["proxy.polycorn", "localhost", "127.0.0.1", "::1"];

/// Largest accepted validity, in days (100 years).
const MAX_DAYS: u32 = 36_500;
/// Certificates are back-dated by this much to tolerate clock skew between
/// the machine that issues them and the train / cloud hosts.
const BACKDATE_SECS: i64 = 3600;

/// A CA as PEM text: freshly made by [`generate_ca`] or read back from disk
/// by [`crate::load_ca`]. Pass it to [`issue_train`] and [`issue_proxy`].
#[derive(Clone)]
pub struct GeneratedCa {
    /// The self-signed CA certificate (`ca.crt`).
    pub cert_pem: String,
    /// The CA's PKCS#8 private key (`ca.key`). Keep it secret.
    pub key_pem: String,
}

impl fmt::Debug for GeneratedCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GeneratedCa").field("cert_pem", &self.cert_pem).field("key_pem", &"<redacted>").finish()
    }
}

/// A leaf certificate (train or proxy) and its private key, as PEM text.
#[derive(Clone)]
pub struct IssuedCert {
    /// The certificate, signed by the CA.
    pub cert_pem: String,
    /// Its PKCS#8 private key. Keep it secret.
    pub key_pem: String,
}

impl fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssuedCert").field("cert_pem", &self.cert_pem).field("key_pem", &"<redacted>").finish()
    }
}

/// Returns the DNS SAN that carries the identity of `train_id`
/// (`<train_id>.trains.polycorn`).
pub fn train_san(train_id: &str) -> String {
    format!("{train_id}.{TRAIN_DOMAIN}")
}

/// Checks that `id` is a usable train id: one lowercase DNS label, so that it
/// fits in the SAN `<id>.trains.polycorn` and is a safe file name.
pub fn validate_train_id(id: &str) -> Result<(), PkiError> {
    let bad = |reason| Err(PkiError::InvalidTrainId { id: id.to_owned(), reason });
    if id.is_empty() {
        return bad("it is empty");
    }
    if id.len() > 63 {
        return bad("it is longer than 63 characters");
    }
    if !id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
        return bad("it contains a character other than a-z, 0-9 and '-'");
    }
    if id.starts_with('-') || id.ends_with('-') {
        return bad("it starts or ends with '-'");
    }
    Ok(())
}

/// Checks a name used as a CN and as a file stem (proxy name).
fn validate_file_stem(what: &'static str, name: &str) -> Result<(), PkiError> {
    let bad = |reason| Err(PkiError::InvalidName { what, name: name.to_owned(), reason });
    if name.is_empty() || name.len() > 64 {
        return bad("it must have 1 to 64 characters");
    }
    if name.starts_with('.') {
        return bad("it must not start with '.'");
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')) {
        return bad("use only A-Z, a-z, 0-9, '-', '_' and '.' (it becomes a file name)");
    }
    Ok(())
}

fn validity(what: &'static str, days: u32) -> Result<(time::OffsetDateTime, time::OffsetDateTime), PkiError> {
    if days == 0 || days > MAX_DAYS {
        return Err(PkiError::InvalidValidity { what, days });
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    let to_time = |secs: i64| {
        time::OffsetDateTime::from_unix_timestamp(secs).map_err(|_| PkiError::InvalidValidity { what, days })
    };
    let not_before = to_time(now - BACKDATE_SECS)?;
    let not_after = to_time(now + i64::from(days) * 86_400)?;
    Ok((not_before, not_after))
}

fn new_key(what: &str) -> Result<KeyPair, PkiError> {
    KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
        .map_err(|cause| PkiError::Generate { what: format!("the ECDSA P-256 key of {what}"), cause })
}

fn subject(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn.push(DnType::OrganizationName, ORGANIZATION);
    dn
}

fn ca_key_usages() -> Vec<KeyUsagePurpose> {
    vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature]
}

/// Generates a self-signed development CA named `name`, valid for `days`.
///
/// The CA may only sign leaf certificates (path length 0).
pub fn generate_ca(name: &str, days: u32) -> Result<GeneratedCa, PkiError> {
    if name.trim().is_empty() {
        return Err(PkiError::InvalidName { what: "CA name", name: name.to_owned(), reason: "it is empty" });
    }
    let (not_before, not_after) = validity("the CA", days)?;
    let key = new_key("the CA")?;
    let mut params = CertificateParams::default();
    params.distinguished_name = subject(name);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = ca_key_usages();
    params.not_before = not_before;
    params.not_after = not_after;
    let cert = params
        .self_signed(&key)
        .map_err(|cause| PkiError::Generate { what: format!("the CA certificate `{name}`"), cause })?;
    Ok(GeneratedCa { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}

/// A CA ready to sign: its key, its subject rebuilt for rcgen, and roots for
/// self-checking what it issues.
pub(crate) struct LoadedCa {
    pub(crate) issuer: Issuer<'static, KeyPair>,
    roots: Arc<RootCertStore>,
    /// The CA's subject (DER contents of the `Name`), to recognise what it issued.
    pub(crate) subject: Vec<u8>,
    /// The CA's subjectKeyIdentifier, if it has one: CRLs name it in their
    /// authorityKeyIdentifier.
    pub(crate) key_id: Option<Vec<u8>>,
}

fn unusable(detail: impl Into<String>) -> PkiError {
    PkiError::UnusableCa { dir: PathBuf::from("<memory>"), detail: detail.into() }
}

pub(crate) fn open_ca(ca: &GeneratedCa) -> Result<LoadedCa, PkiError> {
    let cert_der = CertificateDer::from_pem_slice(ca.cert_pem.as_bytes())
        .map_err(|e| unusable(format!("the CA certificate is not valid PEM ({e})")))?;
    let key =
        KeyPair::from_pem(&ca.key_pem).map_err(|e| unusable(format!("the CA key is not a usable PKCS#8 key ({e})")))?;
    let parsed = webpki::EndEntityCert::try_from(&cert_der)
        .map_err(|e| unusable(format!("the CA certificate does not parse ({e})")))?;

    if parsed.subject_public_key_info().as_ref() != key.subject_public_key_info().as_slice() {
        return Err(unusable("the CA key does not belong to the CA certificate"));
    }

    // Rebuild the CA subject attribute by attribute so that the issuer name of
    // every leaf matches the CA subject byte for byte.
    let mut dn = DistinguishedName::new();
    let attributes =
        x509::subject_attributes(&cert_der).map_err(|e| unusable(format!("the CA subject does not parse ({e})")))?;
    for attr in &attributes {
        let text = std::str::from_utf8(&attr.value).map_err(|_| unusable("the CA subject has a non-text attribute"))?;
        let value = match attr.tag {
            12 => DnValue::Utf8String(text.to_owned()),
            19 => DnValue::PrintableString(
                text.try_into().map_err(|_| unusable("the CA subject has a bad PrintableString"))?,
            ),
            22 => DnValue::Ia5String(text.try_into().map_err(|_| unusable("the CA subject has a bad IA5String"))?),
            _ => return Err(unusable("the CA subject uses an unsupported string type")),
        };
        let ty = DnType::from_oid(&attr.oid);
        if dn.get(&ty).is_some() {
            return Err(unusable("the CA subject repeats an attribute type"));
        }
        dn.push(ty, value);
    }

    let mut params = CertificateParams::default();
    params.distinguished_name = dn;
    params.key_usages = ca_key_usages();
    // Leaves carry an authorityKeyIdentifier; it must equal the CA's
    // subjectKeyIdentifier (OpenSSL refuses the chain otherwise). CAs made
    // by `generate_ca` use rcgen's default (truncated SHA-256), others may
    // not.
    let key_id = x509::subject_key_identifier(&cert_der)
        .map_err(|e| unusable(format!("the CA extensions do not parse ({e})")))?;
    if let Some(ski) = &key_id {
        params.key_identifier_method = KeyIdMethod::PreSpecified(ski.clone());
    }
    let issuer = Issuer::new(params, key);
    let subject = parsed.subject().to_vec();

    let mut roots = RootCertStore::empty();
    roots.add(cert_der).map_err(|e| unusable(format!("the CA certificate is not a usable trust anchor ({e})")))?;
    Ok(LoadedCa { issuer, roots: Arc::new(roots), subject, key_id })
}

/// Checks that `ca` can sign: PEM parses, key matches, subject is readable.
pub(crate) fn check_ca(ca: &GeneratedCa) -> Result<(), PkiError> {
    open_ca(ca).map(|_| ())
}

fn leaf_params(
    common_name: &str,
    sans: Vec<SanType>,
    eku: ExtendedKeyUsagePurpose,
    what: &'static str,
    days: u32,
) -> Result<CertificateParams, PkiError> {
    let (not_before, not_after) = validity(what, days)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = subject(common_name);
    params.subject_alt_names = sans;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![eku];
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(random_serial()?);
    params.not_before = not_before;
    params.not_after = not_after;
    Ok(params)
}

/// A random, positive 128-bit serial number.
///
/// rcgen's default serial is a hash of the subject's public key: unique as
/// long as every certificate gets a fresh key, which `sign_leaf` does. A
/// random serial does not depend on that, and is what RFC 5280 / the CA/B
/// rules expect; revocation (`polycorn-pki revoke`) identifies a certificate
/// by it.
fn random_serial() -> Result<SerialNumber, PkiError> {
    let mut bytes = [0u8; 16];
    crate::provider().secure_random.fill(&mut bytes).map_err(|_| PkiError::Generate {
        what: "a random serial number".into(),
        cause: rcgen::Error::RingUnspecified,
    })?;
    bytes[0] &= 0x7f; // positive
    bytes[0] |= 0x40; // and always 16 octets long
    Ok(SerialNumber::from(bytes.to_vec()))
}

fn sign_leaf(
    ca: &LoadedCa,
    params: &CertificateParams,
    label: &str,
) -> Result<(CertificateDer<'static>, IssuedCert), PkiError> {
    let key = new_key(label)?;
    let cert = params
        .signed_by(&key, &ca.issuer)
        .map_err(|cause| PkiError::Generate { what: format!("the certificate of {label}"), cause })?;
    let issued = IssuedCert { cert_pem: cert.pem(), key_pem: key.serialize_pem() };
    Ok((cert.der().clone(), issued))
}

fn self_check_failed(label: &str, e: rustls::Error) -> PkiError {
    unusable(format!("the certificate just issued for {label} does not verify against the CA ({e})"))
}

/// Issues the certificate of train `train_id` (CN = train id, DNS SAN
/// `<train_id>.trains.polycorn`, extended key usage clientAuth), valid for
/// `days`.
pub fn issue_train(ca: &GeneratedCa, train_id: &str, days: u32) -> Result<IssuedCert, PkiError> {
    validate_train_id(train_id)?;
    let ca = open_ca(ca)?;
    let san = SanType::DnsName(
        train_san(train_id)
            .try_into()
            .map_err(|cause| PkiError::Generate { what: format!("the SAN of train `{train_id}`"), cause })?,
    );
    let params = leaf_params(train_id, vec![san], ExtendedKeyUsagePurpose::ClientAuth, "a train certificate", days)?;
    let label = format!("train `{train_id}`");
    let (der, issued) = sign_leaf(&ca, &params, &label)?;

    // Self-check: the new certificate must pass exactly the verification the
    // proxy will apply.
    let verifier = WebPkiClientVerifier::builder_with_provider(ca.roots, crate::provider())
        .build()
        .map_err(|e| unusable(format!("cannot build a verifier from the CA ({e})")))?;
    verifier.verify_client_cert(&der, &[], UnixTime::now()).map_err(|e| self_check_failed(&label, e))?;
    Ok(issued)
}

/// Parses one proxy SAN: an IP address or a DNS name.
fn parse_san(san: &str) -> Result<SanType, PkiError> {
    if let Ok(ip) = san.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    let invalid = |reason: String| PkiError::InvalidSan { san: san.to_owned(), reason };
    rustls_pki_types::DnsName::try_from(san)
        .map_err(|_| invalid("it is neither an IP address nor a valid DNS name".into()))?;
    if san.ends_with(&format!(".{TRAIN_DOMAIN}")) {
        return Err(invalid(format!("names under `{TRAIN_DOMAIN}` are reserved for train identities")));
    }
    Ok(SanType::DnsName(san.try_into().map_err(|e| invalid(format!("{e}")))?))
}

/// Issues a proxy server certificate (CN = `name`, the given DNS and IP SANs,
/// extended key usage serverAuth), valid for `days`.
///
/// `name` also becomes the file stem (`<name>.crt` / `<name>.key`). At least
/// one SAN is required: the relay-agent verifies the proxy against the name
/// or address it dials.
pub fn issue_proxy(ca: &GeneratedCa, name: &str, sans: &[String], days: u32) -> Result<IssuedCert, PkiError> {
    validate_file_stem("proxy name", name)?;
    if sans.is_empty() {
        return Err(PkiError::InvalidSan {
            san: String::new(),
            reason: "no SAN given; pass at least one --san".into(),
        });
    }
    let san_types = sans.iter().map(|s| parse_san(s)).collect::<Result<Vec<_>, _>>()?;
    let ca = open_ca(ca)?;
    let params = leaf_params(name, san_types, ExtendedKeyUsagePurpose::ServerAuth, "a proxy certificate", days)?;
    let label = format!("proxy `{name}`");
    let (der, issued) = sign_leaf(&ca, &params, &label)?;

    // Self-check: the relay-agent's verification must accept it for its
    // first SAN.
    let verifier = WebPkiServerVerifier::builder_with_provider(ca.roots, crate::provider())
        .build()
        .map_err(|e| unusable(format!("cannot build a verifier from the CA ({e})")))?;
    let server_name = ServerName::try_from(sans[0].as_str())
        .map_err(|e| PkiError::InvalidSan { san: sans[0].clone(), reason: e.to_string() })?
        .to_owned();
    verifier
        .verify_server_cert(&der, &[], &server_name, &[], UnixTime::now())
        .map_err(|e| self_check_failed(&label, e))?;
    Ok(issued)
}

/// Re-labels an [`PkiError::UnusableCa`] with the directory it came from.
pub(crate) fn with_ca_dir(err: PkiError, dir: &std::path::Path) -> PkiError {
    match err {
        PkiError::UnusableCa { detail, .. } => PkiError::UnusableCa { dir: dir.to_owned(), detail },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::string::PrintableString;

    /// A CA shaped like one made by another tool: PrintableString country,
    /// a subjectKeyIdentifier that is not rcgen's default SHA-256 one.
    fn foreign_ca() -> GeneratedCa {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CountryName, DnValue::PrintableString(PrintableString::try_from("DE").unwrap()));
        dn.push(DnType::OrganizationName, "Elsewhere");
        dn.push(DnType::CommonName, "Foreign CA");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = ca_key_usages();
        params.key_identifier_method = KeyIdMethod::PreSpecified(vec![0xab; 20]);
        let cert = params.self_signed(&key).unwrap();
        GeneratedCa { cert_pem: cert.pem(), key_pem: key.serialize_pem() }
    }

    fn der_of(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    #[test]
    fn leaves_of_a_foreign_ca_match_its_name_and_key_id() {
        let ca = foreign_ca();
        let ca_der = der_of(&ca.cert_pem);
        let issued = issue_train(&ca, "train-1", 30).unwrap();
        let leaf_der = der_of(&issued.cert_pem);

        let ca_cert = webpki::EndEntityCert::try_from(&ca_der).unwrap();
        let leaf = webpki::EndEntityCert::try_from(&leaf_der).unwrap();
        assert_eq!(leaf.issuer(), ca_cert.subject());
        assert_eq!(x509::authority_key_identifier(&leaf_der).unwrap(), Some(vec![0xab; 20]));
    }

    #[test]
    fn leaves_of_our_own_ca_carry_its_key_id() {
        let ca = generate_ca("Own CA", 30).unwrap();
        let ski = x509::subject_key_identifier(&der_of(&ca.cert_pem))
            .unwrap()
            .expect("generate_ca writes a subjectKeyIdentifier");
        let issued = issue_proxy(&ca, "p", &["localhost".to_owned()], 30).unwrap();
        assert_eq!(x509::authority_key_identifier(&der_of(&issued.cert_pem)).unwrap(), Some(ski));
    }
}
