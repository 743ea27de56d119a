//! Subflow set-up: socket options, the TLS handshake and the HELLO exchange.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use polycorn_core::wire::{Frame, FrameDecoder, VERSION};
use polycorn_core::{PathConfig, PathId};
use socket2::{Domain, Protocol, SockRef, Socket, Type};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Unsent bytes above which a subflow socket stops reporting writable: the
/// kernel holds little, so the scheduler decides late (as MPTCP does).
pub const NOTSENT_LOWAT_BYTES: u32 = 128 * 1024;

/// How a relay reaches its proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// One TLS-over-TCP subflow per interface, scheduled by Polycorn.
    Tls,
    /// One QUIC subflow per interface ([`crate::quic`]), scheduled by
    /// Polycorn; a carrier where UDP does not get through falls back to a
    /// TLS subflow on its own.
    Quic,
    /// One Linux MPTCP connection (TLS inside), scheduled by the kernel.
    KernelMptcp,
    /// One Linux MPTCP connection per passenger connection, scheduled by
    /// the kernel, no Polycorn session ([`crate::mptcp_conn`]).
    KernelMptcpConn,
}

impl Transport {
    /// Every value, as the flags spell them.
    pub const NAMES: &'static str = "tls, quic, kernel-mptcp or kernel-mptcp-conn";

    pub const ALL: [Transport; 4] =
        [Transport::Tls, Transport::Quic, Transport::KernelMptcp, Transport::KernelMptcpConn];

    /// The flag's spelling.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Tls => "tls",
            Transport::Quic => "quic",
            Transport::KernelMptcp => "kernel-mptcp",
            Transport::KernelMptcpConn => "kernel-mptcp-conn",
        }
    }

    /// The socket protocol of its connections.
    pub fn protocol(self) -> Protocol {
        match self {
            Transport::Tls | Transport::Quic => Protocol::TCP,
            Transport::KernelMptcp | Transport::KernelMptcpConn => Protocol::MPTCP,
        }
    }

    /// The endpoint's model of its paths over this transport. Over one
    /// kernel MPTCP connection the kernel retransmits and runs congestion
    /// control on each subflow, and the endpoint has no other path to move
    /// data to, so it keeps neither a retransmission timer nor a congestion
    /// window of its own: it writes what the socket takes, as an
    /// application on an MPTCP socket does. With its own, the window froze
    /// on the railway (it grows only while SRTT < 2 × min RTT, and one
    /// stream over subflows of unequal delay is rarely so: one 16 KB frame
    /// per round trip, 19 of 30 downloads of a trip past their slot) and
    /// its timer fired 167 times on one trip, each time dropping the
    /// window to its floor.
    pub fn path_config(self, base: PathConfig) -> PathConfig {
        match self {
            Transport::KernelMptcp => PathConfig {
                min_rto: KERNEL_MPTCP_RTO,
                max_rto: KERNEL_MPTCP_RTO,
                initial_cwnd_bytes: KERNEL_MPTCP_WINDOW_BYTES,
                min_cwnd_bytes: KERNEL_MPTCP_WINDOW_BYTES,
                max_cwnd_bytes: KERNEL_MPTCP_WINDOW_BYTES,
                ..base
            },
            Transport::Tls | Transport::Quic | Transport::KernelMptcpConn => base,
        }
    }
}

/// Over kernel MPTCP ([`Transport::path_config`]): the endpoint's timer
/// only as a last resort (the session's dead-path detection acts sooner).
pub const KERNEL_MPTCP_RTO: std::time::Duration = std::time::Duration::from_secs(60);
/// ... and its window: bytes in flight through the one connection, far
/// above any bandwidth-delay product of the carriers (the socket's own
/// buffer, small by `TCP_NOTSENT_LOWAT`, is what paces the writes).
pub const KERNEL_MPTCP_WINDOW_BYTES: u64 = 32 << 20;

impl std::str::FromStr for Transport {
    type Err = crate::Error;
    fn from_str(s: &str) -> Result<Self, crate::Error> {
        Transport::ALL.into_iter().find(|t| t.name() == s).ok_or_else(|| {
            crate::Error::option(format!("--transport {s:?}"), format!("unknown; use {}", Transport::NAMES))
        })
    }
}

