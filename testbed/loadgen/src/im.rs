//! Instant-messaging workload: the client (`im`) and the echo-style server (`im-server`).
//!
//! Wire format: the client sends 100-byte messages `[user u32 BE][msg u32 BE][92 filler bytes]`;
//! the server answers each with 4 bytes, the msg index (bytes 4..8) unchanged.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::clock::TripClock;
use crate::plan::{im_due_times, us_to_ms};
use crate::record::{ConnRecord, ImRecord, Sink};

pub const MSG_LEN: usize = 100;
pub const REPLY_LEN: usize = 4;
const FILLER: u8 = b'.';

/// The 100-byte message `msg` of `user`.
pub fn encode_message(user: u32, msg: u32) -> [u8; MSG_LEN] {
    let mut m = [FILLER; MSG_LEN];
    m[0..4].copy_from_slice(&user.to_be_bytes());
    m[4..8].copy_from_slice(&msg.to_be_bytes());
    m
}

/// The reply to a message: its bytes 4..8.
pub fn reply_for(message: &[u8; MSG_LEN]) -> [u8; REPLY_LEN] {
    [message[4], message[5], message[6], message[7]]
}

/// `im` configuration.
#[derive(Debug, Clone)]
pub struct ImConfig {
    pub server: SocketAddr,
    pub seed: u64,
    pub users: u32,
    pub messages: u32,
    pub mean_gap_ms: f64,
    pub start_us: i64,
    pub deadline_us: Option<i64>,
    /// User u's connections come from this IPv4 address + u (distinct passengers, as the
    /// relay tells users apart by source address); `None`: the system's choice for all.
    pub source_base: Option<std::net::Ipv4Addr>,
}

/// The local address of user `user`'s connections: `base + user`.
pub fn source_addr(base: std::net::Ipv4Addr, user: u32) -> Result<std::net::Ipv4Addr> {
    u32::from(base)
        .checked_add(user)
        .map(std::net::Ipv4Addr::from)
        .ok_or_else(|| anyhow!("--source-base {base} + user {user} overflows IPv4"))
}

