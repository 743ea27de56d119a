//! The errors this crate returns at start-up: options and configuration
//! files that do not hold, and the failure-table sources that cannot open.
//! Each keeps its cause as `std::error::Error::source`, not in its own
//! message, so a binary's `anyhow` report (`{:#}`) shows the whole chain
//! once.

use std::path::PathBuf;

/// A start-up error: the process should not start with these options.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag (or its config-file key) with a value it cannot take.
    #[error("{flag}: {reason}")]
    Option {
        /// The flag as the user wrote it, e.g. `--conn-window`, with its
        /// value where that helps.
        flag: String,
        reason: String,
    },
    /// A file a flag names that could not be read or created.
    #[error("{what} {}", path.display())]
    Io {
        /// What the file is, e.g. `reading config file`.
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A configuration file that is not valid TOML for these options.
    #[error("parsing config file {}", path.display())]
    ConfigSyntax {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    /// A pipeline that does not compose.
    #[error("scheduler {name:?}")]
    Scheduler {
        name: String,
        #[source]
        source: polycorn_core::sched::ConfigError,
    },
    /// `--failure-table-verify-key` unreadable or without a key.
    #[error("--failure-table-verify-key")]
    VerifyKey(#[source] polycorn_pki::PkiError),
    /// A failure-location table refused at start-up (malformed, or not
    /// signed by a verify key); `origin` names the source.
    #[error("{origin}: {reason}")]
    TableRefused { origin: String, reason: String },
}

impl Error {
    /// An [`Error::Option`].
    pub fn option(flag: impl Into<String>, reason: impl Into<String>) -> Error {
        Error::Option { flag: flag.into(), reason: reason.into() }
    }
}

/// Why a table's signature does not hold (`--failure-table-verify-key`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the table is not signed (--failure-table-verify-key requires a signature)")]
    Unsigned,
    #[error("the signature is {0} bytes long, not an Ed25519 signature")]
    TooLong(usize),
    #[error("the signature is not base64: {0}")]
    NotBase64(String),
    #[error("the signature has {0} bytes, an Ed25519 signature 64")]
    WrongLength(usize),
    #[error("the signature does not verify with the {keys} key(s) of --failure-table-verify-key {origin}")]
    NoKeyVerifies { keys: usize, origin: String },
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;
    use std::path::Path;

    use super::*;

    #[test]
    fn errors_keep_their_cause() {
        let e = crate::config::load_toml::<std::collections::BTreeMap<String, String>>(Some(Path::new(
            "/nonexistent/polycorn.toml",
        )))
        .unwrap_err();
        assert!(matches!(&e, Error::Io { what: "reading config file", .. }), "{e:?}");
        let io = e.source().and_then(|s| s.downcast_ref::<std::io::Error>()).expect("the io::Error is the source");
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
        assert_eq!(
            e.to_string(),
            "reading config file /nonexistent/polycorn.toml",
            "the cause is the source, not repeated"
        );

        let e = crate::config::build_pipeline("no-such-pipeline", &Default::default()).unwrap_err();
        assert!(matches!(&e, Error::Scheduler { name, .. } if name == "no-such-pipeline"), "{e:?}");
        assert!(e.source().is_some());

        let e = "x y".parse::<crate::subflow::Congestion>().unwrap_err();
        assert!(matches!(&e, Error::Option { flag, .. } if flag == "--subflow-cc \"x y\""), "{e:?}");
    }
}
