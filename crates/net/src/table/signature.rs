//! Signed failure-location tables: `--failure-table-verify-key
//! FILE` holds the trainer's Ed25519 public key(s) (PEM `PUBLIC KEY`,
//! `polycorn-pki table-key`); with it, every source's table must come with
//! a detached signature over its exact bytes that one of those keys
//! verifies, or it is refused before it is parsed.
//!
//! The signature is carried as base64 (standard alphabet, padded) of the 64
//! bytes of RFC 8032 Ed25519: in the Kafka header [`KAFKA_HEADER`], the
//! API's response header [`HTTP_HEADER`], and the sidecar file
//! `<table file>.sig` ([`sidecar`]). Surrounding whitespace is ignored.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use ring::signature::{UnparsedPublicKey, ED25519};

pub use crate::error::SignatureError;
use crate::table::state::KeyId;

/// The Kafka header of a table message that carries its signature.
pub const KAFKA_HEADER: &str = "polycorn-signature";
/// The response header of `GET /v1/failure-table` that carries it.
pub const HTTP_HEADER: &str = "x-polycorn-signature";
/// Longest signature text accepted (64 bytes are 88 base64 characters).
const MAX_TEXT: usize = 1024;

/// The signature file of the table file `table`: `<table>.sig`.
pub fn sidecar(table: &Path) -> PathBuf {
    let mut s = table.as_os_str().to_owned();
    s.push(".sig");
    PathBuf::from(s)
}

/// The keys a table's signature must verify with (any one of them).
#[derive(Clone)]
pub struct Verifier {
    keys: Vec<polycorn_pki::TablePublicKey>,
    /// Where the keys came from, for the log.
    origin: String,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier").field("keys", &self.keys.len()).field("origin", &self.origin).finish()
    }
}

impl Verifier {
    /// The keys of `--failure-table-verify-key FILE`; an unreadable file or
    /// one without an Ed25519 public key is an error.
    pub fn load(path: &Path) -> Result<Verifier, crate::Error> {
        let keys = polycorn_pki::load_table_verify_keys(path).map_err(crate::Error::VerifyKey)?;
        Ok(Verifier { keys, origin: path.display().to_string() })
    }

    /// `--failure-table-verify-key`, when given.
    pub fn from_flag(path: Option<&Path>) -> Result<Option<Verifier>, crate::Error> {
        path.map(Verifier::load).transpose()
    }

    pub fn from_keys(keys: Vec<polycorn_pki::TablePublicKey>, origin: &str) -> Verifier {
        Verifier { keys, origin: origin.into() }
    }

