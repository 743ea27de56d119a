//! Executes a bulk plan: sequential HTTP/1.1 downloads, one fresh TCP connection each.

use std::net::{Ipv4Addr, SocketAddr};

use anyhow::{bail, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::clock::TripClock;
use crate::plan::{expand_path, us_to_ms, Download};
use crate::record::{BulkRecord, Sink};

/// Largest response header accepted.
const MAX_HEADER: usize = 64 * 1024;

/// Spacing of the progress samples, µs of trip time.
pub const PROGRESS_STEP_US: i64 = 100_000;

/// What a download achieved so far; kept outside the future so a timeout can still report it.
///
/// Progress samples lie on a grid of [`PROGRESS_STEP_US`] from the download's start: the point at
/// grid time g holds the body bytes of the reads that completed at or before g. They are written
/// lazily, when a read completes after one or more grid times (so a stall costs nothing while it
/// lasts, and its grid points all show the bytes from before it), and by [`Progress::finish`].
///
/// One curve can span several requests (`backlog`): [`Progress::begin_request`] starts the next
/// request on the same grid, its bytes adding to the running total; `fetch` checks the body of
/// the current request ([`Progress::request_bytes`]). A bulk download is a single request.
#[derive(Debug)]
pub struct Progress {
    /// Cumulative body bytes over all requests.
    body_bytes: u64,
    /// `body_bytes` when the current request began (0 for the first).
    request_base: u64,
    /// Trip time of the current request's last body byte.
    end_us: Option<i64>,
    next_sample_us: i64,
    samples: Vec<(i64, u64)>,
}

impl Progress {
    /// A download starting at trip time `start_us`: the first point is (start, 0).
    pub fn new(start_us: i64) -> Self {
        Progress {
            body_bytes: 0,
            request_base: 0,
            end_us: None,
            next_sample_us: start_us + PROGRESS_STEP_US,
            samples: vec![(start_us, 0)],
        }
    }

    /// A read that completed at `now_us` brought the body to `bytes` in total.
    pub fn update(&mut self, now_us: i64, bytes: u64) {
        self.fill(now_us);
        self.body_bytes = bytes;
    }

    /// A read of the current request that completed at `now_us` brought `n` more body bytes.
    pub fn add(&mut self, now_us: i64, n: u64) {
        self.update(now_us, self.body_bytes + n);
    }

    /// The next request starts: its body bytes add to those so far, on the same grid.
    pub fn begin_request(&mut self) {
        self.request_base = self.body_bytes;
        self.end_us = None;
    }

    /// Body bytes of the current request.
    pub fn request_bytes(&self) -> u64 {
        self.body_bytes - self.request_base
    }

    /// Grid points before `now_us` (they hold the bytes from before any read completing at `now_us`).
    fn fill(&mut self, now_us: i64) {
        while self.next_sample_us < now_us {
            self.samples.push((self.next_sample_us, self.body_bytes));
            self.next_sample_us += PROGRESS_STEP_US;
        }
    }

    /// The download ended (completed, failed or abandoned) at `end_us`: grid points before it and a
    /// final point (end, bytes); a final point at the time of the last point replaces it.
    pub fn finish(&mut self, end_us: i64) {
        self.fill(end_us);
        match self.samples.last_mut() {
            Some(last) if last.0 >= end_us => last.1 = self.body_bytes,
            _ => self.samples.push((end_us, self.body_bytes)),
        }
        self.next_sample_us = i64::MAX;
    }

    /// Body bytes so far (over all requests).
    pub fn body_bytes(&self) -> u64 {
        self.body_bytes
    }

    /// The samples as (trip µs, cumulative body bytes).
    pub fn samples(&self) -> &[(i64, u64)] {
        &self.samples
    }
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
        let start_us = self.clock.now_us();
        let mut progress = Progress::new(start_us);
        let deadline = d.deadline_us();
        let (timeout, error) = if start_us >= deadline {
            (true, Some("started after its deadline (slot end - 100 ms)".to_owned()))
        } else {
            let fut = fetch(&self.clock, self.origin, None, self.host, &path, d.size, &mut progress);
            match tokio::time::timeout_at(self.clock.instant_at(deadline), fut).await {
                Ok(Ok(())) => (false, None),
                Ok(Err(e)) => (false, Some(format!("{e:#}"))),
                Err(_) => (true, Some(format!("timeout after {:.3} ms", us_to_ms(deadline - start_us)))),
            }
        };
        let ok = error.is_none();
        // The progress ends at the last byte, or when the download failed or was abandoned (at its
        // start if it never ran).
        let end_us = match progress.end_us {
            Some(t) if ok => t,
            _ if start_us >= deadline => start_us,
            _ => self.clock.now_us(),
        };
        progress.finish(end_us);
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
            progress: progress.samples().iter().map(|&(t, b)| (us_to_ms(t), b)).collect(),
        }
    }
}

