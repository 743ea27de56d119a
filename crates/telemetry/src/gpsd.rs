//! gpsd's JSON protocol (<https://gpsd.io/gpsd_json.html>), sans-IO: the
//! bytes a gpsd socket yields become [`GpsdFix`]es.
//!
//! A client connects (TCP 2947 by default), sends [`WATCH`] and then reads
//! one JSON object per line. Only `TPV` reports with `mode` ≥ 2 (a 2D or 3D
//! fix), a latitude, a longitude and a time become fixes; every other class
//! (`VERSION`, `DEVICES`, `WATCH`, `SKY`, ...) and TPVs without a fix are
//! skipped. gpsd's first TPV after a `WATCH` can be a partial report from
//! its cache, with a position but no time, speed or course (seen with gpsd
//! 3.22); it cannot be placed in time and is skipped too. Speed, course
//! and accuracy missing from a timed fix are 0 ("unknown", as in the
//! schema's accuracy). A line that is not JSON, not an object with a `class`, or a
//! TPV with impossible values is an error for that line only; [`GpsdStats`]
//! counts every case, and nothing here panics on any input.
//!
//! [`LineBuffer`] splits the byte stream into lines and drops lines longer
//! than [`MAX_LINE_BYTES`], so a misbehaving peer cannot grow memory.

use serde::Deserialize;

use crate::v1;

/// The command that starts gpsd's JSON stream.
pub const WATCH: &str = "?WATCH={\"enable\":true,\"json\":true};\n";

/// gpsd's default TCP port.
pub const DEFAULT_PORT: u16 = 2947;

/// Longest line kept; gpsd's longest reports (`SKY` with every satellite)
/// are a few KiB.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// A position fix from a TPV report.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpsdFix {
    /// The fix's GPS time (TPV `time`), Unix ms.
    pub time_unix_ms: i64,
    pub fix: v1::GpsFix,
}

/// What one line was.
#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    Fix(GpsdFix),
    /// A TPV without a usable fix (mode 0/1, no position or no time).
    NoFix,
    /// A report of another class, e.g. `SKY`.
    Other(String),
}

/// Why a line was refused.
#[derive(Debug, thiserror::Error)]
pub enum GpsdError {
    #[error("gpsd line is not a JSON object with a class: {0}")]
    NotJson(#[from] serde_json::Error),
    #[error("gpsd TPV with an impossible {field}: {value}")]
    Invalid { field: &'static str, value: f64 },
    #[error("gpsd TPV with an unreadable time: {0:?}")]
    BadTime(String),
    #[error("gpsd line longer than {MAX_LINE_BYTES} bytes, dropped")]
    TooLong,
}

/// Counters of a gpsd stream, plain data; the shell exports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpsdStats {
    pub lines: u64,
    pub fixes: u64,
    pub no_fix: u64,
    pub other: u64,
    pub malformed: u64,
}

impl GpsdStats {
    /// Count one line's result.
    pub fn count(&mut self, r: &Result<Message, GpsdError>) {
        self.lines += 1;
        match r {
            Ok(Message::Fix(_)) => self.fixes += 1,
            Ok(Message::NoFix) => self.no_fix += 1,
            Ok(Message::Other(_)) => self.other += 1,
            Err(_) => self.malformed += 1,
        }
    }
}

#[derive(Deserialize)]
struct Report {
    class: String,
    #[serde(default)]
    mode: Option<i64>,
    #[serde(default)]
    time: Option<String>,
    #[serde(default)]
    lat: Option<f64>,
    #[serde(default)]
    lon: Option<f64>,
    #[serde(default)]
    speed: Option<f64>,
    #[serde(default)]
    track: Option<f64>,
    #[serde(default)]
    eph: Option<f64>,
    #[serde(default)]
    epx: Option<f64>,
    #[serde(default)]
    epy: Option<f64>,
}

/// Parse one line of gpsd output (without its newline).
pub fn parse_line(line: &str) -> Result<Message, GpsdError> {
    let r: Report = serde_json::from_str(line.trim())?;
    if r.class != "TPV" {
        return Ok(Message::Other(r.class));
    }
    let (Some(mode), Some(lat), Some(lon), Some(time)) = (r.mode, r.lat, r.lon, r.time) else {
        return Ok(Message::NoFix);
    };
    if mode < 2 {
        return Ok(Message::NoFix);
    }
    let check = |field: &'static str, value: f64, ok: bool| {
        if ok {
            Ok(value)
        } else {
            Err(GpsdError::Invalid { field, value })
        }
    };
    let lat = check("lat", lat, (-90.0..=90.0).contains(&lat))?;
    let lon = check("lon", lon, (-180.0..=180.0).contains(&lon))?;
    let speed = r.speed.map(|v| check("speed", v, v.is_finite() && v >= 0.0)).transpose()?;
    let track = r.track.map(|v| check("track", v, v.is_finite())).transpose()?;
    // `eph` (gpsd ≥ 3.19) is the horizontal error; older ones give the
    // per-axis 95 % errors, combined here conservatively.
    let time_unix_ms = parse_time_unix_ms(&time).ok_or(GpsdError::BadTime(time))?;
    let accuracy = match (r.eph, r.epx, r.epy) {
        (Some(h), _, _) if h.is_finite() && h >= 0.0 => h,
        (_, Some(x), Some(y)) if x.is_finite() && y.is_finite() => x.hypot(y),
        _ => 0.0,
    };
    Ok(Message::Fix(GpsdFix {
        time_unix_ms,
        fix: v1::GpsFix {
            lat_deg: lat,
            lon_deg: lon,
            speed_mps: speed.unwrap_or(0.0),
            heading_deg: track.unwrap_or(0.0).rem_euclid(360.0),
            accuracy_m: accuracy,
            track_m: None,
        },
    }))
}

