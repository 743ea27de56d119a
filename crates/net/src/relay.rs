//! Copying bytes both ways between a tunnel connection and a socket, telling
//! the endpoint where the socket's bursts end (the proxy's side: server
//! bytes; the relay-agent marks passenger bytes through
//! `polycorn_capture::Dialer::poll_write_burst`). The copier and why a short
//! read ends a burst: [`polycorn_capture::copy`].

use std::io;

use tokio::io::{AsyncRead, AsyncWrite};

use crate::session::ConnStream;

/// Copy both ways between `conn` and `socket` until both directions have
/// seen EOF (each EOF becomes a shutdown of the other side, so half-closed
/// exchanges work), marking burst ends in the socket → tunnel direction.
/// Returns `(tunnel → socket, socket → tunnel)` byte counts; the first I/O
/// error of either direction ends both.
pub async fn relay_bursts<S>(conn: &mut ConnStream, socket: &mut S, buf_size: usize) -> io::Result<(u64, u64)>
where
    S: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let (up, down) =
        polycorn_capture::copy_bidirectional_bursts(socket, conn, buf_size, |c: &mut ConnStream, cx, buf, end| {
            c.poll_write_burst(cx, buf, end)
        })
        .await?;
    Ok((down, up))
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