/// The congestion control the relay and proxy ask the kernel for on the
/// sockets that carry their traffic over the carriers (`--subflow-cc`).
pub const DEFAULT_CONGESTION: &str = "bbr";

/// Congestion control of the carrier-facing sockets: a named kernel
/// algorithm (`TCP_CONGESTION`), or whatever the kernel's default is.
///
/// Named explicitly because the kernel default is machine state
/// (`net.ipv4.tcp_congestion_control`, inherited by new network namespaces):
/// left implicit, two runs of the same benchmark, or two trains, could run
/// different algorithms without anyone knowing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Congestion {
    /// Leave the kernel's default (`kernel`).
    Kernel,
    /// Ask for this algorithm; when the kernel does not have it (module
    /// missing, or not allowed to load it), warn once and keep the default.
    Named(String),
}

impl Default for Congestion {
    fn default() -> Self {
        Congestion::Named(DEFAULT_CONGESTION.into())
    }
}

impl std::str::FromStr for Congestion {
    type Err = crate::Error;
    fn from_str(s: &str) -> Result<Self, crate::Error> {
        // TCP_CA_NAME_MAX is 16 bytes with the terminating NUL.
        let ok = !s.is_empty() && s.len() < 16 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        match s {
            "kernel" => Ok(Congestion::Kernel),
            _ if ok => Ok(Congestion::Named(s.into())),
            _ => Err(crate::Error::option(
                format!("--subflow-cc {s:?}"),
                "not a congestion control: a kernel algorithm name (e.g. bbr, cubic; 1 to 15 letters, digits or _) or kernel",
            )),
        }
    }
}

impl std::fmt::Display for Congestion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Congestion::Kernel => f.write_str("kernel"),
            Congestion::Named(n) => f.write_str(n),
        }
    }
}

static CONGESTION_WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl Congestion {
    /// Apply to a socket before it connects or listens (accepted sockets
    /// inherit a listener's choice; an MPTCP socket passes it to its
    /// subflows). A failure is logged once per process and otherwise
    /// ignored: the connection works with the kernel's default.
    pub fn apply(&self, sock: &Socket) {
        let Congestion::Named(name) = self else { return };
        if let Err(e) = sock.set_tcp_congestion(name.as_bytes()) {
            if !CONGESTION_WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(
                    algorithm = %name,
                    error = %e,
                    effective = %effective_congestion(sock).unwrap_or_else(|| "unknown".into()),
                    "the kernel refused the subflow congestion control (load its module, e.g. modprobe tcp_{name}): using the kernel default"
                );
            }
        }
    }
}

/// The congestion control a socket runs, as the kernel names it.
pub fn effective_congestion(sock: &Socket) -> Option<String> {
    let v = sock.tcp_congestion().ok()?;
    let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
    Some(String::from_utf8_lossy(&v[..end]).into_owned())
}

/// The congestion control of a connected stream (for logs).
pub fn stream_congestion(stream: &TcpStream) -> Option<String> {
    effective_congestion(&SockRef::from(stream))
}

/// Socket options every subflow gets.
pub fn tune(stream: &TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    set_notsent_lowat(stream, NOTSENT_LOWAT_BYTES)
}

fn set_notsent_lowat(stream: &TcpStream, bytes: u32) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let v: libc::c_int = bytes as libc::c_int;
    // SAFETY: valid fd owned by `stream`, option value is a c_int of the
    // size passed.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_NOTSENT_LOWAT,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Connect to `addr`, optionally bound to network interface `device`
/// (SO_BINDTODEVICE) so the subflow uses that carrier.
pub async fn connect(
    addr: SocketAddr,
    device: Option<&str>,
    transport: Transport,
    cc: &Congestion,
) -> io::Result<TcpStream> {
    let proto = transport.protocol();
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(proto))
        .map_err(|e| io::Error::new(e.kind(), format!("creating {transport:?} socket: {e}")))?;
    cc.apply(&sock);
    if let Some(dev) = device {
        sock.bind_device(Some(dev.as_bytes()))
            .map_err(|e| io::Error::new(e.kind(), format!("binding subflow to interface {dev}: {e}")))?;
    }
    sock.set_nonblocking(true)?;
    let std: std::net::TcpStream = sock.into();
    let s = tokio::net::TcpSocket::from_std_stream(std);
    let stream = s.connect(addr).await?;
    tune(&stream)?;
    Ok(stream)
}

