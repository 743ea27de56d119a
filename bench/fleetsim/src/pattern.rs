//! The origin's byte streams, as `polycorn_benchrun.fleet_traffic` defines
//! them: a download of key `k` is a 1 MiB block of random bytes, read
//! cyclically from an offset that depends on `k`, so a byte of another
//! download, a gap or a duplicate does not match. The block is Python's
//! `random.Random(0x706F6C79636F726E).randbytes(1 << 20)`: MT19937 seeded by
//! `init_by_array` with the seed's 32-bit words, least significant first,
//! and its outputs written little-endian; rebuilt here bit for bit so that
//! the simulated passengers check the same origin the real ones do.

use std::sync::OnceLock;

/// Length of the block.
pub const BLOCK_LEN: usize = 1 << 20;
/// The seed of the block.
const SEED: u64 = 0x706F_6C79_636F_726E;
/// How far apart consecutive keys enter the block.
const KEY_STRIDE: u64 = 40_503;

const N: usize = 624;
const M: usize = 397;

/// MT19937 (Matsumoto and Nishimura 1998), as CPython's `_random` runs it.
struct Mt19937 {
    mt: [u32; N],
    i: usize,
}

impl Mt19937 {
    fn init_genrand(s: u32) -> [u32; N] {
        let mut mt = [0u32; N];
        mt[0] = s;
        for i in 1..N {
            mt[i] = 1_812_433_253u32.wrapping_mul(mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_add(i as u32);
        }
        mt
    }

    fn by_array(key: &[u32]) -> Mt19937 {
        let mut mt = Self::init_genrand(19_650_218);
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..N.max(key.len()) {
            let prev = mt[i - 1] ^ (mt[i - 1] >> 30);
            mt[i] = (mt[i] ^ prev.wrapping_mul(1_664_525)).wrapping_add(key[j]).wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..N - 1 {
            let prev = mt[i - 1] ^ (mt[i - 1] >> 30);
            mt[i] = (mt[i] ^ prev.wrapping_mul(1_566_083_941)).wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
        }
        mt[0] = 0x8000_0000;
        Mt19937 { mt, i: N }
    }

    fn next_u32(&mut self) -> u32 {
        if self.i >= N {
            for k in 0..N {
                let y = (self.mt[k] & 0x8000_0000) | (self.mt[(k + 1) % N] & 0x7FFF_FFFF);
                let mag = if y & 1 == 1 { 0x9908_B0DF } else { 0 };
                self.mt[k] = self.mt[(k + M) % N] ^ (y >> 1) ^ mag;
            }
            self.i = 0;
        }
        let mut y = self.mt[self.i];
        self.i += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9D2C_5680;
        y ^= (y << 15) & 0xEFC6_0000;
        y ^ (y >> 18)
    }
}

/// The block (built once).
pub fn block() -> &'static [u8] {
    static BLOCK: OnceLock<Vec<u8>> = OnceLock::new();
    BLOCK.get_or_init(|| {
        let mut mt = Mt19937::by_array(&[SEED as u32, (SEED >> 32) as u32]);
        let mut b = Vec::with_capacity(BLOCK_LEN);
        while b.len() < BLOCK_LEN {
            b.extend_from_slice(&mt.next_u32().to_le_bytes());
        }
        b
    })
}

/// Where byte `offset` of download `key` is in the block.
fn start(key: u64, offset: u64) -> usize {
    ((u128::from(key) * u128::from(KEY_STRIDE) + u128::from(offset)) % BLOCK_LEN as u128) as usize
}

/// Bytes `offset .. offset + n` of download `key`.
pub fn pattern(key: u64, offset: u64, n: usize) -> Vec<u8> {
    let b = block();
    let mut out = Vec::with_capacity(n);
    let mut at = start(key, offset);
    while out.len() < n {
        let take = (n - out.len()).min(BLOCK_LEN - at);
        out.extend_from_slice(&b[at..at + take]);
        at = 0;
    }
    out
}

/// Whether `data` is bytes `offset ..` of download `key` (without copying).
pub fn matches(key: u64, offset: u64, data: &[u8]) -> bool {
    let b = block();
    let mut at = start(key, offset);
    let mut rest = data;
    while !rest.is_empty() {
        let take = rest.len().min(BLOCK_LEN - at);
        if rest[..take] != b[at..at + take] {
            return false;
        }
        rest = &rest[take..];
        at = 0;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The block is Python's: its first and last bytes and its CRC-32, as
    /// `random.Random(0x706F6C79636F726E).randbytes(1 << 20)` gives them.
    #[test]
    fn the_block_is_the_python_origins() {
        let b = block();
        assert_eq!(b.len(), BLOCK_LEN);
        assert_eq!(b[..8], [0x23, 0x4a, 0xe9, 0x26, 0x4a, 0x96, 0x1f, 0x96]);
        assert_eq!(b[BLOCK_LEN - 8..], [0xf2, 0xe1, 0xdf, 0x1a, 0x7f, 0xbe, 0xbd, 0xb6]);
        assert_eq!(crc32fast::hash(b), PYTHON_CRC32);
    }

    /// zlib.crc32 of the Python block.
    const PYTHON_CRC32: u32 = 0xc9fc_3527;

    #[test]
    fn pattern_is_keyed_and_continuous_across_the_block_end() {
        let a = pattern(7, 0, 3 << 20);
        assert_eq!(a[1000..5000], pattern(7, 1000, 4000)[..]);
        assert_ne!(pattern(8, 0, 4096), a[..4096]);
        assert!(matches(7, 12_345, &a[12_345..12_345 + (1 << 20) + 77]));
        let mut bad = a[100..200].to_vec();
        bad[50] ^= 1;
        assert!(!matches(7, 100, &bad));
        assert!(!matches(7, 101, &a[100..200]), "a shifted stream does not match");
    }
}
