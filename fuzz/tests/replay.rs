//! Every fuzz target on its committed corpus (`corpus/TARGET/*`), on
//! mutations of it and on random inputs, without the fuzzer: what `make
//! fuzz-smoke` (in `make test`) runs in a plain `cargo test`.
//! `FUZZ_REPLAY_INPUTS` (default 50,000) is the number of generated inputs per
//! target; `FUZZ_REPLAY_SEED` changes them.

use std::path::Path;
use std::time::Instant;

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| !p.file_name().unwrap().to_string_lossy().starts_with("crash-"))
        .collect();
    files.sort();
    files.into_iter().map(|p| std::fs::read(&p).expect("corpus file")).collect()
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// A seed changed the way a mutational fuzzer would: bytes flipped, set to
/// interesting values, inserted, removed, a slice duplicated, truncated.
fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..=rng.below(8) {
        let at = rng.below(v.len() + 1);
        match rng.below(6) {
            0 if at < v.len() => v[at] ^= 1 << rng.below(8),
            1 if at < v.len() => v[at] = [0, 1, 0x7f, 0x80, 0xff][rng.below(5)],
            2 => v.insert(at, rng.next() as u8),
            3 if at < v.len() => {
                v.remove(at);
            }
            4 if !v.is_empty() => {
                let from = rng.below(v.len());
                let len = rng.below(v.len() - from + 1).min(64);
                let piece: Vec<u8> = v[from..from + len].to_vec();
                v.splice(at..at, piece);
            }
            _ => v.truncate(at),
        }
    }
    v
}

#[test]
fn every_target_survives_its_corpus_mutations_and_random_inputs() {
    let n: usize = std::env::var("FUZZ_REPLAY_INPUTS").ok().and_then(|s| s.parse().ok()).unwrap_or(50_000);
    let seed: u64 = std::env::var("FUZZ_REPLAY_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed);
    for &(name, target) in polycorn_fuzz::TARGETS {
        let started = Instant::now();
        let seeds = corpus(name);
        assert!(!seeds.is_empty(), "no corpus for {name}");
        for s in &seeds {
            target(s);
        }
        let mut rng = Rng(seed ^ name.len() as u64 ^ 0x9e37_79b9_7f4a_7c15);
        for i in 0..n {
            let input = if i % 4 == 3 {
                let len = rng.below(1024);
                (0..len).map(|_| rng.next() as u8).collect()
            } else {
                let s = &seeds[rng.below(seeds.len())];
                mutate(&mut rng, s)
            };
            target(&input);
        }
        eprintln!("{name}: {} corpus files, {n} generated inputs, {:.1?}", seeds.len(), started.elapsed());
    }
}
