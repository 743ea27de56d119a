//! A carrier interface's link state, as the kernel reports it.
//!
//! A subflow bound to a modem's interface learns nothing when the modem
//! goes away (the SIM lost, the modem reset, the interface taken down): its
//! TCP socket sees no error until a retransmission times out, and the
//! endpoint declares the path dead only after its `dead_after` (10 s)
//! without an answer. The interface's `operstate` says it at once, so the
//! relay watches it and ends the subflow as soon as the interface is down
//! (or gone), and dials again only once it is back.
//!
//! sysfs is read (`/sys/class/net/DEV/operstate`, a few bytes every
//! [`POLL`]) rather than subscribing to rtnetlink: it needs no extra
//! dependency or socket, works in every network namespace the relay runs
//! in, and a quarter second is far below what the endpoint's timers see.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often the state is read.
pub const POLL: Duration = Duration::from_millis(250);

/// Where the kernel lists interfaces.
pub const SYSFS_NET: &str = "/sys/class/net";

/// Why an interface cannot carry traffic, from its `operstate` file's
/// content (`None`: the file is missing, the interface is gone); `None`
/// when it can. `unknown` (TUN devices, some modem drivers) and `dormant`
/// count as usable: the kernel does not know, and a dial will tell.
pub fn unusable(operstate: Option<&str>) -> Option<String> {
    match operstate.map(str::trim) {
        None => Some("gone".into()),
        Some("down") => Some("down".into()),
        Some("lowerlayerdown") => Some("down (lower layer down)".into()),
        Some("notpresent") => Some("not present".into()),
        Some(_) => None,
    }
}

/// One interface's state under a sysfs root (tests use their own root).
#[derive(Clone, Debug)]
pub struct LinkWatch {
    dev: String,
    file: PathBuf,
}

impl LinkWatch {
    /// Watches `dev` under [`SYSFS_NET`].
    pub fn new(dev: &str) -> io::Result<LinkWatch> {
        LinkWatch::under(Path::new(SYSFS_NET), dev)
    }

    /// Watches `dev` under `root`. Refuses names no interface can have.
    pub fn under(root: &Path, dev: &str) -> io::Result<LinkWatch> {
        if dev.is_empty() || dev.len() > 15 || dev.contains(['/', '\0']) || dev == "." || dev == ".." {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{dev:?} is not a network interface name (1 to 15 bytes, no '/')"),
            ));
        }
        Ok(LinkWatch { dev: dev.to_string(), file: root.join(dev).join("operstate") })
    }

    /// The interface's name.
    pub fn device(&self) -> &str {
        &self.dev
    }

    /// Why the interface cannot carry traffic now, or `None` when it can.
    pub fn unusable(&self) -> Option<String> {
        let state = std::fs::read_to_string(&self.file).ok();
        unusable(state.as_deref())
    }

    /// Completes when the interface becomes unusable, with an error that
    /// says so.
    pub async fn lost(&self) -> io::Error {
        self.lost_polling(POLL).await
    }

    /// Completes when the interface can carry traffic again.
    pub async fn usable(&self) {
        self.usable_polling(POLL).await
    }

    async fn lost_polling(&self, poll: Duration) -> io::Error {
        loop {
            if let Some(why) = self.unusable() {
                return io::Error::new(io::ErrorKind::NotConnected, format!("interface {} is {why}", self.dev));
            }
            tokio::time::sleep(poll).await;
        }
    }

    async fn usable_polling(&self, poll: Duration) {
        while self.unusable().is_some() {
            tokio::time::sleep(poll).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operstates_that_carry_nothing_are_unusable() {
        for (state, usable) in [
            (Some("up\n"), true),
            (Some("unknown\n"), true),
            (Some("dormant\n"), true),
            (Some("down\n"), false),
            (Some("lowerlayerdown\n"), false),
            (Some("notpresent\n"), false),
            (None, false),
        ] {
            assert_eq!(unusable(state).is_none(), usable, "{state:?}");
        }
    }

    #[test]
    fn names_no_interface_can_have_are_refused() {
        for bad in ["", "../etc", "a/b", ".", "..", "sixteen-bytes-xx"] {
            assert!(LinkWatch::under(Path::new("/nonexistent"), bad).is_err(), "{bad:?}");
        }
        assert!(LinkWatch::under(Path::new("/nonexistent"), "wwan0").is_ok());
    }

    // Real time with a short poll rather than tokio's paused clock: the
    // paused clock needs tokio's `test-util`, which would then be compiled
    // into every binary of the test build (docs/testing.md, "Compile once").
    // The timeouts bound only a failure; nothing here asserts a duration.
    #[tokio::test]
    async fn lost_completes_when_the_interface_goes_down_or_away() {
        const FAST: Duration = Duration::from_millis(2);
        const BOUND: Duration = Duration::from_secs(30);
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("wwan0");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("operstate"), "up\n").unwrap();
        let w = LinkWatch::under(root.path(), "wwan0").unwrap();
        assert!(w.unusable().is_none());
        let lost = w.lost_polling(FAST);
        tokio::pin!(lost);
        // Many polls of an interface that is up: not lost.
        assert!(tokio::time::timeout(FAST * 50, &mut lost).await.is_err(), "up: not lost");
        std::fs::write(dir.join("operstate"), "down\n").unwrap();
        let e = tokio::time::timeout(BOUND, &mut lost).await.expect("down: lost");
        assert_eq!(e.to_string(), "interface wwan0 is down");
        // Back up; then the interface disappears (modem unplugged).
        std::fs::write(dir.join("operstate"), "up\n").unwrap();
        tokio::time::timeout(BOUND, w.usable_polling(FAST)).await.expect("usable again");
        std::fs::remove_dir_all(&dir).unwrap();
        let e = tokio::time::timeout(BOUND, w.lost_polling(FAST)).await.expect("gone: lost");
        assert_eq!(e.to_string(), "interface wwan0 is gone");
    }
}