/// Parse gpsd's UTC time, `YYYY-MM-DDTHH:MM:SS[.fff]Z`, into Unix ms.
pub fn parse_time_unix_ms(s: &str) -> Option<i64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|x| x.parse::<i64>().ok());
    let (y, mo, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':').map(|x| x.parse::<i64>().ok());
    let (h, mi, sec) = (t.next()??, t.next()??, t.next()??);
    // Years outside 1..=9999 (ISO 8601's four digits) are refused: a year
    // like 1969260370 made the milliseconds overflow (found by fuzz/).
    if !(1..=9999).contains(&y)
        || !(1..=12).contains(&mo)
        || !(1..=31).contains(&day)
        || h > 23
        || mi > 59
        || sec > 60
        || h < 0
        || mi < 0
        || sec < 0
    {
        return None;
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let ms = frac.bytes().chain(std::iter::repeat(b'0')).take(3).fold(0, |a, b| a * 10 + i64::from(b - b'0'));
    Some(((days_from_civil(y, mo, day) * 24 + h) * 60 + mi) * 60_000 + sec * 1000 + ms)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Splits a byte stream into lines, dropping overlong ones.
#[derive(Debug, Default)]
pub struct LineBuffer {
    buf: Vec<u8>,
    /// Discarding the rest of an overlong line.
    skipping: bool,
}

impl LineBuffer {
    /// Feed bytes; returns the complete lines in them (lossy UTF-8), and
    /// `Err(TooLong)` in place of each overlong line.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Result<String, GpsdError>> {
        let mut out = Vec::new();
        for chunk in bytes.split_inclusive(|&b| b == b'\n') {
            let complete = chunk.last() == Some(&b'\n');
            let body = if complete { &chunk[..chunk.len() - 1] } else { chunk };
            if !self.skipping {
                if self.buf.len() + body.len() > MAX_LINE_BYTES {
                    self.buf.clear();
                    self.skipping = true;
                    out.push(Err(GpsdError::TooLong));
                } else {
                    self.buf.extend_from_slice(body);
                }
            }
            if complete {
                if !self.skipping {
                    let line = String::from_utf8_lossy(&self.buf).trim_end_matches('\r').to_string();
                    if !line.trim().is_empty() {
                        out.push(Ok(line));
                    }
                }
                self.buf.clear();
                self.skipping = false;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // Shapes as gpsd 3.22 prints them.
    const TPV: &str = r#"{"class":"TPV","device":"/dev/pts/3","mode":3,"time":"2024-05-01T08:00:01.000Z","ept":0.005,"lat":39.865000000,"lon":116.379000000,"altHAE":45.000,"altMSL":45.000,"alt":45.000,"epx":7.1,"epy":9.3,"epv":23.000,"track":160.0000,"magtrack":153.2,"speed":83.333,"climb":0.000,"eps":18.60,"ecefx":-2180000.00,"geoidSep":-9.000,"eph":11.600,"sep":25.500}"#;

    #[test]
    fn a_3d_tpv_becomes_a_fix_with_speed_heading_and_accuracy() {
        let Message::Fix(f) = parse_line(TPV).unwrap() else { panic!("not a fix") };
        assert_eq!((f.fix.lat_deg, f.fix.lon_deg), (39.865, 116.379));
        assert_eq!((f.fix.speed_mps, f.fix.heading_deg, f.fix.accuracy_m), (83.333, 160.0, 11.6));
        assert_eq!(f.time_unix_ms, 1_714_550_401_000);
        assert_eq!(f.fix.track_m, None, "gpsd knows no track position");
    }

    #[test]
    fn without_eph_the_axis_errors_give_the_accuracy() {
        let l = r#"{"class":"TPV","mode":2,"time":"1970-01-01T00:00:01Z","lat":1.0,"lon":2.0,"epx":3.0,"epy":4.0}"#;
        let Message::Fix(f) = parse_line(l).unwrap() else { panic!("not a fix") };
        assert_eq!((f.fix.accuracy_m, f.time_unix_ms, f.fix.speed_mps), (5.0, 1000, 0.0));
    }

    #[test]
    fn tpvs_without_a_fix_and_other_classes_are_skipped() {
        assert_eq!(parse_line(r#"{"class":"TPV","device":"/dev/ttyS0","mode":1}"#).unwrap(), Message::NoFix);
        assert_eq!(parse_line(r#"{"class":"TPV","mode":3}"#).unwrap(), Message::NoFix);
        // gpsd 3.22's cached partial TPV right after WATCH.
        let partial = r#"{"class":"TPV","device":"/dev/pts/1","mode":3,"lat":39.84671,"lon":116.387673333,"altHAE":36.0,"eph":17.1}"#;
        assert_eq!(parse_line(partial).unwrap(), Message::NoFix);
        let v = r#"{"class":"VERSION","release":"3.22","rev":"3.22","proto_major":3,"proto_minor":14}"#;
        assert_eq!(parse_line(v).unwrap(), Message::Other("VERSION".into()));
        assert!(matches!(parse_line(r#"{"class":"SKY","satellites":[]}"#).unwrap(), Message::Other(_)));
    }

    #[test]
    fn malformed_lines_are_errors_and_counted() {
        let mut st = GpsdStats::default();
        for l in [
            "",
            "not json",
            "[1,2]",
            r#"{"mode":3}"#,
            r#"{"class":"TPV","mode":3,"time":"2024-01-01T00:00:00Z","lat":91,"lon":0}"#,
            r#"{"class":"TPV","mode":"3"}"#,
            r#"{"class":"TPV","mode":3,"time":"noon","lat":1,"lon":1}"#,
        ] {
            let r = parse_line(l);
            assert!(r.is_err(), "{l:?} -> {r:?}");
            st.count(&r);
        }
        st.count(&parse_line(TPV));
        assert_eq!((st.lines, st.malformed, st.fixes), (8, 7, 1));
    }

    #[test]
    fn gpsd_times_parse_to_unix_ms() {
        assert_eq!(parse_time_unix_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_time_unix_ms("2000-03-01T00:00:00.5Z"), Some(951_868_800_500));
        assert_eq!(parse_time_unix_ms("2024-02-29T23:59:59.999Z"), Some(1_709_251_199_999));
        for bad in [
            "2024-13-01T00:00:00Z",
            "2024-01-01T00:00:00",
            "yesterday",
            "2024-01-01T00:00:00.x1Z",
            "--T::Z",
            // Found by fuzz/: the milliseconds of this year overflow an i64.
            "1969260370-01-01T00:00:03Z",
            "-5-01-01T00:00:00Z",
        ] {
            assert_eq!(parse_time_unix_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn lines_split_across_reads_are_joined_and_overlong_ones_dropped() {
        let mut b = LineBuffer::default();
        assert!(b.push(b"{\"class\":").is_empty());
        let v = b.push(b"\"X\"}\r\n\n{\"a\"");
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].as_ref().unwrap(), "{\"class\":\"X\"}");
        let big = vec![b'x'; MAX_LINE_BYTES + 1];
        let v = b.push(&big);
        assert!(matches!(v.as_slice(), [Err(GpsdError::TooLong)]));
        assert!(b.push(b"still the long line").is_empty());
        let v = b.push(b"\nnext\n");
        assert_eq!(v.into_iter().map(Result::unwrap).collect::<Vec<_>>(), vec!["next".to_string()]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::cases(256)))]
        #[test]
        fn no_input_panics(bytes in prop::collection::vec(any::<u8>(), 0..400), cuts in prop::collection::vec(0usize..400, 0..5)) {
            let mut b = LineBuffer::default();
            let mut st = GpsdStats::default();
            let mut at = 0;
            let mut cuts = cuts;
            cuts.sort_unstable();
            for c in cuts.into_iter().chain([bytes.len()]) {
                let c = c.clamp(at, bytes.len());
                for l in b.push(&bytes[at..c]) {
                    let r = l.and_then(|l| parse_line(&l));
                    st.count(&r);
                }
                at = c;
            }
            let _ = parse_time_unix_ms(&String::from_utf8_lossy(&bytes));
        }
    }
}
