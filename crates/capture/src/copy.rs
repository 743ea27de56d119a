//! Copying bytes both ways between two streams, telling one of them where the
//! other's bursts end.
//!
//! `tokio::io::copy_bidirectional` would do the copying, but the multipath
//! scheduler also wants to know when a sender has nothing more *for now*: a
//! request or response on a kept-alive connection, or a chat message, ends
//! without a FIN, and tail-aware rejection (`tail-reject` with `bursts = 1`)
//! treats the last bytes of such a burst like the tail of a finished flow.
//! The signal is a read shorter than the buffer: the kernel had no more bytes
//! queued at that moment. A bulk transfer the tunnel cannot keep up with
//! fills the socket's receive queue, so its reads are full and mark nothing.
//!
//! The relay-agent marks bursts of passenger bytes (uplink), the proxy those
//! of server bytes (downlink); both copy with [`copy_bidirectional_bursts`].

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// One direction's buffer: bytes `pos..cap` read and not yet written.
struct Half {
    buf: Box<[u8]>,
    pos: usize,
    cap: usize,
    /// The bytes in the buffer came from a read shorter than the buffer.
    short: bool,
    read_done: bool,
    /// Bytes were written since the last flush.
    need_flush: bool,
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
            need_flush: false,
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
/// Like tokio's copy, a writer that buffers (TLS) is flushed whenever the
/// reader has nothing more for now.
fn poll_copy<R, W>(
    h: &mut Half,
    cx: &mut Context<'_>,
    reader: &mut R,
    writer: &mut W,
    write: &impl Fn(&mut W, &mut Context<'_>, &[u8], bool) -> Poll<io::Result<usize>>,
) -> Poll<io::Result<()>>
where
    R: AsyncRead + Unpin + ?Sized,
    W: AsyncWrite + Unpin + ?Sized,
{
    while !h.done {
        if h.pos == h.cap && !h.read_done && h.poll_fill(cx, reader)?.is_pending() {
            if h.need_flush {
                ready!(Pin::new(&mut *writer).poll_flush(cx))?;
                h.need_flush = false;
            }
            return Poll::Pending;
        }
        while h.pos < h.cap {
            let n = ready!(write(writer, cx, &h.buf[h.pos..h.cap], h.short))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            h.pos += n;
            h.moved += n as u64;
            h.need_flush = true;
        }
        if h.read_done {
            ready!(Pin::new(&mut *writer).poll_shutdown(cx))?;
            h.done = true;
        }
    }
    Poll::Ready(Ok(()))
}

/// Copy both ways between `a` and `b` until both directions have seen EOF
/// (each EOF becomes a shutdown of the other side, so half-closed exchanges
/// work). Bytes from `a` are written to `b` with `write_b`, which is told
/// whether each chunk ends one of `a`'s bursts; bytes from `b` are a plain
/// copy. Returns `(a → b, b → a)` byte counts; the first I/O error of either
/// direction ends both. `buf_size` (at least 1 KiB) is each direction's buffer.
pub async fn copy_bidirectional_bursts<A, B, F>(
    a: &mut A,
    b: &mut B,
    buf_size: usize,
    write_b: F,
) -> io::Result<(u64, u64)>
where
    A: AsyncRead + AsyncWrite + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Unpin + ?Sized,
    F: Fn(&mut B, &mut Context<'_>, &[u8], bool) -> Poll<io::Result<usize>>,
{
    let size = buf_size.max(1024);
    let (mut ab, mut ba) = (Half::new(size), Half::new(size));
    let plain = |w: &mut A, cx: &mut Context<'_>, buf: &[u8], _end: bool| Pin::new(w).poll_write(cx, buf);
    poll_fn(|cx| {
        let x = poll_copy(&mut ab, cx, a, b, &write_b)?;
        let y = poll_copy(&mut ba, cx, b, a, &plain)?;
        if x.is_ready() && y.is_ready() {
            Poll::Ready(Ok((ab.moved, ba.moved)))
        } else {
            Poll::Pending
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    use super::*;

    /// A tunnel end that records each write's length and burst mark.
    struct Marks {
        inner: DuplexStream,
        log: Arc<Mutex<Vec<(usize, bool)>>>,
    }

    impl AsyncRead for Marks {
        fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for Marks {
        fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.inner).poll_write(cx, buf)
        }
        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_flush(cx)
        }
        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    impl Marks {
        fn write_burst(&mut self, cx: &mut Context<'_>, buf: &[u8], end: bool) -> Poll<io::Result<usize>> {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, buf))?;
            self.log.lock().unwrap().push((n, end));
            Poll::Ready(Ok(n))
        }
    }

    #[tokio::test]
    async fn short_reads_end_bursts_and_both_directions_flow() {
        let (mut app, mut a) = tokio::io::duplex(1 << 16);
        let (inner, mut peer) = tokio::io::duplex(1 << 16);
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut b = Marks { inner, log: log.clone() };
        let task = tokio::spawn(async move {
            copy_bidirectional_bursts(&mut a, &mut b, 1024, |w: &mut Marks, cx: &mut Context<'_>, buf: &[u8], end| {
                w.write_burst(cx, buf, end)
            })
            .await
        });
        // Two full buffers, then a short message: only the short read ends a burst.
        app.write_all(&[1; 2048]).await.unwrap();
        let mut got = vec![0; 2048];
        peer.read_exact(&mut got).await.unwrap();
        app.write_all(b"hello").await.unwrap();
        let mut hello = [0; 5];
        peer.read_exact(&mut hello).await.unwrap();
        assert_eq!(&hello, b"hello");
        assert_eq!(*log.lock().unwrap(), vec![(1024, false), (1024, false), (5, true)]);
        // The other direction is a plain copy; EOF both ways ends the copy.
        peer.write_all(b"answer").await.unwrap();
        peer.shutdown().await.unwrap();
        let mut answer = [0; 6];
        app.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"answer");
        app.shutdown().await.unwrap();
        assert_eq!(task.await.unwrap().unwrap(), (2053, 6));
    }
}
