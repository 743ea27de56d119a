//! Plumbing shared by the TCP servers: the accept loop with its connection
//! limit and shutdown, passenger socket options, and the byte relay.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinError, JoinSet};
use tracing::{debug, error, warn};

use crate::{CaptureStats, RelayOpts};

/// Copies bytes both ways between a passenger and its tunnel stream until
/// both directions have seen EOF, and returns `(up, down)` byte counts.
/// Passenger bytes go to the tunnel through `write`, which is told whether
/// each chunk ends one of the passenger's bursts ([`crate::copy`]); the
/// servers pass [`crate::Dialer::poll_write_burst`].
///
/// Half-close is preserved: EOF from one side becomes a `shutdown()` (FIN)
/// towards the other while the opposite direction keeps flowing, so
/// request-then-wait-for-response protocols (`nc -N`, HTTP/1.0 clients)
/// work. Bytes are added to [`CaptureStats::bytes_up`] and
/// [`CaptureStats::bytes_down`] as they move, not at the end, so long-lived
/// connections show up in the counters. An I/O error on either side ends both
/// directions and counts in [`CaptureStats::relay_errors`].
pub async fn relay<P, T, F>(passenger: &mut P, tunnel: &mut T, opts: &RelayOpts, write: F) -> io::Result<(u64, u64)>
where
    P: AsyncRead + AsyncWrite + Unpin + ?Sized,
    T: AsyncRead + AsyncWrite + Unpin + ?Sized,
    F: Fn(&mut T, &mut Context<'_>, &[u8], bool) -> Poll<io::Result<usize>>,
{
    let stats = &opts.stats;
    let mut counted = Counted { inner: passenger, up: &stats.bytes_up, down: &stats.bytes_down };
    let res = crate::copy::copy_bidirectional_bursts(&mut counted, tunnel, opts.buf_size, write).await;
    if res.is_err() {
        CaptureStats::inc(&stats.relay_errors);
    }
    res
}

/// A passenger stream that counts what is read from it (up) and written to
/// it (down).
struct Counted<'a, S: ?Sized> {
    inner: &'a mut S,
    up: &'a AtomicU64,
    down: &'a AtomicU64,
}

impl<S: AsyncRead + Unpin + ?Sized> AsyncRead for Counted<'_, S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut *self.inner).poll_read(cx, buf))?;
        self.up.fetch_add((buf.filled().len() - before) as u64, Ordering::Relaxed);
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin + ?Sized> AsyncWrite for Counted<'_, S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let n = ready!(Pin::new(&mut *self.inner).poll_write(cx, buf))?;
        self.down.fetch_add(n as u64, Ordering::Relaxed);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let n = ready!(Pin::new(&mut *self.inner).poll_write_vectored(cx, bufs))?;
        self.down.fetch_add(n as u64, Ordering::Relaxed);
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.inner).poll_shutdown(cx)
    }
}

/// Keeps [`CaptureStats::active`] up while a passenger connection lives.
pub(crate) struct ActiveGuard(Arc<CaptureStats>);