/// Listening socket for subflows (MPTCP-capable when `transport` says so;
/// an MPTCP listener also accepts plain TCP).
pub fn listen(addr: SocketAddr, transport: Transport, cc: &Congestion) -> io::Result<tokio::net::TcpListener> {
    let proto = transport.protocol();
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(proto))?;
    sock.set_reuse_address(true)?;
    cc.apply(&sock);
    sock.bind(&addr.into()).map_err(|e| io::Error::new(e.kind(), format!("binding {addr}: {e}")))?;
    sock.listen(1024)?;
    sock.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(sock.into())
}

/// Reads the bytes a subflow socket holds unsent in the kernel
/// (SIOCOUTQNSD), so the endpoint can count them into the path's send-buffer
/// occupancy. Holds a duplicate of the socket's descriptor, so it stays valid
/// whatever wraps the socket (TLS) and however long either lives.
#[derive(Debug)]
pub struct UnsentProbe(std::os::fd::OwnedFd);

impl UnsentProbe {
    pub fn new(stream: &TcpStream) -> io::Result<Self> {
        use std::os::fd::AsFd;
        Ok(UnsentProbe(stream.as_fd().try_clone_to_owned()?))
    }

    pub fn unsent_bytes(&self) -> Option<u64> {
        use std::os::fd::AsRawFd;
        let mut v: libc::c_int = 0;
        // SAFETY: ioctl with an int out-parameter on a socket descriptor we own.
        let rc = unsafe {
            libc::ioctl(self.0.as_raw_fd(), 0x894B /* SIOCOUTQNSD */, &mut v)
        };
        (rc == 0).then_some(v.max(0) as u64)
    }
}

/// Most bytes a subflow's writer takes from the endpoint for one write.
pub const MAX_WRITE: usize = 256 * 1024;

/// Keep SockRef in use for platform checks in tests.
pub fn is_mptcp(stream: &TcpStream) -> bool {
    SockRef::from(stream).protocol().ok().flatten() == Some(Protocol::MPTCP)
}

/// What the relay announces in HELLO.
#[derive(Clone, Debug)]
pub struct Hello {
    pub session: u64,
    pub path: PathId,
    pub train_id: String,
    pub path_name: String,
}

/// Read exactly one frame (used only for the handshake).
async fn read_frame<S: AsyncRead + Unpin>(s: &mut S, what: &str) -> io::Result<Frame> {
    let mut dec = FrameDecoder::new();
    let mut byte = [0u8; 1];
    // HELLO frames are tiny; reading byte by byte keeps any following data
    // in the socket for the session's reader.
    loop {
        match dec.next_frame() {
            Ok(Some(d)) => return Ok(d.frame),
            Ok(None) => {}
            Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, format!("reading {what}: {e}"))),
        }
        if dec.buffered() > 1024 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("reading {what}: frame too large")));
        }
        let n = s.read(&mut byte).await?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("peer closed before {what}")));
        }
        dec.push(&byte);
    }
}

/// Relay side of the handshake: send HELLO, wait for HELLO_ACK.
pub async fn client_hello<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    hello: &Hello,
    timeout: Duration,
) -> io::Result<u64> {
    let mut out = Vec::new();
    Frame::Hello {
        version: VERSION,
        session: hello.session,
        path: hello.path,
        train_id: hello.train_id.clone(),
        path_name: hello.path_name.clone(),
    }
    .encode(&mut out);
    s.write_all(&out).await?;
    s.flush().await?;
    let f = tokio::time::timeout(timeout, read_frame(s, "HELLO_ACK"))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "waiting for HELLO_ACK"))??;
    match f {
        Frame::HelloAck { version: VERSION, session, path, instance }
            if session == hello.session && path == hello.path =>
        {
            Ok(instance)
        }
        Frame::HelloAck { version, .. } if version != VERSION => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("proxy speaks protocol version {version}, this relay speaks {VERSION}"),
        )),
        other => Err(io::Error::new(io::ErrorKind::InvalidData, format!("expected HELLO_ACK, got {other:?}"))),
    }
}

