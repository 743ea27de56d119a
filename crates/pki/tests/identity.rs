//! Behaviour of the Polycorn identity model, checked with real rustls
//! handshakes over an in-memory pipe (no sockets, no async runtime).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use polycorn_pki::{
    client_config, generate_ca, issue_proxy, issue_train, load_certs, load_key, server_config, train_id_of, write_ca,
    write_dev_bundle, write_issued, CertPaths, DevBundle, GeneratedCa, PkiError, ALPN_PROTOCOL, DEFAULT_CA_DAYS,
    DEFAULT_LEAF_DAYS, DEV_PROXY_SANS,
};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, ConnectionCommon, ServerConfig, ServerConnection};

const TRAIN: &str = "train-0042";
const OTHER_TRAIN: &str = "train-0099";
const PROXY_NAME: &str = "proxy.polycorn";

// ---------------------------------------------------------------- harness

/// What each side of a handshake ended with.
#[derive(Debug)]
struct Outcome {
    client: Result<(), rustls::Error>,
    server: Result<(), rustls::Error>,
    client_conn: ClientConnection,
    server_conn: ServerConnection,
}

impl Outcome {
    fn both_ok(&self) -> bool {
        self.client.is_ok() && self.server.is_ok()
    }
}

/// Moves every pending TLS record from `from` to `to` and lets `to` process
/// them. Returns the number of bytes moved and `to`'s processing result.
fn pump<A, B>(from: &mut ConnectionCommon<A>, to: &mut ConnectionCommon<B>) -> (usize, Result<(), rustls::Error>) {
    let mut wire = Vec::new();
    while from.wants_write() {
        if from.write_tls(&mut wire).is_err() {
            break;
        }
    }
    let moved = wire.len();
    let mut rd = &wire[..];
    while !rd.is_empty() {
        match to.read_tls(&mut rd) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    (moved, to.process_new_packets().map(|_| ()))
}

/// Runs a full handshake between the two configurations, keeping the first
/// error each side reports (including alerts received from the peer).
fn handshake(client: Arc<ClientConfig>, server: Arc<ServerConfig>) -> Outcome {
    let name = ServerName::try_from(PROXY_NAME).unwrap();
    let mut c = ClientConnection::new(client, name).unwrap();
    let mut s = ServerConnection::new(server).unwrap();
    let mut client_res = Ok(());
    let mut server_res = Ok(());
    for _ in 0..32 {
        let (to_server, res) = pump(&mut c, &mut s);
        if server_res.is_ok() {
            server_res = res;
        }
        let (to_client, res) = pump(&mut s, &mut c);
        if client_res.is_ok() {
            client_res = res;
        }
        let idle = to_server == 0 && to_client == 0;
        let done = !c.is_handshaking() && !s.is_handshaking();
        if idle && (done || client_res.is_err() || server_res.is_err()) {
            break;
        }
    }
    Outcome { client: client_res, server: server_res, client_conn: c, server_conn: s }
}

/// A CA with its train and proxy certificates on disk.
struct Pki {
    _dir: tempfile::TempDir,
    ca_cert: PathBuf,
    proxy: CertPaths,
    trains: Vec<(String, CertPaths)>,
}

impl Pki {
    fn train(&self, id: &str) -> &CertPaths {
        &self.trains.iter().find(|(t, _)| t == id).unwrap().1
    }

    fn client(&self, train: &str) -> Arc<ClientConfig> {
        let t = self.train(train);
        client_config(&self.ca_cert, &t.cert, &t.key).unwrap()
    }

    fn server(&self, allowed: &[&str]) -> Arc<ServerConfig> {
        let allowed: Vec<String> = allowed.iter().map(|s| (*s).to_owned()).collect();
        server_config(&self.ca_cert, &self.proxy.cert, &self.proxy.key, &allowed).unwrap()
    }
}

fn make_pki(ca_name: &str, trains: &[&str]) -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let ca = generate_ca(ca_name, DEFAULT_CA_DAYS).unwrap();
    let ca_paths = write_ca(dir.path(), &ca, false).unwrap();
    let sans: Vec<String> = DEV_PROXY_SANS.iter().map(|s| (*s).to_owned()).collect();
    let proxy = issue_proxy(&ca, "proxy", &sans, DEFAULT_LEAF_DAYS).unwrap();
    let proxy = write_issued(dir.path(), "proxy", &proxy, false).unwrap();
    let trains = trains
        .iter()
        .map(|t| {
            let issued = issue_train(&ca, t, DEFAULT_LEAF_DAYS).unwrap();
            ((*t).to_owned(), write_issued(dir.path(), t, &issued, false).unwrap())
        })
        .collect();
    Pki { _dir: dir, ca_cert: ca_paths.cert, proxy, trains }
}

