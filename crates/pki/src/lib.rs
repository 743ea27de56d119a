//! Polycorn's public-key infrastructure: who may talk to whom.
//!
//! # Identity model
//!
//! Polycorn pairs every train with its own cloud proxy. The on-train
//! relay-agent opens one TLS 1.3 subflow per cellular interface to that proxy,
//! and both ends authenticate with certificates from one **Polycorn CA**:
//!
//! * **CA** — a self-signed ECDSA P-256 certificate (`ca.crt`, default name
//!   "Polycorn Development CA", 10 years, path length 0: it signs leaves
//!   only). Both ends trust exactly this CA and nothing else (no web PKI
//!   roots).
//! * **Train certificate** — one per train. Its identity is the *train id*
//!   (e.g. `train-0042`, one lowercase DNS label), carried twice: as the
//!   subject CN and as the DNS SAN `<train-id>.trains.polycorn`
//!   ([`TRAIN_DOMAIN`]). Extended key usage clientAuth only, so a train
//!   certificate cannot pose as a proxy.
//! * **Proxy certificate** — the DNS names / IP addresses the relay-agent
//!   dials as SANs (e.g. `proxy.polycorn`, `localhost`, `127.0.0.1`).
//!   Extended key usage serverAuth only, so a proxy certificate cannot pose as
//!   a train. Names under `trains.polycorn` are refused.
//!
//! A proxy serves exactly one train. Its [`server_config`] therefore checks
//! two things about every client: the certificate chains to the CA
//! (delegated to rustls' `WebPkiClientVerifier`), **and** its train identity
//! ([`train_id_of`]) is in the proxy's allowed list. A valid certificate of
//! another train is refused during the handshake, with an error naming that
//! train. The relay-agent's [`client_config`] verifies the proxy against the
//! CA and the dialled name, and presents the train certificate.
//!
//! Both configurations use the *ring* provider, TLS 1.3 only, and the ALPN
//! protocol `polycorn/1` ([`ALPN_PROTOCOL`]).
//!
//! # Issuing
//!
//! [`generate_ca`], [`issue_train`] and [`issue_proxy`] return PEM text;
//! [`write_ca`], [`write_issued`] and [`write_dev_bundle`] put it on disk
//! (keys with mode 0600). The `polycorn-pki` binary wraps them:
//!
//! ```text
//! polycorn-pki init-ca     --out pki/ca
//! polycorn-pki issue-train --ca-dir pki/ca --train-id train-0042 --out pki/trains
//! polycorn-pki issue-proxy --ca-dir pki/ca --name proxy-0042 --san proxy.polycorn --out pki/proxy
//! polycorn-pki dev         --out pki/dev --train train-0042
//! ```
//!
//! Every issued certificate is verified against its CA, with the same
//! verifier the peer will use, before it is returned.
//!
//! # Revoking
//!
//! [`revoke`] lists a serial in the CA directory's `revoked.json` and writes
//! the CA-signed CRL `ca.crl`; [`resign_crl`] renews it. The proxy loads it
//! with [`server_config_with_crl`], whose [`CrlWatch`] reloads it when the
//! file changes.
//!
//! This is a development PKI: there is no intermediate CA and no OCSP; the
//! CA key is a plain file.

mod crl;
mod error;
mod files;
mod issue;
mod table_key;
mod tls;
mod x509;

pub use crl::{
    read_revocation_state, resign_crl, revoke, serial_issued_by, sign_crl, CrlReport, RevocationState, RevokeReason,
    RevokedEntry, Serial, CRL_FILE, DEFAULT_CRL_DAYS, REVOKED_FILE,
};
pub use error::PkiError;
pub use files::{
    load_ca, write_ca, write_dev_bundle, write_issued, CertPaths, DevBundle, CA_CERT_FILE, CA_KEY_FILE, DEV_PROXY_NAME,
};
pub use issue::{
    generate_ca, issue_proxy, issue_train, train_san, validate_train_id, GeneratedCa, IssuedCert, DEFAULT_CA_DAYS,
    DEFAULT_CA_NAME, DEFAULT_LEAF_DAYS, DEV_PROXY_SANS, ORGANIZATION, TRAIN_DOMAIN,
};
pub use table_key::{
    generate_table_key, load_table_verify_keys, parse_table_verify_keys, public_key_pem, table_key_from_seed,
    table_key_paths, write_table_key, TableKeyPair, TableKeyPaths, TablePublicKey, TABLE_SIGNING_KEY_FILE,
    TABLE_VERIFY_KEY_FILE,
};
pub use tls::{
    authenticated_refusal, client_config, load_certs, load_crls, load_key, server_config, server_config_with_crl,
    train_id_of, CrlStatus, CrlWatch, ALPN_PROTOCOL,
};

pub(crate) use tls::provider;
