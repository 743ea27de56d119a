//! Executes a bulk plan: sequential HTTP/1.1 downloads, one fresh TCP connection each.

use std::net::SocketAddr;

use anyhow::{bail, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::clock::TripClock;
use crate::plan::{expand_path, us_to_ms, Download};
use crate::record::{BulkRecord, Sink};

/// Largest response header accepted.
const MAX_HEADER: usize = 64 * 1024;

/// What a download achieved so far; kept outside the future so a timeout can still report it.
#[derive(Debug, Default)]
struct Progress {
    body_bytes: u64,
    end_us: Option<i64>,
}

pub struct BulkRun<'a> {
    pub clock: TripClock,
    pub origin: SocketAddr,
    /// `Host` header value (the `--origin` argument as given).
    pub host: &'a str,
    pub path_template: &'a str,
    pub sink: Sink,
}

impl BulkRun<'_> {
    /// Runs the downloads in order, writing one record each.
    pub async fn run(&self, plan: &[Download]) -> Result<()> {
        for d in plan {
            let late = self.clock.sleep_until(d.planned_us).await;
            let rec = self.download(d, late).await;
            self.sink.write(&rec)?;
        }
        Ok(())
    }

    async fn download<'d>(&self, d: &'d Download, late: bool) -> BulkRecord<'d> {
        let path = expand_path(self.path_template, d);
        let mut progress = Progress::default();
        let start_us = self.clock.now_us();
        let deadline = d.deadline_us();
        let (timeout, error) = if start_us >= deadline {
            (true, Some("started after its deadline (slot end - 100 ms)".to_owned()))
        } else {
            let fut = fetch(&self.clock, self.origin, self.host, &path, d.size, &mut progress);
            match tokio::time::timeout_at(self.clock.instant_at(deadline), fut).await {
                Ok(Ok(())) => (false, None),
                Ok(Err(e)) => (false, Some(format!("{e:#}"))),
                Err(_) => (true, Some(format!("timeout after {:.3} ms", us_to_ms(deadline - start_us)))),
            }
        };
        let ok = error.is_none();
        BulkRecord {
            id: d.id,
            label: &d.label,
            size: d.size,
            planned_ms: us_to_ms(d.planned_us),
            start_ms: us_to_ms(start_us),
            end_ms: if ok { progress.end_us.map(us_to_ms) } else { None },
            bytes: progress.body_bytes,
            ok,
            timeout,
            error,
            late,
            timeout_ms: us_to_ms(d.timeout_us),
        }
    }
}

/// Connects, sends the request and reads the whole response body, updating `p` as bytes arrive.
/// Succeeds only with status 200 and exactly `size` body bytes.
async fn fetch(
    clock: &TripClock,
    origin: SocketAddr,
    host: &str,
    path: &str,
    size: u64,
    p: &mut Progress,
) -> Result<()> {
    let mut s = TcpStream::connect(origin).await.map_err(|e| anyhow::anyhow!("connect: {e}"))?;
    s.set_nodelay(true).map_err(|e| anyhow::anyhow!("TCP_NODELAY: {e}"))?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: polycorn-loadgen\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.map_err(|e| anyhow::anyhow!("send request: {e}"))?;

    // Response header.
    let mut buf = vec![0u8; 64 * 1024];
    let mut head: Vec<u8> = Vec::new();
    let header_end = loop {
        let n = s.read(&mut buf).await.map_err(|e| anyhow::anyhow!("read header: {e}"))?;
        if n == 0 {
            bail!("connection closed before the end of the response header ({} bytes)", head.len());
        }
        let from = head.len().saturating_sub(3);
        head.extend_from_slice(&buf[..n]);
        if let Some(i) = find(&head[from..], b"\r\n\r\n") {
            break from + i + 4;
        }
        if head.len() > MAX_HEADER {
            bail!("response header longer than {MAX_HEADER} bytes");
        }
    };
    let content_length = parse_head(&head[..header_end])?;
    if let Some(cl) = content_length {
        if cl != size {
            bail!("Content-Length {cl} differs from the planned size {size}");
        }
    }

    // Body: what came with the header, then until `size` bytes (Content-Length) or EOF.
    let early = (head.len() - header_end) as u64;
    p.body_bytes = early.min(size);
    if early > 0 {
        p.end_us = Some(clock.now_us());
    }
    if early > size {
        bail!("more body bytes than the planned size {size}");
    }
    while content_length.is_none() || p.body_bytes < size {
        let n = s.read(&mut buf).await.map_err(|e| anyhow::anyhow!("read body after {} bytes: {e}", p.body_bytes))?;
        if n == 0 {
            break;
        }
        p.body_bytes += n as u64;
        p.end_us = Some(clock.now_us());
        if p.body_bytes > size {
            bail!("more body bytes than the planned size {size}");
        }
    }
    if p.body_bytes != size {
        bail!("connection closed after {} of {size} body bytes", p.body_bytes);
    }
    if size == 0 {
        p.end_us = Some(clock.now_us());
    }
    Ok(())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Checks the status line (HTTP/1.x 200) and returns the Content-Length, if any.
fn parse_head(head: &[u8]) -> Result<Option<u64>> {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.split("\r\n");
    let status = lines.next().unwrap_or_default();
    let mut parts = status.splitn(3, ' ');
    let (version, code) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    if !version.starts_with("HTTP/1.") {
        bail!("not an HTTP/1.x response: {:?}", truncate(status));
    }
    if code != "200" {
        bail!("HTTP status {:?}", truncate(status));
    }
    let mut content_length = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else { continue };
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("content-length") {
            let v: u64 = value.parse().map_err(|_| anyhow::anyhow!("bad Content-Length {:?}", truncate(value)))?;
            if content_length.is_some_and(|c| c != v) {
                bail!("conflicting Content-Length headers");
            }
            content_length = Some(v);
        } else if name.eq_ignore_ascii_case("transfer-encoding") && !value.eq_ignore_ascii_case("identity") {
            bail!("Transfer-Encoding {:?} is not supported (the origin must send Content-Length)", truncate(value));
        }
    }
    Ok(content_length)
}

fn truncate(s: &str) -> String {
    s.chars().take(80).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_parsing() {
        assert_eq!(parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n").unwrap(), Some(12));
        assert_eq!(parse_head(b"HTTP/1.0 200 OK\r\ncontent-length:7\r\nX: y\r\n\r\n").unwrap(), Some(7));
        assert_eq!(parse_head(b"HTTP/1.1 200 OK\r\nServer: x\r\n\r\n").unwrap(), None);
        assert!(parse_head(b"HTTP/1.1 404 Not Found\r\nContent-Length: 1\r\n\r\n").is_err());
        assert!(parse_head(b"SSH-2.0-x\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n").is_err());
        assert!(parse_head(b"").is_err());
        assert!(parse_head(&[0xff, 0xfe, b'\r', b'\n']).is_err());
    }
}
