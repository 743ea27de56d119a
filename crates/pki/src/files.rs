//! Putting certificates and keys on disk, and reading the CA back.
//!
//! Layout (flat, one directory per role is up to the operator):
//!
//! | file            | content                                |
//! |-----------------|----------------------------------------|
//! | `ca.crt`        | CA certificate (trust anchor, public)  |
//! | `ca.key`        | CA private key (mode 0600)             |
//! | `<train>.crt`   | train certificate                      |
//! | `<train>.key`   | train private key (mode 0600)          |
//! | `<proxy>.crt`   | proxy certificate                      |
//! | `<proxy>.key`   | proxy private key (mode 0600)          |
//!
//! Files are written to a temporary name in the same directory and renamed
//! into place, so a crash never leaves a half-written key behind.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::issue::{
    generate_ca, issue_proxy, issue_train, validate_train_id, with_ca_dir, GeneratedCa, IssuedCert, DEFAULT_CA_DAYS,
    DEFAULT_CA_NAME, DEFAULT_LEAF_DAYS, DEV_PROXY_SANS,
};
use crate::PkiError;

/// File name of the CA certificate inside a CA directory.
pub const CA_CERT_FILE: &str = "ca.crt";
/// File name of the CA private key inside a CA directory.
pub const CA_KEY_FILE: &str = "ca.key";
/// Name (and file stem) of the proxy certificate in a development bundle.
pub const DEV_PROXY_NAME: &str = "proxy";

/// Where a certificate and its key were written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertPaths {
    /// The certificate (`.crt`, PEM).
    pub cert: PathBuf,
    /// The private key (`.key`, PEM, mode 0600).
    pub key: PathBuf,
}

/// The files of a development bundle written by [`write_dev_bundle`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevBundle {
    /// The bundle directory.
    pub dir: PathBuf,
    /// `ca.crt`: the trust anchor both ends load.
    pub ca_cert: PathBuf,
    /// `ca.key`: the CA key (only needed to issue more certificates).
    pub ca_key: PathBuf,
    /// `proxy.crt`: proxy certificate with the SANs of [`DEV_PROXY_SANS`].
    pub proxy_cert: PathBuf,
    /// `proxy.key`: its key.
    pub proxy_key: PathBuf,
    /// Train id -> (certificate path, key path).
    pub trains: BTreeMap<String, (PathBuf, PathBuf)>,
    /// True if an existing CA in `dir` was reused rather than generated.
    pub reused_ca: bool,
    /// `table-signing.key` / `table-signing.pub`: the failure-table
    /// signing key pair (kept when both exist).
    pub table_key: crate::TableKeyPaths,
    /// True if an existing table signing key was kept.
    pub reused_table_key: bool,
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> PkiError + 'a {
    move |cause| PkiError::Io { op, path: path.to_owned(), cause }
}

fn ensure_dir(dir: &Path) -> Result<(), PkiError> {
    fs::create_dir_all(dir).map_err(io_err("create directory", dir))
}