    /// How many keys verify.
    pub fn keys(&self) -> usize {
        self.keys.len()
    }

    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The key that signed exactly `body`, if `signature` (the base64 text
    /// as carried; `None`: the source had none) is one of the keys'
    /// signatures of it; the reason when it is not.
    pub fn verify(&self, body: &[u8], signature: Option<&[u8]>) -> Result<KeyId, SignatureError> {
        let Some(text) = signature else {
            return Err(SignatureError::Unsigned);
        };
        let sig = decode(text)?;
        match self.keys.iter().find(|k| UnparsedPublicKey::new(&ED25519, k).verify(body, &sig).is_ok()) {
            Some(k) => Ok(KeyId::of(k)),
            None => Err(SignatureError::NoKeyVerifies { keys: self.keys.len(), origin: self.origin.clone() }),
        }
    }

    /// Whether the key `id` is one of these.
    pub fn trusts(&self, id: &KeyId) -> bool {
        self.keys.iter().any(|k| KeyId::of(k) == *id)
    }
}

/// The 64 signature bytes of their base64 text.
fn decode(text: &[u8]) -> Result<Vec<u8>, SignatureError> {
    if text.len() > MAX_TEXT {
        return Err(SignatureError::TooLong(text.len()));
    }
    let trimmed = text.trim_ascii();
    let sig = base64::engine::general_purpose::STANDARD
        .decode(trimmed)
        .map_err(|e| SignatureError::NotBase64(e.to_string()))?;
    if sig.len() != 64 {
        return Err(SignatureError::WrongLength(sig.len()));
    }
    Ok(sig)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ring::signature::Ed25519KeyPair;

    /// The trainer's side in tests: the key pair of seed `[n; 32]`.
    pub(crate) struct Signer(Ed25519KeyPair, polycorn_pki::TableKeyPair);

    impl Signer {
        pub(crate) fn new(n: u8) -> Signer {
            let seed = [n; 32];
            Signer(
                Ed25519KeyPair::from_seed_unchecked(&seed).unwrap(),
                polycorn_pki::table_key_from_seed(&seed).unwrap(),
            )
        }

        /// The signature of `body` as a source carries it.
        pub(crate) fn sign(&self, body: &[u8]) -> Vec<u8> {
            base64::engine::general_purpose::STANDARD.encode(self.0.sign(body).as_ref()).into_bytes()
        }

        pub(crate) fn public_pem(&self) -> &str {
            &self.1.public_pem
        }

        pub(crate) fn key_id(&self) -> KeyId {
            KeyId::of(&self.1.public_key)
        }

        pub(crate) fn verifier(&self) -> Verifier {
            Verifier::from_keys(vec![self.1.public_key], "test")
        }
    }

    #[test]
    fn only_a_signature_of_these_bytes_by_a_listed_key_verifies() {
        let (trainer, other) = (Signer::new(1), Signer::new(2));
        let v = trainer.verifier();
        let body = b"{\"version\":1}";
        v.verify(body, Some(&trainer.sign(body))).unwrap();
        let with_space = [b"  ".as_slice(), &trainer.sign(body), b"\n"].concat();
        v.verify(body, Some(&with_space)).expect("surrounding whitespace (a .sig file's newline) is ignored");

        let e = v.verify(body, None).unwrap_err().to_string();
        assert!(e.contains("not signed"), "{e}");
        let e = v.verify(body, Some(&other.sign(body))).unwrap_err().to_string();
        assert!(e.contains("does not verify with the 1 key(s)"), "another key: {e}");
        let mut flipped = body.to_vec();
        flipped[2] ^= 1;
        assert!(v.verify(&flipped, Some(&trainer.sign(body))).is_err(), "a flipped byte of the body");
        assert!(v.verify(body, Some(&trainer.sign(b"{\"version\":2}"))).is_err(), "another table's signature");
        assert!(v.verify(body, Some(b"!!")).unwrap_err().to_string().contains("not base64"));
        assert!(v.verify(body, Some(b"AAAA")).unwrap_err().to_string().contains("3 bytes"));
        assert!(v.verify(body, Some(&[b'A'; 4096])).unwrap_err().to_string().contains("4096 bytes long"));

        // Several keys (a rotation): either verifies, and says which.
        let both = Verifier::from_keys(vec![trainer.1.public_key, other.1.public_key], "two");
        let (t, o) = (KeyId::of(&trainer.1.public_key), KeyId::of(&other.1.public_key));
        assert_eq!(both.verify(body, Some(&trainer.sign(body))).unwrap(), t);
        assert_eq!(both.verify(body, Some(&other.sign(body))).unwrap(), o);
        assert!(both.trusts(&t) && both.trusts(&o) && !v.trusts(&o));
    }

    #[test]
    fn the_verify_key_file_is_checked_at_start_and_the_sidecar_is_beside_the_table() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("verify.pub");
        let (a, b) = (Signer::new(1), Signer::new(2));
        std::fs::write(&p, format!("{}{}", a.public_pem(), b.public_pem())).unwrap();
        let v = Verifier::from_flag(Some(&p)).unwrap().unwrap();
        assert_eq!(v.keys(), 2);
        assert!(Verifier::from_flag(None).unwrap().is_none());
        std::fs::write(&p, "nothing").unwrap();
        assert!(Verifier::load(&p).unwrap_err().to_string().contains("--failure-table-verify-key"));
        assert!(Verifier::load(&dir.path().join("missing")).is_err());
        assert_eq!(sidecar(Path::new("/etc/t/table.json")), Path::new("/etc/t/table.json.sig"));
    }
}
