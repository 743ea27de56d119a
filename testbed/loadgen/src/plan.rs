//! Deterministic plans: the bulk download schedule and the IM message due times.
//!
//! All plan times are integer microseconds of trip time, so a plan is exact and byte-identical in
//! every copy that gets the same flags; records print them as milliseconds (`us / 1000.0`).

use std::fmt;

use anyhow::{bail, Context, Result};

use crate::rng::{stream, TAG_BULK, TAG_IM_USER};

/// Guard at the end of each slot: a download's timeout ends this long before its slot does.
pub const SLOT_GUARD_US: i64 = 100_000;
/// Fixed part of the reserve: 1 s.
pub const RESERVE_BASE_US: i64 = 1_000_000;
/// Rate of the size-dependent part of the reserve: 5 Mbit/s = 5 bits per microsecond.
pub const RESERVE_BITS_PER_US: i64 = 5;
/// The shortest slot accepted: twice the guard, so that every timeout is positive.
pub const MIN_SLOT_US: i64 = 2 * SLOT_GUARD_US + 1;

/// One download size class, e.g. `1MB=1048576`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeClass {
    pub label: String,
    pub bytes: u64,
}

/// Parses `LABEL=BYTES[,LABEL=BYTES...]`. Labels are `[A-Za-z0-9._-]+` (they go into URL paths) and
/// unique; bytes is a non-negative decimal integer.
pub fn parse_sizes(s: &str) -> Result<Vec<SizeClass>> {
    let mut out: Vec<SizeClass> = Vec::new();
    for item in s.split(',') {
        let item = item.trim();
        let Some((label, bytes)) = item.split_once('=') else {
            bail!("size {item:?} is not LABEL=BYTES (e.g. 1MB=1048576)");
        };
        let (label, bytes) = (label.trim(), bytes.trim());
        if label.is_empty() || !label.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')) {
            bail!("size label {label:?} must be non-empty and use only A-Z a-z 0-9 . _ -");
        }
        let bytes: u64 =
            bytes.parse().with_context(|| format!("size {item:?}: {bytes:?} is not a byte count (plain integer)"))?;
        if bytes > (1 << 40) {
            bail!("size {item:?} is larger than 1 TiB");
        }
        if out.iter().any(|c| c.label == label) {
            bail!("size label {label:?} given twice");
        }
        out.push(SizeClass { label: label.to_owned(), bytes });
    }
    Ok(out)
}

/// Parses `A:B` (seconds of trip time, decimals allowed) into microseconds, requiring 0 <= A < B.
pub fn parse_window(s: &str) -> Result<(i64, i64)> {
    let Some((a, b)) = s.split_once(':') else {
        bail!("window {s:?} is not A:B (seconds of trip time, e.g. 60:600)");
    };
    let a = parse_seconds(a).with_context(|| format!("window {s:?}: start"))?;
    let b = parse_seconds(b).with_context(|| format!("window {s:?}: end"))?;
    if b <= a {
        bail!("window {s:?}: end must be after start");
    }
    Ok((a, b))
}

/// Parses non-negative seconds (decimals allowed) into whole microseconds.
pub fn parse_seconds(s: &str) -> Result<i64> {
    let v: f64 = s.trim().parse().with_context(|| format!("{s:?} is not a number of seconds"))?;
    if !v.is_finite() || !(0.0..=1e9).contains(&v) {
        bail!("{s:?} must be a number of seconds between 0 and 1e9");
    }
    Ok((v * 1e6).round() as i64)
}

/// The reserve of a download of `bytes` in a slot of `slot_us`: `min(L/2, 1 s + bytes*8 / 5 Mbit/s)`.
/// The start is drawn from the first `L - reserve` of the slot, so that at least `reserve` is left
/// for the transfer.
pub fn reserve_us(slot_us: i64, bytes: u64) -> i64 {
    let transfer = (bytes as i64).saturating_mul(8) / RESERVE_BITS_PER_US;
    (slot_us / 2).min(RESERVE_BASE_US.saturating_add(transfer))
}

/// One planned download.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Download {
    pub id: usize,
    pub label: String,
    pub size: u64,
    pub slot_start_us: i64,
    pub slot_end_us: i64,
    pub planned_us: i64,
    /// `slot_end - planned - 100 ms`; the download is abandoned at `planned + timeout`.
    pub timeout_us: i64,
}

impl Download {
    /// The absolute trip time at which the download is abandoned.
    pub fn deadline_us(&self) -> i64 {
        self.planned_us + self.timeout_us
    }
}

