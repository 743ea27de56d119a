//! A small seeded PRNG (SplitMix64), so the crate needs no `rand` dependency and every run with
//! the same seed makes the same random decisions; and its counter-based form ([`splitmix_at`]),
//! a keyed hash that gives the i-th draw of a stream directly, for the time-keyed loss process.

/// SplitMix64's increment (the odd integer closest to 2^64 / φ).
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function (Stafford's "Mix13" variant of the MurmurHash3 finaliser): a
/// bijection of `u64` in which every input bit affects every output bit.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Draw `i` (0-based) of the SplitMix64 stream seeded with `key`, in O(1): the value the
/// `(i + 1)`-th [`SplitMix64::next_u64`] of `SplitMix64::new(key)` returns. SplitMix64 is
/// counter-based (its state after `n` steps is `key + n · γ`), so this is the same generator,
/// addressed by index instead of stepped: a keyed hash of `(key, i)`.
pub fn splitmix_at(key: u64, i: u64) -> u64 {
    mix64(key.wrapping_add(i.wrapping_add(1).wrapping_mul(GAMMA)))
}

/// A uniform draw from `[0, 1)` with 53 bits of precision from 64 random bits (the top 53).
pub fn unit_f64(bits: u64) -> f64 {
    (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// SplitMix64 (Steele, Lea and Flood 2014): 64 bits of state, passes BigCrush, good enough to
/// drive loss decisions and trivially reproducible.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator seeded with `seed`; equal seeds give equal sequences.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// An independent generator for (`seed`, `tag`) (a carrier, a purpose,
    /// a user): seed and tag are mixed through one SplitMix64 step, so
    /// neighbouring seeds or tags give unrelated streams and adding a stream
    /// never changes the draws of another. The trace generator and the load
    /// generator draw every stream this way.
    pub fn stream(seed: u64, tag: u64) -> Self {
        let mut mix = SplitMix64::new(seed ^ tag.wrapping_mul(0xD1B5_4A32_D192_ED03));
        SplitMix64::new(mix.next_u64())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix64(self.state)
    }

    /// A uniform draw from `[0, 1)` with 53 bits of precision.
    pub fn next_f64(&mut self) -> f64 {
        unit_f64(self.next_u64())
    }

    /// `true` with probability `p` (`p <= 0` never, `p >= 1` always).
    pub fn bernoulli(&mut self, p: f64) -> bool {
        self.next_f64() < p
    }

    /// Uniform integer on `[0, n)` (`n > 0`), by Lemire's multiply-shift (bias < n / 2^64).
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Exponential with the given mean (inversion on `(0, 1]`).
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.next_f64()).ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence_and_uniform_mean() {
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        let n = 100_000;
        let mut sum = 0.0;
        for _ in 0..n {
            let x = a.next_f64();
            assert_eq!(x, b.next_f64());
            assert!((0.0..1.0).contains(&x));
            sum += x;
        }
        assert!((sum / n as f64 - 0.5).abs() < 0.01);
    }

    #[test]
    fn splitmix_at_addresses_the_stream_by_index() {
        for key in [0, 1, 7, u64::MAX, 0x1234_5678_9ABC_DEF0] {
            let mut g = SplitMix64::new(key);
            for i in 0..1000 {
                assert_eq!(splitmix_at(key, i), g.next_u64(), "key {key} draw {i}");
            }
        }
        // The reference output of SplitMix64 (Vigna's splitmix64.c) seeded with 0.
        assert_eq!(splitmix_at(0, 0), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn streams_are_pinned() {
        // The trace generator's and load generator's plans depend on these
        // values: a change here changes every generated trip and plan.
        let mut s = SplitMix64::stream(7, 0x6275_6C6B);
        let first = s.next_u64();
        let mut mix = SplitMix64::new(7 ^ 0x6275_6C6Bu64.wrapping_mul(0xD1B5_4A32_D192_ED03));
        assert_eq!(first, SplitMix64::new(mix.next_u64()).next_u64());
        assert_ne!(SplitMix64::stream(7, 1).next_u64(), SplitMix64::stream(7, 2).next_u64());
    }
}
