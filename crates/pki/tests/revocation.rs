//! Revocation: a train certificate listed in the CA's CRL fails the
//! handshake with the proxy, at start and after the proxy reloads the CRL.

use std::path::Path;
use std::sync::Arc;

use polycorn_pki::{
    client_config, generate_ca, issue_proxy, issue_train, load_ca, read_revocation_state, resign_crl, revoke,
    serial_issued_by, server_config_with_crl, write_ca, write_issued, CertPaths, CrlWatch, PkiError, RevokeReason,
    Serial, CRL_FILE, DEFAULT_CRL_DAYS, DEFAULT_LEAF_DAYS, DEV_PROXY_SANS,
};
use rustls::pki_types::ServerName;
use rustls::{CertificateError, ClientConnection, ConnectionCommon, ServerConfig, ServerConnection};

const TRAIN: &str = "train-0042";

fn pump<A, B>(from: &mut ConnectionCommon<A>, to: &mut ConnectionCommon<B>) -> (usize, Result<(), rustls::Error>) {
    let mut wire = Vec::new();
    while from.wants_write() {
        if from.write_tls(&mut wire).is_err() {
            break;
        }
    }
    let mut rd = &wire[..];
    while !rd.is_empty() {
        match to.read_tls(&mut rd) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    (wire.len(), to.process_new_packets().map(|_| ()))
}

/// A handshake over an in-memory pipe; returns the server's verdict.
fn handshake(ca: &Path, train: &CertPaths, server: Arc<ServerConfig>) -> Result<(), rustls::Error> {
    let client = client_config(ca, &train.cert, &train.key).unwrap();
    let mut c = ClientConnection::new(client, ServerName::try_from("proxy.polycorn").unwrap()).unwrap();
    let mut s = ServerConnection::new(server).unwrap();
    let (mut client_res, mut server_res) = (Ok(()), Ok(()));
    for _ in 0..32 {
        let (to_server, res) = pump(&mut c, &mut s);
        server_res = server_res.and(res);
        let (to_client, res) = pump(&mut s, &mut c);
        client_res = client_res.and(res);
        if to_server == 0 && to_client == 0 {
            break;
        }
    }
    server_res?;
    client_res?;
    assert!(!s.is_handshaking() && !c.is_handshaking(), "handshake did not finish");
    Ok(())
}

struct Setup {
    _dir: tempfile::TempDir,
    ca_dir: std::path::PathBuf,
    proxy: CertPaths,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let ca_dir = dir.path().join("ca");
        write_ca(&ca_dir, &generate_ca("Test CA", 30).unwrap(), false).unwrap();
        let ca = load_ca(&ca_dir).unwrap();
        let sans: Vec<String> = DEV_PROXY_SANS.iter().map(|s| (*s).to_owned()).collect();
        let proxy = issue_proxy(&ca, "proxy", &sans, DEFAULT_LEAF_DAYS).unwrap();
        let proxy = write_issued(dir.path(), "proxy", &proxy, false).unwrap();
        Setup { _dir: dir, ca_dir, proxy }
    }

    fn ca_cert(&self) -> std::path::PathBuf {
        self.ca_dir.join("ca.crt")
    }

    fn crl(&self) -> std::path::PathBuf {
        self.ca_dir.join(CRL_FILE)
    }

    /// Issues (or re-issues) the train certificate into `sub`.
    fn issue_train(&self, sub: &str) -> CertPaths {
        let ca = load_ca(&self.ca_dir).unwrap();
        let issued = issue_train(&ca, TRAIN, DEFAULT_LEAF_DAYS).unwrap();
        write_issued(&self.ca_dir.parent().unwrap().join(sub), TRAIN, &issued, false).unwrap()
    }

    fn server(&self, crl: bool) -> (Arc<ServerConfig>, Option<CrlWatch>) {
        let crl = crl.then(|| self.crl());
        server_config_with_crl(&self.ca_cert(), &self.proxy.cert, &self.proxy.key, &[TRAIN.to_owned()], crl.as_deref())
            .unwrap()
    }

    fn revoke(&self, cert: &CertPaths) {
        let ca = load_ca(&self.ca_dir).unwrap();
        let (serial, name) = serial_issued_by(&ca, &cert.cert).unwrap();
        assert_eq!(name.as_deref(), Some(TRAIN));
        let report = revoke(&self.ca_dir, &serial, name, RevokeReason::Superseded, DEFAULT_CRL_DAYS).unwrap();
        assert!(report.newly_revoked);
    }
}

fn is_revoked(res: &Result<(), rustls::Error>) -> bool {
    matches!(res, Err(rustls::Error::InvalidCertificate(CertificateError::Revoked)))
}

