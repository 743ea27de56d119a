//! Seeded streams of SplitMix64 (Steele, Lea & Flood 2014; the testbed's one generator, from
//! polycorn-emu): a tiny, fully specified generator, so that plans are byte-identical across
//! copies, builds and dependency upgrades.

pub use polycorn_emu::SplitMix64;

/// Stream tag of the bulk plan.
pub const TAG_BULK: u64 = 0x6275_6C6B; // "bulk"
/// Stream tag of IM user `u` is `TAG_IM_USER + u`.
pub const TAG_IM_USER: u64 = 0x696D_0000_0000; // "im" << 32

/// An independent generator for (`seed`, `tag`) ([`SplitMix64::stream`]).
pub fn stream(seed: u64, tag: u64) -> SplitMix64 {
    SplitMix64::stream(seed, tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_values() {
        // First outputs of SplitMix64 seeded with 1234567 (reference implementation by Vigna).
        let mut r = SplitMix64::new(1234567);
        assert_eq!(r.next_u64(), 6457827717110365317);
        assert_eq!(r.next_u64(), 3203168211198807973);
    }

    #[test]
    fn ranges() {
        let mut r = stream(7, TAG_BULK);
        for _ in 0..10_000 {
            let f = r.next_f64();
            assert!((0.0..1.0).contains(&f));
            assert!(r.below(3) < 3);
            assert!(r.exponential(10.0) >= 0.0);
        }
    }
}