fn error_text(err: &rustls::Error) -> String {
    format!("{err} / {err:?}")
}

fn first_cert(path: &Path) -> CertificateDer<'static> {
    load_certs(path).unwrap().remove(0)
}

// ---------------------------------------------------------------- behaviours

#[test]
fn train_with_its_own_certificate_is_accepted() {
    let pki = make_pki("Test CA", &[TRAIN]);
    let mut out = handshake(pki.client(TRAIN), pki.server(&[TRAIN]));
    assert!(out.both_ok(), "handshake failed: {out:?}");
    assert!(!out.client_conn.is_handshaking() && !out.server_conn.is_handshaking());

    // TLS 1.3, ALPN polycorn/1, and the proxy sees the train's identity.
    assert_eq!(out.server_conn.protocol_version(), Some(rustls::ProtocolVersion::TLSv1_3));
    assert_eq!(out.client_conn.alpn_protocol(), Some(ALPN_PROTOCOL));
    assert_eq!(out.server_conn.alpn_protocol(), Some(ALPN_PROTOCOL));
    let peer = out.server_conn.peer_certificates().unwrap();
    assert_eq!(train_id_of(&peer[0]).unwrap(), TRAIN);

    // Application data flows both ways.
    use std::io::{Read, Write};
    out.client_conn.writer().write_all(b"ping").unwrap();
    let (_, res) = pump(&mut out.client_conn, &mut out.server_conn);
    res.unwrap();
    let mut buf = [0u8; 4];
    out.server_conn.reader().read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");
    out.server_conn.writer().write_all(b"pong").unwrap();
    let (_, res) = pump(&mut out.server_conn, &mut out.client_conn);
    res.unwrap();
    out.client_conn.reader().read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"pong");
}

#[test]
fn other_trains_certificate_is_refused() {
    // Both trains hold valid certificates from the same CA, but this proxy
    // serves only TRAIN.
    let pki = make_pki("Test CA", &[TRAIN, OTHER_TRAIN]);
    let out = handshake(pki.client(OTHER_TRAIN), pki.server(&[TRAIN]));

    let server_err = out.server.as_ref().expect_err("proxy must refuse the other train");
    let text = error_text(server_err);
    assert!(matches!(server_err, rustls::Error::InvalidCertificate(_)), "{text}");
    assert!(text.contains(OTHER_TRAIN), "error must name the train: {text}");
    assert!(text.contains("not served by this proxy"), "{text}");
    println!("proxy refused the other train with: {server_err}");
    // The relay-agent learns about it through an alert.
    assert!(matches!(out.client, Err(rustls::Error::AlertReceived(_))), "client saw: {:?}", out.client);

    // Sanity check: the same certificate is fine for its own proxy.
    assert!(handshake(pki.client(OTHER_TRAIN), pki.server(&[OTHER_TRAIN])).both_ok());
}

