//! A small seeded PRNG and deterministic stream content.
//!
//! Hand-rolled so the `testing` feature adds no dependency: SplitMix64
//! (Steele, Lea and Flood, OOPSLA 2014) is tiny, statistically adequate for
//! drawing losses, and trivially reproducible across platforms. The
//! testbed's generator (`polycorn-emu`'s `SplitMix64`) is the same
//! algorithm; this copy exists because the sans-IO core may not depend on
//! the testbed, and a test pins both to Vigna's reference output.

/// SplitMix64: one `u64` of state, a new output per call.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.state)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        // The top 53 bits fill an f64 mantissa exactly.
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[0, n)`; `n` must be positive.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        // Multiply-shift: unbiased enough for test scenarios, branch-free.
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// True with probability `p`. Draws nothing when `p <= 0`, so a lossless
    /// link does not shift the random sequence of anything else.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.next_f64() < p
    }
}

/// The SplitMix64 finaliser: a stateless 64-bit hash.
pub fn mix(x: u64) -> u64 {
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fill `buf` with the bytes at `offset..offset + buf.len()` of the
/// pseudo-random stream named `key`. Any byte can be recomputed from its
/// offset alone, so a receiver checks content without keeping a copy.
pub fn fill_content(key: u64, offset: u64, buf: &mut [u8]) {
    let mut off = offset;
    let mut i = 0;
    while i < buf.len() {
        let word = mix(key ^ (off / 8).wrapping_mul(0x9E37_79B9_7F4A_7C15)).to_le_bytes();
        let start = (off % 8) as usize;
        let n = (8 - start).min(buf.len() - i);
        buf[i..i + n].copy_from_slice(&word[start..start + n]);
        i += n;
        off += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_is_the_same_however_it_is_split() {
        let mut whole = vec![0u8; 1000];
        fill_content(7, 3, &mut whole);
        let mut parts = vec![0u8; 1000];
        let (a, b) = parts.split_at_mut(13);
        fill_content(7, 3, a);
        fill_content(7, 16, b);
        assert_eq!(whole, parts);
        let mut other = vec![0u8; 1000];
        fill_content(8, 3, &mut other);
        assert_ne!(whole, other, "streams differ by key");
    }

    #[test]
    fn reference_values() {
        // Vigna's splitmix64.c seeded with 0 and with 1234567: the values the
        // testbed's copy (polycorn-emu, polycorn-loadgen) is pinned to.
        assert_eq!(SplitMix64::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
        let mut r = SplitMix64::new(1234567);
        assert_eq!(r.next_u64(), 6457827717110365317);
        assert_eq!(r.next_u64(), 3203168211198807973);
    }

    #[test]
    fn chance_tracks_its_probability() {
        let mut r = SplitMix64::new(1);
        let hits = (0..100_000).filter(|_| r.chance(0.1)).count();
        assert!((9_000..11_000).contains(&hits), "{hits}");
        assert!((0..1000).all(|_| r.below(5) < 5));
    }
}
