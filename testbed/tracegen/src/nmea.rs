//! A trip's GPS fixes as an NMEA 0183 log (`polycorn-tracegen nmea`), for
//! gpsd's `gpsfake`: the testbed then runs the relay on the real gpsd, as a
//! train does, instead of replaying the positions from `events.jsonl`.
//!
//! One `$GPRMC` (time, status, position, speed over ground in knots,
//! course, date) and one `$GPGGA` (time, position, fix quality, satellites,
//! HDOP, altitude) per fix, stamped with the fix's UTC time: the trip's
//! epoch plus its `t_ms`. gpsd reports each pair as one TPV (a 3-D fix).
//! The positions are the generator's GPS fixes, error included; HDOP is the
//! fix's accuracy over 5 m (a receiver's typical user range error), so a
//! 20 m fix reads HDOP 4.0.

use polycorn_telemetry::events::TripEvent;
use time::OffsetDateTime;

/// A receiver's user-equivalent range error, m: accuracy = HDOP × this.
pub const UERE_M: f64 = 5.0;
const KNOTS_PER_MPS: f64 = 3600.0 / 1852.0;

fn sentence(body: &str) -> String {
    let sum = body.bytes().fold(0u8, |a, b| a ^ b);
    format!("${body}*{sum:02X}\r\n")
}

/// `ddmm.mmmm` (or `dddmm.mmmm` with `width` 3) and the hemisphere.
fn degrees_minutes(x: f64, width: usize, pos: char, neg: char) -> (String, char) {
    let a = x.abs();
    let mut d = a.trunc();
    let mut m = ((a - d) * 60.0 * 10_000.0).round() / 10_000.0;
    if m >= 60.0 {
        d += 1.0;
        m = 0.0;
    }
    (format!("{:0width$}{m:07.4}", d as u32), if x < 0.0 { neg } else { pos })
}

/// The NMEA log of the GPS events of a trip whose time zero is
/// `epoch_unix_ms`, from the first fix at or after `from_unix_ms`.
pub fn nmea_log(events: &[TripEvent], epoch_unix_ms: i64, from_unix_ms: i64) -> Result<String, String> {
    let mut out = String::new();
    for e in events {
        let TripEvent::Gps { t_ms, lat, lon, speed_mps, heading_deg, accuracy_m, .. } = *e else {
            continue;
        };
        let t = epoch_unix_ms + t_ms as i64;
        if t < from_unix_ms {
            continue;
        }
        let at = OffsetDateTime::from_unix_timestamp_nanos(i128::from(t) * 1_000_000)
            .map_err(|e| format!("fix at {t} ms: {e}"))?;
        let hms = format!("{:02}{:02}{:02}.{:02}", at.hour(), at.minute(), at.second(), at.millisecond() / 10);
        let date = format!("{:02}{:02}{:02}", at.day(), u8::from(at.month()), at.year().rem_euclid(100));
        let (la, ns) = degrees_minutes(lat, 2, 'N', 'S');
        let (lo, ew) = degrees_minutes(lon, 3, 'E', 'W');
        let knots = speed_mps.max(0.0) * KNOTS_PER_MPS;
        let course = heading_deg.rem_euclid(360.0);
        let hdop = (accuracy_m / UERE_M).clamp(0.5, 99.0);
        out += &sentence(&format!("GPRMC,{hms},A,{la},{ns},{lo},{ew},{knots:.3},{course:.1},{date},,,A"));
        out += &sentence(&format!("GPGGA,{hms},{la},{ns},{lo},{ew},1,10,{hdop:.1},45.0,M,0.0,M,,"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gps(t_ms: u64, lat: f64, lon: f64) -> TripEvent {
        TripEvent::Gps { t_ms, lat, lon, speed_mps: 83.3, heading_deg: 160.0, accuracy_m: 20.0, track_m: 0.0 }
    }

    /// Parse a sentence back: checksum, fields.
    fn fields(line: &str) -> Vec<String> {
        let (body, sum) = line.trim_end().trim_start_matches('$').split_once('*').unwrap();
        assert_eq!(u8::from_str_radix(sum, 16).unwrap(), body.bytes().fold(0u8, |a, b| a ^ b));
        body.split(',').map(str::to_owned).collect()
    }

    fn decimal(dm: &str, hemi: &str) -> f64 {
        let v: f64 = dm.parse().unwrap();
        let d = (v / 100.0).trunc();
        let x = d + (v - 100.0 * d) / 60.0;
        if hemi == "S" || hemi == "W" {
            -x
        } else {
            x
        }
    }

    #[test]
    fn fixes_become_rmc_and_gga_with_their_utc_time_and_position() {
        let ev = vec![
            gps(0, 39.864905, 116.378909),
            TripEvent::CellChange { t_ms: 500, carrier: 0, cell: 1 },
            gps(1000, -33.5, -70.25),
        ];
        // 2024-05-01T08:00:00.250Z
        let epoch = 1_714_550_400_250;
        let log = nmea_log(&ev, epoch, epoch).unwrap();
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines.len(), 4, "{log}");
        let rmc = fields(lines[0]);
        assert_eq!(
            (rmc[0].as_str(), rmc[1].as_str(), rmc[2].as_str(), rmc[9].as_str()),
            ("GPRMC", "080000.25", "A", "010524")
        );
        assert!((decimal(&rmc[3], &rmc[4]) - 39.864905).abs() < 1e-6);
        assert!((decimal(&rmc[5], &rmc[6]) - 116.378909).abs() < 1e-6);
        assert!((rmc[7].parse::<f64>().unwrap() / KNOTS_PER_MPS - 83.3).abs() < 1e-3);
        let gga = fields(lines[1]);
        assert_eq!((gga[0].as_str(), gga[6].as_str(), gga[8].as_str()), ("GPGGA", "1", "4.0"));
        let south = fields(lines[2]);
        assert_eq!(south[1], "080001.25");
        assert!(
            (decimal(&south[3], &south[4]) + 33.5).abs() < 1e-6 && (decimal(&south[5], &south[6]) + 70.25).abs() < 1e-6
        );
        // Fixes before `from` are left out.
        assert_eq!(nmea_log(&ev, epoch, epoch + 1).unwrap().lines().count(), 2);
    }

    #[test]
    fn minutes_that_round_to_sixty_carry_into_the_degree() {
        assert_eq!(degrees_minutes(10.999_999_99, 2, 'N', 'S').0, "1100.0000");
    }
}