impl ActiveGuard {
    pub(crate) fn new(stats: &Arc<CaptureStats>) -> Self {
        stats.active.fetch_add(1, Ordering::Relaxed);
        Self(stats.clone())
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Socket options for a freshly accepted passenger connection.
pub(crate) fn prepare_passenger(stream: &TcpStream, opts: &RelayOpts) {
    // Relayed bytes have already been batched by the passenger's own stack;
    // holding them back again only adds latency.
    if let Err(e) = stream.set_nodelay(true) {
        debug!(error = %e, "TCP_NODELAY on passenger socket");
    }
    if let Some(idle) = opts.keepalive {
        let ka = TcpKeepalive::new().with_time(idle).with_interval(Duration::from_secs(10)).with_retries(6);
        if let Err(e) = SockRef::from(stream).set_tcp_keepalive(&ka) {
            debug!(error = %e, "keepalive on passenger socket");
        }
    }
}

/// Makes the coming close of `stream` a RST instead of a FIN, so a passenger
/// whose destination failed sees a reset rather than a clean (and so
/// possibly mistaken for complete) end of stream.
pub(crate) fn reset_on_close(stream: &TcpStream) {
    if let Err(e) = SockRef::from(stream).set_linger(Some(Duration::ZERO)) {
        debug!(error = %e, "SO_LINGER 0 on passenger socket");
    }
}

/// How long connections still open after the drain get to reset their
/// passenger sockets before their tasks are dropped.
const ABORT_GRACE: Duration = Duration::from_secs(1);

/// Accepts until `shutdown` resolves, runs `handler` for each connection in
/// its own task with at most `opts.max_conns` at once, then drains for
/// `opts.drain_timeout` and resets what is left (TCP RST to the passenger).
pub(crate) async fn accept_loop<F, Fut>(
    listener: TcpListener,
    opts: &RelayOpts,
    shutdown: impl Future,
    what: &'static str,
    mut handler: F,
) where
    F: FnMut(TcpStream, SocketAddr) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let sem = Arc::new(Semaphore::new(opts.max_conns.clamp(1, Semaphore::MAX_PERMITS)));
    let mut tasks = JoinSet::new();
    let (abort_tx, abort_rx) = tokio::sync::watch::channel(false);
    let mut shutdown = pin!(shutdown);
    let local = listener.local_addr().ok();
    debug!(server = what, ?local, "accepting");
    loop {
        while let Some(res) = tasks.try_join_next() {
            log_join(what, res);
        }
        let accepted = tokio::select! {
            biased;
            _ = &mut shutdown => break,
            r = accept_with_permit(&listener, &sem) => r,
        };
        match accepted {
            Ok((stream, peer, permit)) => {
                CaptureStats::inc(&opts.stats.accepted);
                let active = ActiveGuard::new(&opts.stats);
                // A second descriptor of the passenger's socket, so that on
                // shutdown the socket can be reset (SO_LINGER 0) although
                // the handler owns the stream; it is closed last, so a
                // normal close stays a FIN after the data.
                let socket = stream.as_fd().try_clone_to_owned();
                let fut = handler(stream, peer);
                let mut abort = abort_rx.clone();
                tasks.spawn(async move {
                    let _permit = permit;
                    let _active = active;
                    tokio::select! {
                        () = fut => {}
                        _ = abort.wait_for(|a| *a) => {
                            if let Ok(fd) = &socket {
                                let _ = SockRef::from(fd).set_linger(Some(Duration::ZERO));
                            }
                        }
                    }
                    drop(socket);
                });
            }
            Err(e) => {
                // EMFILE/ENFILE/ENOBUFS and the like: back off instead of
                // spinning on an error that persists until something closes.
                warn!(server = what, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    drop(listener);
    let open = tasks.len();
    if open > 0 {
        debug!(server = what, open, drain = ?opts.drain_timeout, "shutting down");
        let drain = async {
            while let Some(res) = tasks.join_next().await {
                log_join(what, res);
            }
        };
        let _ = tokio::time::timeout(opts.drain_timeout, drain).await;
        // What is left is reset towards its passenger now, while the
        // relay's interception rules still translate the connection: a
        // close after they are gone would never reach the passenger, who
        // would wait on a dead connection (found by `make chaos`).
        let _ = abort_tx.send(true);
        let reset = async {
            while let Some(res) = tasks.join_next().await {
                log_join(what, res);
            }
        };
        let _ = tokio::time::timeout(ABORT_GRACE, reset).await;
        tasks.shutdown().await;
    }
}

async fn accept_with_permit(
    listener: &TcpListener,
    sem: &Arc<Semaphore>,
) -> io::Result<(TcpStream, SocketAddr, OwnedSemaphorePermit)> {
    let permit = sem.clone().acquire_owned().await.map_err(io::Error::other)?;
    let (stream, peer) = listener.accept().await?;
    Ok((stream, peer, permit))
}

fn log_join(what: &'static str, res: Result<(), JoinError>) {
    if let Err(e) = res {
        if e.is_panic() {
            error!(server = what, error = %e, "connection task panicked");
        }
    }
}

/// Runs `fut` under `limit`, turning expiry into `ErrorKind::TimedOut`.
pub(crate) async fn with_timeout<T>(
    limit: Duration,
    what: &str,
    fut: impl Future<Output = io::Result<T>>,
) -> io::Result<T> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, format!("{what} timed out after {limit:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A passenger that sends a request and half-closes still gets the whole
    /// answer: the FIN travels on, the other direction stays open.
    #[tokio::test]
    async fn relay_keeps_other_direction_open_after_half_close() {
        let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server_addr = server.local_addr().unwrap();
        let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let front_addr = front.local_addr().unwrap();
        let opts = RelayOpts::default();
        let stats = opts.stats.clone();

        // Origin: reads the request to EOF, then answers and closes.
        let origin = tokio::spawn(async move {
            let (mut s, _) = server.accept().await.unwrap();
            let mut req = Vec::new();
            s.read_to_end(&mut req).await.unwrap();
            s.write_all(b"got ").await.unwrap();
            s.write_all(&req).await.unwrap();
        });
        let relayer = tokio::spawn(async move {
            let (mut p, _) = front.accept().await.unwrap();
            let mut t = TcpStream::connect(server_addr).await.unwrap();
            let plain = |t: &mut TcpStream, cx: &mut Context<'_>, buf: &[u8], _| Pin::new(t).poll_write(cx, buf);
            relay(&mut p, &mut t, &opts, plain).await.unwrap()
        });

        let mut c = TcpStream::connect(front_addr).await.unwrap();
        c.write_all(b"hello").await.unwrap();
        c.shutdown().await.unwrap();
        let mut resp = Vec::new();
        c.read_to_end(&mut resp).await.unwrap();
        assert_eq!(resp, b"got hello");
        origin.await.unwrap();
        assert_eq!(relayer.await.unwrap(), (5, 9));
        let s = stats.snapshot();
        assert_eq!((s.bytes_up, s.bytes_down, s.relay_errors), (5, 9, 0));
    }
}
