//! Adam's elementwise update on FP32 slices, compiled for the CPU's widest vectors.
//!
//! dfdx's f32 Adam ran on the calling thread in the baseline build's SSE code, its square root
//! and division four lanes at a time: 3.3% of the small GPT's O0 step on an AVX-512 Xeon
//! (`perf record` of `cargo bench --bench cpu_step -- --only gpt-small --config O0`), with the
//! pool's other thread idle. The same expression, operation for
//! operation, on AVX-512 or AVX2 registers: every operation is IEEE's, rounded once, and Rust
//! never contracts a multiply and an add into a fused one, so every level gives the scalar
//! loop's bits (`tests/optim.rs` holds each level to a scalar reference).

/// Adam's constants for one step, converted from the configuration's f64 values as dfdx's f32
/// kernel converts them: `β`, `ε` and the learning rate rounded to f32, the bias corrections
/// `1 / (1 − βᵗ)` computed in f32.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamStep {
    /// `β₁`, `β₂`.
    pub betas: [f32; 2],
    /// `ε`, added to `√v̂`.
    pub eps: f32,
    /// The learning rate.
    pub lr: f32,
    /// `1 / (1 − β₁ᵗ)` and `1 / (1 − β₂ᵗ)`.
    pub correction: (f32, f32),
    /// L2 weight decay `λ`: `λ·p` added to the gradient.
    pub l2: Option<f32>,
    /// Decoupled weight decay `λ·lr` (AdamW): `λ·lr·p` added to the step.
    pub decoupled: Option<f32>,
}

impl AdamStep {
    /// The constants of step `t` (counted from 1) for `betas`, `eps` and `lr`, with L2 decay
    /// `l2` or decoupled decay `decoupled` (AdamW's `λ`, multiplied by `lr` in f64 before its
    /// rounding, as dfdx does).
    pub fn new(
        t: i32,
        betas: [f64; 2],
        eps: f64,
        lr: f64,
        l2: Option<f64>,
        decoupled: Option<f64>,
    ) -> Self {
        let betas = betas.map(|b| b as f32);
        AdamStep {
            betas,
            eps: eps as f32,
            lr: lr as f32,
            correction: (
                (1.0f32 - betas[0].powi(t)).recip(),
                (1.0f32 - betas[1].powi(t)).recip(),
            ),
            l2: l2.map(|wd| wd as f32),
            decoupled: decoupled.map(|wd| (wd * lr) as f32),
        }
    }

    /// One update of the parameters `p` and the moments `m` and `v` from the gradient `g`,
    /// element by element: `g' = g + λ·p` (L2), `m = β₁·m + (1 − β₁)·g'`, `v = β₂·v + (1 −
    /// β₂)·g'²`, `p −= lr·m̂ / (√v̂ + ε) (+ λ·lr·p)`, in dfdx's order of operations.
    ///
    /// # Panics
    /// If the four slices' lengths differ.
    pub fn update(&self, p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32]) {
        assert!(
            m.len() == p.len() && v.len() == p.len() && g.len() == p.len(),
            "Adam: parameters, moments and gradient of different lengths"
        );
        #[cfg(target_arch = "x86_64")]
        if crate::level::level() >= crate::level::Level::Avx512 {
            #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
            fn widest(s: &AdamStep, p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32]) {
                s.by_decay(p, m, v, g)
            }
            // SAFETY: the level is at least AVX-512, which is only detected (or forced) on a
            // CPU with AVX-512F, BW and VL, and AVX2 and FMA.
            return unsafe { widest(self, p, m, v, g) };
        }
        #[cfg(target_arch = "x86_64")]
        if crate::level::level() >= crate::level::Level::Avx2 {
            #[target_feature(enable = "avx2,fma")]
            fn wide(s: &AdamStep, p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32]) {
                s.by_decay(p, m, v, g)
            }
            // SAFETY: the level is at least AVX2, which is only detected (or forced) on a CPU
            // with AVX2 and FMA.
            return unsafe { wide(self, p, m, v, g) };
        }
        self.by_decay(p, m, v, g)
    }

    /// One loop per kind of decay, chosen outside it, so that each vectorises.
    #[inline(always)]
    fn by_decay(&self, p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32]) {
        match (self.l2, self.decoupled) {
            (None, None) => self.run::<false, false>(p, m, v, g),
            (Some(_), None) => self.run::<true, false>(p, m, v, g),
            (None, Some(_)) => self.run::<false, true>(p, m, v, g),
            (Some(_), Some(_)) => self.run::<true, true>(p, m, v, g),
        }
    }

    #[inline(always)]
    fn run<const L2: bool, const DECOUPLED: bool>(
        &self,
        p: &mut [f32],
        m: &mut [f32],
        v: &mut [f32],
        g: &[f32],
    ) {
        let [b1, b2] = self.betas;
        let (l2, decoupled) = (self.l2.unwrap_or(0.0), self.decoupled.unwrap_or(0.0));
        for (((p, m), v), &g) in p.iter_mut().zip(m).zip(v).zip(g) {
            let mut g = g;
            if L2 {
                g += l2 * *p;
            }
            *m = *m * b1 + g * (1.0 - b1);
            *v = *v * b2 + g.powi(2) * (1.0 - b2);
            let m_hat = *m * self.correction.0;
            let v_hat = *v * self.correction.1;
            g = self.lr * m_hat / (v_hat.sqrt() + self.eps);
            if DECOUPLED {
                g += decoupled * *p;
            }
            *p -= g;
        }
    }
}