/// The bulk plan:
///
/// 1. the list is `per_size` copies of each size class, classes in the order given;
/// 2. it is shuffled by Fisher–Yates (`i` from n-1 down to 1, `j = below(i + 1)`) with the stream
///    `stream(seed, TAG_BULK)`;
/// 3. the window is split into n equal slots of `L = floor((B - A) / n)` µs; slot k is
///    `[A + k L, A + (k+1) L]`;
/// 4. with the same stream, for k = 0..n-1 in order: `start = s_k + below(max(0, L - reserve) + 1)`
///    µs, `timeout = e_k - start - 100 ms`.
pub fn bulk_plan(seed: u64, window: (i64, i64), per_size: usize, sizes: &[SizeClass]) -> Result<Vec<Download>> {
    let (a, b) = window;
    if b <= a {
        bail!("window end must be after its start");
    }
    if per_size == 0 || sizes.is_empty() {
        bail!("nothing to plan: --per-size and --sizes must be non-empty");
    }
    let mut list: Vec<&SizeClass> = sizes.iter().flat_map(|c| std::iter::repeat_n(c, per_size)).collect();
    let n = list.len() as i64;
    let slot = (b - a) / n;
    if slot < MIN_SLOT_US {
        bail!(
            "window of {:.3} s split into {n} slots gives {:.3} s each; each slot needs more than {:.3} s",
            (b - a) as f64 / 1e6,
            slot as f64 / 1e6,
            2.0 * SLOT_GUARD_US as f64 / 1e6
        );
    }
    let mut rng = stream(seed, TAG_BULK);
    for i in (1..list.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        list.swap(i, j);
    }
    let plan = list
        .into_iter()
        .enumerate()
        .map(|(k, class)| {
            let s = a + k as i64 * slot;
            let e = s + slot;
            let span = (slot - reserve_us(slot, class.bytes)).max(0);
            let planned = s + rng.below(span as u64 + 1) as i64;
            Download {
                id: k,
                label: class.label.clone(),
                size: class.bytes,
                slot_start_us: s,
                slot_end_us: e,
                planned_us: planned,
                timeout_us: e - planned - SLOT_GUARD_US,
            }
        })
        .collect();
    Ok(plan)
}

/// Expands a path template: `{label}` and `{size}` are replaced.
pub fn expand_path(template: &str, d: &Download) -> String {
    template.replace("{label}", &d.label).replace("{size}", &d.size.to_string())
}

/// Checks a path template: absolute, printable ASCII without spaces, naming `{label}` or `{size}`.
pub fn check_path_template(t: &str) -> Result<()> {
    if !t.starts_with('/') {
        bail!("path template {t:?} must start with '/'");
    }
    if !t.chars().all(|c| c.is_ascii_graphic()) {
        bail!("path template {t:?} must be printable ASCII without spaces");
    }
    if !t.contains("{label}") && !t.contains("{size}") {
        bail!("path template {t:?} names neither {{label}} nor {{size}}: every size would fetch the same file");
    }
    Ok(())
}

/// Due times (trip µs) of the `messages` messages of IM user `user`: message m is due at
/// `T + 1 s + sum_{i<=m} gap_i`, gaps exponential with mean `mean_gap_ms` drawn from
/// `stream(seed, TAG_IM_USER + user)`; the running sum is kept in f64 ms and each due time rounded
/// to the microsecond.
pub fn im_due_times(seed: u64, user: u32, messages: u32, start_us: i64, mean_gap_ms: f64) -> Vec<i64> {
    let mut rng = stream(seed, TAG_IM_USER + u64::from(user));
    let base = start_us + 1_000_000;
    let mut cum_ms = 0.0f64;
    (0..messages)
        .map(|_| {
            cum_ms += rng.exponential(mean_gap_ms);
            base + (cum_ms * 1000.0).round() as i64
        })
        .collect()
}

/// Microseconds of trip time as milliseconds (exact to the µs in the printed JSON).
pub fn us_to_ms(us: i64) -> f64 {
    us as f64 / 1000.0
}