#[test]
fn certificate_from_another_ca_is_refused() {
    let pki = make_pki("Test CA", &[TRAIN]);
    // A rogue CA issues a certificate claiming to be the very train served.
    let rogue = make_pki("Rogue CA", &[TRAIN]);
    let rogue_train = rogue.train(TRAIN);
    // The rogue train trusts the real CA for the proxy, so only its own
    // certificate can be the problem.
    let client = client_config(&pki.ca_cert, &rogue_train.cert, &rogue_train.key).unwrap();
    let out = handshake(client, pki.server(&[TRAIN]));

    let server_err = out.server.as_ref().expect_err("proxy must refuse a foreign CA");
    assert!(
        matches!(server_err, rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer)),
        "{}",
        error_text(server_err)
    );
    assert!(out.client.is_err(), "client must see the refusal");
}

#[test]
fn client_without_certificate_is_refused() {
    let pki = make_pki("Test CA", &[TRAIN]);
    let mut roots = rustls::RootCertStore::empty();
    for cert in load_certs(&pki.ca_cert).unwrap() {
        roots.add(cert).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut anonymous = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    anonymous.alpn_protocols = vec![ALPN_PROTOCOL.to_vec()];

    let out = handshake(Arc::new(anonymous), pki.server(&[TRAIN]));
    let server_err = out.server.as_ref().expect_err("proxy must require a certificate");
    assert!(matches!(server_err, rustls::Error::NoCertificatesPresented), "{}", error_text(server_err));
    assert!(out.client.is_err(), "client must see the refusal");
}

#[test]
fn proxy_presenting_a_certificate_from_another_ca_is_refused_by_the_client() {
    let pki = make_pki("Test CA", &[TRAIN]);
    let rogue = make_pki("Rogue CA", &[]);
    // The rogue proxy trusts the real CA for clients but presents its own
    // CA's server certificate (valid for proxy.polycorn).
    let server = server_config(&pki.ca_cert, &rogue.proxy.cert, &rogue.proxy.key, &[TRAIN.to_owned()]).unwrap();
    let out = handshake(pki.client(TRAIN), server);

    let client_err = out.client.as_ref().expect_err("relay must refuse the proxy");
    assert!(
        matches!(client_err, rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer)),
        "{}",
        error_text(client_err)
    );
    assert!(out.server.is_err(), "proxy must see the refusal");
}

#[test]
fn proxy_certificate_is_not_accepted_as_a_train_certificate() {
    // Same CA, but a serverAuth-only proxy certificate used as client cert.
    let pki = make_pki("Test CA", &[TRAIN]);
    let client = client_config(&pki.ca_cert, &pki.proxy.cert, &pki.proxy.key).unwrap();
    let out = handshake(client, pki.server(&[TRAIN, "proxy"]));
    assert!(out.server.is_err(), "proxy cert must not authenticate a train");
}

#[test]
fn train_id_of_reads_the_cn_and_san() {
    let pki = make_pki("Test CA", &[TRAIN]);
    assert_eq!(train_id_of(&first_cert(&pki.train(TRAIN).cert)).unwrap(), TRAIN);

    // Certificates shaped by hand with rcgen (self-signed: train_id_of only
    // reads, it does not verify).
    let make = |cn: Option<&str>, sans: &[&str]| -> CertificateDer<'static> {
        let mut params =
            rcgen::CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        if let Some(cn) = cn {
            params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        }
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        params.self_signed(&key).unwrap().der().clone()
    };

    // SAN only.
    assert_eq!(train_id_of(&make(None, &["train-7.trains.polycorn"])).unwrap(), "train-7");
    // CN only (no DNS SAN at all).
    assert_eq!(train_id_of(&make(Some("train-8"), &[])).unwrap(), "train-8");
    // CN and SAN agree.
    assert_eq!(train_id_of(&make(Some("train-9"), &["train-9.trains.polycorn"])).unwrap(), "train-9");
    // CN and SAN disagree.
    let err = train_id_of(&make(Some("train-1"), &["train-2.trains.polycorn"])).unwrap_err();
    assert!(matches!(err, PkiError::NoTrainIdentity { .. }), "{err}");
    // Two different train SANs.
    let err = train_id_of(&make(None, &["train-1.trains.polycorn", "train-2.trains.polycorn"])).unwrap_err();
    assert!(err.to_string().contains("ambiguous"), "{err}");
    // A proxy certificate has DNS SANs but no train identity.
    let err = train_id_of(&first_cert(&pki.proxy.cert)).unwrap_err();
    assert!(matches!(err, PkiError::NoTrainIdentity { .. }), "{err}");
    // Neither CN nor SAN.
    assert!(train_id_of(&make(None, &[])).is_err());
    // Not a certificate at all.
    assert!(train_id_of(&CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, 0x01])).is_err());
}

