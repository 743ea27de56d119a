//! The one error type of this crate.
//!
//! Every message names the operation that failed, the file involved (if any)
//! and what the operator should do about it, because these errors end up in
//! the logs of the relay-agent and the proxy at start-up. Messages are
//! self-contained (they include the underlying cause), so `Error::source()`
//! is deliberately not chained: logging with `{}` shows everything once.

use std::path::PathBuf;

/// Everything that can go wrong while generating, writing, loading or using
/// Polycorn certificates.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PkiError {
    /// A file or directory could not be read, written or created.
    #[error("could not {op} `{path}`: {cause}; check that the path exists and is accessible")]
    Io {
        /// What was being done, e.g. "read" or "create directory".
        op: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The underlying I/O error.
        cause: std::io::Error,
    },

    /// A PEM file could not be parsed.
    #[error(
        "could not parse the {what} PEM file `{path}`: {detail}; \
         expected a PEM file as written by `polycorn-pki`"
    )]
    Pem {
        /// "certificate" or "private key".
        what: &'static str,
        /// The file concerned.
        path: PathBuf,
        /// The parser's explanation.
        detail: String,
    },

    /// A certificate file holds no `CERTIFICATE` block.
    #[error(
        "`{path}` contains no PEM CERTIFICATE block; point to a .crt file written by \
         `polycorn-pki` (init-ca, issue-train, issue-proxy or dev)"
    )]
    NoCertificate {
        /// The file concerned.
        path: PathBuf,
    },

    /// A key file holds no private key block.
    #[error(
        "`{path}` contains no PEM PRIVATE KEY block; point to the .key file written next to \
         the certificate by `polycorn-pki`"
    )]
    NoPrivateKey {
        /// The file concerned.
        path: PathBuf,
    },

    /// A file that would be written already exists.
    #[error(
        "refusing to overwrite `{path}`; pass --force to replace it, or choose another output \
         directory"
    )]
    AlreadyExists {
        /// The existing file.
        path: PathBuf,
    },

    /// A CA directory holds neither `ca.crt` nor `ca.key`.
    #[error(
        "no CA in `{dir}` (neither ca.crt nor ca.key exists); create one with \
         `polycorn-pki init-ca --out {dir}` or point --ca-dir at the existing CA directory"
    )]
    NoCa {
        /// The directory searched.
        dir: PathBuf,
    },

    /// Only one of `ca.crt` / `ca.key` exists in a CA directory.
    #[error(
        "CA directory `{dir}` has `{present}` but not `{missing}`; restore the missing file or \
         remove the directory and run `polycorn-pki init-ca` again (every train and proxy \
         certificate must then be re-issued)"
    )]
    IncompleteCa {
        /// The CA directory.
        dir: PathBuf,
        /// The file that exists.
        present: &'static str,
        /// The file that is missing.
        missing: &'static str,
    },

    /// A train id is not usable as an identity.
    #[error(
        "invalid train id `{id}`: {reason}; a train id is one DNS label (1-63 characters of \
         a-z, 0-9 and '-', not starting or ending with '-'), e.g. `train-0042`"
    )]
    InvalidTrainId {
        /// The offending id.
        id: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// A subject alternative name given for a proxy certificate is unusable.
    #[error(
        "invalid subject alternative name `{san}` for the proxy certificate: {reason}; give a \
         DNS name (e.g. `proxy.polycorn`) or an IP address (e.g. `127.0.0.1`, `::1`)"
    )]
    InvalidSan {
        /// The offending name.
        san: String,
        /// Why it was rejected.
        reason: String,
    },

    /// A name (CA name, proxy name) is empty or otherwise unusable.
    #[error("invalid {what} `{name}`: {reason}")]
    InvalidName {
        /// What the name is for, e.g. "proxy name".
        what: &'static str,
        /// The offending name.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// A validity of zero days (or too many) was requested.
    #[error("invalid validity of {days} days for {what}; give between 1 and 36500 days")]
    InvalidValidity {
        /// What the certificate is for.
        what: &'static str,
        /// The requested number of days.
        days: u32,
    },

    /// rcgen failed to generate a key or certificate.
    #[error("could not generate {what}: {cause}")]
    Generate {
        /// What was being generated.
        what: String,
        /// The underlying error.
        cause: rcgen::Error,
    },

    /// The CA on disk cannot be used to issue certificates.
    #[error(
        "cannot use the CA in `{dir}`: {detail}; re-create it with `polycorn-pki init-ca \
         --force` (every train and proxy certificate must then be re-issued)"
    )]
    UnusableCa {
        /// Where the CA was read from (`<memory>` if it was not read from disk).
        dir: PathBuf,
        /// What is wrong with it.
        detail: String,
    },

    /// A certificate could not be parsed as X.509.
    #[error("could not parse {what} as an X.509 certificate: {detail}")]
    BadCertificate {
        /// Which certificate.
        what: String,
        /// The parser's explanation.
        detail: String,
    },

    /// A (client) certificate carries no usable train identity.
    #[error(
        "the certificate carries no train identity ({detail}); train certificates have \
         CN=<train-id> and the DNS SAN `<train-id>.trains.polycorn`, issue one with \
         `polycorn-pki issue-train`"
    )]
    NoTrainIdentity {
        /// Why no identity could be read.
        detail: String,
    },

    /// A train authenticated correctly but is not the train this proxy serves.
    #[error(
        "train `{train}` is not served by this proxy (it serves: {allowed}); the relay-agent \
         of `{train}` must connect to its own proxy, or add the train to the proxy's allowed \
         trains"
    )]
    TrainNotAllowed {
        /// The train id presented by the client certificate.
        train: String,
        /// The comma-separated allowed train ids.
        allowed: String,
    },

    /// The failure-table signing key could not be made.
    #[error("could not generate the failure-table signing key: {detail}")]
    TableKey {
        /// What failed.
        detail: String,
    },

    /// `server_config` was called without any allowed train.
    #[error(
        "no allowed train given to the proxy TLS configuration; a proxy serves exactly one \
         train, pass its train id"
    )]
    NoAllowedTrain,

    /// rustls rejected the configuration (certificates, key or CA).
    #[error("could not build the {what}: {cause}")]
    Tls {
        /// Which configuration, e.g. "proxy TLS configuration".
        what: &'static str,
        /// The underlying rustls error.
        cause: rustls::Error,
    },

    /// A serial number given to `revoke` is not usable.
    #[error(
        "invalid serial number `{serial}`: {reason}; give the hex serial printed by `openssl x509 -noout -serial`"
    )]
    InvalidSerial {
        /// The offending text.
        serial: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// A certificate to revoke was not issued by the CA given.
    #[error(
        "the certificate in `{path}` was not issued by this CA (its issuer is not the CA's subject); \
         point --ca-dir at the CA that issued it"
    )]
    NotIssuedByCa {
        /// The certificate file.
        path: PathBuf,
    },

    /// `revoked.json` of a CA directory does not parse.
    #[error(
        "could not read the revocation state `{path}`: {detail}; restore it from a backup (its \
         serials are also listed in the last ca.crl: `openssl crl -noout -text -in ca.crl`)"
    )]
    BadRevocationState {
        /// The file.
        path: PathBuf,
        /// The parser's explanation.
        detail: String,
    },

    /// A CRL file is unusable (does not parse, or is not signed by the CA).
    #[error(
        "cannot use the CRL `{path}`: {detail}; re-sign it with `polycorn-pki crl --ca-dir <CA dir>` \
         and give the proxy the ca.crl written next to the CA that signed its train certificates"
    )]
    BadCrl {
        /// The CRL file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },

    /// A certificate verifier could not be built from the CA.
    #[error("could not build the {what} verifier from the CA `{path}`: {cause}")]
    Verifier {
        /// "client-certificate" or "proxy-certificate".
        what: &'static str,
        /// The CA file.
        path: PathBuf,
        /// The underlying rustls error.
        cause: rustls::server::VerifierBuilderError,
    },
}
