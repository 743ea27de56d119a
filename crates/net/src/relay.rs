//! Copying bytes both ways between a tunnel connection and a socket, telling
//! the endpoint where the socket's bursts end.
//!
//! `tokio::io::copy_bidirectional` would do the copying, but the scheduler
//! also wants to know when the sender has nothing more *for now*: a response
//! on a kept-alive connection or a chat message ends without a FIN, and
//! tail-aware rejection (`tail-reject` with `bursts = 1`) treats the last
//! bytes of such a burst like the tail of a finished flow. The signal is a
//! read from the socket shorter than the buffer: the kernel had no more
//! bytes queued at that moment. A bulk transfer the tunnel cannot keep up
//! with fills the socket's receive queue, so its reads are full and mark
//! nothing.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::session::ConnStream;

/// One direction's buffer: bytes `pos..cap` read and not yet written.
struct Half {
    buf: Box<[u8]>,
    pos: usize,
    cap: usize,
    /// The bytes in the buffer came from a read shorter than the buffer.
    short: bool,
    read_done: bool,
    done: bool,
    moved: u64,
}

impl Half {
    fn new(size: usize) -> Self {
        Half {
            buf: vec![0; size].into_boxed_slice(),
            pos: 0,
            cap: 0,
            short: false,
            read_done: false,
            done: false,
            moved: 0,
        }
    }

    /// Read into the empty buffer; `Ready(Ok(()))` once something (or EOF) came.
    fn poll_fill<R: AsyncRead + Unpin + ?Sized>(&mut self, cx: &mut Context<'_>, r: &mut R) -> Poll<io::Result<()>> {
        let mut rb = ReadBuf::new(&mut self.buf);
        ready!(Pin::new(r).poll_read(cx, &mut rb))?;
        let n = rb.filled().len();
        if n == 0 {
            self.read_done = true;
        }
        (self.pos, self.cap, self.short) = (0, n, n < self.buf.len());
        Poll::Ready(Ok(()))
    }
}

/// Copy `reader` to `writer` through `h` until EOF, then shut `writer`
/// down; `write` writes one chunk, told whether it came from a short read.
fn poll_copy<R, W>(
    h: &mut Half,
    cx: &mut Context<'_>,
    reader: &mut R,
    writer: &mut W,
    write: impl Fn(&mut W, &mut Context<'_>, &[u8], bool) -> Poll<io::Result<usize>>,
) -> Poll<io::Result<()>>
where
    R: AsyncRead + Unpin + ?Sized,
    W: AsyncWrite + Unpin + ?Sized,
{
    while !h.done {
        if h.pos == h.cap && !h.read_done {
            ready!(h.poll_fill(cx, reader))?;
        }
        while h.pos < h.cap {
            let n = ready!(write(writer, cx, &h.buf[h.pos..h.cap], h.short))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            h.pos += n;
            h.moved += n as u64;
        }
        if h.read_done {
            ready!(Pin::new(&mut *writer).poll_shutdown(cx))?;
            h.done = true;
        }
    }
    Poll::Ready(Ok(()))
}

/// Copy both ways between `conn` and `socket` until both directions have
/// seen EOF (each EOF becomes a shutdown of the other side, so half-closed
/// exchanges work), marking burst ends in the socket → tunnel direction.
/// Returns `(tunnel → socket, socket → tunnel)` byte counts; the first I/O
/// error of either direction ends both.
pub async fn relay_bursts<S>(conn: &mut ConnStream, socket: &mut S, buf_size: usize) -> io::Result<(u64, u64)>
where
    S: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let size = buf_size.max(1024);
    let (mut up, mut down) = (Half::new(size), Half::new(size));
    poll_fn(|cx| {
        // Tunnel → socket, a plain copy; socket → tunnel, each chunk saying
        // whether it ends a burst.
        let a = poll_copy(&mut up, cx, conn, socket, |s, cx, buf, _| Pin::new(s).poll_write(cx, buf))?;
        let b = poll_copy(&mut down, cx, socket, conn, |c, cx, buf, short| c.poll_write_burst(cx, buf, short))?;
        if a.is_ready() && b.is_ready() {
            Poll::Ready(Ok((up.moved, down.moved)))
        } else {
            Poll::Pending
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use polycorn_core::sched::Registry;
    use polycorn_core::{ConnId, Endpoint, EndpointConfig, Role, UserId};
    use tokio::io::AsyncWriteExt;

    use super::*;
    use crate::Session;

    /// Wait (bounded) until the relay endpoint holds `bytes` of `conn`; its
    /// burst-end mark then.
    async fn held(session: &Session, conn: ConnId, bytes: u64) -> bool {
        for _ in 0..500 {
            if let Some((b, end)) = session.peek(|st, _| st.ep.send_state(conn)) {
                if b >= bytes {
                    return end;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the endpoint never held {bytes} bytes of {conn}");
    }

    #[tokio::test]
    async fn a_short_read_ends_a_burst_and_full_reads_do_not() {
        // No path is up: what the relay writes stays in the endpoint, where
        // its burst-end mark can be read.
        let pipeline = Registry::with_builtins().build("minrtt").unwrap();
        let (session, _events) =
            Session::new(Endpoint::new(EndpointConfig::new(Role::Relay), pipeline, Instant::now()));
        let mut conn = session.open(UserId([1; 16]), "10.99.0.10:80".parse().unwrap()).unwrap();
        let id = conn.id();
        let (mut app, mut socket) = tokio::io::duplex(1 << 16);
        let task = tokio::spawn(async move { relay_bursts(&mut conn, &mut socket, 1024).await });
        // Two full buffers and nothing after them: the reads were full, the
        // writer cannot tell the burst ended.
        app.write_all(&[1; 2048]).await.unwrap();
        assert!(!held(&session, id, 2048).await, "full reads mark nothing");
        // A chat message: one short read, the source is drained.
        app.write_all(b"hello").await.unwrap();
        assert!(held(&session, id, 2053).await, "a short read ends the burst");
        // More bytes: the mark follows the latest read.
        app.write_all(&[2; 1024]).await.unwrap();
        assert!(!held(&session, id, 3077).await, "a full read clears it");
        task.abort();
    }
}
