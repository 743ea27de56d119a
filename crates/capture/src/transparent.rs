//! Transparent TCP capture: the listener behind the nftables REDIRECT.
//!
//! Passengers do not know about the relay; they connect to wherever they
//! like and the train's `prerouting` nat chain (see [`crate::rules`])
//! rewrites the destination to this listener. Conntrack still remembers the
//! original destination, and `getsockopt(SO_ORIGINAL_DST)` hands it back, so
//! the relay can ask the tunnel for exactly the connection the passenger
//! wanted. With TPROXY instead of REDIRECT nothing is rewritten: the socket's
//! local address already is the destination ([`tproxy_dst`]).
//!
//! A connection whose "original" destination is this listener itself was not
//! redirected (a passenger connected straight to the relay port); relaying it
//! would dial the relay port on the far side or loop, so it is refused.

use std::future::Future;
use std::io;
use std::mem::{size_of, MaybeUninit};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, RawFd};

use tokio::net::{TcpListener, TcpStream};
use tracing::debug;

use crate::relay::{accept_loop, prepare_passenger, relay, reset_on_close, with_timeout};
use crate::{canonical, CaptureStats, Dialer, RelayOpts};

/// The destination a REDIRECTed (or DNATed) connection was originally sent
/// to, from conntrack: `SO_ORIGINAL_DST` for IPv4 (also on a dual-stack
/// socket carrying IPv4) and `IP6T_SO_ORIGINAL_DST` for IPv6.
///
/// Fails with `ENOENT` (`ErrorKind::NotFound`) when conntrack has no entry
/// for the connection. For a connection that conntrack saw but that was not
/// NATed it returns the socket's own local address.
pub fn original_dst(stream: &TcpStream) -> io::Result<SocketAddr> {
    let fd = stream.as_raw_fd();
    match stream.local_addr()? {
        SocketAddr::V4(_) => so_original_dst_v4(fd),
        SocketAddr::V6(a) if a.ip().to_ipv4_mapped().is_some() => so_original_dst_v4(fd),
        SocketAddr::V6(_) => so_original_dst_v6(fd),
    }
}

/// The destination of a connection accepted on an `IP_TRANSPARENT` socket
/// fed by TPROXY: simply its local address, which need not be local.
pub fn tproxy_dst(stream: &TcpStream) -> io::Result<SocketAddr> {
    stream.local_addr().map(canonical)
}

fn so_original_dst_v4(fd: RawFd) -> io::Result<SocketAddr> {
    let mut addr = MaybeUninit::<libc::sockaddr_in>::zeroed();
    let mut len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: `addr` is a writable buffer of `len` bytes that outlives the
    // call; the kernel writes at most `len` bytes and updates `len`.
    let rc = unsafe { libc::getsockopt(fd, libc::SOL_IP, libc::SO_ORIGINAL_DST, addr.as_mut_ptr().cast(), &mut len) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: zero-initialised, and any bit pattern is a valid sockaddr_in.
    let addr = unsafe { addr.assume_init() };
    if len as usize != size_of::<libc::sockaddr_in>() || addr.sin_family != libc::AF_INET as libc::sa_family_t {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "SO_ORIGINAL_DST: unexpected address"));
    }
    let ip = Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr));
    Ok(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(addr.sin_port))))
}

fn so_original_dst_v6(fd: RawFd) -> io::Result<SocketAddr> {
    let mut addr = MaybeUninit::<libc::sockaddr_in6>::zeroed();
    let mut len = size_of::<libc::sockaddr_in6>() as libc::socklen_t;
    // SAFETY: as above, with a sockaddr_in6-sized buffer.
    let rc =
        unsafe { libc::getsockopt(fd, libc::SOL_IPV6, libc::IP6T_SO_ORIGINAL_DST, addr.as_mut_ptr().cast(), &mut len) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: zero-initialised, and any bit pattern is a valid sockaddr_in6.
    let addr = unsafe { addr.assume_init() };
    if len as usize != size_of::<libc::sockaddr_in6>() || addr.sin6_family != libc::AF_INET6 as libc::sa_family_t {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "IP6T_SO_ORIGINAL_DST: unexpected address"));
    }
    let ip = Ipv6Addr::from(addr.sin6_addr.s6_addr);
    let a = SocketAddrV6::new(ip, u16::from_be(addr.sin6_port), addr.sin6_flowinfo, addr.sin6_scope_id);
    Ok(canonical(SocketAddr::V6(a)))
}

