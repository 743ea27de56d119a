//! Loading PEM files and building the rustls configurations of both ends.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::SystemTime;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, DistinguishedName, OtherError, RootCertStore, ServerConfig,
    SignatureScheme,
};
use rustls_pki_types::pem::{self, PemObject};

use crate::issue::{validate_train_id, TRAIN_DOMAIN};
use crate::x509;
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

/// Reads every `X509 CRL` block of the PEM file `path` (as written by
/// `polycorn-pki revoke` / `crl`). Fails if there is none.
pub fn load_crls(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, PkiError> {
    let bad = |detail: String| PkiError::BadCrl { path: path.to_owned(), detail };
    let crls = CertificateRevocationListDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| match e {
            pem::Error::Io(cause) => PkiError::Io { op: "read", path: path.to_owned(), cause },
            other => bad(format!("it is not a PEM file ({other})")),
        })?;
    if crls.is_empty() {
        return Err(bad("it holds no PEM `X509 CRL` block".into()));
    }
    Ok(crls)
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

    let attributes = x509::subject_attributes(cert).map_err(|e| none(format!("the subject does not parse: {e}")))?;
    let mut common_names = attributes.iter().filter(|a| a.oid == x509::COMMON_NAME);
    let cn = match (common_names.next(), common_names.next()) {
        (None, _) => None,
        (Some(attr), None) => {
            Some(x509::directory_string(attr).ok_or_else(|| none("the CN is not a text string".into()))?.to_owned())
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
///
/// The inner verifier sits behind a lock so that a new CRL can replace it
/// ([`CrlWatch::check`]) while the `ServerConfig` holding this verifier
/// stays in use: the next handshake sees the new CRL.
#[derive(Debug)]
struct TrainIdentityVerifier {
    inner: RwLock<Arc<dyn ClientCertVerifier>>,
    /// The CA subjects, fixed: a CRL change does not change the CA.
    root_hints: Vec<DistinguishedName>,
    allowed: Vec<String>,
}

impl TrainIdentityVerifier {
    fn inner(&self) -> Arc<dyn ClientCertVerifier> {
        self.inner.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn replace(&self, verifier: Arc<dyn ClientCertVerifier>) {
        *self.inner.write().unwrap_or_else(PoisonError::into_inner) = verifier;
    }
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

/// The refusal behind a failed TLS handshake (the `io::Error` tokio-rustls
/// returns) when the peer's certificate chained to the fleet CA but named no
/// train, or another train: an authenticated peer, as opposed to anyone who
/// failed the handshake itself (the proxy logs each of the former, and the
/// latter at a bounded rate).
pub fn authenticated_refusal(err: &std::io::Error) -> Option<&PkiError> {
    let tls = err.get_ref()?.downcast_ref::<rustls::Error>()?;
    let rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(inner))) = tls else { return None };
    inner.downcast_ref::<Refusal>().map(|r| &r.0)
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
        &self.root_hints
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self.inner().verify_client_cert(end_entity, intermediates, now)?;
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
        self.inner().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner().supported_verify_schemes()
    }
}

/// Builds the proxy's TLS configuration, without revocation checking.
///
/// Same as [`server_config_with_crl`] with no CRL.
pub fn server_config(
    ca: &Path,
    cert: &Path,
    key: &Path,
    allowed_trains: &[String],
) -> Result<Arc<ServerConfig>, PkiError> {
    server_config_with_crl(ca, cert, key, allowed_trains, None).map(|(config, _)| config)
}

/// What a CRL check found, beyond "usable".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrlStatus {
    /// How many CRLs the file holds.
    pub crls: usize,
    /// Its nextUpdate has passed: it still applies (revoked certificates
    /// stay refused) but is stale; sign a new one with `polycorn-pki crl`.
    pub expired: bool,
}

/// Checks `crls` the way the proxy will use them, on the proxy's own
/// certificate `probe` (issued by the same CA, so covered by its CRL):
/// this proves the CRL is signed by the CA and is current. A CRL that
/// revokes the proxy's own certificate, is signed by another key or names
/// another issuer is refused. If `probe` does not verify against `ca` on
/// its own (e.g. the proxy certificate comes from another CA), the check
/// is skipped.
fn check_crls(
    ca: &Path,
    probe: &CertificateDer<'_>,
    crl_path: &Path,
    crls: &[CertificateRevocationListDer<'static>],
    now: UnixTime,
) -> Result<CrlStatus, PkiError> {
    let bad = |detail: String| PkiError::BadCrl { path: crl_path.to_owned(), detail };
    let ca_certs = load_certs(ca)?;
    let anchors = ca_certs.iter().filter_map(|c| webpki::anchor_from_trusted_cert(c).ok()).collect::<Vec<_>>();
    let parsed = crls
        .iter()
        .map(|c| webpki::BorrowedCertRevocationList::from_der(c.as_ref()).map(webpki::CertRevocationList::from))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("it does not parse as an X.509 CRL ({e})")))?;
    let status = CrlStatus { crls: crls.len(), expired: false };
    let Ok(ee) = webpki::EndEntityCert::try_from(probe) else {
        return Ok(status);
    };
    let provider = provider();
    let algs = provider.signature_verification_algorithms.all;
    let verify = |revocation: Option<webpki::RevocationOptions<'_>>| {
        ee.verify_for_usage(algs, &anchors, &[], now, webpki::KeyUsage::server_auth(), revocation, None).map(|_| ())
    };
    if verify(None).is_err() {
        return Ok(status);
    }
    let refs = parsed.iter().collect::<Vec<_>>();
    let options = webpki::RevocationOptionsBuilder::new(&refs)
        .map_err(|_| bad("it holds no CRL".into()))?
        .with_depth(webpki::RevocationCheckDepth::EndEntity)
        .with_status_policy(webpki::UnknownStatusPolicy::Deny)
        .with_expiration_policy(webpki::ExpirationPolicy::Enforce)
        .build();
    match verify(Some(options)) {
        Ok(()) => Ok(status),
        Err(webpki::Error::CrlExpired { .. }) => Ok(CrlStatus { expired: true, ..status }),
        Err(webpki::Error::CertRevoked) => Err(bad("it revokes this proxy's own certificate".into())),
        Err(webpki::Error::UnknownRevocationStatus) => {
            Err(bad(format!("no CRL in it is issued by the CA `{}`", ca.display())))
        }
        Err(e) => Err(bad(format!("it does not verify against the CA `{}` ({e:?})", ca.display()))),
    }
}