#[test]
fn a_revoked_train_certificate_fails_the_handshake_and_its_reissue_passes() {
    let pki = Setup::new();
    let old = pki.issue_train("old");
    resign_crl(&pki.ca_dir, DEFAULT_CRL_DAYS).unwrap(); // an empty CRL to start with
    let (server, watch) = pki.server(true);
    let mut watch = watch.expect("a CRL was given");
    assert!(!watch.status().expired);
    handshake(&pki.ca_cert(), &old, server.clone()).expect("a fresh certificate passes with an empty CRL");

    // Re-issue, then revoke the old certificate.
    let new = pki.issue_train("new");
    assert_ne!(Serial::of_cert_file(&old.cert).unwrap(), Serial::of_cert_file(&new.cert).unwrap());
    pki.revoke(&old);
    let state = read_revocation_state(&pki.ca_dir).unwrap();
    assert_eq!((state.crl_number, state.revoked.len()), (2, 1));

    // The running proxy picks the new CRL up without a restart.
    let reloaded = watch.check().expect("the CRL file changed");
    assert!(reloaded.is_ok(), "{reloaded:?}");
    assert!(watch.check().is_none(), "unchanged since");
    let res = handshake(&pki.ca_cert(), &old, server.clone());
    assert!(is_revoked(&res), "the revoked certificate must fail: {res:?}");
    handshake(&pki.ca_cert(), &new, server).expect("the re-issued certificate passes");

    // A proxy started with the CRL refuses it too.
    let (server, _) = pki.server(true);
    assert!(is_revoked(&handshake(&pki.ca_cert(), &old, server.clone())));
    handshake(&pki.ca_cert(), &new, server).unwrap();
    // Without the CRL nothing is revoked.
    let (server, _) = pki.server(false);
    handshake(&pki.ca_cert(), &old, server).unwrap();
}

#[test]
fn a_bad_new_crl_is_refused_and_the_previous_one_stays() {
    let pki = Setup::new();
    let old = pki.issue_train("old");
    pki.revoke(&old);
    let (server, watch) = pki.server(true);
    let mut watch = watch.unwrap();
    let good = std::fs::read(pki.crl()).unwrap();

    // A CRL of another CA: refused at reload, the old list still applies.
    let other = tempfile::tempdir().unwrap();
    write_ca(other.path(), &generate_ca("Other CA", 30).unwrap(), false).unwrap();
    resign_crl(other.path(), DEFAULT_CRL_DAYS).unwrap();
    std::fs::copy(other.path().join(CRL_FILE), pki.crl()).unwrap();
    let res = watch.check().expect("changed");
    assert!(matches!(res, Err(PkiError::BadCrl { .. })), "{res:?}");
    assert!(is_revoked(&handshake(&pki.ca_cert(), &old, server.clone())));
    // ... and at start it is an error naming the file.
    let err =
        server_config_with_crl(&pki.ca_cert(), &pki.proxy.cert, &pki.proxy.key, &[TRAIN.into()], Some(&pki.crl()))
            .unwrap_err();
    assert!(err.to_string().contains(CRL_FILE), "{err}");

    std::fs::write(pki.crl(), "not a crl").unwrap();
    assert!(matches!(watch.check(), Some(Err(PkiError::BadCrl { .. }))));
    std::fs::write(pki.crl(), good).unwrap();
    assert!(matches!(watch.check(), Some(Ok(_))));
    assert!(is_revoked(&handshake(&pki.ca_cert(), &old, server)));
}

#[test]
fn revoking_by_serial_and_twice_is_idempotent() {
    let pki = Setup::new();
    let old = pki.issue_train("old");
    let hex = Serial::of_cert_file(&old.cert).unwrap().to_hex();
    let serial = Serial::from_hex(&hex.to_uppercase()).unwrap();
    let first = revoke(&pki.ca_dir, &serial, None, RevokeReason::KeyCompromise, 7).unwrap();
    let second = revoke(&pki.ca_dir, &serial, None, RevokeReason::KeyCompromise, 7).unwrap();
    assert!(first.newly_revoked && !second.newly_revoked);
    assert_eq!((first.crl_number, second.crl_number, second.revoked), (1, 2, 1));
    let (server, _) = pki.server(true);
    assert!(is_revoked(&handshake(&pki.ca_cert(), &old, server)));
    // A certificate of another CA cannot be revoked by file.
    let other = generate_ca("Other CA", 30).unwrap();
    let foreign = issue_train(&other, TRAIN, 30).unwrap();
    let foreign = write_issued(&pki.ca_dir.parent().unwrap().join("foreign"), TRAIN, &foreign, false).unwrap();
    let ca = load_ca(&pki.ca_dir).unwrap();
    assert!(matches!(serial_issued_by(&ca, &foreign.cert), Err(PkiError::NotIssuedByCa { .. })));
}
