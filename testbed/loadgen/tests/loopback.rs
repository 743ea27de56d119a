//! End-to-end runs of the binary on loopback: bulk against a tiny HTTP server, im against
//! im-server. No wall-clock durations are asserted, only completion and record contents.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use polycorn_loadgen::plan::{im_due_times, us_to_ms};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_polycorn-loadgen");

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("polycorn-loadgen-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn read_jsonl(p: &Path) -> Vec<Value> {
    std::fs::read_to_string(p).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Waits for a child with a generous safety limit so that a hung binary fails the test instead of
/// hanging it.
fn wait(mut child: Child, limit: Duration) -> Output {
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            child.kill().unwrap();
            panic!("polycorn-loadgen did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn run(args: &[&str]) -> Output {
    let child = Command::new(BIN).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    wait(child, Duration::from_secs(60))
}

fn sigterm(child: &Child) {
    let st = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(st.success());
}

/// A tiny HTTP/1.1 origin: `/files/bench-{label}.bin`. Labels: `ok*` serve the size in the table;
/// `short` announces its size but closes early; `wrong` announces a different length; `stall`
/// sends the header and then nothing; `slow` sends its body in 10 pieces 40 ms apart; anything
/// else is 404. Records the request heads.
fn http_origin(sizes: HashMap<String, usize>) -> (String, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let heads2 = heads.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let sizes = sizes.clone();
            let heads = heads2.clone();
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if s.read(&mut b).unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(b[0]);
                }
                let head = String::from_utf8(head).unwrap();
                heads.lock().unwrap().push(head.clone());
                let path = head.split(' ').nth(1).unwrap_or("").to_owned();
                let label = path.strip_prefix("/files/bench-").and_then(|p| p.strip_suffix(".bin")).unwrap_or("");
                let Some(&size) = sizes.get(label) else {
                    let _ = s.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                    return;
                };
                let (announce, send) = match label {
                    "short" => (size, size / 2),
                    "wrong" => (size + 1, size + 1),
                    _ => (size, size),
                };
                let hdr = format!("HTTP/1.1 200 OK\r\nContent-Length: {announce}\r\nConnection: close\r\n\r\n");
                let _ = s.write_all(hdr.as_bytes());
                if label == "stall" {
                    std::thread::sleep(Duration::from_secs(20));
                    return;
                }
                let body = vec![0x5au8; send];
                if label == "slow" {
                    for (i, piece) in body.chunks(send.div_ceil(10).max(1)).enumerate() {
                        if i > 0 {
                            std::thread::sleep(Duration::from_millis(40));
                        }
                        if s.write_all(piece).is_err() {
                            return;
                        }
                    }
                    return;
                }
                for chunk in body.chunks(8192) {
                    if s.write_all(chunk).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, heads)
}

#[test]
fn plan_only_is_byte_identical_and_needs_no_network() {
    let args = ["bulk", "--seed", "7", "--window-s", "30:330", "--per-size", "4", "--plan-only"];
    let a = run(&args);
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    // Different origin/epoch/out-of-band flags must not change the plan.
    let b = run(&[&args[..], &["--origin", "192.0.2.1:9", "--epoch-unix-ms", "1"]].concat());
    assert_eq!(a.stdout, b.stdout);
    let lines: Vec<Value> =
        String::from_utf8(a.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 12);
    for (k, l) in lines.iter().enumerate() {
        assert_eq!(l["id"], k);
        assert!(l["planned_ms"].as_f64().unwrap() >= l["slot_start_ms"].as_f64().unwrap());
        let end = l["planned_ms"].as_f64().unwrap() + l["timeout_ms"].as_f64().unwrap();
        assert!((end - (l["slot_end_ms"].as_f64().unwrap() - 100.0)).abs() < 1e-6);
    }
    let c = run(&["bulk", "--seed", "8", "--window-s", "30:330", "--per-size", "4", "--plan-only"]);
    assert_ne!(lines.len(), 0);
    assert_ne!(c.stdout, b.stdout);
}

#[test]
fn bad_flags_are_rejected() {
    for args in [
        &["bulk", "--seed", "1", "--window-s", "10:5", "--per-size", "1", "--plan-only"][..],
        &["bulk", "--seed", "1", "--window-s", "0:100", "--per-size", "1", "--sizes", "1MB", "--plan-only"],
        &["bulk", "--seed", "1", "--window-s", "0:100", "--per-size", "1", "--sizes", "a=1k", "--plan-only"],
        &["bulk", "--seed", "1", "--window-s", "0:100", "--per-size", "0", "--plan-only"],
        &["bulk", "--seed", "1", "--window-s", "0:0.1", "--per-size", "1", "--plan-only"],
        &["bulk", "--seed", "1", "--window-s", "0:100", "--per-size", "1", "--path-template", "/x", "--plan-only"],
        &["bulk", "--seed", "1", "--window-s", "0:100", "--per-size", "1"],
        &["im", "--server", "127.0.0.1:1", "--epoch-unix-ms", "0", "--seed", "1", "--users", "1", "--messages", "1"],
        &[
            "im",
            "--server",
            "127.0.0.1:1",
            "--epoch-unix-ms",
            "0",
            "--seed",
            "1",
            "--users",
            "1",
            "--messages",
            "1",
            "--mean-gap-ms",
            "0",
            "--start-s",
            "1",
            "--out",
            "/dev/null",
        ],
        &[
            "im",
            "--server",
            "127.0.0.1:1",
            "--epoch-unix-ms",
            "0",
            "--seed",
            "1",
            "--users",
            "1",
            "--messages",
            "1",
            "--mean-gap-ms",
            "10",
            "--start-s",
            "5",
            "--deadline-s",
            "4",
            "--out",
            "/dev/null",
        ],
    ] {
        let o = run(args);
        assert!(!o.status.success(), "accepted {args:?}");
        assert!(!o.stderr.is_empty());
    }
}

#[test]
fn bulk_end_to_end() {
    let sizes: HashMap<String, usize> =
        [("oksmall", 1000), ("okbig", 300_000), ("short", 5000), ("wrong", 700), ("stall", 100)]
            .into_iter()
            .map(|(l, s)| (l.to_owned(), s))
            .collect();
    let (origin, heads) = http_origin(sizes);
    let out = tmp("bulk.jsonl");
    let epoch = now_ms().to_string();
    let common = [
        "bulk",
        "--seed",
        "3",
        "--window-s",
        "0.3:5.3",
        "--per-size",
        "2",
        "--sizes",
        "oksmall=1000,okbig=300000,short=5000,wrong=700,stall=100",
    ];
    let plan = run(&[&common[..], &["--plan-only"]].concat());
    assert!(plan.status.success());
    let o =
        run(&[&common[..], &["--origin", &origin, "--epoch-unix-ms", &epoch, "--out", out.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let recs = read_jsonl(&out);
    let plan: Vec<Value> =
        String::from_utf8(plan.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(recs.len(), 10);
    for (k, (r, p)) in recs.iter().zip(&plan).enumerate() {
        assert_eq!(r["id"], k);
        for f in ["label", "size", "planned_ms", "timeout_ms"] {
            assert_eq!(r[f], p[f], "field {f} of download {k}");
        }
        let label = r["label"].as_str().unwrap();
        let size = r["size"].as_u64().unwrap();
        let (start, planned) = (r["start_ms"].as_f64().unwrap(), r["planned_ms"].as_f64().unwrap());
        assert!(start >= planned, "download {k} started before its plan");
        assert_eq!(r["late"], false);
        check_progress(r);
        match label {
            "oksmall" | "okbig" => {
                assert_eq!(r["ok"], true, "{r}");
                assert_eq!(r["bytes"].as_u64().unwrap(), size);
                assert!(r["end_ms"].as_f64().unwrap() >= start);
                assert_eq!(r["timeout"], false);
                assert!(r["error"].is_null());
            }
            "short" => {
                assert_eq!(r["ok"], false);
                assert_eq!(r["timeout"], false);
                assert!(r["end_ms"].is_null());
                assert_eq!(r["bytes"].as_u64().unwrap(), size / 2);
                assert!(r["error"].as_str().unwrap().contains("closed after 2500 of 5000"), "{r}");
            }
            "wrong" => {
                assert_eq!(r["ok"], false);
                assert!(r["error"].as_str().unwrap().contains("Content-Length 701"), "{r}");
            }
            "stall" => {
                assert_eq!(r["ok"], false);
                assert_eq!(r["timeout"], true);
                assert!(r["end_ms"].is_null());
                assert!(r["error"].as_str().unwrap().starts_with("timeout"), "{r}");
            }
            _ => unreachable!(),
        }
    }
    let heads = heads.lock().unwrap();
    assert_eq!(heads.len(), 10);
    for h in heads.iter() {
        assert!(h.starts_with("GET /files/bench-"), "{h}");
        assert!(h.contains("\r\nConnection: close\r\n"), "{h}");
        assert!(h.contains(&format!("\r\nHost: {origin}\r\n")), "{h}");
    }
}

/// Checks a record's `progress` against its other fields; returns the points.
fn check_progress(r: &Value) -> Vec<(f64, u64)> {
    let pts: Vec<(f64, u64)> = r["progress"]
        .as_array()
        .unwrap_or_else(|| panic!("no progress: {r}"))
        .iter()
        .map(|p| (p[0].as_f64().unwrap(), p[1].as_u64().unwrap()))
        .collect();
    let start = r["start_ms"].as_f64().unwrap();
    assert_eq!(pts[0], (start, 0), "{r}");
    assert!(pts.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1), "times increase, bytes never fall: {r}");
    let &(end, bytes) = pts.last().unwrap();
    assert_eq!(bytes, r["bytes"].as_u64().unwrap(), "{r}");
    if r["ok"] == true {
        assert_eq!(end, r["end_ms"].as_f64().unwrap(), "{r}");
    }
    // Between the first and the last point: every 100 ms after the start, none skipped, and the
    // last of them less than 100 ms before the end.
    let inner = &pts[1..pts.len().saturating_sub(1)];
    for (k, &(t, _)) in inner.iter().enumerate() {
        assert!((t - start - 100.0 * (k + 1) as f64).abs() < 0.01, "point {} at {t}: {r}", k + 1);
    }
    let last_grid = inner.last().map_or(start, |p| p.0);
    assert!(pts.len() == 1 || end - last_grid <= 100.01, "{r}");
    pts
}

#[test]
fn bulk_records_download_progress() {
    let sizes: HashMap<String, usize> = [("slow", 250_000), ("short", 5000), ("stall", 100), ("oksmall", 1000)]
        .into_iter()
        .map(|(l, s)| (l.to_owned(), s))
        .collect();
    let (origin, _) = http_origin(sizes);
    let out = tmp("progress.jsonl");
    let epoch = now_ms().to_string();
    let o = run(&[
        "bulk",
        "--seed",
        "5",
        "--window-s",
        "0.3:10.3",
        "--per-size",
        "1",
        "--sizes",
        "slow=250000,short=5000,stall=100,oksmall=1000",
        "--origin",
        &origin,
        "--epoch-unix-ms",
        &epoch,
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let recs = read_jsonl(&out);
    assert_eq!(recs.len(), 4);
    for r in &recs {
        let pts = check_progress(r);
        match r["label"].as_str().unwrap() {
            "slow" => {
                assert_eq!(r["ok"], true, "{r}");
                // The origin's pauses alone make it last more than 360 ms: at least three grid points.
                assert!(pts.len() >= 5, "{r}");
                assert_eq!(pts.last().unwrap().1, 250_000);
            }
            "short" => assert_eq!(pts.last().unwrap().1, 2500, "{r}"),
            "stall" => {
                assert_eq!(r["timeout"], true, "{r}");
                assert!(pts.iter().all(|p| p.1 == 0), "{r}");
                assert!(pts.len() >= 2, "{r}");
            }
            "oksmall" => assert_eq!(r["ok"], true, "{r}"),
            _ => unreachable!(),
        }
    }
}

#[test]
fn bulk_marks_late_starts() {
    let (origin, _) = http_origin([("oksmall".to_owned(), 10)].into_iter().collect());
    let out = tmp("late.jsonl");
    // Trip time is already 2.5 s: download 0 (planned <= 2 s: 3 s slot minus a 1 s reserve) is late.
    let epoch = (now_ms() - 2500).to_string();
    let o = run(&[
        "bulk",
        "--seed",
        "1",
        "--window-s",
        "0:6",
        "--per-size",
        "2",
        "--sizes",
        "oksmall=10",
        "--origin",
        &origin,
        "--epoch-unix-ms",
        &epoch,
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let recs = read_jsonl(&out);
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[0]["late"], true);
    assert!(recs[0]["start_ms"].as_f64().unwrap() > recs[0]["planned_ms"].as_f64().unwrap());
}

#[test]
fn bulk_stops_cleanly_on_sigterm() {
    let out = tmp("sigterm.jsonl");
    let epoch = now_ms().to_string();
    let child = Command::new(BIN)
        .args(["bulk", "--seed", "1", "--window-s", "100:200", "--per-size", "1", "--origin", "127.0.0.1:9"])
        .args(["--epoch-unix-ms", &epoch, "--out", out.to_str().unwrap()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    sigterm(&child);
    let o = wait(child, Duration::from_secs(20));
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("SIGTERM"));
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "");
}

/// Starts im-server on a free loopback port; returns the child and its address.
fn im_server() -> (Child, String) {
    let mut child = Command::new(BIN)
        .args(["im-server", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("listening on ").expect("im-server prints its address").to_owned();
    (child, addr)
}

#[test]
fn im_end_to_end_and_server_robustness() {
    let (mut server, addr) = im_server();

    // Bad clients: garbage then close; a good message then a short one; a huge burst then reset.
    {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.write_all(b"hello").unwrap();
    }
    {
        let mut s = TcpStream::connect(&addr).unwrap();
        let mut msg = [0u8; 100];
        msg[4..8].copy_from_slice(&77u32.to_be_bytes());
        s.write_all(&msg).unwrap();
        let mut r = [0u8; 4];
        s.read_exact(&mut r).unwrap();
        assert_eq!(u32::from_be_bytes(r), 77);
        s.write_all(&[1, 2, 3]).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        assert!(rest.is_empty(), "server answered a short message");
    }
    {
        let mut s = TcpStream::connect(&addr).unwrap();
        let _ = s.write_all(&vec![0xffu8; 1 << 20]);
    }

    let out = tmp("im.jsonl");
    let epoch = now_ms();
    let o = run(&[
        "im",
        "--server",
        &addr,
        "--epoch-unix-ms",
        &epoch.to_string(),
        "--seed",
        "5",
        "--users",
        "3",
        "--messages",
        "6",
        "--mean-gap-ms",
        "40",
        "--start-s",
        "0.2",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(server.try_wait().unwrap().is_none(), "im-server died");

    let recs = read_jsonl(&out);
    assert_eq!(recs.len(), 18);
    let mut by_user: HashMap<u64, Vec<&Value>> = HashMap::new();
    for r in &recs {
        by_user.entry(r["user"].as_u64().unwrap()).or_default().push(r);
    }
    assert_eq!(by_user.len(), 3);
    for (u, rs) in &by_user {
        let due = im_due_times(5, *u as u32, 6, 200_000, 40.0);
        let mut prev_recv = f64::MIN;
        for (m, r) in rs.iter().enumerate() {
            assert_eq!(r["msg"], m, "records of a user are in message order");
            assert_eq!(r["ok"], true, "{r}");
            assert!(r["error"].is_null());
            assert_eq!(r["due_ms"].as_f64().unwrap(), us_to_ms(due[m]));
            let (send, recv, delay) =
                (r["send_ms"].as_f64().unwrap(), r["recv_ms"].as_f64().unwrap(), r["delay_ms"].as_f64().unwrap());
            assert!(send >= r["due_ms"].as_f64().unwrap());
            assert!(send >= prev_recv);
            assert!(recv >= send);
            assert!((delay - (recv - send)).abs() < 1e-6);
            prev_recv = recv;
        }
    }
    let conns = read_jsonl(&tmp("im.conn.jsonl"));
    assert_eq!(conns.len(), 3);
    for c in &conns {
        assert_eq!(c["ok"], true);
        assert_eq!(c["attempt"], 0);
        assert!(c["start_ms"].as_f64().unwrap() >= 200.0);
        assert!(c["connect_ms"].as_f64().unwrap() >= 0.0);
    }

    sigterm(&server);
    let o = wait(server, Duration::from_secs(20));
    assert!(o.status.success());
}

#[test]
fn im_deadline_with_unanswered_message() {
    // A server that accepts and never answers.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming() {
            held.push(s);
        }
    });
    let due = im_due_times(11, 0, 4, 100_000, 50.0);
    let deadline_us = due[0] + 400_000;
    let out = tmp("deadline.jsonl");
    let o = run(&[
        "im",
        "--server",
        &addr,
        "--epoch-unix-ms",
        &now_ms().to_string(),
        "--seed",
        "11",
        "--users",
        "1",
        "--messages",
        "4",
        "--mean-gap-ms",
        "50",
        "--start-s",
        "0.1",
        "--deadline-s",
        &format!("{}", deadline_us as f64 / 1e6),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let recs = read_jsonl(&out);
    assert_eq!(recs.len(), 4);
    for (m, r) in recs.iter().enumerate() {
        assert_eq!(r["msg"], m);
        assert_eq!(r["ok"], false);
        assert_eq!(r["error"], "deadline");
        assert!(r["recv_ms"].is_null() && r["delay_ms"].is_null());
        // Message 0 was sent (and never answered); the rest were never sent.
        assert_eq!(r["send_ms"].is_null(), m > 0, "{r}");
    }
}

#[test]
fn im_records_connection_failures_and_continues() {
    // A port with nothing listening.
    let addr = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let out = tmp("refused.jsonl");
    let conn_out = tmp("refused-conns.jsonl");
    let o = run(&[
        "im",
        "--server",
        &addr,
        "--epoch-unix-ms",
        &now_ms().to_string(),
        "--seed",
        "2",
        "--users",
        "2",
        "--messages",
        "5",
        "--mean-gap-ms",
        "100",
        "--start-s",
        "0.1",
        "--deadline-s",
        "1.5",
        "--out",
        out.to_str().unwrap(),
        "--conn-out",
        conn_out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let recs = read_jsonl(&out);
    assert_eq!(recs.len(), 10);
    for r in &recs {
        assert_eq!(r["ok"], false);
        let err = r["error"].as_str().unwrap();
        if r["due_ms"].as_f64().unwrap() >= 1500.0 {
            assert_eq!(err, "deadline");
        } else {
            assert!(err == "deadline" || err.starts_with("no connection"), "{r}");
        }
    }
    let conns = read_jsonl(&conn_out);
    assert!(conns.len() >= 2);
    assert!(conns.iter().all(|c| c["ok"] == false && c["end_ms"].is_null() && c["error"].is_string()));
}

#[test]
fn im_users_come_from_distinct_source_addresses_with_source_base() {
    // A server that answers like im-server and records each connection's peer address.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let peers = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&peers);
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            seen.lock().unwrap().push(s.peer_addr().unwrap().ip().to_string());
            std::thread::spawn(move || {
                let mut msg = [0u8; 100];
                while s.read_exact(&mut msg).is_ok() {
                    if s.write_all(&msg[4..8]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    let out = tmp("source-base.jsonl");
    let o = run(&[
        "im",
        "--server",
        &addr,
        "--epoch-unix-ms",
        &now_ms().to_string(),
        "--seed",
        "5",
        "--users",
        "3",
        "--messages",
        "2",
        "--mean-gap-ms",
        "10",
        "--start-s",
        "0",
        "--source-base",
        "127.0.0.10",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(read_jsonl(&out).iter().all(|r| r["ok"] == true));
    let mut got = peers.lock().unwrap().clone();
    got.sort();
    assert_eq!(got, ["127.0.0.10", "127.0.0.11", "127.0.0.12"]);
}