#[cfg(unix)]
fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn cli_dev_bundle_files_exist_with_0600_keys() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("dev");
    let trains = vec![TRAIN.to_owned(), OTHER_TRAIN.to_owned()];
    let bundle: DevBundle = write_dev_bundle(&out, &trains).unwrap();
    assert!(!bundle.reused_ca);

    let mut keys = vec![bundle.ca_key.clone(), bundle.proxy_key.clone()];
    let mut files = vec![bundle.ca_cert.clone(), bundle.proxy_cert.clone()];
    assert_eq!(bundle.trains.len(), 2);
    for (train, (cert, key)) in &bundle.trains {
        assert_eq!(cert, &out.join(format!("{train}.crt")));
        assert_eq!(key, &out.join(format!("{train}.key")));
        files.push(cert.clone());
        keys.push(key.clone());
    }
    for f in files.iter().chain(&keys) {
        assert!(f.is_file(), "{} missing", f.display());
    }
    #[cfg(unix)]
    for k in &keys {
        assert_eq!(mode_of(k), 0o600, "{}", k.display());
    }
    // No temporary files left behind.
    let leftovers: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // The bundle is usable as is.
    let (tc, tk) = &bundle.trains[TRAIN];
    let client = client_config(&bundle.ca_cert, tc, tk).unwrap();
    let server = server_config(&bundle.ca_cert, &bundle.proxy_cert, &bundle.proxy_key, &[TRAIN.to_owned()]).unwrap();
    assert!(handshake(client.clone(), server).both_ok());

    // Running it again reuses the CA, so earlier certificates stay valid.
    let ca_before = std::fs::read(&bundle.ca_cert).unwrap();
    let again = write_dev_bundle(&out, &[TRAIN.to_owned()]).unwrap();
    assert!(again.reused_ca);
    assert_eq!(std::fs::read(&again.ca_cert).unwrap(), ca_before);
    let server = server_config(&again.ca_cert, &again.proxy_cert, &again.proxy_key, &[TRAIN.to_owned()]).unwrap();
    assert!(handshake(client, server).both_ok());
}

#[test]
fn existing_ca_is_not_overwritten_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let first = generate_ca("First", 30).unwrap();
    write_ca(dir.path(), &first, false).unwrap();
    let second: GeneratedCa = generate_ca("Second", 30).unwrap();
    let err = write_ca(dir.path(), &second, false).unwrap_err();
    assert!(matches!(err, PkiError::AlreadyExists { .. }), "{err}");
    assert!(err.to_string().contains("--force"), "{err}");
    write_ca(dir.path(), &second, true).unwrap();
    let on_disk = std::fs::read_to_string(dir.path().join("ca.crt")).unwrap();
    assert_eq!(on_disk, second.cert_pem);
    #[cfg(unix)]
    assert_eq!(mode_of(&dir.path().join("ca.key")), 0o600);
}