/// Proxy side: read HELLO (with a timeout). The caller checks the train.
pub async fn server_read_hello<S: AsyncRead + Unpin>(s: &mut S, timeout: Duration) -> io::Result<Hello> {
    let f = tokio::time::timeout(timeout, read_frame(s, "HELLO"))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "waiting for HELLO"))??;
    match f {
        Frame::Hello { version: VERSION, session, path, train_id, path_name } => {
            Ok(Hello { session, path, train_id, path_name })
        }
        Frame::Hello { version, .. } => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("relay speaks protocol version {version}, this proxy speaks {VERSION}"),
        )),
        other => Err(io::Error::new(io::ErrorKind::InvalidData, format!("expected HELLO, got {other:?}"))),
    }
}

/// Proxy side: accept the HELLO, naming this proxy process's `instance`.
pub async fn server_ack<S: AsyncWrite + Unpin>(s: &mut S, hello: &Hello, instance: u64) -> io::Result<()> {
    let mut out = Vec::new();
    Frame::HelloAck { version: VERSION, session: hello.session, path: hello.path, instance }.encode(&mut out);
    s.write_all(&out).await?;
    s.flush().await
}

/// TLS configurations for both ends.
pub type ClientTls = Arc<rustls::ClientConfig>;
pub type ServerTls = Arc<rustls::ServerConfig>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn congestion_control_names_parse_and_bad_ones_are_refused() {
        assert_eq!("bbr".parse::<Congestion>().ok(), Some(Congestion::Named("bbr".into())));
        assert_eq!("kernel".parse::<Congestion>().ok(), Some(Congestion::Kernel));
        assert_eq!(Congestion::default().to_string(), DEFAULT_CONGESTION);
        for bad in ["", "b b", "cubic\0", "a-very-long-name-x", "../x"] {
            let e = bad.parse::<Congestion>().unwrap_err().to_string();
            assert!(e.contains("not a congestion control"), "{bad:?}: {e}");
        }
    }

    #[tokio::test]
    async fn a_listener_passes_its_congestion_control_to_accepted_sockets() {
        // reno is built into every Linux kernel, so this needs no module.
        let cc: Congestion = "reno".parse().unwrap();
        let l = listen("127.0.0.1:0".parse().unwrap(), Transport::Tls, &cc).unwrap();
        let addr = l.local_addr().unwrap();
        let (c, a) = tokio::join!(connect(addr, None, Transport::Tls, &cc), l.accept());
        assert_eq!(stream_congestion(&c.unwrap()).as_deref(), Some("reno"));
        assert_eq!(stream_congestion(&a.unwrap().0).as_deref(), Some("reno"));
        // An algorithm the kernel does not have leaves the default, and the
        // connection still works.
        let missing: Congestion = "nosuchcc".parse().unwrap();
        let l = listen("127.0.0.1:0".parse().unwrap(), Transport::Tls, &missing).unwrap();
        let addr = l.local_addr().unwrap();
        let (c, a) = tokio::join!(connect(addr, None, Transport::Tls, &missing), l.accept());
        let (c, _a) = (c.unwrap(), a.unwrap());
        assert_ne!(stream_congestion(&c).as_deref(), Some("nosuchcc"));
    }

    #[test]
    fn over_kernel_mptcp_the_endpoint_leaves_retransmission_and_congestion_to_the_kernel() {
        let base = PathConfig::default();
        assert_eq!(Transport::Tls.path_config(base.clone()), base);
        assert_eq!(Transport::KernelMptcpConn.path_config(base.clone()), base);
        let k = Transport::KernelMptcp.path_config(base.clone());
        assert_eq!((k.min_rto, k.max_rto), (KERNEL_MPTCP_RTO, KERNEL_MPTCP_RTO));
        assert_eq!(
            (k.initial_cwnd_bytes, k.min_cwnd_bytes, k.max_cwnd_bytes),
            (KERNEL_MPTCP_WINDOW_BYTES, KERNEL_MPTCP_WINDOW_BYTES, KERNEL_MPTCP_WINDOW_BYTES)
        );
        assert_eq!((k.queue_limit_bytes, k.initial_rtt), (base.queue_limit_bytes, base.initial_rtt));
    }

    #[test]
    fn transports_parse_by_their_flag_names() {
        for t in Transport::ALL {
            assert_eq!(t.name().parse::<Transport>().ok(), Some(t));
        }
        let e = "mptcp".parse::<Transport>().unwrap_err().to_string();
        assert!(e.contains("kernel-mptcp-conn"), "{e}");
    }
}