/// Connects (from `source` when given, else from the address the system picks), sends the request
/// and reads the whole response body, adding the body bytes to `p` as they arrive (the caller
/// starts `p`'s request). Succeeds only with status 200 and exactly `size` body bytes.
pub(crate) async fn fetch(
    clock: &TripClock,
    origin: SocketAddr,
    source: Option<Ipv4Addr>,
    host: &str,
    path: &str,
    size: u64,
    p: &mut Progress,
) -> Result<()> {
    let mut s = match source {
        None => TcpStream::connect(origin).await.map_err(|e| anyhow::anyhow!("connect: {e}"))?,
        Some(local) => {
            let sock = TcpSocket::new_v4().map_err(|e| anyhow::anyhow!("socket: {e}"))?;
            sock.bind(SocketAddr::from((local, 0))).map_err(|e| anyhow::anyhow!("bind {local}: {e}"))?;
            sock.connect(origin).await.map_err(|e| anyhow::anyhow!("connect: {e}"))?
        }
    };
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
    let now = clock.now_us();
    p.add(now, early.min(size));
    if early > 0 {
        p.end_us = Some(now);
    }
    if early > size {
        bail!("more body bytes than the planned size {size}");
    }
    while content_length.is_none() || p.request_bytes() < size {
        let n =
            s.read(&mut buf).await.map_err(|e| anyhow::anyhow!("read body after {} bytes: {e}", p.request_bytes()))?;
        if n == 0 {
            break;
        }
        let now = clock.now_us();
        p.add(now, n as u64);
        p.end_us = Some(now);
        if p.request_bytes() > size {
            bail!("more body bytes than the planned size {size}");
        }
    }
    if p.request_bytes() != size {
        bail!("connection closed after {} of {size} body bytes", p.request_bytes());
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
    fn progress_is_sampled_on_a_100_ms_grid_from_the_start() {
        const MS: i64 = 1000;
        let mut p = Progress::new(1_000 * MS);
        p.update(1_020 * MS, 0); // header only
        p.update(1_050 * MS, 1000);
        p.update(1_100 * MS, 3000); // completes exactly at the first grid time: counts there
        p.update(1_130 * MS, 5000);
        // A 450 ms stall, then two reads; the stall's grid points show the bytes from before it.
        p.update(1_580 * MS, 6000);
        p.update(1_590 * MS, 8000);
        p.finish(1_590 * MS);
        assert_eq!(p.body_bytes(), 8000);
        let want: Vec<(i64, u64)> =
            vec![(1_000, 0), (1_100, 3000), (1_200, 5000), (1_300, 5000), (1_400, 5000), (1_500, 5000), (1_590, 8000)]
                .into_iter()
                .map(|(t, b)| (t * MS, b))
                .collect();
        assert_eq!(p.samples(), &want[..]);

        // Abandoned with nothing received: grid points up to the end, then the end.
        let mut p = Progress::new(0);
        p.finish(250 * MS);
        assert_eq!(p.samples(), &[(0, 0), (100 * MS, 0), (200 * MS, 0), (250 * MS, 0)]);
        // Ending on a grid time or at the start gives no duplicate time.
        let mut p = Progress::new(0);
        p.update(150 * MS, 10);
        p.finish(200 * MS);
        assert_eq!(p.samples(), &[(0, 0), (100 * MS, 0), (200 * MS, 10)]);
        let mut p = Progress::new(5);
        p.finish(5);
        assert_eq!(p.samples(), &[(5, 0)]);
    }

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
