//! The failure-table signing key: an Ed25519 key pair whose
//! private half signs every failure-location table the trainer publishes and
//! whose public half relays and proxies verify them with
//! (`--failure-table-verify-key`, crates/net's `table::signature`).
//!
//! Formats, the ones OpenSSL and Python's `cryptography` read and write:
//!
//! | file | content |
//! |---|---|
//! | `table-signing.key` | the private key: PEM `PRIVATE KEY`, PKCS#8 v1 (RFC 8410), mode 0600; the trainer's `--table-signing-key` |
//! | `table-signing.pub` | the public key: PEM `PUBLIC KEY`, SubjectPublicKeyInfo (RFC 8410); relays' and proxies' `--failure-table-verify-key` |
//!
//! A verify-key file may hold several `PUBLIC KEY` blocks: a table is
//! accepted when one of them verifies its signature, which is how the key
//! is rotated (docs/operations.md).

use std::path::{Path, PathBuf};

use base64::Engine as _;
use ring::rand::SecureRandom as _;
use ring::signature::{Ed25519KeyPair, KeyPair as _};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::SubjectPublicKeyInfoDer;

use crate::files::write_file;
use crate::PkiError;

/// The private key's file name in a key directory (and a development bundle).
pub const TABLE_SIGNING_KEY_FILE: &str = "table-signing.key";
/// The public key's file name.
pub const TABLE_VERIFY_KEY_FILE: &str = "table-signing.pub";

/// DER of an Ed25519 SubjectPublicKeyInfo before its 32 key bytes
/// (RFC 8410 §4: SEQUENCE { SEQUENCE { OID 1.3.101.112 }, BIT STRING }).
const SPKI_PREFIX: [u8; 12] = [0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00];
/// DER of an Ed25519 PKCS#8 v1 private key before its 32-byte seed
/// (RFC 8410 §7: version 0, the algorithm, OCTET STRING { OCTET STRING }).
const PKCS8_PREFIX: [u8; 16] =
    [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];

/// An Ed25519 public key, the 32 bytes of RFC 8032.
pub type TablePublicKey = [u8; 32];

/// A freshly generated key pair, as PEM text.
#[derive(Clone, PartialEq, Eq)]
pub struct TableKeyPair {
    /// PKCS#8 `PRIVATE KEY`.
    pub private_pem: String,
    /// SubjectPublicKeyInfo `PUBLIC KEY`.
    pub public_pem: String,
    /// The public key's bytes.
    pub public_key: TablePublicKey,
}

impl std::fmt::Debug for TableKeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableKeyPair").field("public_pem", &self.public_pem).finish_non_exhaustive()
    }
}

fn pem(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// The PEM `PUBLIC KEY` of `key`.
pub fn public_key_pem(key: &TablePublicKey) -> String {
    pem("PUBLIC KEY", &[&SPKI_PREFIX[..], key].concat())
}

/// The key pair of a 32-byte Ed25519 seed (the private key of RFC 8032).
pub fn table_key_from_seed(seed: &[u8; 32]) -> Result<TableKeyPair, PkiError> {
    let pair = Ed25519KeyPair::from_seed_unchecked(seed)
        .map_err(|e| PkiError::TableKey { detail: format!("deriving the public key: {e}") })?;
    let public_key: TablePublicKey = pair.public_key().as_ref().try_into().expect("an Ed25519 public key is 32 bytes");
    Ok(TableKeyPair {
        private_pem: pem("PRIVATE KEY", &[&PKCS8_PREFIX[..], seed].concat()),
        public_pem: public_key_pem(&public_key),
        public_key,
    })
}

/// A new key pair from the system's random generator.
pub fn generate_table_key() -> Result<TableKeyPair, PkiError> {
    let mut seed = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut seed)
        .map_err(|_| PkiError::TableKey { detail: "the system's random generator failed".into() })?;
    let pair = table_key_from_seed(&seed);
    seed.fill(0);
    pair
}

/// Where [`write_table_key`] put the key pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableKeyPaths {
    /// `table-signing.key` (mode 0600).
    pub private_key: PathBuf,
    /// `table-signing.pub`.
    pub public_key: PathBuf,
}

/// The paths of the key pair in `dir`.
pub fn table_key_paths(dir: &Path) -> TableKeyPaths {
    TableKeyPaths { private_key: dir.join(TABLE_SIGNING_KEY_FILE), public_key: dir.join(TABLE_VERIFY_KEY_FILE) }
}

/// Generates a key pair into `dir` (created if missing). Refuses to replace
/// an existing key unless `force`: every relay and proxy verifying with the
/// old public key would refuse the tables signed with the new one.
pub fn write_table_key(dir: &Path, force: bool) -> Result<TableKeyPaths, PkiError> {
    let paths = table_key_paths(dir);
    if !force {
        if let Some(p) = [&paths.private_key, &paths.public_key].into_iter().find(|p| p.exists()) {
            return Err(PkiError::AlreadyExists { path: p.clone() });
        }
    }
    std::fs::create_dir_all(dir).map_err(|cause| PkiError::Io { op: "create directory", path: dir.into(), cause })?;
    let pair = generate_table_key()?;
    write_file(&paths.private_key, &pair.private_pem, true)?;
    write_file(&paths.public_key, &pair.public_pem, false)?;
    Ok(paths)
}

