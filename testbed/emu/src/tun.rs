//! Minimal Linux TUN devices for the `polycorn-emu` shell: layer-3 (`IFF_TUN`), no packet
//! information header (`IFF_NO_PI`), blocking file descriptor.
//!
//! The device exists as long as its file descriptor is open (it is not made persistent), so
//! dropping the [`Tun`], or the process exiting for any reason, removes the interface, also after
//! it was moved to another network namespace.

use std::ffi::c_char;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

/// A TUN device: one IP packet per `read`/`write`.
#[derive(Debug)]
pub struct Tun {
    file: File,
    name: String,
}

impl Tun {
    /// Creates the TUN interface `name` (at most 15 bytes) in the calling thread's network
    /// namespace. The file descriptor is blocking and close-on-exec.
    pub fn create(name: &str) -> io::Result<Self> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.bytes().any(|b| b == 0 || b == b'/') {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("bad interface name {name:?}")));
        }
        let file = OpenOptions::new().read(true).write(true).custom_flags(libc::O_CLOEXEC).open("/dev/net/tun")?;
        // SAFETY: ifreq is plain old data; all-zero is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
            *dst = src as c_char;
        }
        req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
        // SAFETY: TUNSETIFF reads and writes a `struct ifreq`, which `req` is; the fd is open.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req as *mut libc::ifreq) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { file, name: name.to_string() })
    }

    /// The name the device was created with (a later rename is not tracked).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Blocks until one packet is available and copies it into `buf` (truncated if longer).
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is valid for `buf.len()` writable bytes; the fd is open.
        let n = unsafe { libc::read(self.file.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    /// Injects one IP packet into the kernel as if received on the interface.
    pub fn send(&self, packet: &[u8]) -> io::Result<usize> {
        // SAFETY: `packet` is valid for `packet.len()` readable bytes; the fd is open.
        let n = unsafe { libc::write(self.file.as_raw_fd(), packet.as_ptr().cast(), packet.len()) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}

/// IP version of a packet read from a TUN device (4 or 6), `None` for anything else.
pub fn ip_version(packet: &[u8]) -> Option<u8> {
    match packet.first()? >> 4 {
        v @ (4 | 6) => Some(v),
        _ => None,
    }
}