#[test]
fn loading_errors_name_the_file_and_the_remedy() {
    let pki = make_pki("Test CA", &[TRAIN]);
    // A certificate file where a key is expected.
    let cert_path = &pki.train(TRAIN).cert;
    let err = load_key(cert_path).unwrap_err();
    let text = err.to_string();
    assert!(text.contains(&cert_path.display().to_string()), "{text}");
    assert!(text.contains("PRIVATE KEY"), "{text}");
    // A missing file.
    let missing = pki.ca_cert.with_file_name("nope.crt");
    let text = load_certs(&missing).unwrap_err().to_string();
    assert!(text.contains("nope.crt"), "{text}");
    // A key file where certificates are expected.
    let text = load_certs(&pki.train(TRAIN).key).unwrap_err().to_string();
    assert!(text.contains("CERTIFICATE"), "{text}");
    // A proxy without any allowed train.
    let err = server_config(&pki.ca_cert, &pki.proxy.cert, &pki.proxy.key, &[]).unwrap_err();
    assert!(matches!(err, PkiError::NoAllowedTrain), "{err}");
}

#[test]
fn invalid_train_ids_and_sans_are_rejected() {
    let ca = generate_ca("Test CA", 30).unwrap();
    for bad in ["", "Train-1", "../etc", "a.b", "-x", "x-", &"a".repeat(64)] {
        let err = issue_train(&ca, bad, 30).unwrap_err();
        assert!(matches!(err, PkiError::InvalidTrainId { .. }), "{bad}: {err}");
    }
    for bad in ["not a name", "x.trains.polycorn"] {
        let err = issue_proxy(&ca, "proxy", &[bad.to_owned()], 30).unwrap_err();
        assert!(matches!(err, PkiError::InvalidSan { .. }), "{bad}: {err}");
    }
    assert!(issue_proxy(&ca, "proxy", &[], 30).is_err());
    assert!(issue_proxy(&ca, "../proxy", &["localhost".to_owned()], 30).is_err());
    assert!(issue_train(&ca, TRAIN, 0).is_err());
}

#[test]
fn mismatched_ca_key_is_reported() {
    let a = generate_ca("A", 30).unwrap();
    let b = generate_ca("B", 30).unwrap();
    let franken = GeneratedCa { cert_pem: a.cert_pem, key_pem: b.key_pem };
    let err = issue_train(&franken, TRAIN, 30).unwrap_err();
    assert!(err.to_string().contains("does not belong"), "{err}");
}

#[test]
fn command_line_init_issue_and_handshake() {
    let bin = env!("CARGO_BIN_EXE_polycorn-pki");
    let dir = tempfile::tempdir().unwrap();
    let ca_dir = dir.path().join("ca");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(bin).args(args).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let ca = ca_dir.to_str().unwrap();
    let out = dir.path().join("out");
    let out_s = out.to_str().unwrap();

    let (ok, text) = run(&["init-ca", "--out", ca, "--name", "CLI CA"]);
    assert!(ok, "{text}");
    let (ok, text) = run(&["init-ca", "--out", ca]);
    assert!(!ok && text.contains("--force"), "{text}");

    let (ok, text) = run(&["issue-train", "--ca-dir", ca, "--train-id", TRAIN, "--out", out_s]);
    assert!(ok, "{text}");
    let (ok, text) = run(&[
        "issue-proxy",
        "--ca-dir",
        ca,
        "--name",
        "p1",
        "--san",
        PROXY_NAME,
        "127.0.0.1",
        "--san",
        "::1",
        "--out",
        out_s,
        "--days",
        "30",
    ]);
    assert!(ok, "{text}");
    let (ok, text) = run(&["issue-train", "--ca-dir", ca, "--train-id", "Bad", "--out", out_s]);
    assert!(!ok && text.contains("invalid train id"), "{text}");

    let client =
        client_config(&ca_dir.join("ca.crt"), &out.join(format!("{TRAIN}.crt")), &out.join(format!("{TRAIN}.key")))
            .unwrap();
    let server =
        server_config(&ca_dir.join("ca.crt"), &out.join("p1.crt"), &out.join("p1.key"), &[TRAIN.to_owned()]).unwrap();
    assert!(handshake(client, server).both_ok());

    let (ok, text) = run(&["--help"]);
    assert!(ok && text.contains("issue-proxy"), "{text}");
}