/// The Ed25519 public keys of the `PUBLIC KEY` blocks of `pem` (at least
/// one). `what` names the source in errors.
pub fn parse_table_verify_keys(pem: &[u8], what: &str) -> Result<Vec<TablePublicKey>, String> {
    let mut keys = Vec::new();
    for (i, block) in SubjectPublicKeyInfoDer::pem_slice_iter(pem).enumerate() {
        let der = block.map_err(|e| format!("{what}: PUBLIC KEY block {}: {e}", i + 1))?;
        let der = der.as_ref();
        match der.strip_prefix(&SPKI_PREFIX[..]) {
            Some(k) if k.len() == 32 => keys.push(k.try_into().expect("32 bytes")),
            _ => {
                return Err(format!(
                    "{what}: PUBLIC KEY block {} is not an Ed25519 public key (RFC 8410); \
                     make one with `polycorn-pki table-key`",
                    i + 1
                ))
            }
        }
    }
    if keys.is_empty() {
        let hint = if String::from_utf8_lossy(pem).contains("PRIVATE KEY") {
            ": it holds a private key; give the public key (table-signing.pub), never the signing key"
        } else {
            ""
        };
        return Err(format!("{what}: no PEM PUBLIC KEY block{hint}"));
    }
    Ok(keys)
}

/// [`parse_table_verify_keys`] of the file at `path`.
pub fn load_table_verify_keys(path: &Path) -> Result<Vec<TablePublicKey>, PkiError> {
    let pem = std::fs::read(path).map_err(|cause| PkiError::Io { op: "read", path: path.into(), cause })?;
    parse_table_verify_keys(&pem, &path.display().to_string()).map_err(|detail| PkiError::Pem {
        what: "failure-table verify key",
        path: path.into(),
        detail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{UnparsedPublicKey, ED25519};

    #[test]
    fn the_files_are_the_rfc_8410_forms_and_sign_and_verify() {
        let dir = tempfile::tempdir().unwrap();
        let paths = write_table_key(dir.path(), false).unwrap();
        let private = std::fs::read_to_string(&paths.private_key).unwrap();
        let public = std::fs::read(&paths.public_key).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&paths.private_key).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "the signing key is secret");
        }
        // ring reads the PKCS#8 v1 key back (as OpenSSL and cryptography do).
        let der = rustls_pki_types::PrivatePkcs8KeyDer::from_pem_slice(private.as_bytes()).unwrap();
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der.secret_pkcs8_der()).unwrap();
        let keys = parse_table_verify_keys(&public, "pub").unwrap();
        assert_eq!(keys, vec![<[u8; 32]>::try_from(pair.public_key().as_ref()).unwrap()]);
        let sig = pair.sign(b"table");
        UnparsedPublicKey::new(&ED25519, &keys[0]).verify(b"table", sig.as_ref()).unwrap();

        let e = write_table_key(dir.path(), false).unwrap_err();
        assert!(e.to_string().contains("--force"), "{e}");
        write_table_key(dir.path(), true).unwrap();
        assert_ne!(std::fs::read(&paths.public_key).unwrap(), public, "--force makes a new key");
    }

    #[test]
    fn a_verify_key_file_may_hold_several_keys_and_nothing_else() {
        let (a, b) = (table_key_from_seed(&[1; 32]).unwrap(), table_key_from_seed(&[2; 32]).unwrap());
        let both = format!("{}{}", a.public_pem, b.public_pem);
        assert_eq!(parse_table_verify_keys(both.as_bytes(), "f").unwrap(), vec![a.public_key, b.public_key]);
        let e = parse_table_verify_keys(a.private_pem.as_bytes(), "f").unwrap_err();
        assert!(e.contains("never the signing key"), "{e}");
        assert!(parse_table_verify_keys(b"", "f").unwrap_err().contains("no PEM PUBLIC KEY"));
        // A P-256 public key is not an Ed25519 one.
        let p256 = rcgen::KeyPair::generate().unwrap().public_key_pem();
        let e = parse_table_verify_keys(p256.as_bytes(), "f").unwrap_err();
        assert!(e.contains("not an Ed25519 public key"), "{e}");
    }

    /// RFC 8032 §7.1, test 1: the seed's public key, so the PEM carries
    /// the standard's key and not some other derivation.
    #[test]
    fn the_public_key_of_a_seed_is_rfc_8032s() {
        let hex = |s: &str| {
            (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect::<Vec<u8>>()
        };
        let seed: [u8; 32] =
            hex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60").try_into().unwrap();
        let pair = table_key_from_seed(&seed).unwrap();
        assert_eq!(pair.public_key.to_vec(), hex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"));
    }
}