/// Serves REDIRECTed passenger connections until `shutdown` resolves.
///
/// For each connection: read the original destination, refuse it if it is
/// the listener itself (loop protection), [`Dialer::dial`] it on behalf of
/// the passenger's source IP, and [`relay`] both ways. A failed dial or
/// relay closes the passenger side with a RST. At most
/// [`RelayOpts::max_conns`] connections are served at once. Errors are
/// logged (at `debug`, since passengers cause most of them) and counted in
/// [`RelayOpts::stats`]; nothing here panics on bad input.
pub async fn serve_transparent<D: Dialer>(listener: TcpListener, dialer: D, opts: RelayOpts, shutdown: impl Future) {
    let listen_addr = listener.local_addr().ok().map(canonical);
    let task_opts = opts.clone();
    accept_loop(listener, &opts, shutdown, "transparent", move |stream, peer| {
        handle(stream, peer, listen_addr, dialer.clone(), task_opts.clone())
    })
    .await;
}

async fn handle<D: Dialer>(
    mut stream: TcpStream,
    peer: SocketAddr,
    listen_addr: Option<SocketAddr>,
    dialer: D,
    opts: RelayOpts,
) {
    let stats = &opts.stats;
    let user = peer.ip().to_canonical();
    let dst = match original_dst(&stream) {
        Ok(dst) => dst,
        Err(e) => {
            debug!(%peer, error = %e, "no original destination; refusing");
            CaptureStats::inc(&stats.refused);
            reset_on_close(&stream);
            return;
        }
    };
    let local = stream.local_addr().ok().map(canonical);
    if Some(dst) == local || Some(dst) == listen_addr {
        debug!(%peer, %dst, "connection to the relay itself (not redirected); refusing");
        CaptureStats::inc(&stats.refused);
        reset_on_close(&stream);
        return;
    }
    prepare_passenger(&stream, &opts);
    let mut tunnel = match with_timeout(opts.dial_timeout, "dial", dialer.dial(user, dst)).await {
        Ok(t) => t,
        Err(e) => {
            debug!(%peer, %dst, error = %e, "dial failed");
            CaptureStats::inc(&stats.dial_failed);
            reset_on_close(&stream);
            return;
        }
    };
    match relay(&mut stream, &mut tunnel, &opts, D::poll_write_burst).await {
        Ok((up, down)) => debug!(%peer, %dst, up, down, "relay done"),
        Err(e) => {
            debug!(%peer, %dst, error = %e, "relay ended with error");
            reset_on_close(&stream);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;
    use tokio::io::AsyncReadExt;

    #[derive(Clone, Default)]
    struct NeverDialer(Arc<Mutex<Vec<SocketAddr>>>);

    impl Dialer for NeverDialer {
        type Stream = TcpStream;
        async fn dial(&self, _user: IpAddr, dst: SocketAddr) -> io::Result<TcpStream> {
            self.0.lock().unwrap().push(dst);
            Err(io::ErrorKind::ConnectionRefused.into())
        }
    }

    /// Without a REDIRECT the "original destination" is the listener itself
    /// (or unknown): the connection is refused, never dialed.
    #[tokio::test]
    async fn transparent_refuses_direct_connection_to_itself() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let opts = RelayOpts::default();
        let stats = opts.stats.clone();
        let dialer = NeverDialer::default();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_transparent(listener, dialer.clone(), opts, stop_rx));

        // RST (possibly before connect() returns) or EOF, but no data and no
        // hang.
        if let Ok(mut c) = TcpStream::connect(addr).await {
            let mut buf = Vec::new();
            let r = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut buf)).await.unwrap();
            assert!(r.is_err() || buf.is_empty(), "{r:?} {buf:?}");
        }
        // The connection is counted before the server shuts down.
        for _ in 0..100 {
            if stats.snapshot().refused == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop_tx.send(()).unwrap();
        server.await.unwrap();
        let s = stats.snapshot();
        assert_eq!((s.accepted, s.refused, s.dial_failed, s.active), (1, 1, 0, 0));
        assert!(dialer.0.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn tproxy_dst_is_local_address() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _c = TcpStream::connect(addr).await.unwrap();
        let (s, _) = listener.accept().await.unwrap();
        assert_eq!(tproxy_dst(&s).unwrap(), addr);
    }
}
