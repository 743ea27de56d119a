//! Loading PEM files and building the rustls configurations of both ends.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, DistinguishedName, OtherError, RootCertStore, ServerConfig,
    SignatureScheme,
};
use rustls_pki_types::pem::{self, PemObject};

use crate::der;
use crate::issue::{validate_train_id, TRAIN_DOMAIN};
use crate::PkiError;

/// The ALPN protocol id both ends require.
pub const ALPN_PROTOCOL: &[u8] = b"polycorn/1";

/// The crypto provider of every configuration: *ring*, TLS 1.3 suites only
/// (the configurations are restricted to TLS 1.3 by protocol version).
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn pem_error(what: &'static str, path: &Path, err: pem::Error) -> PkiError {
    match err {
        pem::Error::Io(cause) => PkiError::Io { op: "read", path: path.to_owned(), cause },
        pem::Error::NoItemsFound if what == "private key" => PkiError::NoPrivateKey { path: path.to_owned() },
        pem::Error::NoItemsFound => PkiError::NoCertificate { path: path.to_owned() },
        other => PkiError::Pem { what, path: path.to_owned(), detail: other.to_string() },
    }
}

/// Reads every `CERTIFICATE` block of the PEM file `path` (leaf first, as
/// written by `polycorn-pki`). Fails if there is none.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, PkiError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error("certificate", path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error("certificate", path, e))?;
    if certs.is_empty() {
        return Err(PkiError::NoCertificate { path: path.to_owned() });
    }
    Ok(certs)
}

/// Reads the first private key (PKCS#8, SEC1 or PKCS#1) of the PEM file
/// `path`.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, PkiError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| pem_error("private key", path, e))
}

fn load_roots(ca: &Path) -> Result<Arc<RootCertStore>, PkiError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(ca)? {
        roots.add(cert).map_err(|e| PkiError::BadCertificate {
            what: format!("the CA certificate in `{}`", ca.display()),
            detail: e.to_string(),
        })?;
    }
    Ok(Arc::new(roots))
}

/// Extracts the train identity from a train certificate.
///
/// The identity is read from the DNS SAN `<train-id>.trains.polycorn`; the
/// subject CN, if present, must agree with it. A certificate without any DNS
/// SAN falls back to its CN; one with DNS SANs but none under
/// `trains.polycorn` (e.g. a proxy certificate) has no train identity. A
/// certificate with several different train SANs is refused as ambiguous.
///
/// This only *reads* the identity; it does not verify the certificate. The
/// proxy calls it after the chain has been verified against the CA.
pub fn train_id_of(cert: &CertificateDer<'_>) -> Result<String, PkiError> {
    let parsed = webpki::EndEntityCert::try_from(cert)
        .map_err(|e| PkiError::BadCertificate { what: "the client certificate".into(), detail: e.to_string() })?;
    let none = |detail: String| PkiError::NoTrainIdentity { detail };

    let suffix = format!(".{TRAIN_DOMAIN}");
    let mut san_ids: Vec<String> = Vec::new();
    let mut has_dns_sans = false;
    for name in parsed.valid_dns_names() {
        has_dns_sans = true;
        let lower = name.to_ascii_lowercase();
        if let Some(id) = lower.strip_suffix(&suffix) {
            validate_train_id(id).map_err(|e| none(format!("bad train SAN `{name}`: {e}")))?;
            if !san_ids.iter().any(|known| known == id) {
                san_ids.push(id.to_owned());
            }
        }
    }

    let attributes = der::parse_name(parsed.subject()).map_err(|e| none(format!("the subject does not parse: {e}")))?;
    let mut common_names = attributes.iter().filter(|a| a.oid == der::COMMON_NAME);
    let cn = match (common_names.next(), common_names.next()) {
        (None, _) => None,
        (Some(attr), None) => {
            Some(der::directory_string(attr).ok_or_else(|| none("the CN is not a text string".into()))?.to_owned())
        }
        (Some(_), Some(_)) => return Err(none("the subject has several CNs".into())),
    };

    match (san_ids.as_slice(), cn) {
        ([id], Some(cn)) if *id != cn => Err(none(format!("CN `{cn}` disagrees with the SAN `{id}{suffix}`"))),
        ([id], _) => Ok(id.clone()),
        ([], _) if has_dns_sans => {
            Err(none(format!("it has DNS SANs but none under `{TRAIN_DOMAIN}`; is it a proxy certificate?")))
        }
        ([], Some(cn)) => {
            validate_train_id(&cn).map_err(|e| none(format!("no train SAN, and the CN: {e}")))?;
            Ok(cn)
        }
        ([], None) => Err(none(format!("no CN and no `*{suffix}` SAN"))),
        (ids, _) => Err(none(format!("several train SANs ({}), which is ambiguous", ids.join(", ")))),
    }
}