impl fmt::Display for SizeClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.label, self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes() -> Vec<SizeClass> {
        parse_sizes("256KB=262144,1MB=1048576,4MB=4194304").unwrap()
    }

    #[test]
    fn parse_sizes_ok_and_errors() {
        let s = sizes();
        assert_eq!(s.len(), 3);
        assert_eq!(s[1], SizeClass { label: "1MB".into(), bytes: 1048576 });
        assert!(parse_sizes("1MB").is_err());
        assert!(parse_sizes("1MB=1M").is_err());
        assert!(parse_sizes("=5").is_err());
        assert!(parse_sizes("a b=5").is_err());
        assert!(parse_sizes("a=1,a=2").is_err());
        assert!(parse_sizes("a=-1").is_err());
        assert_eq!(parse_sizes(" a = 0 ").unwrap(), vec![SizeClass { label: "a".into(), bytes: 0 }]);
    }

    #[test]
    fn parse_window_ok_and_errors() {
        assert_eq!(parse_window("60:600").unwrap(), (60_000_000, 600_000_000));
        assert_eq!(parse_window("0.5:1.25").unwrap(), (500_000, 1_250_000));
        assert!(parse_window("10:10").is_err());
        assert!(parse_window("10:5").is_err());
        assert!(parse_window("10").is_err());
        assert!(parse_window("-1:5").is_err());
        assert!(parse_window("a:5").is_err());
        assert!(parse_window("1:inf").is_err());
    }

    #[test]
    fn reserve_rule() {
        let l = 60_000_000; // 60 s slot
        assert_eq!(reserve_us(l, 0), 1_000_000);
        // 256 KiB: 1 s + 262144*8/5 µs = 1 s + 419430 µs
        assert_eq!(reserve_us(l, 262_144), 1_419_430);
        // 4 MiB: 1 s + 6710886 µs
        assert_eq!(reserve_us(l, 4_194_304), 7_710_886);
        // capped at half the slot
        assert_eq!(reserve_us(4_000_000, 4_194_304), 2_000_000);
        assert_eq!(reserve_us(1_000_000, 0), 500_000);
    }

    #[test]
    fn plan_is_deterministic_and_seed_dependent() {
        let w = (60_000_000, 600_000_000);
        let a = bulk_plan(42, w, 5, &sizes()).unwrap();
        let b = bulk_plan(42, w, 5, &sizes()).unwrap();
        assert_eq!(a, b);
        let c = bulk_plan(43, w, 5, &sizes()).unwrap();
        assert_ne!(a, c);
        // Each class appears per_size times.
        for class in sizes() {
            assert_eq!(a.iter().filter(|d| d.label == class.label && d.size == class.bytes).count(), 5);
        }
        // Pinned output of seed 42, so that any change in the algorithm is noticed (it is a contract:
        // copies built from different commits must agree).
        let head: Vec<(&str, i64)> = a.iter().take(3).map(|d| (d.label.as_str(), d.planned_us)).collect();
        assert_eq!(head, PINNED_SEED_42);
    }

    const PINNED_SEED_42: [(&str, i64); 3] = [("256KB", 75_296_009), ("1MB", 121_830_926), ("256KB", 155_251_991)];

    #[test]
    fn slots_do_not_overlap_and_reserve_is_respected() {
        for seed in 0..200 {
            for (w, n) in [((0, 10_000_000), 1), ((60_000_000, 600_000_000), 5), ((1_000_000, 4_000_000), 2)] {
                let plan = bulk_plan(seed, w, n, &sizes()).unwrap();
                let slot = (w.1 - w.0) / plan.len() as i64;
                for (k, d) in plan.iter().enumerate() {
                    assert_eq!(d.id, k);
                    assert_eq!(d.slot_start_us, w.0 + k as i64 * slot);
                    assert_eq!(d.slot_end_us, d.slot_start_us + slot);
                    assert!(d.slot_end_us <= w.1);
                    assert!(d.planned_us >= d.slot_start_us);
                    // at least the reserve is left after the start
                    assert!(d.slot_end_us - d.planned_us >= reserve_us(slot, d.size));
                    assert_eq!(d.deadline_us(), d.slot_end_us - SLOT_GUARD_US);
                    assert!(d.timeout_us > 0);
                    if k > 0 {
                        let prev = &plan[k - 1];
                        assert!(prev.deadline_us() < d.planned_us, "download {k} overlaps the previous one");
                        assert!(prev.slot_end_us <= d.slot_start_us);
                    }
                }
            }
        }
    }

    #[test]
    fn plan_errors() {
        assert!(bulk_plan(1, (0, 1_000_000), 0, &sizes()).is_err());
        assert!(bulk_plan(1, (0, 1_000_000), 1, &[]).is_err());
        // 3 downloads in 0.6 s: 0.2 s slots are too short
        assert!(bulk_plan(1, (0, 600_000), 1, &sizes()).is_err());
        assert!(bulk_plan(1, (0, 603_003), 1, &sizes()).is_ok());
    }

    #[test]
    fn path_templates() {
        assert!(check_path_template("/files/bench-{label}.bin").is_ok());
        assert!(check_path_template("/x/{size}").is_ok());
        assert!(check_path_template("files/{label}").is_err());
        assert!(check_path_template("/files/x.bin").is_err());
        assert!(check_path_template("/a b/{label}").is_err());
        let d = &bulk_plan(1, (0, 10_000_000), 1, &sizes()).unwrap()[0];
        assert_eq!(expand_path("/f/{label}-{size}", d), format!("/f/{}-{}", d.label, d.size));
    }

    #[test]
    fn im_due_times_are_deterministic_increasing_and_per_user() {
        let a = im_due_times(9, 0, 100, 5_000_000, 200.0);
        assert_eq!(a, im_due_times(9, 0, 100, 5_000_000, 200.0));
        assert_ne!(a, im_due_times(9, 1, 100, 5_000_000, 200.0));
        assert!(a[0] >= 6_000_000);
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
        // mean gap roughly 200 ms over 100 draws
        let mean_ms = (a[99] - 6_000_000) as f64 / 100.0 / 1000.0;
        assert!((100.0..400.0).contains(&mean_ms), "{mean_ms}");
        // Prefix property: more messages do not change earlier due times.
        assert_eq!(&im_due_times(9, 3, 200, 0, 50.0)[..10], &im_due_times(9, 3, 10, 0, 50.0)[..]);
    }
}
