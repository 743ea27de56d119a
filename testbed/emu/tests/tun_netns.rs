//! End-to-end test of the `polycorn-emu` binary between two network namespaces: one carrier
//! at 20 Mbit/s and 20 ms each way. Needs root, `ip netns`, /dev/net/tun and python3; skipped
//! (and passing) otherwise.
#![cfg(target_os = "linux")]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Deletes the namespaces and kills the emulator, also when the test fails.
struct Guard {
    namespaces: Vec<String>,
    children: Vec<Child>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn run(args: &[&str]) -> Output {
    let out = Command::new(args[0]).args(&args[1..]).output().expect("spawn");
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Some("no /dev/net/tun".into());
    }
    for (cmd, args) in [("ip", &["netns", "list"][..]), ("python3", &["-c", "pass"][..])] {
        match Command::new(cmd).args(args).stdout(Stdio::null()).stderr(Stdio::null()).status() {
            Ok(s) if s.success() => {}
            _ => return Some(format!("`{cmd} {}` unavailable", args.join(" "))),
        }
    }
    None
}

const RECEIVER: &str = r#"
import hashlib, socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.77.0.2", 5999)); s.listen(1)
print("listening", flush=True)
c, _ = s.accept(); t0 = time.monotonic(); h = hashlib.sha256(); n = 0
while True:
    b = c.recv(65536)
    if not b: break
    h.update(b); n += len(b)
print(n, h.hexdigest(), time.monotonic() - t0, flush=True)
"#;

const SENDER: &str = r#"
import socket
data = bytes(range(256)) * 8192
s = socket.create_connection(("10.77.0.2", 5999), timeout=15)
s.sendall(data); s.shutdown(socket.SHUT_WR); s.recv(1); s.close()
"#;

#[test]
fn one_carrier_rate_and_delay() {
    if let Some(why) = skip_reason() {
        println!("SKIPPED tun_netns: {why}");
        return;
    }
    let pid = std::process::id();
    let (train, cloud) = (format!("pcemu{pid}t"), format!("pcemu{pid}c"));
    let mut guard = Guard { namespaces: Vec::new(), children: Vec::new() };
    for ns in [&train, &cloud] {
        run(&["ip", "netns", "add", ns]);
        guard.namespaces.push(ns.clone());
        run(&["ip", "-n", ns, "link", "set", "lo", "up"]);
    }

    let mut emu = Command::new(env!("CARGO_BIN_EXE_polycorn-emu"))
        .args(["--train-ns", &train, "--cloud-ns", &cloud, "--carriers", "1"])
        .args(["--rate-mbit", "20", "--delay-ms", "20", "--buffer-bytes", "200000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start polycorn-emu");
    let stdout = emu.stdout.take().expect("stdout");
    let mut stderr = emu.stderr.take().expect("stderr");
    guard.children.push(emu);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let ready = rx.recv_timeout(Duration::from_secs(10)).unwrap_or_default();
    assert!(ready.contains("ready"), "emulator not ready: {ready:?}");

    // Ping: both directions carry 20 ms.
    let out = run(&["ip", "netns", "exec", &train, "ping", "-c", "3", "-i", "0.2", "-W", "2", "10.77.0.2"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let rtts: Vec<f64> =
        text.split_whitespace().filter_map(|w| w.strip_prefix("time=")).filter_map(|v| v.parse().ok()).collect();
    assert_eq!(rtts.len(), 3, "ping output: {text}");
    assert!(rtts.iter().all(|&r| r >= 40.0), "RTTs below 40 ms: {rtts:?}");
    println!("ping RTTs: {rtts:?} ms");

    // 2 MiB over TCP, train -> cloud.
    let mut receiver = Command::new("ip")
        .args(["netns", "exec", &cloud, "python3", "-c", RECEIVER])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start receiver");
    let mut rout = BufReader::new(receiver.stdout.take().expect("receiver stdout"));
    guard.children.push(receiver);
    let mut line = String::new();
    rout.read_line(&mut line).expect("receiver line");
    assert_eq!(line.trim(), "listening");
    let t0 = Instant::now();
    let sender =
        Command::new("ip").args(["netns", "exec", &train, "python3", "-c", SENDER]).status().expect("run sender");
    let elapsed = t0.elapsed();
    assert!(sender.success(), "sender failed");
    line.clear();
    rout.read_line(&mut line).expect("receiver result");
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields.len(), 3, "receiver said {line:?}");
    let data: Vec<u8> = (0..=255u8).cycle().take(256 * 8192).collect();
    let expected = {
        let out = Command::new("python3")
            .args(["-c", "import hashlib; print(hashlib.sha256(bytes(range(256)) * 8192).hexdigest())"])
            .output()
            .expect("python3");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(fields[0], data.len().to_string(), "byte count");
    assert_eq!(fields[1], expected, "payload hash");
    let mbit = data.len() as f64 * 8.0 / elapsed.as_secs_f64() / 1e6;
    println!("2 MiB in {elapsed:?}: {mbit:.1} Mbit/s");
    assert!(elapsed >= Duration::from_millis(500), "too fast for a 20 Mbit/s link: {elapsed:?}");
    assert!(mbit < 25.0, "faster than the 20 Mbit/s bottleneck allows: {mbit:.1} Mbit/s");
    assert!(elapsed < Duration::from_secs(15), "transfer too slow: {elapsed:?}");

    // SIGTERM: clean exit 0, interfaces gone.
    let emu = &mut guard.children[0];
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe { libc::kill(emu.id() as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(s) = emu.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "emulator did not exit on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    let _ = stderr.read_to_string(&mut err);
    println!("emulator stderr:\n{err}");
    assert!(status.success(), "emulator exit status {status}");
    assert!(err.contains("carrier 0 up: arrived"), "no stats printed");
    for (ns, dev) in [(&train, "car0"), (&cloud, "cpx0")] {
        let s = Command::new("ip").args(["-n", ns, "link", "show", dev]).stderr(Stdio::null()).output().expect("ip");
        assert!(!s.status.success(), "{dev} still exists in {ns}");
    }
}