/// A client-certificate verifier that accepts only the trains a proxy serves.
///
/// Chain validation (signature, validity, clientAuth usage, CA) is delegated
/// to rustls' [`WebPkiClientVerifier`]; only then is the train identity read
/// with [`train_id_of`] and compared with the allowed list.
#[derive(Debug)]
struct TrainIdentityVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    allowed: Vec<String>,
}

/// Carries a [`PkiError`] through rustls.
///
/// rustls renders `CertificateError::Other` with `{:?}`, so this wrapper's
/// `Debug` is the human-readable message; the structured error stays
/// reachable through `source()`.
struct Refusal(PkiError);

impl std::fmt::Debug for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for Refusal {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

fn refuse(err: PkiError) -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(Refusal(err)))))
}

impl ClientCertVerifier for TrainIdentityVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self.inner.verify_client_cert(end_entity, intermediates, now)?;
        let train = train_id_of(end_entity).map_err(refuse)?;
        if !self.allowed.contains(&train) {
            return Err(refuse(PkiError::TrainNotAllowed { train, allowed: self.allowed.join(", ") }));
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Builds the proxy's TLS configuration.
///
/// * TLS 1.3 only, *ring* provider, ALPN [`ALPN_PROTOCOL`];
/// * presents `cert` (chain, PEM) with `key`;
/// * requires a client certificate that chains to `ca` **and** whose train
///   identity ([`train_id_of`]) is in `allowed_trains`. Any other train —
///   even with a valid certificate from the same CA — fails the handshake
///   with an error naming the train.
///
/// A proxy serves exactly one train, so `allowed_trains` normally has one
/// element; it must not be empty.
pub fn server_config(
    ca: &Path,
    cert: &Path,
    key: &Path,
    allowed_trains: &[String],
) -> Result<Arc<ServerConfig>, PkiError> {
    if allowed_trains.is_empty() {
        return Err(PkiError::NoAllowedTrain);
    }
    for train in allowed_trains {
        validate_train_id(train)?;
    }
    let roots = load_roots(ca)?;
    let certs = load_certs(cert)?;
    let key = load_key(key)?;
    let provider = provider();

    let inner = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
        .build()
        .map_err(|cause| PkiError::Verifier { what: "client-certificate", path: ca.to_owned(), cause })?;
    let verifier = Arc::new(TrainIdentityVerifier { inner, allowed: allowed_trains.to_vec() });

    let tls = |cause| PkiError::Tls { what: "proxy TLS configuration", cause };
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|cause| PkiError::Tls {
            what: "proxy TLS configuration (does the key match the certificate?)",
            cause,
        })?;
    config.alpn_protocols = vec![ALPN_PROTOCOL.to_vec()];
    Ok(Arc::new(config))
}

/// Builds the relay-agent's TLS configuration.
///
/// * TLS 1.3 only, *ring* provider, ALPN [`ALPN_PROTOCOL`];
/// * verifies the proxy certificate against `ca` (and, as usual, against the
///   server name passed to `ClientConnection::new`);
/// * presents the train certificate `cert` with `key`.
pub fn client_config(ca: &Path, cert: &Path, key: &Path) -> Result<Arc<ClientConfig>, PkiError> {
    let roots = load_roots(ca)?;
    let certs = load_certs(cert)?;
    let key = load_key(key)?;
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|cause| PkiError::Tls { what: "relay-agent TLS configuration", cause })?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .map_err(|cause| PkiError::Tls {
            what: "relay-agent TLS configuration (does the key match the certificate?)",
            cause,
        })?;
    config.alpn_protocols = vec![ALPN_PROTOCOL.to_vec()];
    Ok(Arc::new(config))
}