/// Writes `contents` to `path` atomically; `secret` files get mode 0600.
pub(crate) fn write_file(path: &Path, contents: &str, secret: bool) -> Result<(), PkiError> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{file_name}.tmp{}", std::process::id()));

    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(if secret { 0o600 } else { 0o644 });
    }
    let result = (|| {
        let mut file = options.open(&tmp).map_err(io_err("create", &tmp))?;
        // The mode given to open() is filtered by the umask and ignored if
        // the file already existed: set it explicitly.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = if secret { 0o600 } else { 0o644 };
            file.set_permissions(fs::Permissions::from_mode(mode)).map_err(io_err("set permissions of", &tmp))?;
        }
        file.write_all(contents.as_bytes()).map_err(io_err("write", &tmp))?;
        file.sync_all().map_err(io_err("sync", &tmp))?;
        fs::rename(&tmp, path).map_err(io_err("rename into place", path))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

fn refuse_existing(paths: &[&Path], force: bool) -> Result<(), PkiError> {
    if force {
        return Ok(());
    }
    match paths.iter().find(|p| p.exists()) {
        Some(p) => Err(PkiError::AlreadyExists { path: p.to_path_buf() }),
        None => Ok(()),
    }
}

/// Writes `dir/ca.crt` and `dir/ca.key` (mode 0600), creating `dir`.
///
/// Refuses to replace existing files unless `force` is set.
pub fn write_ca(dir: &Path, ca: &GeneratedCa, force: bool) -> Result<CertPaths, PkiError> {
    let paths = CertPaths { cert: dir.join(CA_CERT_FILE), key: dir.join(CA_KEY_FILE) };
    refuse_existing(&[&paths.cert, &paths.key], force)?;
    ensure_dir(dir)?;
    write_file(&paths.key, &ca.key_pem, true)?;
    write_file(&paths.cert, &ca.cert_pem, false)?;
    Ok(paths)
}

/// Writes `dir/<stem>.crt` and `dir/<stem>.key` (mode 0600), creating `dir`.
///
/// Refuses to replace existing files unless `force` is set.
pub fn write_issued(dir: &Path, stem: &str, issued: &IssuedCert, force: bool) -> Result<CertPaths, PkiError> {
    let paths = CertPaths { cert: dir.join(format!("{stem}.crt")), key: dir.join(format!("{stem}.key")) };
    refuse_existing(&[&paths.cert, &paths.key], force)?;
    ensure_dir(dir)?;
    write_file(&paths.key, &issued.key_pem, true)?;
    write_file(&paths.cert, &issued.cert_pem, false)?;
    Ok(paths)
}

fn read_text(path: &Path) -> Result<String, PkiError> {
    fs::read_to_string(path).map_err(io_err("read", path))
}

/// Reads the CA (`ca.crt` and `ca.key`) from `dir`, checking that the key
/// belongs to the certificate.
pub fn load_ca(dir: &Path) -> Result<GeneratedCa, PkiError> {
    let cert = dir.join(CA_CERT_FILE);
    let key = dir.join(CA_KEY_FILE);
    match (cert.exists(), key.exists()) {
        (true, false) => {
            return Err(PkiError::IncompleteCa { dir: dir.to_owned(), present: CA_CERT_FILE, missing: CA_KEY_FILE })
        }
        (false, true) => {
            return Err(PkiError::IncompleteCa { dir: dir.to_owned(), present: CA_KEY_FILE, missing: CA_CERT_FILE })
        }
        (false, false) => return Err(PkiError::NoCa { dir: dir.to_owned() }),
        (true, true) => {}
    }
    let ca = GeneratedCa { cert_pem: read_text(&cert)?, key_pem: read_text(&key)? };
    // Validate now, so that a broken CA is reported with its directory.
    crate::issue::check_ca(&ca).map_err(|e| with_ca_dir(e, dir))?;
    Ok(ca)
}

/// Writes a one-shot development bundle into `dir`:
///
/// * `ca.crt` / `ca.key` — reused if both already exist, otherwise generated
///   ([`DEFAULT_CA_NAME`], [`DEFAULT_CA_DAYS`]);
/// * `proxy.crt` / `proxy.key` — SANs `proxy.polycorn`, `localhost`,
///   `127.0.0.1`, `::1` (re-issued on every call);
/// * `<train>.crt` / `<train>.key` for every train id (re-issued on every
///   call);
/// * `table-signing.key` / `table-signing.pub` — the failure-table signing
///   key pair (the trainer signs, relays and proxies verify), kept if both
///   already exist.
///
/// Re-running it with the same directory keeps the CA, so certificates handed
/// out earlier stay valid.
pub fn write_dev_bundle(dir: &Path, trains: &[String]) -> Result<DevBundle, PkiError> {
    for train in trains {
        validate_train_id(train)?;
        if train == DEV_PROXY_NAME || train == "ca" {
            return Err(PkiError::InvalidTrainId {
                id: train.clone(),
                reason: "it collides with a file name of the development bundle",
            });
        }
    }
    ensure_dir(dir)?;
    let ca_cert = dir.join(CA_CERT_FILE);
    let ca_key = dir.join(CA_KEY_FILE);
    let reused_ca = ca_cert.exists() || ca_key.exists();
    let ca = if reused_ca {
        load_ca(dir)?
    } else {
        let ca = generate_ca(DEFAULT_CA_NAME, DEFAULT_CA_DAYS)?;
        write_ca(dir, &ca, false)?;
        ca
    };
    let with_dir = |e| with_ca_dir(e, dir);

    let sans: Vec<String> = DEV_PROXY_SANS.iter().map(|s| (*s).to_owned()).collect();
    let proxy = issue_proxy(&ca, DEV_PROXY_NAME, &sans, DEFAULT_LEAF_DAYS).map_err(with_dir)?;
    let proxy_paths = write_issued(dir, DEV_PROXY_NAME, &proxy, true)?;

    let mut train_paths = BTreeMap::new();
    for train in trains {
        let issued = issue_train(&ca, train, DEFAULT_LEAF_DAYS).map_err(with_dir)?;
        let paths = write_issued(dir, train, &issued, true)?;
        train_paths.insert(train.clone(), (paths.cert, paths.key));
    }

    let table_key = crate::table_key_paths(dir);
    let reused_table_key = table_key.private_key.exists() && table_key.public_key.exists();
    if !reused_table_key {
        crate::write_table_key(dir, true)?;
    }

    Ok(DevBundle {
        table_key,
        reused_table_key,
        dir: dir.to_owned(),
        ca_cert,
        ca_key,
        proxy_cert: proxy_paths.cert,
        proxy_key: proxy_paths.key,
        trains: train_paths,
        reused_ca,
    })
}