fn client_verifier(
    roots: Arc<RootCertStore>,
    ca: &Path,
    crl: Option<(&Path, Vec<CertificateRevocationListDer<'static>>)>,
) -> Result<Arc<dyn ClientCertVerifier>, PkiError> {
    let mut builder = WebPkiClientVerifier::builder_with_provider(roots, provider());
    let crl_path = crl.as_ref().map(|(path, _)| path.to_path_buf());
    if let Some((_, crls)) = crl {
        // Only train certificates are checked (the CA is the trust anchor);
        // a certificate of this CA is always covered by its CRL, so unknown
        // status stays an error. An expired CRL still applies (the proxy
        // warns): locking every train out because nobody re-signed in time
        // would be worse than a stale list.
        builder = builder.with_crls(crls).only_check_end_entity_revocation();
    }
    builder.build().map_err(|cause| match (crl_path, cause) {
        (Some(path), rustls::server::VerifierBuilderError::InvalidCrl(e)) => {
            PkiError::BadCrl { path, detail: format!("rustls refused it ({e:?})") }
        }
        (_, cause) => PkiError::Verifier { what: "client-certificate", path: ca.to_owned(), cause },
    })
}

/// Keeps the proxy's CRL current: re-reads the CRL file when its size or
/// modification time changes and swaps the new list into the verifier of
/// the `ServerConfig` it came with. The next handshake uses it; subflows
/// already established are not re-checked.
#[derive(Debug)]
pub struct CrlWatch {
    path: PathBuf,
    ca: PathBuf,
    roots: Arc<RootCertStore>,
    probe: CertificateDer<'static>,
    stamp: Option<(SystemTime, u64)>,
    verifier: Arc<TrainIdentityVerifier>,
    status: CrlStatus,
}

fn stamp_of(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

impl CrlWatch {
    /// The CRL file watched.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The status of the CRL in use.
    pub fn status(&self) -> CrlStatus {
        self.status
    }

    /// Re-reads the CRL file if it changed. `None`: unchanged (or missing,
    /// then the CRL in use stays); `Some(Ok)`: the new CRL is in use;
    /// `Some(Err)`: the new file is unusable and the previous CRL stays in
    /// use (reported once per change).
    pub fn check(&mut self) -> Option<Result<CrlStatus, PkiError>> {
        let stamp = stamp_of(&self.path);
        if stamp.is_none() || stamp == self.stamp {
            return None;
        }
        self.stamp = stamp;
        Some(self.reload())
    }

    fn reload(&mut self) -> Result<CrlStatus, PkiError> {
        let crls = load_crls(&self.path)?;
        let status = check_crls(&self.ca, &self.probe, &self.path, &crls, UnixTime::now())?;
        let inner = client_verifier(self.roots.clone(), &self.ca, Some((&self.path, crls)))?;
        self.verifier.replace(inner);
        self.status = status;
        Ok(status)
    }

    /// Whether the CRL in use has passed its nextUpdate by now (re-checked,
    /// not cached: call it now and then, e.g. hourly, to warn).
    pub fn expired_now(&self) -> bool {
        match load_crls(&self.path) {
            Ok(crls) => matches!(
                check_crls(&self.ca, &self.probe, &self.path, &crls, UnixTime::now()),
                Ok(CrlStatus { expired: true, .. })
            ),
            Err(_) => self.status.expired,
        }
    }
}

/// Builds the proxy's TLS configuration.
///
/// * TLS 1.3 only, *ring* provider, ALPN [`ALPN_PROTOCOL`];
/// * presents `cert` (chain, PEM) with `key`;
/// * requires a client certificate that chains to `ca` **and** whose train
///   identity ([`train_id_of`]) is in `allowed_trains`. Any other train —
///   even with a valid certificate from the same CA — fails the handshake
///   with an error naming the train;
/// * with `crl` (PEM CRLs as written by `polycorn-pki revoke` / `crl`): a
///   client certificate whose serial the CRL lists fails the handshake
///   (`CertificateError::Revoked`). The CRL must be usable at start (it is
///   checked against the CA with the proxy's own certificate, see
///   [`CrlStatus`]); the returned [`CrlWatch`] reloads it when the file
///   changes.
///
/// A proxy serves exactly one train, so `allowed_trains` normally has one
/// element; it must not be empty.
pub fn server_config_with_crl(
    ca: &Path,
    cert: &Path,
    key: &Path,
    allowed_trains: &[String],
    crl: Option<&Path>,
) -> Result<(Arc<ServerConfig>, Option<CrlWatch>), PkiError> {
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

    let loaded_crl = match crl {
        Some(path) => {
            let stamp = stamp_of(path);
            let crls = load_crls(path)?;
            let status = check_crls(ca, &certs[0], path, &crls, UnixTime::now())?;
            Some((path, stamp, crls, status))
        }
        None => None,
    };
    let inner =
        client_verifier(roots.clone(), ca, loaded_crl.as_ref().map(|(path, _, crls, _)| (*path, crls.clone())))?;
    let verifier = Arc::new(TrainIdentityVerifier {
        root_hints: inner.root_hint_subjects().to_vec(),
        inner: RwLock::new(inner),
        allowed: allowed_trains.to_vec(),
    });
    let watch = loaded_crl.map(|(path, stamp, _, status)| CrlWatch {
        path: path.to_owned(),
        ca: ca.to_owned(),
        roots,
        probe: certs[0].clone(),
        stamp,
        verifier: verifier.clone(),
        status,
    });

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
    Ok((Arc::new(config), watch))
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