/// Runs all users to completion (every message recorded) or to the deadline.
pub async fn run_im(clock: TripClock, cfg: ImConfig, sink: Sink, conn_sink: Sink) -> Result<()> {
    let mut tasks = tokio::task::JoinSet::new();
    for user in 0..cfg.users {
        let due = im_due_times(cfg.seed, user, cfg.messages, cfg.start_us, cfg.mean_gap_ms);
        let u =
            User { user, clock, cfg: cfg.clone(), due, sink: sink.clone(), conn_sink: conn_sink.clone(), attempts: 0 };
        tasks.spawn(u.run());
    }
    let mut first_err = None;
    while let Some(res) = tasks.join_next().await {
        let res = res.map_err(|e| anyhow!("user task failed: {e}")).and_then(|r| r);
        if let Err(e) = res {
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(()), Err)
}

struct User {
    user: u32,
    clock: TripClock,
    cfg: ImConfig,
    due: Vec<i64>,
    sink: Sink,
    conn_sink: Sink,
    attempts: u32,
}

/// How one message ended.
enum Outcome {
    Ok { recv_us: i64 },
    Failed(String),
    Deadline,
}

impl User {
    async fn run(mut self) -> Result<()> {
        let deadline = self.cfg.deadline_us.unwrap_or(i64::MAX);
        let mut conn: Option<TcpStream> = None;
        if self.cfg.start_us < deadline {
            self.clock.sleep_until(self.cfg.start_us).await;
            match tokio::time::timeout_at(self.clock.instant_at(deadline), self.connect()).await {
                Ok(c) => conn = c,
                Err(_) => return self.give_up(0, None),
            }
        }
        for m in 0..self.cfg.messages {
            let due = self.due[m as usize];
            if due >= deadline {
                return self.give_up(m, None);
            }
            self.clock.sleep_until(due).await;
            if conn.is_none() {
                // One reconnect attempt per message whose connection is gone.
                match tokio::time::timeout_at(self.clock.instant_at(deadline), self.connect()).await {
                    Ok(Some(c)) => conn = Some(c),
                    Ok(None) => {
                        self.record(m, None, Outcome::Failed("no connection (reconnect failed)".to_owned()))?;
                        continue;
                    }
                    Err(_) => return self.give_up(m, None),
                }
            }
            let stream = conn.as_mut().expect("connected above");
            let send_us = self.clock.now_us();
            let exchange = exchange(&self.clock, stream, self.user, m);
            let outcome = match tokio::time::timeout_at(self.clock.instant_at(deadline), exchange).await {
                Ok(Ok(recv_us)) => Outcome::Ok { recv_us },
                Ok(Err(e)) => Outcome::Failed(format!("{e:#}")),
                Err(_) => Outcome::Deadline,
            };
            match outcome {
                Outcome::Deadline => return self.give_up(m, Some(send_us)),
                Outcome::Failed(_) => conn = None,
                Outcome::Ok { .. } => {}
            }
            self.record(m, Some(send_us), outcome)?;
        }
        Ok(())
    }

    /// One connection attempt, recorded in the connection log.
    async fn connect(&mut self) -> Option<TcpStream> {
        let attempt = self.attempts;
        self.attempts += 1;
        let start_us = self.clock.now_us();
        let res = async {
            let s = match self.cfg.source_base {
                None => TcpStream::connect(self.cfg.server).await.context("connect")?,
                Some(base) => {
                    let local = source_addr(base, self.user)?;
                    let sock = tokio::net::TcpSocket::new_v4().context("socket")?;
                    sock.bind(SocketAddr::from((local, 0))).with_context(|| format!("bind {local}"))?;
                    sock.connect(self.cfg.server).await.context("connect")?
                }
            };
            s.set_nodelay(true).context("TCP_NODELAY")?;
            anyhow::Ok(s)
        }
        .await;
        let end_us = self.clock.now_us();
        let (stream, error) = match res {
            Ok(s) => (Some(s), None),
            Err(e) => (None, Some(format!("{e:#}"))),
        };
        let ok = stream.is_some();
        let rec = ConnRecord {
            user: self.user,
            attempt,
            start_ms: us_to_ms(start_us),
            end_ms: ok.then(|| us_to_ms(end_us)),
            connect_ms: ok.then(|| us_to_ms(end_us - start_us)),
            ok,
            error,
        };
        if let Err(e) = self.conn_sink.write(&rec) {
            eprintln!("polycorn-loadgen: {e:#}");
        }
        stream
    }

    fn record(&self, m: u32, send_us: Option<i64>, outcome: Outcome) -> Result<()> {
        let (recv_us, error) = match outcome {
            Outcome::Ok { recv_us } => (Some(recv_us), None),
            Outcome::Failed(e) => (None, Some(e)),
            Outcome::Deadline => (None, Some("deadline".to_owned())),
        };
        self.sink.write(&ImRecord {
            user: self.user,
            msg: m,
            due_ms: us_to_ms(self.due[m as usize]),
            send_ms: send_us.map(us_to_ms),
            recv_ms: recv_us.map(us_to_ms),
            delay_ms: recv_us.zip(send_us).map(|(r, s)| us_to_ms(r - s)),
            ok: error.is_none(),
            error,
        })
    }

    /// The deadline came: message `from` (sent at `sent`, if it was) and all later ones fail.
    fn give_up(&self, from: u32, sent: Option<i64>) -> Result<()> {
        for m in from..self.cfg.messages {
            self.record(m, if m == from { sent } else { None }, Outcome::Deadline)?;
        }
        Ok(())
    }
}

/// Sends message `m` and waits for its reply; returns the trip time of the reply's last byte.
async fn exchange(clock: &TripClock, s: &mut TcpStream, user: u32, m: u32) -> Result<i64> {
    let msg = encode_message(user, m);
    s.write_all(&msg).await.context("send")?;
    let mut reply = [0u8; REPLY_LEN];
    s.read_exact(&mut reply).await.context("receive reply")?;
    let recv_us = clock.now_us();
    let got = u32::from_be_bytes(reply);
    if got != m {
        return Err(anyhow!("reply names message {got}, expected {m}"));
    }
    Ok(recv_us)
}

/// `im-server`: serves until the process is stopped. Calls `on_bound` with the bound address.
pub async fn serve(listen: &str, on_bound: impl FnOnce(SocketAddr)) -> Result<()> {
    let listener = TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
    on_bound(listener.local_addr()?);
    loop {
        match listener.accept().await {
            Ok((s, _)) => {
                tokio::spawn(serve_conn(s));
            }
            Err(e) => {
                // EMFILE and friends: back off and keep serving the existing connections.
                eprintln!("polycorn-loadgen im-server: accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Serves one connection until EOF, an I/O error or a short message; never panics.
async fn serve_conn(mut s: TcpStream) {
    let _ = s.set_nodelay(true);
    let mut msg = [0u8; MSG_LEN];
    loop {
        if s.read_exact(&mut msg).await.is_err() {
            return;
        }
        if s.write_all(&reply_for(&msg)).await.is_err() {
            return;
        }
    }
}

/// The default connection log next to `out`: `X.jsonl` -> `X.conn.jsonl`, otherwise `out.conn.jsonl`.
pub fn default_conn_out(out: &std::path::Path) -> PathBuf {
    let s = out.to_string_lossy();
    match s.strip_suffix(".jsonl") {
        Some(stem) => PathBuf::from(format!("{stem}.conn.jsonl")),
        None => PathBuf::from(format!("{s}.conn.jsonl")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_layout() {
        let m = encode_message(0x0102_0304, 0x0A0B_0C0D);
        assert_eq!(&m[..8], &[1, 2, 3, 4, 0x0A, 0x0B, 0x0C, 0x0D]);
        assert!(m[8..].iter().all(|&b| b == FILLER));
        assert_eq!(reply_for(&m), [0x0A, 0x0B, 0x0C, 0x0D]);
    }

    #[test]
    fn conn_out_names() {
        assert_eq!(default_conn_out("a/im.jsonl".as_ref()), PathBuf::from("a/im.conn.jsonl"));
        assert_eq!(default_conn_out("im.out".as_ref()), PathBuf::from("im.out.conn.jsonl"));
    }
}
