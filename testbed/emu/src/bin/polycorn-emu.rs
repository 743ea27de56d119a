//! `polycorn-emu`: user-space link emulator between two network namespaces, over TUN devices.
//!
//! For each carrier `i` it creates `car<i>` (10.77.<i>.1/24) in the train namespace and
//! `cpx<i>` (10.77.<i>.2/24) in the cloud namespace, like the veth testbed, and carries packets
//! between them through two [`Link`]s (uplink train → cloud, downlink cloud → train). See
//! `testbed/emu/README.md` for the options and the design.

#[cfg(target_os = "linux")]
fn main() {
    std::process::exit(shell::main());
}

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("polycorn-emu: only Linux is supported");
    std::process::exit(2);
}

#[cfg(target_os = "linux")]
mod shell {
    use std::fmt::Write as _;
    use std::io::{self, Write as _};
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Condvar, Mutex, MutexGuard};
    use std::thread;
    use std::time::{Duration, Instant};

    use clap::Parser;
    use polycorn_emu::tun::{ip_version, Tun};
    use polycorn_emu::{DelaySchedule, Link, LinkConfig, LinkStats, LossKeying, Schedule, Service, Trace, LOSS_SLOT};

    /// Largest packet read from a TUN device (TUN MTU is 1500 unless changed; this leaves room).
    const READ_BUF: usize = 65_536;

    /// Emulates N carrier links between a train and a cloud network namespace over TUN devices
    /// (a drop-in replacement for the veth pairs of testbed/netns). Per-carrier options may be
    /// given once (applies to every carrier) or exactly --carriers times (i-th value for
    /// carrier i).
    #[derive(Debug, Parser)]
    #[command(name = "polycorn-emu", version)]
    struct Cli {
        /// Train-side network namespace (gets car<i>, 10.77.<i>.1/24).
        #[arg(long)]
        train_ns: String,
        /// Cloud-side network namespace (gets cpx<i>, 10.77.<i>.2/24).
        #[arg(long)]
        cloud_ns: String,
        /// Number of carriers (1..=64).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
        carriers: u16,
        /// Constant rate in Mbit/s, both directions (used where no trace is given).
        #[arg(long, value_name = "MBIT")]
        rate_mbit: Vec<f64>,
        /// Mahimahi trace for the uplink (train → cloud); overrides --rate-mbit for it.
        #[arg(long, value_name = "FILE")]
        up_trace: Vec<PathBuf>,
        /// Mahimahi trace for the downlink (cloud → train); overrides --rate-mbit for it.
        #[arg(long, value_name = "FILE")]
        down_trace: Vec<PathBuf>,
        /// Constant one-way delay in ms, both directions (replaces a schedule's delay points).
        #[arg(long, value_name = "MS")]
        delay_ms: Vec<f64>,
        /// Delay/loss/blackout schedule file (polycorn-emu schedule format), both directions.
        #[arg(long, value_name = "FILE")]
        schedule: Vec<PathBuf>,
        /// Droptail buffer per direction in bytes (default: unbounded, like mm-link).
        #[arg(long, value_name = "BYTES")]
        buffer_bytes: Vec<usize>,
        /// Loss PRNG seed. Given once, carrier i uses seed + i; given per carrier, that value.
        /// The downlink uses the carrier's seed XOR 0x9E3779B97F4A7C15.
        #[arg(long)]
        seed: Vec<u64>,
        /// What the Gilbert–Elliott loss draws are keyed by, for every link: `time` (the chain
        /// steps per 1 ms slot and a packet's fate depends only on the seed, its arrival time and
        /// its index in the slot, so schemes run side by side with the same seed see the same
        /// loss) or `packet` (the chain steps per packet, as in the first versions: reproduces
        /// earlier results).
        #[arg(long, value_name = "time|packet", default_value_t = LossKeying::Time)]
        loss_keying: LossKeying,
        /// Bytes per trace delivery opportunity.
        #[arg(long, default_value_t = polycorn_emu::DEFAULT_OPPORTUNITY_BYTES)]
        opportunity_bytes: usize,
        /// Print per-link stats to stderr every SECS seconds (always printed on exit).
        #[arg(long, value_name = "SECS")]
        stats_interval: Option<f64>,
        /// Delete existing car<i>/cpx<i> interfaces first (e.g. the veths of testbed/netns/up.sh).
        #[arg(long)]
        replace: bool,
        /// Time 0 of every trace and schedule as a wall-clock time (UNIX ms), instead of the
        /// emulator's start: emulators started at different moments then replay the same trip
        /// in step (side-by-side benchmarks). At most 60 s in the future; packets before it are
        /// handled as at time 0.
        #[arg(long, value_name = "UNIX_MS")]
        epoch_unix_ms: Option<u64>,
        /// Per-packet event log (every enqueue, drop, dequeue, delivery and blackout edge of
        /// every link) as tab-separated lines: time_ms, carrier, direction, event, packet id,
        /// size, queue bytes after the event. Costs CPU and disk; for debugging and studies.
        #[arg(long, value_name = "FILE")]
        event_log: Option<PathBuf>,
    }

    /// The shared writer of `--event-log`.
    type EventLog = Arc<Mutex<io::BufWriter<std::fs::File>>>;

    /// Appends the events a link recorded since the last call to the event log.
    fn write_events(dir: &Dir, st: &mut State) {
        let Some(log) = &dir.events else { return };
        let events = st.link.drain_events();
        if events.is_empty() {
            return;
        }
        let mut w = log.lock().unwrap_or_else(|e| e.into_inner());
        for e in events {
            let id = e.id.map_or_else(|| "-".to_string(), |i| i.to_string());
            let _ = writeln!(
                w,
                "{:.3}\t{}\t{}\t{}\t{id}\t{}\t{}",
                e.time.as_secs_f64() * 1e3,
                dir.carrier,
                dir.direction,
                e.kind,
                e.size,
                e.queue_bytes
            );
        }
    }

    /// The `Instant` that is trip time 0: now, or the wall-clock `--epoch-unix-ms`.
    fn trip_start(epoch_unix_ms: Option<u64>) -> Result<Instant, String> {
        let now = Instant::now();
        let Some(epoch_ms) = epoch_unix_ms else { return Ok(now) };
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|e| format!("system clock before 1970: {e}"))?;
        let epoch = Duration::from_millis(epoch_ms);
        if epoch <= wall {
            now.checked_sub(wall - epoch).ok_or_else(|| format!("--epoch-unix-ms {epoch_ms} is too far in the past"))
        } else if epoch - wall <= Duration::from_secs(60) {
            Ok(now + (epoch - wall))
        } else {
            Err(format!("--epoch-unix-ms {epoch_ms} is more than 60 s in the future"))
        }
    }

    /// One direction of one carrier, shared by its reader and writer threads.
    struct Dir {
        label: String,
        carrier: usize,
        direction: &'static str,
        events: Option<EventLog>,
        state: Mutex<State>,
        wake: Condvar,
        /// Non-IP packets read and ignored.
        ignored: AtomicU64,
        /// Delivered packets the output TUN refused (e.g. interface down).
        write_errors: AtomicU64,
    }

    struct State {
        link: Link,
        /// The writer is blocked on `wake` until this time (`None`: until notified).
        wake_at: Option<Duration>,
        waiting: bool,
    }

    impl Dir {
        fn lock(&self) -> MutexGuard<'_, State> {
            self.state.lock().unwrap_or_else(|e| e.into_inner())
        }
    }

    pub fn main() -> i32 {
        let cli = Cli::parse();
        let links = match build_links(&cli) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("polycorn-emu: {e}");
                return 2;
            }
        };
        // Block the termination signals in every thread (threads inherit the mask); the main
        // thread takes them synchronously with sigtimedwait.
        let sigs = signal_set();
        // SAFETY: `sigs` is an initialised sigset_t.
        unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &sigs, std::ptr::null_mut()) };

        let start = match trip_start(cli.epoch_unix_ms) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("polycorn-emu: {e}");
                return 2;
            }
        };
        let events: Option<EventLog> = match &cli.event_log {
            None => None,
            Some(p) => match std::fs::File::create(p) {
                Ok(f) => {
                    let mut w = io::BufWriter::with_capacity(1 << 20, f);
                    let _ = writeln!(w, "time_ms\tcarrier\tdirection\tevent\tid\tsize\tqueue_bytes");
                    Some(Arc::new(Mutex::new(w)))
                }
                Err(e) => {
                    eprintln!("polycorn-emu: --event-log {}: {e}", p.display());
                    return 2;
                }
            },
        };
        let mut dirs: Vec<Arc<Dir>> = Vec::new();
        let mut tuns: Vec<(Arc<Tun>, Arc<Tun>)> = Vec::new();
        for (i, (up, down)) in links.into_iter().enumerate() {
            let (car, cpx) = match setup_carrier(&cli, i) {
                Ok(t) => t,
                Err(e) => {
                    // Dropping the already created TUNs (on return) removes them.
                    eprintln!("polycorn-emu: carrier {i}: {e}");
                    return 1;
                }
            };
            let (car, cpx) = (Arc::new(car), Arc::new(cpx));
            let up = new_dir(i, "up", up, events.clone());
            let down = new_dir(i, "down", down, events.clone());
            spawn_direction(&up, &car, &cpx, start);
            spawn_direction(&down, &cpx, &car, start);
            dirs.push(up);
            dirs.push(down);
            tuns.push((car, cpx));
        }
        let keying = match cli.loss_keying {
            LossKeying::Time => format!("{} ms slots", LOSS_SLOT.as_secs_f64() * 1e3),
            LossKeying::Packet => "per packet".to_string(),
        };
        println!(
            "polycorn-emu: ready: {} carrier(s) between {} and {}; loss keying {} ({keying})",
            cli.carriers, cli.train_ns, cli.cloud_ns, cli.loss_keying
        );
        let _ = io::stdout().flush();

        let interval = cli.stats_interval.filter(|s| *s > 0.0).map(Duration::from_secs_f64);
        let signal = wait_for_signal(&sigs, interval, &dirs, start);
        eprintln!("polycorn-emu: signal {signal}, exiting");
        print_stats(&dirs, start);
        if let Some(log) = &events {
            for d in &dirs {
                write_events(d, &mut d.lock());
            }
            let _ = log.lock().unwrap_or_else(|e| e.into_inner()).flush();
        }
        // Exiting closes the TUN file descriptors, which deletes the interfaces in both
        // namespaces; the forwarding threads die with the process.
        drop(tuns);
        0
    }

    fn new_dir(carrier: usize, direction: &'static str, link: Link, events: Option<EventLog>) -> Arc<Dir> {
        Arc::new(Dir {
            label: format!("carrier {carrier} {direction}"),
            carrier,
            direction,
            events,
            state: Mutex::new(State { link, wake_at: None, waiting: false }),
            wake: Condvar::new(),
            ignored: AtomicU64::new(0),
            write_errors: AtomicU64::new(0),
        })
    }

    /// The i-th of a per-carrier option: none, one value for all, or one per carrier.
    fn pick<'a, T>(v: &'a [T], i: usize, n: usize, name: &str) -> Result<Option<&'a T>, String> {
        match v.len() {
            0 => Ok(None),
            1 => Ok(v.first()),
            len if len == n => Ok(v.get(i)),
            len => Err(format!("--{name} given {len} times; give it once or --carriers ({n}) times")),
        }
    }

    fn read_file(path: &Path) -> Result<String, String> {
        std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Builds (uplink, downlink) per carrier, before touching the system.
    fn build_links(cli: &Cli) -> Result<Vec<(Link, Link)>, String> {
        let n = usize::from(cli.carriers);
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let rate = pick(&cli.rate_mbit, i, n, "rate-mbit")?.copied();
            if let Some(r) = rate {
                if !(r.is_finite() && r > 0.0) {
                    return Err(format!("--rate-mbit must be positive, got {r}"));
                }
            }
            let mut schedule = match pick(&cli.schedule, i, n, "schedule")? {
                Some(p) => Schedule::parse(&read_file(p)?).map_err(|e| format!("{}: {e}", p.display()))?,
                None => Schedule::default(),
            };
            if let Some(&d) = pick(&cli.delay_ms, i, n, "delay-ms")? {
                if !(d.is_finite() && d >= 0.0) {
                    return Err(format!("--delay-ms must be non-negative, got {d}"));
                }
                schedule.delay = DelaySchedule::constant(Duration::from_secs_f64(d / 1e3));
            }
            let buffer = pick(&cli.buffer_bytes, i, n, "buffer-bytes")?.copied();
            let seed = match cli.seed.len() {
                0 => i as u64,
                1 => cli.seed[0].wrapping_add(i as u64),
                _ => *pick(&cli.seed, i, n, "seed")?.unwrap_or(&0),
            };
            let service = |trace: Option<&PathBuf>, dir: &str| -> Result<Service, String> {
                match (trace, rate) {
                    (Some(p), _) => {
                        Ok(Service::Trace(Trace::parse(&read_file(p)?).map_err(|e| format!("{}: {e}", p.display()))?))
                    }
                    (None, Some(r)) => Ok(Service::ConstantRate { bits_per_sec: (r * 1e6).round() as u64 }),
                    (None, None) => Err(format!("carrier {i} {dir}: give --rate-mbit or --{dir}-trace")),
                }
            };
            let up_service = service(pick(&cli.up_trace, i, n, "up-trace")?, "up")?;
            let down_service = service(pick(&cli.down_trace, i, n, "down-trace")?, "down")?;
            let config = |service: Service, seed: u64| LinkConfig {
                service,
                opportunity_bytes: cli.opportunity_bytes,
                buffer_bytes: buffer,
                schedule: schedule.clone(),
                seed,
                loss_keying: cli.loss_keying,
                event_log: cli.event_log.is_some(),
            };
            let up = Link::new(config(up_service, seed)).map_err(|e| format!("carrier {i} up: {e}"))?;
            let down = Link::new(config(down_service, seed ^ 0x9E37_79B9_7F4A_7C15))
                .map_err(|e| format!("carrier {i} down: {e}"))?;
            out.push((up, down));
        }
        Ok(out)
    }

    fn ip(args: &[&str]) -> Result<(), String> {
        let out = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
        }
    }

    /// Creates carrier i's TUN pair here, moves them into the namespaces under their final names,
    /// addresses them and brings them up. Returns (train side, cloud side).
    fn setup_carrier(cli: &Cli, i: usize) -> Result<(Tun, Tun), String> {
        let pid = std::process::id();
        let mut made = Vec::new();
        let sides = [
            (&cli.train_ns, format!("car{i}"), format!("10.77.{i}.1/24"), 't'),
            (&cli.cloud_ns, format!("cpx{i}"), format!("10.77.{i}.2/24"), 'c'),
        ];
        for (ns, name, addr, tag) in sides {
            if cli.replace {
                let _ = ip(&["-n", ns, "link", "del", "dev", &name]);
            }
            let tmp = format!("pe{pid}{tag}{i}");
            let tun = Tun::create(&tmp).map_err(|e| format!("create TUN {tmp}: {e}"))?;
            made.push(tun);
            ip(&["link", "set", "dev", &tmp, "netns", ns])?;
            ip(&["-n", ns, "link", "set", "dev", &tmp, "name", &name])?;
            ip(&["-n", ns, "addr", "add", &addr, "dev", &name])?;
            ip(&["-n", ns, "link", "set", "dev", &name, "up"])?;
        }
        let cpx = made.pop().ok_or("internal: no cloud TUN")?;
        let car = made.pop().ok_or("internal: no train TUN")?;
        Ok((car, cpx))
    }

    /// Starts the reader (input TUN → link) and writer (link → output TUN) threads of one
    /// direction.
    fn spawn_direction(dir: &Arc<Dir>, input: &Arc<Tun>, output: &Arc<Tun>, start: Instant) {
        let (d, tun) = (Arc::clone(dir), Arc::clone(input));
        thread::Builder::new()
            .name(format!("rx {}", dir.label))
            .spawn(move || reader(&d, &tun, start))
            .expect("spawn reader thread");
        let (d, tun) = (Arc::clone(dir), Arc::clone(output));
        thread::Builder::new()
            .name(format!("tx {}", dir.label))
            .spawn(move || writer(&d, &tun, start))
            .expect("spawn writer thread");
    }

    /// Blocking reads; each IP packet is pushed into the link at its arrival time. The writer is
    /// woken only when the push makes its next event earlier than the time it sleeps until.
    fn reader(dir: &Dir, tun: &Tun, start: Instant) {
        let mut buf = vec![0u8; READ_BUF];
        loop {
            let n = match tun.recv(&mut buf) {
                Ok(n) => n,
                Err(e) if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock) => continue,
                Err(e) => {
                    // E.g. EBADFD once the namespace holding the device was deleted.
                    eprintln!("polycorn-emu: {}: read from {}: {e}; exiting", dir.label, tun.name());
                    std::process::exit(1);
                }
            };
            if ip_version(&buf[..n]).is_none() {
                dir.ignored.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let data = buf[..n].to_vec();
            let now = start.elapsed();
            let mut st = dir.lock();
            st.link.push(now, data);
            if st.waiting {
                let next = st.link.next_event(now);
                if next.is_some_and(|t| st.wake_at.is_none_or(|w| t < w)) {
                    st.wake_at = next;
                    dir.wake.notify_one();
                }
            }
        }
    }

    /// Delivers due packets, then sleeps on the condition variable until the link's next event
    /// (or until the reader signals an earlier one). Never spins: after everything due has been
    /// polled, `next_event` is strictly in the future.
    fn writer(dir: &Dir, tun: &Tun, start: Instant) {
        let mut due: Vec<Vec<u8>> = Vec::new();
        let mut st = dir.lock();
        loop {
            let now = start.elapsed();
            while let Some(p) = st.link.poll_deliver(now) {
                due.push(p.data);
            }
            if !due.is_empty() {
                drop(st);
                for p in due.drain(..) {
                    if tun.send(&p).is_err() {
                        dir.write_errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                st = dir.lock();
                continue;
            }
            write_events(dir, &mut st);
            let next = st.link.next_event(now);
            st.wake_at = next;
            st.waiting = true;
            st = match next {
                None => dir.wake.wait(st).unwrap_or_else(|e| e.into_inner()),
                Some(t) => dir.wake.wait_timeout(st, t.saturating_sub(now)).unwrap_or_else(|e| e.into_inner()).0,
            };
            st.waiting = false;
        }
    }

    fn signal_set() -> libc::sigset_t {
        // SAFETY: sigemptyset initialises the set; sigaddset with valid signal numbers.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGHUP);
            set
        }
    }

    /// Waits for SIGINT/SIGTERM/SIGHUP, printing stats every `interval` meanwhile.
    fn wait_for_signal(sigs: &libc::sigset_t, interval: Option<Duration>, dirs: &[Arc<Dir>], start: Instant) -> i32 {
        loop {
            let rc = match interval {
                Some(d) => {
                    let ts = libc::timespec { tv_sec: d.as_secs() as libc::time_t, tv_nsec: d.subsec_nanos() as _ };
                    // SAFETY: valid set and timespec; info may be null.
                    unsafe { libc::sigtimedwait(sigs, std::ptr::null_mut(), &ts) }
                }
                // SAFETY: valid set; info may be null.
                None => unsafe { libc::sigwaitinfo(sigs, std::ptr::null_mut()) },
            };
            if rc > 0 {
                return rc;
            }
            if io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock {
                print_stats(dirs, start);
            }
        }
    }

    fn fmt_counter(c: &polycorn_emu::Counter) -> String {
        format!("{}p/{}B", c.packets, c.bytes)
    }

    fn print_stats(dirs: &[Arc<Dir>], start: Instant) {
        let t = start.elapsed().as_secs_f64();
        let mut out = String::new();
        for d in dirs {
            let (s, queued, in_flight, p50, p95): (LinkStats, usize, usize, _, _) = {
                let st = d.lock();
                let q = |x| st.link.sojourn_quantile(x).map_or(-1, |d| d.as_millis() as i64);
                (*st.link.stats(), st.link.queue_bytes(), st.link.in_flight(), q(0.5), q(0.95))
            };
            let rate = if t > 0.0 { s.delivered.bytes as f64 * 8.0 / t / 1e6 } else { 0.0 };
            let _ = writeln!(
                out,
                "polycorn-emu: t={t:.1}s {}: arrived {} delivered {} ({rate:.2} Mbit/s avg) drop-loss {} \
                 drop-buffer {} drop-blackout {} flushed {} max-queue {}B queue {}B in-flight {} non-ip {} \
                 write-errors {} sojourn-p50 {p50}ms sojourn-p95 {p95}ms",
                d.label,
                fmt_counter(&s.arrived),
                fmt_counter(&s.delivered),
                fmt_counter(&s.dropped_loss),
                fmt_counter(&s.dropped_buffer),
                fmt_counter(&s.dropped_blackout),
                fmt_counter(&s.flushed),
                s.max_queue_bytes,
                queued,
                in_flight,
                d.ignored.load(Ordering::Relaxed),
                d.write_errors.load(Ordering::Relaxed),
            );
        }
        eprint!("{out}");
    }
}
