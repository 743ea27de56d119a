//! Samplers on top of polycorn-emu's seeded SplitMix64, plus the normal CDF.

use polycorn_emu::SplitMix64;

/// Derives an independent stream from `seed` and a `tag` (carrier, purpose), so adding a
/// carrier or a process never changes the draws of another.
pub fn stream(seed: u64, tag: u64) -> Rng {
    Rng(SplitMix64::stream(seed, tag))
}

/// Seeded generator with the distributions the model needs.
#[derive(Debug, Clone)]
pub struct Rng(SplitMix64);

impl Rng {
    /// Uniform on `[0, 1)`.
    pub fn uniform(&mut self) -> f64 {
        self.0.next_f64()
    }

    /// Uniform on `(0, 1]` (safe for logarithms).
    fn open(&mut self) -> f64 {
        1.0 - self.0.next_f64()
    }

    /// Standard normal (Box–Muller, one value per call).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.open();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Exponential with the given mean.
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * self.open().ln()
    }

    /// Gamma(shape, scale) by Marsaglia–Tsang (shape < 1 via the U^(1/shape) boost).
    pub fn gamma(&mut self, shape: f64, scale: f64) -> f64 {
        if shape < 1.0 {
            let g = self.gamma(shape + 1.0, 1.0);
            return g * self.open().powf(1.0 / shape) * scale;
        }
        let d = shape - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let x = self.normal();
            let v = (1.0 + c * x).powi(3);
            if v <= 0.0 {
                continue;
            }
            let u = self.open();
            if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
                return d * v * scale;
            }
        }
    }

    /// Lognormal with the given median and log-SD.
    pub fn lognormal(&mut self, median: f64, sigma: f64) -> f64 {
        median * (sigma * self.normal()).exp()
    }

    /// `true` with probability `p`.
    pub fn bernoulli(&mut self, p: f64) -> bool {
        self.uniform() < p
    }
}

/// Complementary error function (Numerical Recipes `erfcc`, relative error < 1.2e-7).
pub fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98 + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// Upper tail of the standard normal, 1 − Φ(z), accurate in the tail.
pub fn normal_sf(z: f64) -> f64 {
    0.5 * erfc(z / std::f64::consts::SQRT_2)
}

/// Quantile function of a unit gamma distribution tabulated from sorted Marsaglia–Tsang draws
/// with a fixed seed (no incomplete-gamma inverse needed; resolution 1/2^17 in probability).
#[derive(Debug, Clone)]
pub struct GammaQuantile {
    sorted: Vec<f64>,
}

impl GammaQuantile {
    /// Tabulates Gamma(shape, 1).
    pub fn new(shape: f64) -> Self {
        let mut rng = stream(0x6A33_A5E5, shape.to_bits());
        let mut sorted: Vec<f64> = (0..1 << 17).map(|_| rng.gamma(shape, 1.0)).collect();
        sorted.sort_by(f64::total_cmp);
        Self { sorted }
    }

    /// The `p`-quantile (linear interpolation between order statistics).
    pub fn at(&self, p: f64) -> f64 {
        let n = self.sorted.len();
        let pos = p.clamp(0.0, 1.0) * (n - 1) as f64;
        let i = pos.floor() as usize;
        let f = pos - i as f64;
        if i + 1 >= n {
            return self.sorted[n - 1];
        }
        self.sorted[i] * (1.0 - f) + self.sorted[i + 1] * f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samplers_have_the_right_means() {
        let mut r = stream(1, 2);
        let n = 50_000;
        let g: f64 = (0..n).map(|_| r.gamma(0.64, 250.0)).sum::<f64>() / n as f64;
        assert!((g - 160.0).abs() < 6.0, "gamma mean {g}");
        let g4: f64 = (0..n).map(|_| r.gamma(4.0, 0.25)).sum::<f64>() / n as f64;
        assert!((g4 - 1.0).abs() < 0.02, "gamma mean {g4}");
        let z: Vec<f64> = (0..n).map(|_| r.normal()).collect();
        let m = z.iter().sum::<f64>() / n as f64;
        let v = z.iter().map(|x| x * x).sum::<f64>() / n as f64;
        assert!(m.abs() < 0.02 && (v - 1.0).abs() < 0.03);
        assert!((normal_sf(1.959_964) - 0.025).abs() < 1e-6);
        assert!((normal_sf(-1.0) - 0.841_344_7).abs() < 1e-6);
    }
}
